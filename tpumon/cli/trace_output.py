"""A trace as the client commands write it (``export``, ``sim --write-trace``): its format
from the output's name, and the file written whole or not at all. A leaf module: no command
module imports another."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable

import click

from tpumon.trace.schema import TraceRow
from tpumon.trace.write import write_trace

WRITABLE = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}  # suffix -> format


def output_format(output: str) -> str:
    """The trace format for an output file, from its suffix; one that the commands cannot
    write is refused (CSV was once written into x.parquet)."""
    suffix = Path(output).suffix.lower()
    if output == "-" or suffix in WRITABLE:
        return WRITABLE.get(suffix, "csv")
    raise click.ClickException(f"{output}: cannot write {suffix or 'a file without a suffix'}"
                               f"; give a name ending {' or '.join(WRITABLE)}, or '-'")


def write_whole(rows: Iterable[TraceRow], output: str, fmt: str) -> int:
    """Write beside ``output`` and rename over it when complete: an error half-way leaves
    an existing file as it was."""
    if output == "-":
        return write_trace(rows, output, fmt)
    partial = f"{output}.partial"
    try:
        count = write_trace(rows, partial, fmt)
        os.replace(partial, output)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)
    return count
