"""The trace file contract (contracts.md section 1): round trips and every validation."""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import os
import pickle
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

from tpumon.trace import read as trace_read
from tpumon.trace import text as trace_text
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.read import read_trace, read_trace_columns
from tpumon.trace.schema import MAX_LINE_CHARS, SeriesColumns, TraceFormatError, TraceRow
from tpumon.trace.write import write_trace

TOTAL = 34088157184
HEADER = "time,host,chip,step,hbm_used_bytes,hbm_total_bytes\n"

ROWS = [
    TraceRow(1750000000.0, "t1v-n-0a1b2c3d-w-0", "0", 1200, 22548578304, TOTAL),
    TraceRow(1750000000.0, "t1v-n-0a1b2c3d-w-0", "1", 1200, 22551724032, TOTAL),
    TraceRow(1750000005.125, "t1v-n-0a1b2c3d-w-0", "0", None, 22548578305, TOTAL),
    TraceRow(1750000005.125, 'odd "host", with comma', "chip-a", 0, 0, TOTAL),
    # used > total is data
    TraceRow(1750000010.999, "t1v-n-0a1b2c3d-w-0", "0", 3, TOTAL + 5, TOTAL),
]


@pytest.fixture
def write_file(tmp_path):
    """Write text to a file under tmp_path and return its path as a string."""
    def write(text: str, name: str = "trace.csv") -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)
    return write


@pytest.fixture
def read_text(write_file):
    """Read text as a trace file of the given name (the suffix picks the format)."""
    def read(text: str, name: str = "trace.csv") -> list[TraceRow]:
        return list(read_trace(write_file(text, name)))
    return read


@pytest.mark.parametrize("fmt,suffix", [("csv", "csv"), ("jsonl", "jsonl")])
def test_round_trip_through_files(tmp_path, fmt, suffix):
    path = tmp_path / f"t.{suffix}"
    assert write_trace(iter(ROWS), path, format=fmt) == len(ROWS)
    assert list(read_trace(path)) == ROWS


def test_round_trip_through_text_file_objects():
    buf = io.StringIO()
    write_trace(ROWS, buf, format="jsonl")
    assert not buf.closed
    buf.seek(0)
    assert list(read_trace(buf, format="jsonl")) == ROWS


def test_write_to_stdout_with_dash(capsys):
    assert write_trace(ROWS[:2], "-") == 2
    out = capsys.readouterr().out
    assert out.splitlines() == [
        HEADER.strip(),
        "1750000000.000,t1v-n-0a1b2c3d-w-0,0,1200,22548578304,34088157184",
        "1750000000.000,t1v-n-0a1b2c3d-w-0,1,1200,22551724032,34088157184",
    ]


def test_dash_reads_stdin(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(HEADER + "1,h,0,,10,100\n"))
    assert list(read_trace("-")) == [TraceRow(1.0, "h", "0", None, 10, 100)]


def test_written_csv_has_contract_column_order_and_empty_step(tmp_path):
    path = tmp_path / "t.csv"
    write_trace([ROWS[2]], path)
    assert path.read_text().splitlines() == [
        HEADER.strip(), "1750000005.125,t1v-n-0a1b2c3d-w-0,0,,22548578305,34088157184"]


