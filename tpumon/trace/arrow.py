"""Trace files read into tables by pyarrow: what ``tpumon analyze`` and ``report`` use
(tpumon.trace.columns turns a table into arrays per series).

Pods of hundreds of chips over days make traces of 10^8-10^9 samples, so the file is parsed
by pyarrow's multithreaded C++ readers (CSV, JSON Lines, Parquet) and checked with vectorized
tests, never row by row in Python. The contract (docs: shared spec, contracts section 1) is
still decided by the validating parser (:mod:`tpumon.trace.text`): a CSV or JSON Lines file that
pyarrow cannot read as is, or that holds any value the vectorized checks would not take
(a name with spaces around it, a time going back, a non-finite time, ...), is read again by
that parser, which accepts it the same way or stops at the first bad line with its number.
So this module only ever returns what the strict parser would, faster; Parquet, which that
parser does not read, gets the same checks here, and an error names the row.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

import numpy as np

from tpumon.trace.schema import MAX_LINE_CHARS, REQUIRED

if TYPE_CHECKING:
    import queue
    import threading

    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.json as pjson



#: Bytes of CSV parsed per block (a row may not be longer: such a file takes the strict parser).
_BLOCK_BYTES = 16 << 20

#: Rows of a Parquet trace read at a time by :func:`read_tables`, row group by row group:
#: one ``iter_batches`` over the whole file holds more the longer the file, one per row
#: group does not. A row group is then the most held at once: a file written as one huge
#: group is read as one.
_PARQUET_BATCH_ROWS = 1 << 18

_NAME_COLUMNS = ("host", "chip")
_NUMBER_COLUMNS = ("time", "step", "hbm_used_bytes", "hbm_total_bytes")

_NEWLINE, _BRACE = ord("\n"), ord("{")

T = TypeVar("T")


@contextmanager
def small_pages() -> Iterator[None]:
    """Within, numpy does not ask the kernel for huge pages for its large arrays.

    numpy advises huge pages (madvise) for every array of 4 MiB or more. Where the kernel
    then compacts memory to find them (transparent huge pages with defrag on madvise, as on
    many VMs), each such array costs kernel time when first written: grouping a trace into
    series takes three times the CPU, most of it in the kernel. Reading a trace makes a
    few dozen such arrays once, so huge pages buy nothing back. Forked workers inherit the
    setting; it is restored on the way out (numpy's switch is process-wide)."""
    import numpy as np

    switch = getattr(getattr(np, "_core", None) or getattr(np, "core", None), "multiarray",
                     None)
    set_huge = getattr(switch, "_set_madvise_hugepage", None)
    if set_huge is None:  # not in this numpy: nothing to switch
        yield
        return
    was = set_huge(False)
    try:
        yield
    finally:
        set_huge(was)


class NeedsStrictParser(Exception):
    """The file holds something the vectorized checks do not decide; says what, for Parquet."""


def arrow_schema() -> pa.Schema:
    """The contract's columns as pyarrow types (step may be null)."""
    import pyarrow as pa

    return pa.schema([("time", pa.float64()), ("host", pa.string()), ("chip", pa.string()),
                      ("step", pa.int64()), ("hbm_used_bytes", pa.int64()),
                      ("hbm_total_bytes", pa.int64())])


def read_table(path: str, fmt: str) -> pa.Table:
    """The file as a table of the contract's columns; NeedsStrictParser if pyarrow cannot read
    it as is (the strict parser then decides what is wrong, or reads it)."""
    import pyarrow as pa

    readers = {"csv": _read_csv, "jsonl": _read_jsonl, "parquet": _read_parquet}
    with open(path, "rb") as file:  # an OSError is Python's, worded as for any other file
        try:
            return readers[fmt](file)
        except (pa.ArrowException, ValueError) as exc:
            raise NeedsStrictParser(str(exc).splitlines()[0] if str(exc) else
                                    type(exc).__name__) from None


#: Rows gathered into one table by :func:`read_tables` before it is handed on: tens of MiB
#: of columns, so that memory stays bounded whatever the trace's length, and large enough
#: that each series gets a long run of rows from each (few chunks to read back). Twice
#: as many cost more memory and gain no speed.
TABLE_ROWS = 1_000_000

#: Bytes of CSV or JSON Lines parsed per block by :func:`read_tables`' streaming readers:
#: pyarrow's default. With the 16 MiB blocks of :func:`read_table` the streaming reader
#: holds several times the memory (its blocks, freed in turn, are not given back to the
#: system), at the same speed. Its default memory pool too (mimalloc): the C library's
#: holds more.
_STREAM_BLOCK_BYTES = 1 << 20


def read_tables(path: str, fmt: str, rows: int | None = None) -> Iterator[pa.Table]:
    """The file as consecutive tables of the contract's columns, of about ``rows`` rows
    each (default TABLE_ROWS; Parquet by its batches, CSV and JSON Lines by pyarrow's
    streaming readers, each table as soon as it has that many rows), with
    the same checks as :func:`read_table`: what a trace of any length is read in, in
    bounded memory. NeedsStrictParser as there, possibly after some tables were given."""
    import pyarrow as pa

    readers = {"csv": _stream_csv, "jsonl": _stream_jsonl, "parquet": _stream_parquet}
    with open(path, "rb") as file:
        try:
            yield from _gathered(readers[fmt](file), rows or TABLE_ROWS)
        except (pa.ArrowException, ValueError) as exc:
            raise NeedsStrictParser(str(exc).splitlines()[0] if str(exc) else
                                    type(exc).__name__) from None


def read_ahead(items: Iterator[T]) -> Iterator[T]:
    """``items``, the next one made on a thread of its own while the caller works on this
    one (one ahead: memory stays bounded), an exception raised where the caller takes the
    item. A trace's parse (pyarrow) and the grouping of the table before (numpy) both let
    go of the GIL: on two cores, the second would otherwise idle while a trace is read."""
    import queue
    import threading

    ahead: queue.Queue[tuple[bool, Any]] = queue.Queue(maxsize=1)
    stop = threading.Event()
    thread = threading.Thread(target=_make, args=(items, ahead, stop),
                              name="tpumon-trace-read", daemon=True)
    thread.start()
    try:
        while True:
            more, item = ahead.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # let a blocked put go, so the thread sees ``stop``
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                pass
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _make(items: Iterator[Any], ahead: queue.Queue[tuple[bool, Any]],
          stop: threading.Event) -> None:
    """:func:`read_ahead`'s thread: each item (True, item), then (False, None), or (False,
    the exception) where making one failed; stops at ``stop``, at the latest an item on."""
    import queue

    try:
        for item in items:
            while not stop.is_set():
                try:
                    ahead.put((True, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        ahead.put((False, None))
    except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
        ahead.put((False, exc))


def _gathered(tables: Iterator[pa.Table], rows: int) -> Iterator[pa.Table]:
    """Consecutive small tables joined (without copying) into ones of at least ``rows``."""
    import pyarrow as pa

    held: list[pa.Table] = []
    count = 0
    for table in tables:
        held.append(table)
        count += len(table)
        if count >= rows:
            yield pa.concat_tables(held, promote_options="permissive")
            held, count = [], 0
    if held:
        yield pa.concat_tables(held, promote_options="permissive")


class ShortLines:
    """A binary file read as pyarrow's CSV reader reads it (``read(size)``, from its I/O
    thread, blocks ahead of its parsers) that ends at the first line of ``longest`` bytes
    or more, and says so in ``refused``. pyarrow refuses a row longer than a block only
    once it parses that block, and by then its read-ahead has taken several more (hundreds
    of MiB for a line of 1 GiB); an end of file here stops the reading at once (an
    exception raised in pyarrow's I/O thread could abort the process at exit), and the
    caller hands the file to the strict parser, which names the line. Cheap: one ``find``
    per half-``longest`` of data, each stopping at the first newline."""

    def __init__(self, raw: BinaryIO, longest: int) -> None:
        self._raw, self._longest, self._window = raw, longest, max(longest // 2, 1)
        self._run = 0  # bytes since the last newline, at the end of the last read
        self.refused = False
        self.closed = False

    def read(self, size: int = -1) -> bytes:
        if self.refused:
            return b""
        data = self._raw.read(size)
        self.refused = self._has_long_line(data)
        return b"" if self.refused else data

    def _has_long_line(self, data: bytes) -> bool:
        first = data.find(b"\n")
        if first < 0:
            self._run += len(data)
            return self._run >= self._longest
        if self._run + first >= self._longest:
            return True
        last = data.rfind(b"\n")
        for start in range(first + 1, last, self._window):
            if data.find(b"\n", start, min(start + self._window, last)) < 0:
                gap = data.find(b"\n", start) - data.rfind(b"\n", 0, start) - 1
                if gap >= self._longest:
                    return True
        self._run = len(data) - 1 - last
        return False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True


def _csv_options(block: int) -> tuple[pcsv.ReadOptions, pcsv.ConvertOptions]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    types = {field.name: field.type for field in arrow_schema()}
    types.update(host=pa.dictionary(pa.int32(), pa.string()),
                 chip=pa.dictionary(pa.int32(), pa.string()))  # a few names, many rows
    convert = pcsv.ConvertOptions(column_types=types, null_values=[""],
                                  strings_can_be_null=False, quoted_strings_can_be_null=False)
    return pcsv.ReadOptions(block_size=block), convert


def _read_csv(file: BinaryIO) -> pa.Table:
    import pyarrow as pa
    import pyarrow.csv as pcsv


    # blocks of 16 MiB, not pyarrow's 1 MiB: a few chunks per column, so the per-chunk
    # dictionaries of names unify and the columns join in a fraction of the time
    read, convert = _csv_options(_BLOCK_BYTES)
    bounded = ShortLines(file, MAX_LINE_CHARS)
    try:
        # the C library's allocator, not pyarrow's default (mimalloc), whose handling of the
        # parse's short-lived blocks costs much more kernel time
        table = pcsv.read_csv(bounded, read_options=read, convert_options=convert,
                              memory_pool=pa.system_memory_pool())
    finally:
        if bounded.refused:  # what pyarrow made of the rest (a cut row) does not count
            raise NeedsStrictParser(f"a line of {MAX_LINE_CHARS:,} bytes or more")
    return _csv_checked(table)


def _stream_csv(file: BinaryIO) -> Iterator[pa.Table]:
    """:func:`_read_csv` a block at a time (pyarrow's streaming reader)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv


    read, convert = _csv_options(_STREAM_BLOCK_BYTES)
    bounded = ShortLines(file, MAX_LINE_CHARS)
    try:
        with pcsv.open_csv(bounded, read_options=read, convert_options=convert) as reader:
            rows = False
            for batch in reader:
                if bounded.refused:
                    break
                rows = True
                yield _csv_checked(pa.Table.from_batches([batch]))
            if not rows and not bounded.refused:
                # a header alone is still checked: a one-line file that is no trace is
                # "missing required column", not "no samples (only a header?)"
                _csv_checked(reader.schema.empty_table())
    finally:
        if bounded.refused:
            raise NeedsStrictParser(f"a line of {MAX_LINE_CHARS:,} bytes or more")


def _csv_checked(table: pa.Table) -> pa.Table:
    """The contract's columns of a CSV table, once the strict parser would take it as is."""
    names = table.column_names
    if any(names.count(c) > 1 for c in arrow_schema().names):
        raise NeedsStrictParser("a column appears twice in the header")
    if any(str(t) in ("binary", "large_binary") for t in table.schema.types):
        raise NeedsStrictParser("not UTF-8 text")  # an unknown column that is not text
    if _longest_text(table) > csv.field_size_limit():
        raise NeedsStrictParser("a field longer than the csv module takes")
    return _select(table)


def _longest_text(table: pa.Table) -> int:
    """Bytes in the longest text field: the csv module (the strict parser) limits fields."""
    import pyarrow as pa
    import pyarrow.compute as pc

    longest = 0
    for column in table.columns:
        texts = [column] if pa.types.is_string(column.type) else \
            [chunk.dictionary for chunk in column.chunks] if pa.types.is_dictionary(column.type) \
            else []
        for text in texts:
            if len(text):
                longest = max(longest, pc.max(pc.binary_length(text)).as_py() or 0)
    return longest


class ObjectLines(ShortLines):
    """:class:`ShortLines` that also ends (``refused``) before the first block with a line
    that does not begin with ``{`` (a blank one included) or with a ``\\r`` not before
    ``\\n``, and counts the lines it passed. pyarrow's JSON reader crashes the process
    on a ``null`` at the start of a block (pyarrow 26, apache/arrow#47409): it must never
    be handed a line that is not an object, nor one that Python's line reading splits
    elsewhere (a lone ``\\r`` is a line break to Python, JSON whitespace to pyarrow).
    One numpy pass a block (~0.5 ns a byte)."""

    def __init__(self, raw: BinaryIO, longest: int) -> None:
        super().__init__(raw, longest)
        self._breaks = 0  # line ends passed
        self._after = b"\n"  # the byte before the next block: the file starts a line

    @property
    def lines(self) -> int:
        """Lines passed so far, a last one without its ``\\n`` included."""
        return self._breaks + (self._after != b"\n")

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        if not data:
            return data
        if not self._all_objects(data) or (b"\r" in data or self._after == b"\r") and \
                not self._returns_paired(data):
            self.refused = True
            return b""
        self._after = data[-1:]
        return data

    def _all_objects(self, data: bytes) -> bool:
        """Whether every line that begins in ``data`` begins with ``{``; counts them."""
        text = np.frombuffer(data, np.uint8)
        breaks = np.flatnonzero(text == _NEWLINE)
        self._breaks += len(breaks)
        starts = text[breaks[:len(breaks) - (text[-1] == _NEWLINE)] + 1]  # within ``data``
        return bool((starts == _BRACE).all()) and (self._after != b"\n" or text[0] == _BRACE)

    def _returns_paired(self, data: bytes) -> bool:
        """Whether every ``\\r`` is followed by ``\\n`` (one at the end, by the next block's)."""
        returns = data.count(b"\r") + (self._after == b"\r")
        paired = data.count(b"\r\n") + (self._after == b"\r" and data[:1] == b"\n")
        return returns == paired + data.endswith(b"\r")


def _jsonl_options(block: int) -> tuple[pjson.ReadOptions, pjson.ParseOptions]:
    import pyarrow.json as pjson

    return (pjson.ReadOptions(block_size=block),
            pjson.ParseOptions(explicit_schema=arrow_schema(),
                               unexpected_field_behavior="error"))


def _read_jsonl(file: BinaryIO) -> pa.Table:
    """JSON Lines through pyarrow, where pyarrow's reader and Python's ``json`` (the strict
    parser) must take the same rows: only the contract's six keys (an unknown one could
    hold what ``json`` refuses and pyarrow skips, nested thousands deep, say), exactly one
    object on each line (pyarrow also reads two on one line; see :class:`ObjectLines` for
    the rest), names that are UTF-8 (pyarrow keeps a string's bytes as they are).
    Anything else (blank lines too) is read by the strict parser, which reads it the same
    way or names the line."""
    import pyarrow as pa
    import pyarrow.json as pjson

    read, parse = _jsonl_options(_BLOCK_BYTES)
    lines = ObjectLines(file, _longest_line())
    try:
        table = pjson.read_json(lines, read_options=read, parse_options=parse,
                                memory_pool=pa.system_memory_pool())
    finally:
        _refused(lines)
    _one_object_a_line(len(table), lines)
    return _jsonl_checked(table)


def _stream_jsonl(file: BinaryIO) -> Iterator[pa.Table]:
    """:func:`_read_jsonl` a block at a time (pyarrow's streaming reader)."""
    import pyarrow as pa
    import pyarrow.json as pjson

    read, parse = _jsonl_options(_STREAM_BLOCK_BYTES)
    lines = ObjectLines(file, _longest_line())
    rows = 0
    try:
        with pjson.open_json(lines, read_options=read, parse_options=parse) as reader:
            for batch in reader:
                if lines.refused:
                    break
                rows += len(batch)
                yield _jsonl_checked(pa.Table.from_batches([batch]))
    finally:
        _refused(lines)
    _one_object_a_line(rows, lines)


def _longest_line() -> int:

    return MAX_LINE_CHARS


def _refused(lines: ObjectLines) -> None:
    """A line too long, or one that is not an object: the strict parser's to read."""
    if lines.refused:
        raise NeedsStrictParser("a line that is not one JSON object of at most "
                                f"{_longest_line():,} bytes")


def _one_object_a_line(rows: int, lines: ObjectLines) -> None:
    if rows != lines.lines:
        raise NeedsStrictParser("not one JSON object on each line")


def _jsonl_checked(table: pa.Table) -> pa.Table:
    """A JSON Lines table whose names are UTF-8 and dictionary-encoded, as from CSV."""
    import pyarrow.compute as pc

    if pc.any(pc.equal(table.column("time"), 0)).as_py():
        # pyarrow reads the integer -0 as -0.0, json as 0 (+0.0): a zero's sign is the
        # strict parser's to give
        raise NeedsStrictParser("a time of zero")
    for name in _NAME_COLUMNS:
        table = table.set_column(table.schema.get_field_index(name), name,
                                 _valid_names(table.column(name)))
    return table


def _valid_names(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A name column dictionary-encoded (as the CSV reader gives it), its distinct names
    checked for UTF-8."""
    import pyarrow as pa

    encoded = column.dictionary_encode()
    try:
        for chunk in encoded.chunks:
            chunk.dictionary.validate(full=True)
    except pa.ArrowInvalid:
        raise NeedsStrictParser("not UTF-8 text") from None
    return encoded


def _read_parquet(file: BinaryIO) -> pa.Table:
    import pyarrow.parquet as pq

    return _parquet_checked(pq.read_table(file))


def _stream_parquet(file: BinaryIO) -> Iterator[pa.Table]:
    """:func:`_read_parquet` a batch at a time (row groups, read in their batches)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pq.ParquetFile(file) as parquet:
        if parquet.metadata.num_rows == 0:  # no batch at all: its columns are still checked
            yield _parquet_checked(parquet.schema_arrow.empty_table())
            return
        for group in range(parquet.num_row_groups):  # one at a time: see _PARQUET_BATCH_ROWS
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS,
                                              row_groups=[group]):
                yield _parquet_checked(pa.Table.from_batches([batch]))


def _parquet_checked(table: pa.Table) -> pa.Table:
    import pyarrow as pa

    selected = _select(table)
    try:
        return selected.cast(arrow_schema(), safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise NeedsStrictParser(f"a column of the wrong type: {exc}") from None


def _select(table: pa.Table) -> pa.Table:
    import pyarrow as pa

    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise NeedsStrictParser("missing required column " + ", ".join(map(repr, missing)))
    if "step" not in table.column_names:
        table = table.append_column("step", pa.nulls(len(table), pa.int64()))
    return table.select(list(arrow_schema().names))


def write_parquet(rows_batches: object, path: str) -> int:
    """Write batches of rows (lists of TraceRow) as a Parquet trace; return the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    count = 0
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for batch in rows_batches:  # type: ignore[attr-defined]
            columns = [[getattr(r, c) for r in batch] for c in schema.names]
            columns[0] = [round(t, 3) for t in columns[0]]  # as CSV and JSONL: ms
            writer.write_table(pa.table(columns, schema=schema))
            count += len(batch)
    return count
