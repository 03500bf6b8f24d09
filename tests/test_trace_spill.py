"""``tpumon analyze`` in bounded memory: a trace read in tables into a spill file and each
series read back when replayed gives what the whole trace read in memory gives."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tpumon.cli import main
from tpumon.detect import replay
from tpumon.detect.replay import read_path, replay_columns, spilled_path
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.read import read_trace_columns
from tpumon.trace.schema import TraceFormatError
from tpumon.trace.write import write_trace

SLICE = "t1v-n-5f0c1a2b"


def slice_rows():
    """A two-host slice (one leaks) and a lone host with a staircase, polled together."""
    rows = []
    for host, scenario, seed in ((f"{SLICE}-w-0", "linear-leak", 1),
                                 (f"{SLICE}-w-1", "healthy", 2),
                                 ("solo", "staircase-leak", 3)):
        rows += generate_trace(scenario, duration_s=8 * 3600, poll_interval_s=20, chips=2,
                               seed=seed, host=host)
    return sorted(rows, key=lambda r: r.time)


def slice_traces_in(directory, rows):
    """``rows`` as trace.csv, trace.jsonl and trace.parquet in ``directory``: {format: path}
    (tests/test_report_stream.py's too)."""
    paths = {}
    for fmt in ("csv", "jsonl", "parquet"):
        paths[fmt] = directory / f"trace.{fmt}"
        write_trace(rows, paths[fmt], fmt)
    return paths


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return slice_traces_in(tmp_path_factory.mktemp("spill"), slice_rows())


def _json(results):
    return [r.to_json() for r in results]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_spilled_series_replay_as_the_whole_trace(traces, small_tables, fmt):
    expected = _json(replay_columns(read_path(str(traces[fmt]))))
    assert any(r["verdict"] == "leak" for r in expected)
    with spilled_path(str(traces[fmt])) as series:
        assert all(len(s._chunks) > 5 for s in series.values())  # many tables each
        loaded = {key: s.load() for key, s in series.items()}
        whole = read_trace_columns(traces[fmt])
        assert list(loaded) == list(whole)
        for key, c in whole.items():
            for got, want in zip(loaded[key], c, strict=True):
                assert got.dtype == want.dtype
                assert got.tobytes() == want.tobytes()  # NaN steps included
        assert _json(replay_columns(series)) == expected


def test_forked_workers_read_their_own_series(traces, small_tables, monkeypatch):
    monkeypatch.setattr(replay, "PARALLEL_MIN_SAMPLES", 0)
    expected = _json(replay_columns(read_path(str(traces["csv"]))))
    with spilled_path(str(traces["csv"])) as series:
        assert _json(replay_columns(series, workers=2)) == expected


def test_the_command_prints_what_the_whole_trace_gives(traces, small_tables):
    for path in traces.values():
        result = CliRunner().invoke(main, ["analyze", "--format", "json", str(path)])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"series": _json(replay_columns(read_path(
            str(path))))}


def test_a_directory_of_traces_in_several_formats(tmp_path, small_tables):
    rows = slice_rows()
    for worker, fmt in enumerate(("csv", "jsonl", "parquet")):
        write_trace([r for r in rows if r.host.endswith(f"-w-{worker}")
                     or (worker == 2 and r.host == "solo")], tmp_path / f"w{worker}.{fmt}", fmt)
    expected = _json(replay_columns(read_path(str(tmp_path))))
    with spilled_path(str(tmp_path)) as series:
        assert _json(replay_columns(series)) == expected
    write_trace([r for r in rows if r.host == "solo"], tmp_path / "again.csv")
    with pytest.raises(TraceFormatError) as whole:
        read_path(str(tmp_path))
    with pytest.raises(TraceFormatError) as spilled, spilled_path(str(tmp_path)):
        pass
    assert str(spilled.value) == str(whole.value)
    assert "also in an earlier file" in str(spilled.value)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
@pytest.mark.parametrize("fault", ["time goes back", "negative used"])
@pytest.mark.parametrize("at", [20 * 384, 20 * 384 + 50])
def test_an_error_in_a_later_table_is_the_whole_traces(tmp_path, small_tables, fmt, fault, at):
    """A bad row far into the trace is named as when the trace is read whole: the same
    row. Parquet's tables here are of 384 rows (three batches of 128), so a time going back
    at row 20 * 384 is one table's first row, and the row before it in its series is in
    the table before (checked across tables); 50 rows on, within one table."""
    rows = slice_rows()
    bad = rows[at]
    if fault == "time goes back":
        earlier = next(r for r in reversed(rows[:at]) if (r.host, r.chip) ==
                       (bad.host, bad.chip))
        rows[at] = bad.__class__(earlier.time - 1, bad.host, bad.chip, bad.step,
                                 bad.hbm_used_bytes, bad.hbm_total_bytes)
    else:
        rows[at] = bad.__class__(bad.time, bad.host, bad.chip, bad.step, -1,
                                 bad.hbm_total_bytes)
    path = tmp_path / f"bad.{fmt}"
    write_trace(rows, path, fmt)
    with pytest.raises(TraceFormatError) as whole:
        read_trace_columns(path)
    with pytest.raises(TraceFormatError) as spilled, spilled_path(str(path)):
        pass
    assert str(spilled.value) == str(whole.value)
    line = at + 1 + (fmt == "csv")  # CSV's lines count the header
    assert f"{path}:{line}:" in str(spilled.value) or f"row {line}:" in str(spilled.value)


def test_a_file_pyarrow_refuses_late_is_read_again_by_the_strict_parser(tmp_path, small_tables):
    """A name with spaces around it far into a CSV (the strict parser strips them; the
    vectorized checks do not decide): the tables spilled before are dropped and the file is
    read whole by the validating parser, with the same results."""
    rows = slice_rows()
    at = len(rows) * 2 // 3
    r = rows[at]
    rows[at] = r.__class__(r.time, f" {r.host} ", r.chip, r.step, r.hbm_used_bytes,
                           r.hbm_total_bytes)
    path = tmp_path / "spaces.csv"
    write_trace(rows, path)
    expected = _json(replay_columns(read_path(str(path))))
    with spilled_path(str(path)) as series:
        assert len(series) == 6
        assert _json(replay_columns(series)) == expected


def test_read_ahead_gives_every_item_and_the_error_where_it_is_taken():
    from tpumon.trace.arrow import read_ahead

    assert list(read_ahead(iter(range(100)))) == list(range(100))

    def failing():
        yield 1
        raise ValueError("bad block")

    got = read_ahead(failing())
    assert next(got) == 1
    with pytest.raises(ValueError, match="bad block"):
        next(got)
    endless = read_ahead(iter(int, 1))  # never ends: a caller that stops must not hang
    assert next(endless) == 0
    endless.close()


def test_a_full_disk_under_the_spill_is_one_line_naming_it(traces, monkeypatch):
    """The spill file's write failing (ENOSPC) is the command's one error line, naming the
    spill file and TMPDIR, not the trace; nothing on stdout, no traceback."""
    import errno
    import io

    from tpumon.trace import spill as trace_spill

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    class Full(io.FileIO):
        write = full

    real_open = open

    def spill_open(path, mode="r", *args, **kwargs):
        return Full(path, mode) if mode == "wb" else real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(trace_spill, "open", spill_open, raising=False)
    result = CliRunner().invoke(main, ["analyze", "--format", "json", str(traces["csv"])])
    assert result.exit_code == 1
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert "No space left on device" in line and "TMPDIR" in line
    assert str(traces["csv"]) not in line and "tpumon-analyze-" in line