def test_written_jsonl_uses_null_step(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace([ROWS[2]], path, format="jsonl")
    assert '"step": null' in path.read_text()


def test_time_is_written_with_three_decimals():
    buf = io.StringIO()
    write_trace([TraceRow(1.23456, "h", "0", None, 1, 2)], buf)
    assert buf.getvalue().splitlines()[1].startswith("1.235,")


def test_csv_column_order_is_free_and_unknown_columns_are_ignored(read_text):
    text = ("hbm_total_bytes,extra,chip,time,hbm_used_bytes,host\n"
            "100,whatever,3,1750000000.000,50,h\n")
    assert read_text(text) == [TraceRow(1750000000.0, "h", "3", None, 50, 100)]


def test_csv_accepts_integer_times_blank_lines_and_a_bom(read_text):
    text = "\ufeff" + HEADER + "\n1750000000,h,0,,10,100\n\n  \n1750000001.5,h,0,7,11,100\n"
    rows = read_text(text)
    assert [(r.time, r.step) for r in rows] == [(1750000000.0, None), (1750000001.5, 7)]


def test_jsonl_chip_numbers_become_strings_and_step_may_be_missing(read_text):
    text = ('{"time": 1, "host": "h", "chip": 0, "hbm_used_bytes": 5, "hbm_total_bytes": 9}\n'
            '\n'
            '{"time": 2.5, "host": "h", "chip": "0", "step": null, "hbm_used_bytes": 6, '
            '"hbm_total_bytes": 9, "other": [1]}\n')
    assert read_text(text, "t.jsonl") == [
        TraceRow(1.0, "h", "0", None, 5, 9), TraceRow(2.5, "h", "0", None, 6, 9)]


def test_series_may_interleave_and_steps_may_go_back(read_text):
    text = HEADER + "10,h,0,500,1,9\n5,h,1,1,1,9\n10,h,1,2,1,9\n11,h,0,100,1,9\n"
    assert [r.step for r in read_text(text)] == [500, 1, 2, 100]


def test_header_only_file_has_no_rows(read_text):
    assert read_text(HEADER) == []


def test_reading_streams_rows_lazily():
    """An endless source still yields its first rows: nothing is read ahead."""
    def endless():
        yield HEADER
        for i in itertools.count():
            yield f"{i},h,0,{i},{i},100\n"

    rows = list(itertools.islice(read_trace(endless()), 5))
    assert [r.step for r in rows] == [0, 1, 2, 3, 4]


def test_rows_before_an_error_are_yielded(write_file):
    it = read_trace(write_file(HEADER + "1,h,0,1,5,9\n2,h,0,2,x,9\n", "t.csv"))
    assert next(it).step == 1
    with pytest.raises(TraceFormatError) as e:
        next(it)
    assert e.value.line == 3


CSV_ERRORS = [
    # (file content, line, message fragment)
    ("", 1, "empty file"),
    ("\n\n", 1, "empty file"),
    ("\ntime,host,chip,hbm_used_bytes\n", 2, "missing required column 'hbm_total_bytes'"),
    ("time,host,hbm_used_bytes\n", 1, "'chip', 'hbm_total_bytes'"),
    ("time,time,host,chip,hbm_used_bytes,hbm_total_bytes\n", 1, "'time' appears twice"),
    (HEADER + "1,h,0,,10,100\nabc,h,0,,10,100\n", 3, "column 'time': 'abc' is not a number"),
    (HEADER + "nan,h,0,,10,100\n", 2, "column 'time': 'nan' is not a finite number"),
    (HEADER + "inf,h,0,,10,100\n", 2, "'inf' is not a finite number"),
    (HEADER + "-Infinity,h,0,,10,100\n", 2, "is not a finite number"),
    (HEADER + "1,h,0,,123.0,100\n", 2, "column 'hbm_used_bytes': '123.0' is not an integer"),
    (HEADER + "1,h,0,,1e9,100\n", 2, "'1e9' is not an integer"),
    (HEADER + "1,h,0,,10,\n", 2, "column 'hbm_total_bytes' is empty"),
    (HEADER + "1,h,0,,-10,100\n", 2, "column 'hbm_used_bytes': -10 is negative"),
    (HEADER + "1,h,0,,10,0\n", 2, "column 'hbm_total_bytes': 0 is not positive"),
    (HEADER + "1,h,0,,10,-100\n", 2, "is not positive"),
    (HEADER + "1,h,0,1.5,10,100\n", 2, "column 'step': '1.5' is not an integer"),
    (HEADER + "1,h,0,-1,10,100\n", 2, "column 'step': -1 is negative"),
    (HEADER + "1,,0,,10,100\n", 2, "column 'host' is empty"),
    (HEADER + "1, ,0,,10,100\n", 2, "column 'host' is empty"),
    (HEADER + "1,h,,,10,100\n", 2, "column 'chip' is empty"),
    (HEADER + "1,h,0,,10\n", 2, "row has 5 fields but the header has 6"),
    (HEADER + "1,h,0,,10,100,7\n", 2, "row has 7 fields"),
    (HEADER + "5,h,0,,1,9\n5,h,1,,1,9\n\n6,h,0,,1,9\n4,h,1,,1,9\n", 6,
     "time 4.000 is earlier than 5.000 on line 3 for host 'h' chip '1'"),
]


@pytest.mark.parametrize("text,line,fragment", CSV_ERRORS)
def test_csv_errors_name_the_line(text, line, fragment, read_text):
    with pytest.raises(TraceFormatError) as e:
        read_text(text)
    assert e.value.line == line
    assert fragment in str(e.value)
    assert str(e.value).startswith(f"{e.value.path}:{line}: ")
    assert "\n" not in str(e.value)


def test_error_message_is_one_clear_line(write_file):
    path = write_file(HEADER + "1,h,0,,abc,100\n", "trace.csv")
    with pytest.raises(TraceFormatError) as e:
        list(read_trace(path))
    assert str(e.value) == f"{path}:2: column 'hbm_used_bytes': 'abc' is not an integer"
    assert (e.value.path, e.value.line) == (path, 2)
    assert e.value.message == "column 'hbm_used_bytes': 'abc' is not an integer"
    assert isinstance(e.value, ValueError)


def test_error_survives_pickling():
    err = TraceFormatError("t.csv", 3, "bad")
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.path, copy.line, copy.message, str(copy)) == ("t.csv", 3, "bad", "t.csv:3: bad")


GOOD = '"time": 1, "host": "h", "chip": 0, "hbm_used_bytes": 5, "hbm_total_bytes": 9'
JSONL_ERRORS = [
    ("{" + GOOD + "}\n{" + GOOD + ",\n", 2, "not valid JSON"),
    ("\n[1, 2]\n", 2, "expected a JSON object, got list"),
    ('{"time": 1, "host": "h", "chip": 0, "hbm_used_bytes": 5}\n', 1,
     "missing required key 'hbm_total_bytes'"),
    ('{' + GOOD.replace('"hbm_used_bytes": 5', '"hbm_used_bytes": 5.5') + '}\n', 1,
     "column 'hbm_used_bytes': 5.5 is not an integer"),
    ('{' + GOOD.replace('"hbm_used_bytes": 5', '"hbm_used_bytes": 5.0') + '}\n', 1,
     "is not an integer"),
    ('{' + GOOD.replace('"hbm_used_bytes": 5', '"hbm_used_bytes": true') + '}\n', 1,
     "is not an integer"),
    ('{' + GOOD.replace('"time": 1', '"time": NaN') + '}\n', 1, "is not a finite number"),
    ('{' + GOOD.replace('"time": 1', '"time": null') + '}\n', 1, "column 'time' is empty"),
    ('{' + GOOD.replace('"host": "h"', '"host": 3') + '}\n', 1, "column 'host': 3 is not a string"),
    ('{' + GOOD.replace('"chip": 0', '"chip": 0.5') + '}\n', 1,
     "column 'chip': 0.5 is not a string"),
    ('{' + GOOD.replace('"time": 1', '"time": 9') + '}\n{' + GOOD + '}\n', 2,
     "is earlier than 9.000"),
]


@pytest.mark.parametrize("text,line,fragment", JSONL_ERRORS)
def test_jsonl_errors_name_the_line(text, line, fragment, read_text):
    with pytest.raises(TraceFormatError) as e:
        read_text(text, "trace.jsonl")
    assert e.value.line == line
    assert fragment in str(e.value)


