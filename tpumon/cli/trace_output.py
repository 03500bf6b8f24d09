"""A trace as the client commands write it (``export``, ``sim --write-trace``): its format
from the output's name, and the file written whole or not at all. A leaf module: no command
module imports another."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from pathlib import Path
from typing import Iterable

import click

from tpumon.trace.schema import TraceRow
from tpumon.trace.write import write_trace

WRITABLE = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}  # suffix -> format


def output_format(output: str, asked: str | None = None, *, can_ask: bool = True) -> str:
    """The trace format for an output file: ``asked`` (``--format``), else from its suffix.
    A suffix the commands cannot write needs ``--format``, and one they can must agree
    with it: CSV was once written into x.parquet, which ``analyze`` then read as Parquet.
    ``can_ask``: the command has a ``--format`` (the error says to use it)."""
    suffix = Path(output).suffix.lower()
    named = WRITABLE.get(suffix)
    if output == "-":
        return asked or "csv"
    if asked is None:
        if named is None:
            raise click.ClickException(
                f"{output}: cannot write {suffix or 'a file without a suffix'}; give a name "
                f"ending {' or '.join(WRITABLE)}, or '-'{', or say --format' if can_ask else ''}")
        return named
    if named is not None and asked != named:
        raise click.ClickException(f"{output}: --format {asked}, but the name says {named}; "
                                   "give a name that agrees (it is how analyze reads it)")
    return asked


def write_whole(rows: Iterable[TraceRow], output: str, fmt: str) -> int:
    """Write beside ``output`` and rename over it when complete: an error half-way leaves
    an existing file as it was. Only a regular file (or a new one) is renamed over, at the
    end of any symlinks to it: a rename over /dev/null or a FIFO put a file in its place
    (``export --format csv -o /dev/null`` as root left every program on the machine
    writing to a file), and one over a symlink replaced the link."""
    if output == "-":
        return _write_stdout(rows, fmt)
    if _not_a_file(output):
        return write_trace(rows, output, fmt)
    target = os.path.realpath(output)
    partial = f"{target}.partial"
    try:
        count = write_trace(rows, partial, fmt)
        os.replace(partial, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)
    return count


def _write_stdout(rows: Iterable[TraceRow], fmt: str) -> int:
    """To stdout, whose reader may leave early (``| head``: it has what it wanted): then
    exit 1 quietly, not with an error line about a broken pipe."""
    try:
        return write_trace(rows, "-", fmt)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # exit's flush too
        sys.exit(1)


def _not_a_file(path: str) -> bool:
    """``path`` is there and is no regular file: a device, a FIFO, a socket."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False  # not there (or not readable): written as a new file, whole
