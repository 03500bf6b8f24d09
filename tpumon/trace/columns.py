"""A table of a trace, as pyarrow read it, into arrays per (host, chip) series: grouped in
file order and checked, vectorized, against the contract (times finite and never going
back within a series, counts in range, names as the strict parser takes them). Any value
the contract refuses raises :class:`tpumon.trace.arrow.NeedsStrictParser`, naming the row,
so that the strict parser decides."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import numpy as np

from tpumon.trace.arrow import NeedsStrictParser
from tpumon.trace.schema import STEP_LIMIT, SeriesColumns

if TYPE_CHECKING:
    import pyarrow as pa

T = TypeVar("T")


def series_columns(table: pa.Table, first_row: int = 0) -> dict[tuple[str, str], SeriesColumns]:
    """Per (host, chip) series arrays of a table, in order of first appearance, each in file
    order; NeedsStrictParser (saying which row) for any value the contract refuses.
    ``first_row``: the table's first row's index in its file (a part of a longer trace),
    for the row numbers said."""

    with _helper(len(table)) as helper:
        # the grouping (names, sort) beside the numbers' conversion and checks: both are
        # numpy and pyarrow work that lets go of the GIL, and a large trace's second core
        # is otherwise idle between the parse and the replay
        grouping = helper.submit(_series_groups, table, first_row)
        times = _numbers(table, "time", np.float64, first_row)
        used = _numbers(table, "hbm_used_bytes", np.int64, first_row)
        total = _numbers(table, "hbm_total_bytes", np.int64, first_row)
        steps = _numbers(table, "step", np.float64, first_row, nulls_allowed=True)  # NaN
        _check_values(times, steps, used, total, first_row)  # named before a bad name
        groups = grouping.result()
        if groups.order is not None:
            order = groups.order
            ahead = [helper.submit(a.take, order) for a in (times, steps)]
            used, total = used.take(order), total.take(order)
            times, steps = (f.result() for f in ahead)
    _check_times(times, groups, first_row)
    return {key: SeriesColumns(times[a:b], steps[a:b], used[a:b], total[a:b])
            for key, a, b in zip(groups.names, groups.starts, groups.ends, strict=True)}


#: Rows from which a trace is grouped on two threads: below, starting one costs more.
_THREADED_ROWS = 1_000_000


@contextmanager
def _helper(rows: int) -> Iterator[Executor]:
    """A second thread for a large table's grouping; for a small one, the calling thread
    itself (the work runs at ``submit``, in the same order)."""
    if rows < _THREADED_ROWS:
        yield _Inline()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="tpumon-trace") as pool:
        yield pool


class _Inline(Executor):
    """Runs what it is given at once: the same code path as a thread, without one."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - raised again by result(), as a thread's
            done.set_exception(exc)
        return done


class _Groups(NamedTuple):
    """Rows grouped by series: ``order`` (None: one series) puts the rows of each series
    together in file order; series i is rows ``starts[i]:ends[i]`` of that order."""

    names: list[tuple[str, str]]  # in order of first appearance
    order: np.ndarray | None
    starts: list[int]
    ends: list[int]