def test_missing_file_is_an_os_error_not_a_format_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_trace(tmp_path / "nope.csv"))


def test_unknown_format_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown trace format"):
        write_trace(ROWS, tmp_path / "t.xml", format="xml")
    with pytest.raises(ValueError, match="unknown trace format"):
        list(read_trace(io.StringIO(HEADER), format="xml"))


# ---------------------------------------------------------------- read_trace_columns
#
# analyze reads traces with read_trace_columns (per-series numpy arrays); it shares the
# validating parser with read_trace, and these tests hold the two to the same results and
# the same errors. The parser's fast paths (str.split for plain CSV lines, inline checks and
# per-column caches of the last good value) are held to the general checks by an oracle.


def as_series(rows):
    """read_trace rows -> {(host, chip): [(time, step, used, total), ...]}, in order of
    first appearance."""
    series = {}
    for r in rows:
        series.setdefault((r.host, r.chip), []).append(
            (r.time, r.step, r.hbm_used_bytes, r.hbm_total_bytes))
    return series


def columns_as_series(columns):
    """read_trace_columns' arrays -> the same shape as as_series, checking the dtypes."""
    series = {}
    for key, c in columns.items():
        assert isinstance(c, SeriesColumns)
        assert (c.times.dtype, c.steps.dtype, c.used.dtype, c.total.dtype) == (
            np.float64, np.float64, np.int64, np.int64)
        assert len(c.times) == len(c.steps) == len(c.used) == len(c.total) > 0
        series[key] = [(t, None if math.isnan(s) else int(s), u, tot)
                       for t, s, u, tot in zip(c.times.tolist(), c.steps.tolist(),
                                               c.used.tolist(), c.total.tolist(), strict=True)]
    return series


def outcome(read, *args, **kwargs):
    """What a reader makes of a file: its series, or (line, message) of its error."""
    try:
        result = read(*args, **kwargs)
        return columns_as_series(result) if isinstance(result, dict) else as_series(result)
    except TraceFormatError as e:
        return (e.line, e.message)


def test_columns_hold_the_rows_of_each_series_in_file_order(read_text, write_file):
    text = (HEADER + "10,h,0,500,1,9\n5,h,1,,2,9\n\n10,h,1,2,3,9\n11,h,0,100,4,9\n"
            "11,g,0,7,5,9\n")
    columns = read_trace_columns(write_file(text))
    assert list(columns) == [("h", "0"), ("h", "1"), ("g", "0")]
    h0 = columns[("h", "0")]
    assert h0.times.tolist() == [10.0, 11.0]
    assert h0.steps.tolist() == [500.0, 100.0]
    assert h0.used.tolist() == [1, 4] and h0.total.tolist() == [9, 9]
    times, steps, used, total = columns[("h", "1")]  # a plain tuple too
    assert np.isnan(steps[0]) and steps[1] == 2.0
    assert columns_as_series(columns) == as_series(read_text(text))


def test_columns_of_an_empty_trace(write_file):
    assert read_trace_columns(write_file(HEADER)) == {}
    assert read_trace_columns(write_file("", "t.jsonl")) == {}


def test_columns_from_stdin_and_open_files(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(HEADER + "1,h,0,,10,100\n"))
    assert columns_as_series(read_trace_columns("-")) == {("h", "0"): [(1.0, None, 10, 100)]}
    buf = io.StringIO()
    write_trace(ROWS, buf, format="jsonl")
    buf.seek(0)
    assert columns_as_series(read_trace_columns(buf, format="jsonl")) == as_series(ROWS)


def interleave(*traces):
    """Rows of several hosts' traces merged in time order, as a pod-wide recording is."""
    return sorted(itertools.chain(*traces), key=lambda r: r.time)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@pytest.mark.parametrize("scenario,chips,drop", [
    ("healthy", 4, 0.0), ("linear-leak", 8, 0.1), ("staircase-leak", 2, 0.0),
    ("job-restart", 4, 0.0), ("step-change", 1, 0.3)])
@pytest.mark.slow
def test_columns_equal_rows_on_simulated_traces(tmp_path, fmt, scenario, chips, drop):
    rows = interleave(*(generate_trace(scenario, duration_s=3 * 3600, chips=chips, host=f"w-{i}",
                                       seed=i, drop_probability=drop) for i in range(2)))
    path = tmp_path / f"t.{fmt}"
    write_trace(rows, path, format=fmt)
    assert list(read_trace(path)) == rows
    assert columns_as_series(read_trace_columns(path)) == as_series(rows)


def test_columns_span_several_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(trace_text, "BATCH_ROWS", 7)
    rows = list(generate_trace("healthy", duration_s=600, chips=3))
    for fmt in ("csv", "jsonl"):
        path = tmp_path / f"t.{fmt}"
        write_trace(rows, path, format=fmt)
        assert columns_as_series(read_trace_columns(path)) == as_series(rows)


ERROR_CASES = ([(text, "trace.csv", line, fragment) for text, line, fragment in CSV_ERRORS]
               + [(text, "trace.jsonl", line, fragment) for text, line, fragment in JSONL_ERRORS])


@pytest.mark.parametrize("text,name,line,fragment", ERROR_CASES)
def test_columns_raise_the_errors_that_rows_do(text, name, line, fragment, write_file):
    path = write_file(text, name)
    with pytest.raises(TraceFormatError) as rows_error:
        list(read_trace(path))
    with pytest.raises(TraceFormatError) as columns_error:
        read_trace_columns(path)
    assert str(columns_error.value) == str(rows_error.value)
    assert columns_error.value.line == line and fragment in columns_error.value.message


