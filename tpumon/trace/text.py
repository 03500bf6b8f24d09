"""The validating parser of CSV and JSON Lines traces: the only code that decides what a
trace row may hold. :func:`tpumon.trace.read.read_trace` and ``read_trace_columns`` take
the same records from it, so they accept and reject the same files with the same
messages, and pyarrow's faster reading (:mod:`tpumon.trace.arrow`) falls back on it to
decide. Each format has a fast path for the common row (inline checks, no calls but the
conversions) that takes only what the general checks, :func:`_check_values`, would take as
is, and hands anything else to them: they decide, and word every message about a value.
tests/test_trace.py holds the fast paths to them; bench/trace_read.py measures them.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator
from itertools import chain
from operator import itemgetter
from typing import Any, overload

from tpumon.trace.schema import COLUMNS, INT_LIMIT, REQUIRED, STEP_LIMIT, TraceFormatError

#: With lists to fill, the parser yields None every BATCH_ROWS rows (read_trace_columns
#: then moves them into arrays).
BATCH_ROWS = 1 << 16


class _FieldError(Exception):
    """A bad value in a row; the reader adds the path and line number."""


#: (series number, time, step or None, used bytes, total bytes)
_Record = tuple[int, float, int | None, int, int]


@overload
def records(stream: Iterator[str], name: str, fmt: str, lines_are_plain: bool,
            names: list[tuple[str, str]], lists: None = None) -> Iterator[_Record]: ...


@overload
def records(stream: Iterator[str], name: str, fmt: str, lines_are_plain: bool,
            names: list[tuple[str, str]], lists: tuple[list[Any], ...]) -> Iterator[None]: ...


def records(stream: Iterator[str], name: str, fmt: str, lines_are_plain: bool,
            names: list[tuple[str, str]],
            lists: tuple[list[Any], ...] | None = None) -> Iterator[_Record | None]:
    """The validated rows of a trace in file order; raises TraceFormatError at the first bad one.

    A record is (series, time, step, used, total), where ``series`` indexes ``names``, to which
    each (host, chip) is appended as it first appears. With ``lists`` (five lists), records are
    appended to those, column by column, instead, and None is yielded every BATCH_ROWS rows.
    """
    if fmt == "csv":
        return _csv_records(stream, name, lines_are_plain, names, lists)
    rows = _jsonl_records(stream, name, names)
    return rows if lists is None else _append_records(rows, lists)


def _append_records(records: Iterator[_Record], lists: tuple[list[Any], ...]) -> Iterator[None]:
    series, times, steps, used, total = lists
    for record in records:
        series.append(record[0])
        times.append(record[1])
        steps.append(record[2])
        used.append(record[3])
        total.append(record[4])
        if len(times) >= BATCH_ROWS:
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
                if len(out_times) >= BATCH_ROWS:
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
