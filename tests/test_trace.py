"""The trace file contract (contracts.md section 1): round trips and every validation."""

from __future__ import annotations

import io
import itertools
import pickle

import pytest

from tpumon.trace import TraceFormatError, TraceRow, read_trace, write_trace

TOTAL = 34088157184
HEADER = "time,host,chip,step,hbm_used_bytes,hbm_total_bytes\n"

ROWS = [
    TraceRow(1750000000.0, "t1v-n-0a1b2c3d-w-0", "0", 1200, 22548578304, TOTAL),
    TraceRow(1750000000.0, "t1v-n-0a1b2c3d-w-0", "1", 1200, 22551724032, TOTAL),
    TraceRow(1750000005.125, "t1v-n-0a1b2c3d-w-0", "0", None, 22548578305, TOTAL),
    TraceRow(1750000005.125, 'odd "host", with comma', "chip-a", 0, 0, TOTAL),
    TraceRow(1750000010.999, "t1v-n-0a1b2c3d-w-0", "0", 3, TOTAL + 5, TOTAL),  # used > total is data
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
    ('{' + GOOD.replace('"hbm_used_bytes": 5', '"hbm_used_bytes": 5.0') + '}\n', 1, "is not an integer"),
    ('{' + GOOD.replace('"hbm_used_bytes": 5', '"hbm_used_bytes": true') + '}\n', 1, "is not an integer"),
    ('{' + GOOD.replace('"time": 1', '"time": NaN') + '}\n', 1, "is not a finite number"),
    ('{' + GOOD.replace('"time": 1', '"time": null') + '}\n', 1, "column 'time' is empty"),
    ('{' + GOOD.replace('"host": "h"', '"host": 3') + '}\n', 1, "column 'host': 3 is not a string"),
    ('{' + GOOD.replace('"chip": 0', '"chip": 0.5') + '}\n', 1, "column 'chip': 0.5 is not a string"),
    ('{' + GOOD.replace('"time": 1', '"time": 9') + '}\n{' + GOOD + '}\n', 2, "is earlier than 9.000"),
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
        write_trace(ROWS, tmp_path / "t.parquet", format="parquet")
    with pytest.raises(ValueError, match="unknown trace format"):
        list(read_trace(io.StringIO(HEADER), format="xml"))