def test_rows_are_real_trace_rows(read_text):
    row = read_text(HEADER + "1.5,h,0,3,10,100\n")[0]
    assert type(row) is TraceRow
    expected = TraceRow(1.5, "h", "0", 3, 10, 100)
    assert row == expected and hash(row) == hash(expected)
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.step = 4
    assert dataclasses.replace(row, step=4).step == 4
    assert pickle.loads(pickle.dumps(row)) == row


# ---------------------------------------------------------------- more of the CSV contract

MORE_CSV_ERRORS = [
    # Bytes must fit int64 and steps float64 exactly (read_trace_columns stores them so).
    (HEADER + "1,h,0,,9223372036854775808,100\n", 2,
     "column 'hbm_used_bytes': 9223372036854775808 is too large (the most is 2**63 - 1)"),
    (HEADER + "1,h,0,,1,9223372036854775808\n", 2, "column 'hbm_total_bytes': 9223372036854775808"),
    (HEADER + "1,h,0,9007199254740992,1,100\n", 2,
     "column 'step': 9007199254740992 is too large (the most is 2**53 - 1)"),
    # Errors after a quoted field that spans lines count its lines.
    ("time,host,chip,note,hbm_used_bytes,hbm_total_bytes\n"
     '1,h,0,"two\nlines",1,100\n2,h,0,"x",y,100\n', 4, "column 'hbm_used_bytes': 'y' is not"),
    ("time,host,chip,hbm_used_bytes,hbm_total_bytes\n"
     '1,"h\n",0,1,100\n0,h,0,1,100\n', 4, "earlier than 1.000 on line 3"),
    # The error names the value as the csv module reads it, without the line break.
    (HEADER + "1,h,0,,10,12x\r\n", 2, "column 'hbm_total_bytes': '12x' is not an integer"),
    (HEADER.replace(",step", "") + "1,h,0,10,12x\n", 2, "'12x' is not an integer"),
    # An overlong field is malformed CSV, reported as such.
    ("time,host,chip,note,hbm_used_bytes,hbm_total_bytes\n" + "1,h,0," + "n" * 200_000 + ",1,9\n",
     2, "not valid CSV: field larger than field limit"),
]


@pytest.mark.parametrize("text,line,fragment", MORE_CSV_ERRORS)
def test_more_csv_errors_name_the_line(text, line, fragment, write_file):
    path = write_file(text)
    for read in (lambda: list(read_trace(path)), lambda: read_trace_columns(path)):
        with pytest.raises(TraceFormatError) as e:
            read()
        assert e.value.line == line
        assert fragment in e.value.message


def test_largest_values_are_read_exactly(write_file):
    big, step = 2**63 - 1, 2**53 - 1
    path = write_file(HEADER + f"1,h,0,{step},{big},{big}\n")
    assert list(read_trace(path)) == [TraceRow(1.0, "h", "0", step, big, big)]
    c = read_trace_columns(path)[("h", "0")]
    assert (int(c.steps[0]), int(c.used[0]), int(c.total[0])) == (step, big, big)


@pytest.mark.parametrize("text,line", [(HEADER + "1,h\r0,0,,10,100\n", 2),
                                       ("\n" + HEADER.replace(",chip", "\r,chip"), 2)])
def test_line_breaks_inside_a_line_of_a_stream_are_malformed_csv(text, line):
    """csv.reader rejects a bare \\r inside a line (a stream that does not split lines on it)."""
    for read in (lambda: list(read_trace(io.StringIO(text))),
                 lambda: read_trace_columns(io.StringIO(text))):
        with pytest.raises(TraceFormatError) as e:
            read()
        assert (e.value.line, e.value.path) == (line, "<stream>")
        assert e.value.message.startswith("not valid CSV: new-line character seen in unquoted")


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_csv_line_endings(newline, tmp_path):
    rows = [ROWS[0], ROWS[2], ROWS[3]]
    buf = io.StringIO()
    write_trace(rows, buf)
    path = tmp_path / "t.csv"
    path.write_bytes(buf.getvalue().replace("\n", newline).encode())
    assert list(read_trace(path)) == rows
    assert columns_as_series(read_trace_columns(path)) == as_series(rows)


def test_csv_odd_but_valid_values(read_text):
    text = ("hbm_total_bytes,time,extra,host,chip,step,hbm_used_bytes\n"
            ' 100 , 5 ,"x, ""y""", h ,0,  ,+7\n'
            '100,6,,h,0 ,1_0,0\n'
            '100,7.25,,"h",0,٣,8\n')
    assert read_text(text) == [TraceRow(5.0, "h", "0", None, 7, 100),
                               TraceRow(6.0, "h", "0", 10, 0, 100),
                               TraceRow(7.25, "h", "0", 3, 8, 100)]


def test_jsonl_odd_but_valid_values(read_text):
    text = ('  {"time": 5, "host": " h", "chip": 0, "hbm_used_bytes": 7,'
            ' "hbm_total_bytes": 100}  \n'
            '{"time": 6.5, "host": "h", "chip": "0 ", "step": 2, "hbm_used_bytes": 8,'
            ' "hbm_total_bytes": 100}\r\n')
    assert read_text(text, "t.jsonl") == [TraceRow(5.0, "h", "0", None, 7, 100),
                                          TraceRow(6.5, "h", "0", 2, 8, 100)]


def test_jsonl_trailing_data_is_an_error(read_text):
    with pytest.raises(TraceFormatError, match=r":1: not valid JSON: Extra data \(column 80\)"):
        read_text("{" + GOOD + "} x\n", "t.jsonl")


# ---------------------------------------------------------------- fast paths against an oracle