def _series_groups(table: pa.Table, first_row: int = 0) -> _Groups:
    host_codes, hosts = _dictionary(table.column("host"), first_row)
    chip_codes, chips = _dictionary(table.column("chip"), first_row)
    for name, values in (("host", hosts), ("chip", chips)):
        for value in values:
            if not value or value.strip() != value:
                raise NeedsStrictParser(f"a {name} name that is empty or has spaces around it")
    rows = len(host_codes)
    if rows == 0:
        return _Groups([], None, [], [])
    width = max(len(chips), 1)
    if len(hosts) * width == 1:
        return _Groups([(hosts[0], chips[0])], None, [0], [rows])
    # A stable sort keeps file order in each series; radix (linear) when keys fit 16 bits,
    # which they are computed in then (a quarter of the memory: every array of a trace's
    # length costs its first write, see small_pages)
    dtype: type = np.uint16 if len(hosts) * width <= 1 << 16 else np.int64
    keys: np.ndarray = host_codes.astype(dtype)
    np.multiply(keys, width, out=keys, casting="unsafe")
    np.add(keys, chip_codes, out=keys, casting="unsafe")
    order = np.argsort(keys, kind="stable")
    grouped = keys[order]
    starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
    ends = np.r_[starts[1:], rows]
    by_appearance = np.argsort(order[starts], kind="stable")
    starts, ends = starts[by_appearance], ends[by_appearance]
    names = [(hosts[p // width], chips[p % width]) for p in grouped[starts].tolist()]
    return _Groups(names, order, starts.tolist(), ends.tolist())


def _numbers(table: pa.Table, column: str, dtype: type, first_row: int,
             nulls_allowed: bool = False) -> np.ndarray:
    """A column as one numpy array of ``dtype``, nulls as NaN where allowed. Written chunk
    by chunk into one array: joining the chunks first, then converting, would make two."""
    values = table.column(column)
    if values.null_count and not nulls_allowed:
        raise NeedsStrictParser(f"row {first_row + _first(values.is_null()) + 1}: column "
                                f"{column!r} is empty")
    out: np.ndarray = np.empty(len(values), dtype)
    at = 0
    for chunk in values.chunks:
        out[at:at + len(chunk)] = chunk.to_numpy(zero_copy_only=False)
        at += len(chunk)
    return out


def _first(mask: pa.ChunkedArray | np.ndarray) -> int:
    array = mask if isinstance(mask, np.ndarray) else mask.to_numpy(zero_copy_only=False)
    return int(np.flatnonzero(array)[0])


def _check_values(times: np.ndarray, steps: np.ndarray, used: np.ndarray,
                  total: np.ndarray, first_row: int) -> None:
    """The contract's tests on values, all rows at once; the first failing row is named."""
    bad = [(~np.isfinite(times), "column 'time' is not a finite number"),
           (used < 0, "column 'hbm_used_bytes' is negative"),
           (total <= 0, "column 'hbm_total_bytes' is not positive"),
           ((steps < 0) | (steps >= STEP_LIMIT), "column 'step' is out of range")]
    for mask, message in bad:
        if mask.any():
            raise NeedsStrictParser(f"row {first_row + _first(mask) + 1}: {message}")


def _dictionary(column: pa.ChunkedArray, first_row: int) -> tuple[np.ndarray, list[str]]:
    """Row codes and the distinct values of a string column (one dictionary for all chunks)."""
    import pyarrow as pa

    if column.null_count:
        raise NeedsStrictParser(f"row {first_row + _first(column.is_null()) + 1}: an empty name")
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    encoded = column.unify_dictionaries().combine_chunks() if column.num_chunks else \
        pa.array([], pa.string()).dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.to_pylist()


def first_row_of(table: pa.Table, key: tuple[str, str]) -> int:
    """The index of a series' first row in a table (to name a row in an error)."""
    import pyarrow.compute as pc

    mine = pc.and_(pc.equal(table.column("host").cast("string"), key[0]),
                   pc.equal(table.column("chip").cast("string"), key[1]))
    return _first(mine)


def _check_times(times: np.ndarray, groups: _Groups, first_row: int) -> None:
    """Times of each series must not go back."""
    if len(times) < 2:
        return
    back = times[1:] < times[:-1]
    for start in groups.starts:
        if start:
            back[start - 1] = False  # from the end of one series to the next: not a step
    if back.any():
        i = _first(back) + 1
        row = i if groups.order is None else int(groups.order[i])
        raise NeedsStrictParser(f"row {first_row + row + 1}: time {times[i]:.3f} is earlier than "
                                f"{times[i - 1]:.3f} earlier in its series (times of a series "
                                "must not go back)")
