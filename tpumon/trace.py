"""Trace files: the recorded HBM samples that `analyze` reads and `export` writes.

The format is a public contract (docs: shared spec, contracts section 1): CSV
with a header (column order free, unknown columns ignored) or JSON Lines with
the same keys. Traces of long runs hold millions of rows, so both the reader
and the writer stream: nothing here holds more than one row plus the last
time of each (host, chip) series.

The reader is strict on purpose. A trace is evidence that a person will act
on ("chip 3 leaks 40 KB per step"), so a malformed value must stop the
analysis with the file and line number rather than be guessed at.
"""

from __future__ import annotations

import csv
import json
import math
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Union

__all__ = ["TraceRow", "TraceFormatError", "read_trace", "write_trace", "COLUMNS"]

#: Column order used when writing; readers must not depend on it.
COLUMNS = ("time", "host", "chip", "step", "hbm_used_bytes", "hbm_total_bytes")
_REQUIRED = ("time", "host", "chip", "hbm_used_bytes", "hbm_total_bytes")
_FORMATS = ("csv", "jsonl")

PathOrFile = Union[str, "os.PathLike[str]", IO[str]]


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One chip's HBM as seen at one poll."""

    time: float
    host: str
    chip: str
    step: int | None
    hbm_used_bytes: int
    hbm_total_bytes: int


class TraceFormatError(ValueError):
    """A trace file is malformed; names the file and the 1-based line.

    ``str()`` is one line, ``path:line: message``, because the CLI prints it
    as is on stderr and a person must be able to open the file at that line.
    """

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message

    def __reduce__(self) -> tuple[Any, ...]:
        # Custom __init__ arguments: tell pickle (multiprocessing) how to rebuild.
        return (type(self), (self.path, self.line, self.message))


class _FieldError(Exception):
    """A bad value in a row; the reader adds the path and line number."""


# ---------------------------------------------------------------- reading


def read_trace(path: PathOrFile, *, format: str | None = None) -> Iterator[TraceRow]:
    """Yield the rows of a trace file, validating as it goes.

    ``path`` is a file name, ``-`` for stdin, or an open text file. The format
    is JSON Lines when the name ends in ``.jsonl``, CSV otherwise, unless
    ``format`` says. Raises :class:`TraceFormatError` at the first malformed
    row, so rows already yielded are valid and everything after is not read.
    """
    if isinstance(path, (str, os.PathLike)) and os.fspath(path) != "-":
        name = os.fspath(path)
        fmt = _resolve_format(format, name)
        with open(name, encoding="utf-8-sig", newline="") as f:
            yield from _read_stream(f, name, fmt)
    else:
        stream = sys.stdin if path == "-" else path
        name = getattr(stream, "name", None)
        name = name if isinstance(name, str) else "<stream>"
        yield from _read_stream(stream, name, _resolve_format(format, name))


def _resolve_format(format: str | None, name: str) -> str:
    if format is None:
        return "jsonl" if name.lower().endswith(".jsonl") else "csv"
    if format not in _FORMATS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {_FORMATS}")
    return format


def _read_stream(stream: IO[str], name: str, fmt: str) -> Iterator[TraceRow]:
    raw = _raw_csv(stream) if fmt == "csv" else _raw_jsonl(stream)
    last: dict[tuple[str, str], tuple[float, int]] = {}
    line = 1
    try:
        for line, values in raw:
            row = _build_row(*values)
            key = (row.host, row.chip)
            prev = last.get(key)
            if prev is not None and row.time < prev[0]:
                raise _FieldError(
                    f"time {row.time:.3f} is earlier than {prev[0]:.3f} on line {prev[1]} "
                    f"for host {row.host!r} chip {row.chip!r} (times of a series must not go back)"
                )
            last[key] = (row.time, line)
            yield row
    except _FieldError as e:
        # The raw iterators set the line of the header / bad JSON in the error args.
        at = e.args[1] if len(e.args) > 1 else line
        raise TraceFormatError(name, at, e.args[0]) from None