def oracle_csv(text):
    """The CSV rules read plainly: csv.reader, then the general checks for every row."""
    text = text.removeprefix("\ufeff")  # files are read as utf-8-sig
    reader = csv.reader(io.StringIO(text, newline=""))
    series, last = {}, {}
    try:
        header = next(r for r in reader if any(f.strip() for f in r))
        index = {c.strip(): i for i, c in reversed(list(enumerate(header)))}
        positions = [index.get(c) for c in trace_text.COLUMNS]
        for fields in reader:
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            if len(fields) != len(header):
                return (reader.line_num,
                        f"row has {len(fields)} fields but the header has {len(header)}")
            try:
                t, host, chip, step, used, total = trace_text._check_values(
                    *(None if p is None else fields[p] for p in positions))
            except trace_text._FieldError as e:
                return (reader.line_num, e.args[0])
            prev = last.get((host, chip))
            if prev is not None and t < prev[0]:
                return (reader.line_num,
                        f"time {t:.3f} is earlier than {prev[0]:.3f} on line {prev[1]} for host "
                        f"{host!r} chip {chip!r} (times of a series must not go back)")
            last[(host, chip)] = (t, reader.line_num)
            series.setdefault((host, chip), []).append((t, step, used, total))
    except csv.Error as e:
        return (reader.line_num, f"not valid CSV: {e}")
    return series


def oracle_jsonl(text):
    """The JSON Lines rules read plainly: json.loads, then the general checks for every line."""
    series, last = {}, {}
    text = text.removeprefix("\ufeff")  # files are read as utf-8-sig
    for line, item in enumerate(io.StringIO(text, newline=""), start=1):
        if not item.strip():
            continue
        try:
            obj = json.loads(item)
        except json.JSONDecodeError as e:
            return (line, f"not valid JSON: {e.msg} (column {e.colno})")
        if not isinstance(obj, dict):
            return (line, f"expected a JSON object, got {type(obj).__name__}")
        missing = [c for c in ("time", "host", "chip", "hbm_used_bytes", "hbm_total_bytes")
                   if c not in obj]
        if missing:
            return (line, f"missing required key {', '.join(repr(c) for c in missing)}")
        try:
            t, host, chip, step, used, total = trace_text._check_values(
                *(obj.get(c) for c in trace_text.COLUMNS))
        except trace_text._FieldError as e:
            return (line, e.args[0])
        prev = last.get((host, chip))
        if prev is not None and t < prev[0]:
            return (line, f"time {t:.3f} is earlier than {prev[0]:.3f} on line {prev[1]} for host "
                          f"{host!r} chip {chip!r} (times of a series must not go back)")
        last[(host, chip)] = (t, line)
        series.setdefault((host, chip), []).append((t, step, used, total))
    return series


# Per column: values the fast path takes, odd values that only the general checks take,
# and bad ones.
CSV_VALUES = {
    "host": (["h", "g"], [" h", "h ", '"h"', '"a,b"', '"h\nx"'], ["", " "]),
    "chip": (["0", "1"], [" 1", "a", '"0"'], ["", " "]),
    "step": (["", "5", "6"], [" ", " 7", "+8", "٩", "1_0", "9007199254740991", '"5"'],
             ["-1", "1.5", "x", "9007199254740992"]),
    "hbm_used_bytes": (["10", "11", "0"], [" 12", "1_000", "9223372036854775807", '"13"'],
                       ["-1", "1e3", "12.0", "", "x", "9223372036854775808"]),
    "hbm_total_bytes": (["100", "200"], ["100 ", "١٠٠", "9223372036854775807"],
                        ["0", "-5", "", "y", "9223372036854775808"]),
    "extra": (["", "x"], ['"q,""r"""', '"multi\nline"', "  "], []),
}
ODD_TIMES = ["{} ", " {}", "{}.0", "{}e0", "{}_0", '"{}"']
BAD_TIMES = ["nan", "inf", "-inf", "", "abc", "0x10", "-{}"]
LAYOUTS = [
    ["time", "host", "chip", "step", "hbm_used_bytes", "hbm_total_bytes"],
    ["hbm_total_bytes", "extra", "chip", "time", "step", "host", "hbm_used_bytes"],
    ["time", "host", "chip", "hbm_used_bytes", "hbm_total_bytes"],
    ["host", "chip", "hbm_used_bytes", "time", "hbm_total_bytes", "step"],
]


def fuzz_value(rng, values, odd, bad):
    good, odd_values, bad_values = values
    roll = rng.random()
    if roll < bad and bad_values:
        return rng.choice(bad_values)
    return rng.choice(odd_values if roll < bad + odd else good)


def fuzz_csv(rng):
    layout = rng.choice(LAYOUTS)
    newline = rng.choice(["\n", "\n", "\r\n"])
    odd, bad = rng.choice([0.0, 0.05, 0.3]), rng.choice([0.0, 0.002, 0.01, 0.05])
    lines = [",".join(layout)]
    t = 1000
    for _ in range(rng.randrange(1, 40)):
        if rng.random() < 0.03:
            lines.append(rng.choice(["", "  ", ","]))
            continue
        t += rng.choice([0, 0, 1, 2]) if rng.random() > bad else rng.choice([-1, -10])
        time = fuzz_value(rng, ([str(t)], ODD_TIMES, BAD_TIMES), odd, bad).format(t)
        values = [time if c == "time" else fuzz_value(rng, CSV_VALUES[c], odd, bad)
                  for c in layout]
        if rng.random() < bad:
            values.append("7")  # one field too many
        lines.append(",".join(values))
    return newline.join(lines) + rng.choice([newline, ""])


def check_fast_paths(path, seed, fuzz, oracle, streams: bool) -> None:
    """Fuzzed files read by both readers (and as streams) agree with the plain oracle."""
    rng = random.Random(seed)
    seen_errors = 0
    for _ in range(600):
        text = fuzz(rng)
        path.write_text(text, newline="")
        expected = oracle(text)
        seen_errors += isinstance(expected, tuple)
        assert outcome(read_trace, path) == expected, text
        assert outcome(read_trace_columns, path) == expected, text
        if streams:
            assert outcome(read_trace, io.StringIO(text, newline="")) == expected, text
            assert outcome(read_trace_columns, io.StringIO(text)) == expected, text
    assert 150 < seen_errors < 450  # the fuzzing reaches both good files and errors


