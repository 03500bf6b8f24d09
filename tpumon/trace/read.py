"""Trace files read: the recorded HBM samples that ``analyze`` and ``report`` read.

The format is a public contract (docs: shared spec, contracts section 1): CSV
with a header (column order free, unknown columns ignored), JSON Lines with
the same keys, or Parquet. Traces of long runs hold millions of rows, so read_trace
streams (nothing held but one row and the last time of each (host, chip) series);
read_trace_columns (``report``) parses in one pass straight into numpy arrays per
series, and spill_trace (``analyze``) does the same a table at a time into a temporary
file (tpumon.trace.spill), so that a trace of any length is read in bounded memory.
Files go through pyarrow where it takes them (tpumon.trace.arrow), and otherwise through
the validating parser (tpumon.trace.text), which decides what a row may hold.

The reader is strict on purpose. A trace is evidence that a person will act
on ("chip 3 leaks 40 KB per step"), so a malformed value must stop the
analysis with the file and line number rather than be guessed at.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from tpumon.trace.schema import (FORMATS, MAX_LINE_CHARS, PathOrFile, SeriesColumns,
                                 TraceFormatError, TraceRow)
from tpumon.trace.text import records

if TYPE_CHECKING:
    import numpy as np  # imported where used: the agent reads no traces

    from tpumon.trace.spill import Spill

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
        for series, t, step, used, total in records(stream, name, fmt, lines_are_plain, names):
            host, chip = names[series]
            yield TraceRow(t, host, chip, step, used, total)


def _parquet_rows(path: PathOrFile) -> Iterator[TraceRow]:
    """The rows of a Parquet trace in file order, checked as a whole first (the format is
    read in columns; there is no line to name)."""
    from tpumon.trace import arrow, columns

    name = _stream_name(path)
    if not isinstance(path, (str, os.PathLike)) or name == "-":
        raise TraceFormatError(name, None, "Parquet is read from a file only")
    try:
        table = arrow.read_table(name, "parquet")
        columns.series_columns(table)
    except arrow.NeedsStrictParser as exc:
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
    from tpumon.trace import arrow, columns

    if isinstance(path, (str, os.PathLike)) and os.fspath(path) != "-" and \
            _rereadable(os.fspath(path)):
        name = os.fspath(path)
        fmt = _resolve_format(format, name)
        try:
            with arrow.small_pages():
                return columns.series_columns(arrow.read_table(name, fmt))
        except arrow.NeedsStrictParser as exc:
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
    from tpumon.trace import arrow, spill as trace_spill

    name = _stream_name(path)
    spill.start_file()
    try:
        if isinstance(path, (str, os.PathLike)) and name != "-" and _rereadable(name):
            fmt = _resolve_format(format, name)
            try:
                _spill_tables(name, fmt, spill, read)
                return
            except arrow.NeedsStrictParser as exc:
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
    from tpumon.trace import arrow, columns, spill as trace_spill

    first_row = 0
    with arrow.small_pages():
        for table in arrow.read_ahead(arrow.read_tables(name, fmt)):
            series = columns.series_columns(table, first_row)
            try:
                spill.add(series)
            except trace_spill.TimeWentBack as exc:
                row = first_row + columns.first_row_of(table, exc.key) + 1
                raise arrow.NeedsStrictParser(
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
        for _ in records(stream, name, fmt, lines_are_plain, names, lists):
            move_to_arrays()  # every BATCH_ROWS rows of the parser
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
        stream = sys.stdin if isinstance(path, (str, os.PathLike)) else path  # "-": stdin
        found = getattr(stream, "name", None)
        name = found if isinstance(found, str) else "<stream>"
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
    if format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}; expected one of {FORMATS}")
    return format