def _raw_csv(stream: IO[str]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """Yield (line, raw values in COLUMNS order) from CSV; ``None`` for no step column."""
    reader = csv.reader(stream)
    header = _first_nonblank(reader)
    if header is None:
        raise _FieldError("empty file: expected a header row naming the columns", 1)
    index = _header_index([c.strip() for c in header], reader.line_num)
    positions = [index.get(c) for c in COLUMNS]
    width = len(header)
    for fields in reader:
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue  # blank line
        if len(fields) != width:
            raise _FieldError(f"row has {len(fields)} fields but the header has {width}", reader.line_num)
        yield reader.line_num, tuple(None if p is None else fields[p] for p in positions)


def _first_nonblank(reader: Any) -> list[str] | None:
    for fields in reader:
        if any(f.strip() for f in fields):
            return fields
    return None


def _header_index(header: list[str], line: int) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, column in enumerate(header):
        if column in index and column in COLUMNS:
            raise _FieldError(f"column {column!r} appears twice in the header", line)
        index.setdefault(column, i)
    missing = [c for c in _REQUIRED if c not in index]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        raise _FieldError(f"missing required column {names} in the header", line)
    return index


def _raw_jsonl(stream: IO[str]) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """Yield (line, raw values in COLUMNS order) from JSON Lines."""
    for line, text in enumerate(stream, start=1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise _FieldError(f"not valid JSON: {e.msg} (column {e.colno})", line) from None
        if not isinstance(obj, dict):
            raise _FieldError(f"expected a JSON object, got {type(obj).__name__}", line)
        missing = [c for c in _REQUIRED if c not in obj]
        if missing:
            raise _FieldError(f"missing required key {', '.join(repr(c) for c in missing)}", line)
        yield line, tuple(obj.get(c) for c in COLUMNS)


def _build_row(time: Any, host: Any, chip: Any, step: Any, used: Any, total: Any) -> TraceRow:
    """Validate raw values (strings from CSV, JSON scalars) into a TraceRow."""
    t = _float_field(time, "time")
    used_b = _int_field(used, "hbm_used_bytes")
    total_b = _int_field(total, "hbm_total_bytes")
    if used_b < 0:
        raise _FieldError(f"column 'hbm_used_bytes': {used_b} is negative")
    if total_b <= 0:
        raise _FieldError(f"column 'hbm_total_bytes': {total_b} is not positive")
    # used > total is accepted: runtimes do report it transiently, and it is data.
    return TraceRow(t, _name_field(host, "host"), _name_field(chip, "chip", numbers=True),
                    _step_field(step), used_b, total_b)


def _float_field(value: Any, column: str) -> float:
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise _FieldError(_not_a(value, column, "number")) from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise _FieldError(_not_a(value, column, "number"))
    if not math.isfinite(number):
        raise _FieldError(f"column {column!r}: {value!r} is not a finite number")
    return number


def _int_field(value: Any, column: str) -> int:
    # int() would accept 123.9 (a JSON float) and truncate it; take only ints and strings.
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _FieldError(_not_a(value, column, "integer"))


def _step_field(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    step = _int_field(value, "step")
    if step < 0:
        raise _FieldError(f"column 'step': {step} is negative")
    return step


def _name_field(value: Any, column: str, *, numbers: bool = False) -> str:
    if numbers and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # JSON chip indices are numbers; series keys are strings
    if not isinstance(value, str):
        raise _FieldError(f"column {column!r}: {value!r} is not a string")
    value = value.strip()
    if not value:
        raise _FieldError(f"column {column!r} is empty")
    return value


def _not_a(value: Any, column: str, kind: str) -> str:
    if value is None or value == "":
        return f"column {column!r} is empty"
    return f"column {column!r}: {value!r} is not {'an' if kind[0] in 'aeiou' else 'a'} {kind}"


# ---------------------------------------------------------------- writing


def write_trace(rows: Iterable[TraceRow], path_or_file: PathOrFile, format: str = "csv") -> int:
    """Write rows as a trace; return how many were written.

    ``path_or_file`` is a file name, ``-`` for stdout, or an open text file
    (left open). Times are written with 3 decimals (millisecond resolution is
    what polls have), so a row whose time has more digits reads back rounded.
    """
    if format not in _FORMATS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {_FORMATS}")
    write = _write_csv if format == "csv" else _write_jsonl
    if path_or_file == "-":
        return write(rows, sys.stdout)
    if isinstance(path_or_file, (str, os.PathLike)):
        with open(path_or_file, "w", encoding="utf-8", newline="") as f:
            return write(rows, f)
    return write(rows, path_or_file)


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