@pytest.mark.slow
def test_csv_fast_paths_agree_with_the_general_checks(tmp_path):
    check_fast_paths(tmp_path / "t.csv", 1, fuzz_csv, oracle_csv, streams=True)


JSON_VALUES = {
    "host": (['"h"', '"g"'], ['" h"', '"h "'], ['""', '" "', "3", "null", "true", '["h"]']),
    "chip": (['"0"', "0", "1"], ['" 1"', "-1", '"a"'], ['""', "0.5", "true", "null", "{}"]),
    "step": (["null", "5", "6"], ["9007199254740991", '"7"', '" 8 "', '""', '" "'],
             ["-1", "1.5", "true", '"x"', "9007199254740992"]),
    "hbm_used_bytes": (["10", "11", "0"], ['"13"', '" 14"', "9223372036854775807"],
                       ["-1", "1e3", "12.0", "true", '"x"', "null", "9223372036854775808"]),
    "hbm_total_bytes": (["100", "200"], ['"100"', "9223372036854775807"],
                        ["0", "-5", "100.5", "false", "9223372036854775808"]),
}
ODD_JSON_TIMES = ["{}", '"{}"', '" {}"', "{}e0"]
BAD_JSON_TIMES = ["NaN", "Infinity", "-Infinity", "true", "null", '"x"', "[1]", "1" + "0" * 400]


def fuzz_jsonl(rng, plain: bool = False):
    """Fuzzed JSON Lines; ``plain``: shaped as pyarrow's reader takes them (each line an
    object from its first byte, names as strings), with odd and bad values rarer, so that
    most files take the fast path and the odd value in one is what decides."""
    odd, bad = rng.choice([0.0, 0.05, 0.3]), rng.choice([0.0, 0.002, 0.01, 0.05])
    if plain:
        odd, bad = odd / 10, bad / 2
    values = dict(JSON_VALUES, chip=(['"0"', '"1"'], *JSON_VALUES["chip"][1:])) if plain \
        else JSON_VALUES
    lines = []
    t = 1000
    for _ in range(rng.randrange(1, 40)):
        if rng.random() < (0.0 if plain else 0.03) + bad:
            lines.append(rng.choice(["", "  ", "[1]", "{", "{} x", "\ufeff{}", "null"]))
            continue
        t += rng.choice([0, 0, 1, 2]) if rng.random() > bad else rng.choice([-1, -10])
        time = fuzz_value(rng, (["{}.0"], ODD_JSON_TIMES, BAD_JSON_TIMES), odd, bad)
        pairs = [f'"time": {time.format(t)}'] + [
            f'"{k}": {fuzz_value(rng, v, odd, bad)}' for k, v in values.items()
            if not (k == "step" and rng.random() < 0.2)]
        if rng.random() < bad:
            pairs.pop(rng.randrange(len(pairs)))
        rng.shuffle(pairs)
        lines.append(rng.choice([""] if plain else ["", "", " "]) + "{" + ", ".join(pairs)
                     + "}" + rng.choice(["", "", " ", "\t"]))
    return "\n".join(lines) + rng.choice(["\n", "", "\r\n"])


@pytest.mark.slow
def test_large_tables_group_on_a_second_thread_with_the_same_results(tmp_path, monkeypatch):
    """A large table's names and sort run beside the numbers' checks, on a helper thread
    (every table here, by lowering the threshold): the same series, and the same error
    where a file holds several, as the row parser's."""
    from tpumon.trace import columns as trace_columns

    threads = []
    groups = trace_columns._series_groups

    def recorded(table, *rest):
        threads.append(threading.current_thread().name)
        return groups(table, *rest)

    monkeypatch.setattr(trace_columns, "_series_groups", recorded)
    monkeypatch.setattr(trace_columns, "_THREADED_ROWS", 0)
    check_fast_paths(tmp_path / "t.csv", 3, fuzz_csv, oracle_csv, streams=True)
    assert threads and all(name.startswith("tpumon-trace") for name in threads)


@pytest.mark.slow
def test_jsonl_fast_paths_agree_with_the_general_checks(tmp_path):
    check_fast_paths(tmp_path / "t.jsonl", 2, fuzz_jsonl, oracle_jsonl, streams=False)


