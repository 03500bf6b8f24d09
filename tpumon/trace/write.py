"""Trace files written: CSV, JSON Lines, or Parquet (through pyarrow, loaded only then)."""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO

from tpumon.trace.schema import COLUMNS, FORMATS, PathOrFile, TraceRow

#: Rows per batch handed to the Parquet writer.
_PARQUET_BATCH_ROWS = 1 << 16


def write_trace(rows: Iterable[TraceRow], path_or_file: PathOrFile, format: str = "csv") -> int:
    """Write rows as a trace; return how many were written.

    ``path_or_file`` is a file name, ``-`` for stdout, or an open text file
    (left open). Times are written with 3 decimals (millisecond resolution is
    what polls have), so a row whose time has more digits reads back rounded. Parquet
    is written to a file name only (it is binary and written at the end).
    """
    if format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {FORMATS}")
    if format == "parquet":
        if not isinstance(path_or_file, (str, os.PathLike)) or path_or_file == "-":
            raise ValueError("Parquet is written to a file, not to a stream")
        from tpumon.trace.arrow import write_parquet
        return write_parquet(_batched(rows, _PARQUET_BATCH_ROWS), os.fspath(path_or_file))
    write = _write_csv if format == "csv" else _write_jsonl
    if path_or_file == "-":
        return write(rows, sys.stdout)
    if isinstance(path_or_file, (str, os.PathLike)):
        with open(path_or_file, "w", encoding="utf-8", newline="") as f:
            return write(rows, f)
    return write(rows, path_or_file)


def _batched(rows: Iterable[TraceRow], size: int) -> Iterator[list[TraceRow]]:
    batch: list[TraceRow] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _write_csv(rows: Iterable[TraceRow], f: IO[str]) -> int:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(COLUMNS)
    n = 0
    for r in rows:
        writer.writerow((f"{r.time:.3f}", r.host, r.chip, "" if r.step is None else r.step,
                         r.hbm_used_bytes, r.hbm_total_bytes))
        n += 1
    return n


def _write_jsonl(rows: Iterable[TraceRow], f: IO[str]) -> int:
    n = 0
    dumps = json.dumps
    for r in rows:
        step = "null" if r.step is None else int(r.step)
        f.write(f'{{"time": {r.time:.3f}, "host": {dumps(r.host)}, "chip": {dumps(r.chip)}, '
                f'"step": {step}, "hbm_used_bytes": {int(r.hbm_used_bytes)}, '
                f'"hbm_total_bytes": {int(r.hbm_total_bytes)}}}\n')
        n += 1
    return n
