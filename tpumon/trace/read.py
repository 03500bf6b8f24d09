"""Trace files: the recorded HBM samples that `analyze` reads and `export` writes.

The format is a public contract (docs: shared spec, contracts section 1): CSV
with a header (column order free, unknown columns ignored) or JSON Lines with
the same keys. Traces of long runs hold millions of rows, so read_trace and
the writer stream (nothing held but one row and the last time of each
(host, chip) series); read_trace_columns (``report``) parses in one pass
straight into numpy arrays per series, and spill_trace (``analyze``) does the
same a table at a time into a temporary file (tpumon.trace.spill), so that a
trace of any length is read in bounded memory. The CSV row parser has a fast
path for the common row; see bench/trace_read.py.

The reader is strict on purpose. A trace is evidence that a person will act
on ("chip 3 leaks 40 KB per step"), so a malformed value must stop the
analysis with the file and line number rather than be guessed at.
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from itertools import chain
from operator import itemgetter
from typing import IO, TYPE_CHECKING, Any, Union

from tpumon.trace.schema import (COLUMNS, INT_LIMIT, MAX_LINE_CHARS, REQUIRED, STEP_LIMIT,
                                 SeriesColumns, SeriesSource, TraceFormatError, TraceRow)

if TYPE_CHECKING:
    import numpy as np  # imported where used: the agent reads no traces

    from tpumon.trace.spill import Spill

__all__ = ["TraceRow", "TraceFormatError", "SeriesColumns", "SeriesSource", "read_trace",
           "read_trace_columns", "spill_trace", "write_trace", "COLUMNS"]

_FORMATS = ("csv", "jsonl", "parquet")

PathOrFile = Union[str, "os.PathLike[str]", IO[str]]


class _FieldError(Exception):
    """A bad value in a row; the reader adds the path and line number."""


# ---------------------------------------------------------------- reading

#: Rows that read_trace_columns gathers in lists before moving them into arrays.
_BATCH_ROWS = 1 << 16

#: Python 3.10's csv module rejects NUL characters; 3.11's reads them like any other.
_CSV_TAKES_NUL = sys.version_info >= (3, 11)

def read_trace(path: PathOrFile, *, format: str | None = None) -> Iterator[TraceRow]:
    """Yield the rows of a trace file, validating as it goes.

    ``path`` is a file name, ``-`` for stdin, or an open text file. The format
    is JSON Lines when the name ends in ``.jsonl``, CSV otherwise, unless
    ``format`` says. Raises :class:`TraceFormatError` at the first malformed
    row, so rows already yielded are valid and everything after is not read.
    """
    if _resolve_format(format, _stream_name(path)) == "parquet":
        yield from _parquet_rows(path)
        return
    with _open_trace(path, format) as (stream, name, fmt, lines_are_plain):
        names: list[tuple[str, str]] = []
        for series, t, step, used, total in _records(stream, name, fmt, lines_are_plain, names):
            host, chip = names[series]
            yield TraceRow(t, host, chip, step, used, total)


def _parquet_rows(path: PathOrFile) -> Iterator[TraceRow]:
    """The rows of a Parquet trace in file order, checked as a whole first (the format is
    read in columns; there is no line to name)."""
    from tpumon.trace import arrow as trace_columns

    name = _stream_name(path)
    if not isinstance(path, (str, os.PathLike)) or name == "-":
        raise TraceFormatError(name, None, "Parquet is read from a file only")
    try:
        table = trace_columns.read_table(name, "parquet")
        trace_columns.series_columns(table)
    except trace_columns.NeedsStrictParser as exc:
        raise TraceFormatError(name, None, str(exc)) from None
    for batch in table.to_batches():
        for record in batch.to_pylist():
            yield TraceRow(record["time"], record["host"], record["chip"], record["step"],
                           record["hbm_used_bytes"], record["hbm_total_bytes"])


def read_trace_columns(path: PathOrFile, *,
                       format: str | None = None) -> dict[tuple[str, str], SeriesColumns]:
    """Read a whole trace into arrays per (host, chip) series (``report``; ``analyze``
    reads through :func:`spill_trace`, in bounded memory).

    Same arguments, same validation and same errors as :func:`read_trace`, and Parquet
    (``.parquet``) too. The dict is in order of first appearance, and a series' arrays hold
    its rows in file order, a missing step as NaN. Files are parsed by pyarrow
    (:mod:`tpumon.trace.arrow`); a CSV or JSON Lines file it does not take as is (and
    stdin, and open text files) goes through the validating parser that :func:`read_trace`
    uses, which accepts the same files and names the line of the first bad value.
    """
    from tpumon.trace import arrow as trace_columns

    if isinstance(path, (str, os.PathLike)) and os.fspath(path) != "-" and \
            _rereadable(os.fspath(path)):
        name = os.fspath(path)
        fmt = _resolve_format(format, name)
        try:
            with trace_columns.small_pages():
                return trace_columns.series_columns(trace_columns.read_table(name, fmt))
        except trace_columns.NeedsStrictParser as exc:
            if fmt == "parquet":
                raise TraceFormatError(name, None, str(exc)) from None
    if _resolve_format(format, _stream_name(path)) == "parquet":
        raise TraceFormatError(_stream_name(path), None, "Parquet is read from a file only")
    return _parsed_columns(path, format)


def spill_trace(path: PathOrFile, spill: Spill, *, format: str | None = None,
                read: Callable[[int], None] | None = None) -> None:
    """Add a trace's series to ``spill`` (as its next file) table by table: what
    :func:`read_trace_columns` returns, in bounded memory whatever the trace's length.

    Same arguments, validation and errors as :func:`read_trace_columns`, and a series that
    an earlier file of the spill holds is an error. ``read`` is told the rows of each table
    as it is added. A file that pyarrow does not take as is, stdin and open text files are
    read whole by the validating parser, as there (their memory is not bounded).
    """
    from tpumon.trace import arrow as trace_columns, spill as trace_spill

    name = _stream_name(path)
    spill.start_file()
    try:
        if isinstance(path, (str, os.PathLike)) and name != "-" and _rereadable(name):
            fmt = _resolve_format(format, name)
            try:
                _spill_tables(name, fmt, spill, read)
                return
            except trace_columns.NeedsStrictParser as exc:
                if fmt == "parquet":
                    raise TraceFormatError(name, None, str(exc)) from None
                spill.drop_file()
        if _resolve_format(format, name) == "parquet":
            raise TraceFormatError(name, None, "Parquet is read from a file only")
        columns = _parsed_columns(path, format)
        spill.add(columns)
        if read is not None:
            read(sum(c.samples for c in columns.values()))
    except trace_spill.SeriesAgain as exc:
        raise TraceFormatError(name, None, f"host {exc.key[0]!r} chip {exc.key[1]!r} is also "
                               "in an earlier file of the directory") from None


def _spill_tables(name: str, fmt: str, spill: Spill, read: Callable[[int], None] | None) -> None:
    """:func:`spill_trace` of a file that pyarrow reads (NeedsStrictParser if not)."""
    from tpumon.trace import arrow as trace_columns, spill as trace_spill

    first_row = 0
    with trace_columns.small_pages():
        for table in trace_columns.read_ahead(trace_columns.read_tables(name, fmt)):
            columns = trace_columns.series_columns(table, first_row)
            try:
                spill.add(columns)
            except trace_spill.TimeWentBack as exc:
                row = first_row + trace_columns.first_row_of(table, exc.key) + 1
                raise trace_columns.NeedsStrictParser(
                    f"row {row}: time {exc.time:.3f} is earlier than {exc.last:.3f} earlier "
                    "in its series (times of a series must not go back)") from None
            first_row += len(table)
            if read is not None:
                read(len(table))


def _rereadable(name: str) -> bool:
    """Whether the file can be read twice (pyarrow first, then the strict parser where
    pyarrow's reading does not decide): not a named pipe or a device, whose first reading
    would leave the second nothing, or wait forever for a writer. A name that cannot be
    looked up is left to ``open`` to word its error."""
    try:
        return stat.S_ISREG(os.stat(name).st_mode)
    except OSError:
        return True


def _stream_name(path: PathOrFile) -> str:
    if isinstance(path, (str, os.PathLike)):
        return os.fspath(path)
    name = getattr(sys.stdin if path == "-" else path, "name", None)
    return name if isinstance(name, str) else "<stream>"


def _parsed_columns(path: PathOrFile,
                    format: str | None) -> dict[tuple[str, str], SeriesColumns]:
    """read_trace_columns through the validating parser, one row at a time."""
    import numpy as np

    names: list[tuple[str, str]] = []
    lists: tuple[list[Any], ...] = ([], [], [], [], [])  # series, times, steps, used, total
    dtypes = (np.intp, np.float64, np.float64, np.int64, np.int64)
    chunks: list[list[np.ndarray]] = [[] for _ in lists]

    def move_to_arrays() -> None:
        for values, dtype, arrays in zip(lists, dtypes, chunks, strict=True):
            arrays.append(np.fromiter(values, dtype, len(values)))  # a step of None -> NaN
            values.clear()

    with _open_trace(path, format) as (stream, name, fmt, lines_are_plain):
        for _ in _records(stream, name, fmt, lines_are_plain, names, lists):
            move_to_arrays()  # every _BATCH_ROWS rows
        move_to_arrays()
    columns = []
    for arrays in chunks:  # joined one column at a time, to hold less memory at once
        columns.append(np.concatenate(arrays))
        arrays.clear()
    series_of = columns.pop(0)
    counts = np.bincount(series_of, minlength=len(names))
    if len(names) > 1:
        # Group the rows by series, keeping file order within each: a stable sort, and a
        # radix sort (linear) when the series numbers fit in 16 bits.
        keys = series_of.astype(np.uint16) if len(names) <= 1 << 16 else series_of
        del series_of
        order = np.argsort(keys, kind="stable")
        del keys
        for i, column in enumerate(columns):
            columns[i] = column[order]  # one copy at a time
            del column
    ends = np.cumsum(counts).tolist()
    return {key: SeriesColumns(*(c[end - count:end] for c in columns))
            for key, end, count in zip(names, ends, counts.tolist(), strict=True)}


@contextmanager
def _open_trace(path: PathOrFile,
                format: str | None) -> Iterator[tuple[Iterator[str], str, str, bool]]:
    """(lines, name for messages, format, plain lines) of a file name, ``-`` or an open text
    file. Lines are plain when they can have line breaks (\\r, \\n) only at their end and no NUL
    that the csv module rejects: files read with newline="" on Python 3.11 and later."""
    if isinstance(path, (str, os.PathLike)) and os.fspath(path) != "-":
        name = os.fspath(path)
        fmt = _resolve_format(format, name)
        with open(name, encoding="utf-8-sig", newline="") as f, _text_only(name):
            yield _bounded_lines(f, name), name, fmt, _CSV_TAKES_NUL
    else:
        stream = sys.stdin if path == "-" else path
        name = getattr(stream, "name", None)
        name = name if isinstance(name, str) else "<stream>"
        with _text_only(name):
            yield _bounded_lines(stream, name), name, _resolve_format(format, name), False


def _bounded_lines(stream: Iterable[str], name: str) -> Iterator[str]:
    """The stream's lines as iterating it gives them, but a line longer than MAX_LINE_CHARS
    is refused (TraceFormatError with its number) as soon as that much has been read (a
    file); an iterable of lines without ``readline`` (a generator) hands them over whole."""
    readline = getattr(stream, "readline", None)
    # a line of the most characters and its end, \r\n included: the end read apart from
    # it would be a blank line of its own and every later line's number one too many
    most = MAX_LINE_CHARS + 2
    lines = iter(stream) if readline is None else iter(lambda: readline(most), "")
    for number, text in enumerate(lines, start=1):
        if len(text) > MAX_LINE_CHARS and len(text.rstrip("\r\n")) > MAX_LINE_CHARS:
            raise TraceFormatError(name, number, f"a line longer than {MAX_LINE_CHARS:,} "
                                   "characters (a trace row is one short line)")
        yield text


@contextmanager
def _text_only(name: str) -> Iterator[None]:
    """A binary file (a database, a PNG given by mistake) is a format error, not a crash."""
    try:
        yield
    except UnicodeDecodeError:
        raise TraceFormatError(name, None, "not UTF-8 text (a trace is CSV, JSON Lines, "
                               "or Parquet named .parquet)") from None


def _resolve_format(format: str | None, name: str) -> str:
    if format is None:
        lower = name.lower()
        return "jsonl" if lower.endswith(".jsonl") else \
            "parquet" if lower.endswith(".parquet") else "csv"
    if format not in _FORMATS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {_FORMATS}")
    return format


# The validating parser. It is the only code that checks trace content: read_trace and
# read_trace_columns take the same records from it, so they accept and reject the same
# files with the same messages. Each format has a fast path for the common row (inline
# checks, no calls but the conversions) that takes only what the general checks,
# _check_values, would take as is, and hands anything else to them: they decide, and word
# every message about a value. tests/test_trace.py holds the fast paths to them.

#: (series number, time, step or None, used bytes, total bytes)
_Record = tuple[int, float, int | None, int, int]


def _records(stream: Iterator[str], name: str, fmt: str, lines_are_plain: bool,
             names: list[tuple[str, str]],
             lists: tuple[list[Any], ...] | None = None) -> Iterator[_Record | None]:
    """The validated rows of a trace in file order; raises TraceFormatError at the first bad one.

    A record is (series, time, step, used, total), where ``series`` indexes ``names``, to which
    each (host, chip) is appended as it first appears. With ``lists`` (five lists), records are
    appended to those, column by column, instead, and None is yielded every _BATCH_ROWS rows.
    """
    if fmt == "csv":
        return _csv_records(stream, name, lines_are_plain, names, lists)
    records = _jsonl_records(stream, name, names)
    return records if lists is None else _append_records(records, lists)


def _append_records(records: Iterator[_Record], lists: tuple[list[Any], ...]) -> Iterator[None]:
    series, times, steps, used, total = lists
    for record in records:
        series.append(record[0])
        times.append(record[1])
        steps.append(record[2])
        used.append(record[3])
        total.append(record[4])
        if len(times) >= _BATCH_ROWS:
            yield None


class _SeriesState:
    """What the parser keeps of one series: its last time and that row's line, to check that
    times do not go back, and its number in the list of names."""

    __slots__ = ("last_time", "last_line", "number")

    def __init__(self, number: int) -> None:
        self.last_time = -math.inf
        self.last_line = 0
        self.number = number


class _Series:
    """The series seen so far. Per series, a state list [last time, its line, series number],
    found by (host, chip) as spelled in the file: CSV rows are looked up before their names
    are stripped, so that names are validated once per series, not once per row."""

    __slots__ = ("names", "by_spelling", "by_name")

    def __init__(self, names: list[tuple[str, str]]) -> None:
        self.names = names
        self.by_spelling: dict[tuple[Any, Any], _SeriesState] = {}
        self.by_name: dict[tuple[str, str], _SeriesState] = {}

    def add(self, host: Any, chip: Any) -> _SeriesState:
        """The state of a series not yet seen spelled this way; validates the names."""
        key = (_name_field(host, "host"), _name_field(chip, "chip", numbers=True))
        state = self.by_name.get(key)
        if state is None:
            state = self.by_name[key] = _SeriesState(len(self.names))
            self.names.append(key)
        self.by_spelling[(host, chip)] = state
        return state

    def went_back(self, state: _SeriesState, time: float) -> _FieldError:
        host, chip = self.names[state.number]
        return _FieldError(
            f"time {time:.3f} is earlier than {state.last_time:.3f} on line {state.last_line} "
            f"for host {host!r} chip {chip!r} (times of a series must not go back)")


def _csv_records(stream: Iterator[str], name: str, lines_are_plain: bool,
                 names: list[tuple[str, str]],
                 lists: tuple[list[Any], ...] | None) -> Iterator[_Record | None]:
    lines = iter(stream)
    series = _Series(names)
    get_state, add_series, went_back = series.by_spelling.get, series.add, series.went_back
    limit, step_limit, field_limit = INT_LIMIT, STEP_LIMIT, csv.field_size_limit()
    csv_reader = csv.reader
    if lists is not None:
        out_series, out_times, out_steps, out_used, out_total = lists
    line = 0  # lines read so far, as csv.reader counts them
    last_t_s = last_step_s = last_total_s = None  # texts of values known good, and the values
    last_t = last_step = last_total = None
    try:
        reader = csv_reader(lines)  # reads no further than the record it returns
        try:
            header = _first_nonblank(reader)
        finally:
            line = reader.line_num
        if header is None:
            raise TraceFormatError(name, 1, "empty file: expected a header row naming the columns")
        index = _header_index([c.strip() for c in header])
        positions = tuple(index.get(c) for c in COLUMNS)
        width = len(header)
        # The usual layout (the writer's) is unpacked as is, which also checks the width.
        pick = None if positions == tuple(range(6)) and width == 6 else _picker(positions)
        for text in lines:
            line += 1
            if '"' in text or len(text) > field_limit or not (lines_are_plain or _plain(text)):
                # Quotes (a quoted field may go on over more lines), an overlong field or
                # odd line breaks: the csv module's parse.
                reader = csv_reader(chain((text,), lines))
                try:
                    fields = next(reader, [])
                finally:
                    line += reader.line_num - 1
                text = ""
            else:
                # Without those, str.split gives the fields that csv.reader would, five times
                # faster, bar the line break that the last one keeps: the fast conversions
                # below ignore it, and the general checks get it stripped.
                fields = text.split(",")
            try:
                if pick is None:
                    t_s, host, chip, step_s, used_s, total_s = fields
                else:
                    if len(fields) != width:
                        raise ValueError
                    t_s, host, chip, step_s, used_s, total_s = pick(fields)
                used = int(used_s)
                if used < 0 or used >= limit:
                    raise ValueError
                # The rows of one poll share time and step, and HBM totals do not change:
                # convert those only when the text differs from the last good row's.
                if t_s == last_t_s:
                    t = last_t
                else:
                    t = float(t_s)
                    if t - t:  # NaN or infinite (t - t is NaN, which is true)
                        raise ValueError
                    last_t_s, last_t = t_s, t
                if step_s == last_step_s:
                    step = last_step
                else:
                    step = int(step_s) if step_s else None
                    if step is not None and (step < 0 or step >= step_limit):
                        raise ValueError
                    last_step_s, last_step = step_s, step
                if total_s == last_total_s:
                    total = last_total
                else:
                    total = int(total_s)
                    if total <= 0 or total >= limit:
                        raise ValueError
                    last_total_s, last_total = total_s, total
            except ValueError:
                # Not the common row: a blank line, a wrong width, an odd but valid value
                # (spaces, an all-blank step) or an error. The general checks decide.
                if text:
                    fields[-1] = fields[-1].rstrip("\r\n")
                if not fields or (len(fields) == 1 and not fields[0].strip()):
                    continue  # blank line
                t, host, chip, step, used, total = _csv_values(fields, positions, width)
            state = get_state((host, chip))
            if state is None:
                state = add_series(host, chip)
            if t < state.last_time:
                raise went_back(state, t)
            state.last_time = t
            state.last_line = line
            if lists is None:
                yield state.number, t, step, used, total
            else:
                out_series.append(state.number)
                out_times.append(t)
                out_steps.append(step)
                out_used.append(used)
                out_total.append(total)
                if len(out_times) >= _BATCH_ROWS:
                    yield None
    except _FieldError as e:
        raise TraceFormatError(name, line, e.args[0]) from None
    except csv.Error as e:
        raise TraceFormatError(name, line, f"not valid CSV: {e}") from None


def _plain(text: str) -> bool:
    """Whether a line has no line break but at its end and no NUL (see _open_trace)."""
    body = text.rstrip("\r\n")
    return "\r" not in body and "\n" not in body and "\0" not in body


def _picker(positions: tuple[int | None, ...]) -> Callable[[list[str]], tuple[str, ...]]:
    """CSV fields -> the strings of COLUMNS in order; an empty step if there is no step column."""
    if positions[3] is not None:
        return itemgetter(*positions)
    get = itemgetter(*(p for p in positions if p is not None))

    def pick(fields: list[str]) -> tuple[str, ...]:
        t, host, chip, used, total = get(fields)
        return t, host, chip, "", used, total
    return pick


def _first_nonblank(reader: Any) -> list[str] | None:
    for fields in reader:
        if any(f.strip() for f in fields):
            return fields
    return None


def _header_index(header: list[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, column in enumerate(header):
        if column in index and column in COLUMNS:
            raise _FieldError(f"column {column!r} appears twice in the header")
        index.setdefault(column, i)
    missing = [c for c in REQUIRED if c not in index]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        raise _FieldError(f"missing required column {names} in the header")
    return index


def _csv_values(fields: list[str], positions: tuple[int | None, ...],
                width: int) -> tuple[Any, ...]:
    """The general checks of one CSV row."""
    if len(fields) != width:
        raise _FieldError(f"row has {len(fields)} fields but the header has {width}")
    return _check_values(*(None if p is None else fields[p] for p in positions))


def _jsonl_records(stream: Iterator[str], name: str,
                   names: list[tuple[str, str]]) -> Iterator[_Record]:
    series = _Series(names)
    get_state, add_series, went_back = series.by_spelling.get, series.add, series.went_back
    scan, loads = json.JSONDecoder().scan_once, json.loads
    limit, step_limit = INT_LIMIT, STEP_LIMIT
    line = 0
    try:
        for line, text in enumerate(stream, start=1):
            try:
                # json.loads without its Python layers, for a line that is one JSON value
                # with nothing after it but JSON whitespace; json.loads itself for the rest.
                obj, end = scan(text, 0)
                if end != len(text) and text[end:].strip(" \t\n\r"):
                    raise ValueError
            except (StopIteration, ValueError, TypeError, RecursionError):
                try:
                    obj = loads(text)
                except json.JSONDecodeError as e:
                    if not text.strip():
                        continue  # blank line
                    raise _FieldError(f"not valid JSON: {e.msg} (column {e.colno})") from None
                except RecursionError:
                    raise _FieldError("not valid JSON: nested too deeply") from None
                except ValueError:  # an integer of thousands of digits (Python's limit)
                    raise _FieldError("not valid JSON: a number too long") from None
            if type(obj) is not dict:
                raise _FieldError(f"expected a JSON object, got {type(obj).__name__}")
            try:
                t, host, chip, step = obj["time"], obj["host"], obj["chip"], obj.get("step")
                used, total = obj["hbm_used_bytes"], obj["hbm_total_bytes"]
            except KeyError:
                missing = ", ".join(repr(c) for c in REQUIRED if c not in obj)
                raise _FieldError(f"missing required key {missing}") from None
            # The common row (names are checked with the series, once), else the general checks.
            if not (type(t) is float and not t - t and type(host) is str
                    and (type(chip) is str or type(chip) is int)
                    and (step is None or (type(step) is int and 0 <= step < step_limit))
                    and type(used) is int and 0 <= used < limit
                    and type(total) is int and 0 < total < limit):
                t, host, chip, step, used, total = _check_values(t, host, chip, step, used, total)
            state = get_state((host, chip))
            if state is None:
                state = add_series(host, chip)
            if t < state.last_time:
                raise went_back(state, t)
            state.last_time = t
            state.last_line = line
            yield state.number, t, step, used, total
    except _FieldError as e:
        raise TraceFormatError(name, line, e.args[0]) from None


def _check_values(time: Any, host: Any, chip: Any, step: Any, used: Any,
                  total: Any) -> tuple[float, str, str, int | None, int, int]:
    """Validate raw values (strings from CSV, JSON scalars): the checks, in the order they
    are reported, and every message about a value."""
    t = _float_field(time, "time")
    used_b = _int_field(used, "hbm_used_bytes")
    total_b = _int_field(total, "hbm_total_bytes")
    if used_b < 0:
        raise _FieldError(f"column 'hbm_used_bytes': {used_b} is negative")
    if total_b <= 0:
        raise _FieldError(f"column 'hbm_total_bytes': {total_b} is not positive")
    # used > total is accepted: runtimes do report it transiently, and it is data.
    return (t, _name_field(host, "host"), _name_field(chip, "chip", numbers=True),
            _step_field(step), _below_limit(used_b, "hbm_used_bytes"),
            _below_limit(total_b, "hbm_total_bytes"))


def _float_field(value: Any, column: str) -> float:
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise _FieldError(_not_a(value, column, "number")) from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # a JSON integer beyond float: not finite either
            number = math.inf
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


def _below_limit(value: int, column: str, limit: int = INT_LIMIT) -> int:
    if value >= limit:
        raise _FieldError(f"column {column!r}: {value} is too large "
                          f"(the most is 2**{limit.bit_length() - 1} - 1)")
    return value


def _step_field(value: Any) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    step = _int_field(value, "step")
    if step < 0:
        raise _FieldError(f"column 'step': {step} is negative")
    return _below_limit(step, "step", STEP_LIMIT)


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
    what polls have), so a row whose time has more digits reads back rounded. Parquet
    is written to a file name only (it is binary and written at the end).
    """
    if format not in _FORMATS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {_FORMATS}")
    if format == "parquet":
        if not isinstance(path_or_file, (str, os.PathLike)) or path_or_file == "-":
            raise ValueError("Parquet is written to a file, not to a stream")
        from tpumon.trace.arrow import write_parquet
        return write_parquet(_batched(rows, _BATCH_ROWS), os.fspath(path_or_file))
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