@pytest.mark.parametrize("block", [None, 1100, 4096])
@pytest.mark.slow
def test_jsonl_shaped_for_pyarrow_agree_too(tmp_path, monkeypatch, block):
    """Fuzzed files most of which pyarrow's reader takes (the general fuzzing above mostly
    goes to the strict parser before pyarrow decides anything), so that pyarrow's answers
    are the ones compared; in blocks of a few lines too, as pyarrow infers and builds each
    block on its own (a null at a block's start is where it crashed). Blocks stay longer
    than twice the longest fuzzed line (~530 bytes): shorter ones make pyarrow refuse
    straddling rows, and its reader then at times aborts the process at exit."""
    from tpumon.trace import arrow as trace_columns

    if block is not None:
        monkeypatch.setattr(trace_columns, "_BLOCK_BYTES", block)
    taken = []
    read_jsonl = trace_columns._read_jsonl

    def counted(file):
        table = read_jsonl(file)
        taken.append(len(table))
        return table

    monkeypatch.setattr(trace_columns, "_read_jsonl", counted)
    check_fast_paths(tmp_path / "t.jsonl", 20 + (block or 0),
                     lambda rng: fuzz_jsonl(rng, plain=True), oracle_jsonl, streams=False)
    assert len(taken) > 300  # of 600 files: pyarrow's reading is what was tested


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_lines_after_a_line_of_the_most_characters_keep_their_numbers(write_file, fmt):
    """A line of exactly MAX_LINE_CHARS characters ending in \\r\\n is one line."""
    if fmt == "csv":  # ten notes: a CSV field is at most 131,072 characters
        head = "time,host,chip,hbm_used_bytes,hbm_total_bytes," + ",".join(
            f"note{i}" for i in range(10))
        row, bad = "1.5,h,0,1,9," + ",".join(["{}"] * 10), "x,h,0,1,9" + "," * 10
        expected = "column 'time': 'x' is not a number"
    else:
        head, row = None, '{{"time": 1.5, "host": "h", "chip": "0", "hbm_used_bytes": 1, ' \
            '"hbm_total_bytes": 9, "note": "{}"}}'
        bad, expected = "null", "expected a JSON object, got NoneType"
    empty = row.format(*[""] * row.count("{}"))
    pad = MAX_LINE_CHARS - len(empty)
    notes = ["x" * (pad // row.count("{}"))] * row.count("{}")
    notes[0] += "x" * (pad - sum(map(len, notes)))
    longest = row.format(*notes)
    assert len(longest) == MAX_LINE_CHARS
    lines = ([head] if head else []) + [longest, empty, bad]
    path = write_file("\r\n".join(lines) + "\r\n", f"t.{fmt}")
    for read in (lambda: list(read_trace(path)), lambda: read_trace_columns(path)):
        with pytest.raises(TraceFormatError) as error:
            read()
        assert error.value.line == len(lines) and expected in error.value.message


def test_a_jsonl_time_of_minus_zero_is_read_as_json_reads_it(write_file):
    """json reads the integer -0 as 0 (+0.0 as a time), pyarrow as -0.0."""
    line = '{{"time": {}, "host": "h", "chip": "0", "hbm_used_bytes": 1, "hbm_total_bytes": 9}}\n'
    for time, negative in (("-0", False), ("-0.0", True), ("0", False)):
        (column,) = read_trace_columns(write_file(line.format(time), "t.jsonl")).values()
        assert column.times[0] == 0 and bool(np.signbit(column.times[0])) is negative, time


def test_a_named_pipe_is_read_once_by_the_strict_parser(tmp_path):
    """A trace from a named pipe can be read only once: it goes to the strict parser
    straight away (pyarrow's reading first left it nothing and the second reading waited
    forever for a writer when the strict parser had to decide, as for a blank line)."""
    pipe = tmp_path / "t.jsonl"
    os.mkfifo(pipe)
    text = '{"time": 1.5, "host": "h", "chip": "0", "hbm_used_bytes": 1, "hbm_total_bytes": 9}\n'
    code = ("import sys; from tpumon.trace.read import read_trace_columns; "
            "print(len(read_trace_columns(sys.argv[1])[('h', '0')].times))")
    reader = subprocess.Popen([sys.executable, "-c", code, str(pipe)], stdout=subprocess.PIPE,
                              text=True)
    with open(pipe, "w") as f:
        f.write(text + "\n" + text)  # a blank line between: the strict parser's to skip
    try:
        out, _ = reader.communicate(timeout=60)
    finally:
        reader.kill()
    assert reader.returncode == 0 and out.strip() == "2"


def test_a_binary_file_is_a_format_error_not_a_crash(tmp_path):
    path = tmp_path / "history.db"
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 4)
    with pytest.raises(TraceFormatError, match="history.db: not UTF-8 text"):
        list(read_trace(path))


# ---------------------------------------------------------------- pyarrow and Parquet


def test_files_are_read_by_pyarrow_not_the_row_parser(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    write_trace(generate_trace("healthy", duration_s=600, poll_interval_s=5, chips=2, seed=3),
                path)
    expected = read_trace_columns(path)
    monkeypatch.setattr(trace_read, "_parsed_columns", lambda *a: pytest.fail("row parser used"))
    assert read_trace_columns(path).keys() == expected.keys()


def test_jsonl_files_are_read_by_pyarrow_not_the_row_parser(tmp_path, monkeypatch):
    rows = list(generate_trace("linear-leak", duration_s=600, poll_interval_s=5, chips=2,
                               seed=4, drop_probability=0.1))
    rows[3] = dataclasses.replace(rows[3], step=None)
    path = tmp_path / "t.jsonl"
    write_trace(rows, path, format="jsonl")
    monkeypatch.setattr(trace_read, "_parsed_columns", lambda *a: pytest.fail("row parser used"))
    assert columns_as_series(read_trace_columns(path)) == as_series(rows)


def read_objects(data: bytes, size: int) -> tuple[bool, int, bytes]:
    """What ObjectLines passes of ``data`` read ``size`` bytes at a time: (refused, lines
    counted, bytes passed)."""
    from tpumon.trace.arrow import ObjectLines

    lines = ObjectLines(io.BytesIO(data), 1 << 20)
    passed = b"".join(iter(lambda: lines.read(size), b""))
    return lines.refused, lines.lines, passed


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
def test_pyarrow_is_handed_only_lines_that_begin_an_object(end):
    """pyarrow 26's JSON reader crashes the process on a ``null`` at the start of a block,
    and reads a lone \\r as whitespace where Python's line reading breaks the line: the
    reader's input ends before any block with a line that does not begin with ``{`` or a
    lone \\r, wherever the blocks are cut; lines are counted (the last without its end)."""
    good = b'{"a": 1}' + end
    for size in range(1, 3 * len(good)):
        assert read_objects(good * 7, size) == (False, 7, good * 7)
        assert read_objects(good * 7 + b'{"a": 1}', size)[:2] == (False, 8)
        # each bad line, and where it goes wrong: pyarrow must never get that byte
        for bad, at in ((b"\n", 0), (b"  \n", 0), (b"null\n", 0), (b' {"a": 1}\n', 0),
                        (b'{"a": 1}\r{"a": 1}\n', 9), (b'{"a": 1}\r', 9)):
            refused, _, passed = read_objects(good * 3 + bad + good * 3, size)
            assert refused and len(passed) <= 3 * len(good) + at, (size, bad)
            assert read_objects(bad + good, size)[0], (size, bad)


def test_a_null_at_the_start_of_a_block_is_the_strict_parsers_not_a_crash(tmp_path,
                                                                        monkeypatch):
    """Without the guard above this kills the test process (pyarrow 26)."""
    from tpumon.trace import arrow as trace_columns

    line = '{"time": 1.5, "host": "h", "chip": "0", "hbm_used_bytes": 1, "hbm_total_bytes": 9}\n'
    monkeypatch.setattr(trace_columns, "_BLOCK_BYTES", len(line))
    path = tmp_path / "t.jsonl"
    for text in ("null\n" + line, line * 3 + "null\n" + line):
        path.write_text(text)
        with pytest.raises(TraceFormatError, match="expected a JSON object, got NoneType"):
            read_trace_columns(path)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_parquet_round_trip_reads_as_the_text_formats(tmp_path, fmt):
    rows = list(generate_trace("linear-leak", duration_s=900, poll_interval_s=7, chips=3,
                               seed=5, drop_probability=0.1))
    rows[4] = dataclasses.replace(rows[4], step=None)
    write_trace(rows, tmp_path / f"t.{fmt}", format=fmt)
    assert write_trace(iter(rows), tmp_path / "t.parquet", format="parquet") == len(rows)
    text = read_trace_columns(tmp_path / f"t.{fmt}")
    parquet = read_trace_columns(tmp_path / "t.parquet")
    assert list(text) == list(parquet)
    for key in text:
        for a, b in zip(text[key], parquet[key], strict=True):
            np.testing.assert_array_equal(a, b)
    assert list(read_trace(tmp_path / "t.parquet")) == list(read_trace(tmp_path / f"t.{fmt}"))


def test_parquet_errors_name_the_row_and_parquet_needs_a_file(tmp_path):
    bad = [dataclasses.replace(ROWS[0], time=ROWS[0].time + 10), ROWS[0], ROWS[1]]
    write_trace(bad, tmp_path / "back.parquet", format="parquet")
    with pytest.raises(TraceFormatError, match=r"back.parquet: row 2: time .* must not go back"):
        read_trace_columns(tmp_path / "back.parquet")
    with pytest.raises(TraceFormatError, match="row 2"):
        list(read_trace(tmp_path / "back.parquet"))
    with pytest.raises(ValueError, match="Parquet is written to a file"):
        write_trace(ROWS, "-", format="parquet")
    (tmp_path / "junk.parquet").write_text("time,host\n")
    with pytest.raises(TraceFormatError, match="junk.parquet: "):
        read_trace_columns(tmp_path / "junk.parquet")


def test_series_keys_past_16_bits_are_grouped_too(read_text, write_file):
    """Series are grouped by a key of host and chip numbers, kept in 16 bits when every
    pair fits there: 300 hosts and 300 chip names (90,000 pairs, though few occur) take
    the 64-bit path, and both give the rows of each series in file order."""
    rows = [f"{t},h{(t * 7) % 300},c{(t * 11) % 300},{t},{t},99\n" for t in range(900)]
    rows += [f"{900 + t},h{t % 3},c{t % 2},{t},{t},99\n" for t in range(12)]
    text = HEADER + "".join(rows)
    assert columns_as_series(read_trace_columns(write_file(text))) == \
        as_series(read_text(text))
    few = HEADER + "".join(rows[900:])  # 3 hosts, 2 chips: 16-bit keys
    assert columns_as_series(read_trace_columns(write_file(few))) == as_series(read_text(few))


def test_small_pages_turns_numpys_huge_page_advice_off_and_back():
    """Reading a trace asks numpy not to advise huge pages (their kernel-side cost was most
    of the time of grouping a large trace, bench/analyze_speed.py) and restores the
    process-wide setting after."""
    from tpumon.trace.arrow import small_pages

    core = getattr(np, "_core", None) or np.core
    switch = getattr(core.multiarray, "_set_madvise_hugepage", None)
    if switch is None:
        pytest.skip("this numpy has no huge-page switch")
    original = switch(True)
    try:
        with small_pages():
            assert switch(False) is False  # off within
        assert switch(True) is True  # back on after
    finally:
        switch(original)


@pytest.mark.parametrize("seed", range(40))
def test_pyarrows_reads_end_at_the_first_line_too_long_and_only_there(seed):
    """ShortLines, between pyarrow's CSV reader and the file: whatever the reads' sizes
    and wherever lines fall against them, it ends the file exactly when some line has
    `longest` bytes or more (the strict parser then names it), and otherwise passes every
    byte through."""
    import io
    import random

    from tpumon.trace.arrow import ShortLines

    rng = random.Random(seed)
    longest = rng.choice([8, 50, 64, 1000])
    lengths = [rng.choice([0, 1, longest // 2, longest - 1, longest, longest + 1,
                           rng.randrange(3 * longest)]) for _ in range(rng.randrange(1, 30))]
    data = b"\n".join(b"x" * n for n in lengths) + rng.choice([b"", b"\n"])
    bounded = ShortLines(io.BytesIO(data), longest)
    out = b""
    while True:
        chunk = bounded.read(rng.choice([1, 7, longest, 3 * longest, 1 << 20]))
        if not chunk:
            break
        out += chunk
    assert bounded.refused == (max(lengths) >= longest), (lengths, longest)
    if not bounded.refused:
        assert out == data
