"""``tpumon analyze``: the table in 80 columns, the forecast at alert time, directories."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from rich.console import Console

from tpumon.cli import main
from tpumon.cli.analyze import HOST_WIDTH, render_table, short_host
from tpumon.detect.replay import analyze_path
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.write import write_trace

SLICE = "t1v-n-39fc0729a1b2c3d4"


def write_slice(directory):
    """Write a two-host slice into ``directory``, one trace file per host (host 0 leaks,
    host 1 is healthy) beside a file that is not a trace; return ``directory``."""
    for worker, scenario in ((0, "linear-leak"), (1, "healthy")):
        rows = generate_trace(scenario, duration_s=12 * 3600, poll_interval_s=10, chips=2,
                              seed=3 + worker, host=f"{SLICE}-w-{worker}")
        write_trace(rows, directory / f"w{worker}.csv")
    (directory / "notes.txt").write_text("not a trace\n")
    return directory


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory):
    """A two-host slice recorded one file per host: host 0 leaks, host 1 is healthy."""
    return write_slice(tmp_path_factory.mktemp("slice"))


def test_short_host_keeps_the_worker_and_the_start():
    hosts = [f"{SLICE}-w-{w}" for w in (3, 12)]
    short = [short_host(h) for h in hosts]
    assert all(len(s) == HOST_WIDTH for s in short)
    assert short[0].endswith("-w-3") and short[1].endswith("-w-12")
    assert all(s.startswith("t1v-n-") and "…" in s for s in short)
    assert short_host("host-a") == "host-a"


def test_a_directory_is_a_slice_and_the_table_fits_80_columns(slice_dir):
    results = analyze_path(str(slice_dir))
    assert [(r.host[-4:], r.chip) for r in results] == \
        [("-w-0", "0"), ("-w-0", "1"), ("-w-1", "0"), ("-w-1", "1")]
    assert {r.verdict for r in results[:2]} == {"leak"}
    console = Console(width=80, record=True, color_system=None)
    render_table(results, console)
    text = console.export_text()
    lines = text.splitlines()
    said = [line for line in lines if " chip " in line or line.startswith("  forecast")]
    assert max(len(line) for line in lines if line not in said) <= 80  # the table
    # a reason and its post-mortem are one line each, left to the terminal to fold (a
    # pipe's console, 80 wide, once cut them mid-sentence)
    forecasts = [line for line in said if line.startswith("  forecast at alert: ")]
    assert len(said) == 6 and len(forecasts) == 2
    assert text.count(f"2 of 4 chips of slice {SLICE})\n") == 2
    assert all(line.endswith(("in the trace", "UTC", "judges a job's end")) or
               line[-1].isdigit() for line in forecasts)
    table_rows = [line for line in lines if "…" in line]
    assert len(table_rows) == 4 and all(line.split()[0][-4:] in ("-w-0", "-w-1")
                                        for line in table_rows)
    assert "KiB/step" in text and text.count("…") == 4  # nothing cut but the hosts
    assert text.count("forecast at alert: step ") == 2


def test_alert_carries_the_forecast_made_then_with_its_interval(slice_dir):
    out = CliRunner().invoke(main, ["analyze", "--format", "json", str(slice_dir / "w0.csv")])
    assert out.exit_code == 0, out.output
    for series in json.loads(out.output)["series"]:
        alert, final = series["alert"], series["predicted_oom"]
        for forecast in (alert["predicted_oom"], final):
            low, high = forecast["interval"]["step"]
            assert low <= forecast["step"] <= high
            t_low, t_high = forecast["interval"]["time"]
            assert t_low <= forecast["time"] <= t_high
        # made at the alert, from less evidence: a different forecast from the final one,
        # and one the OOM that came falls near (HBM full within 20 % of the interval's end)
        assert alert["predicted_oom"] != final and alert["slope_bytes_per_step"] > 0
        full = series["hbm_full_after_alert"]["step"]
        assert alert["step"] < alert["predicted_oom"]["interval"]["step"][0] <= full * 1.2



@pytest.mark.parametrize("command,option,value", [
    ("analyze", "--since", "1h"), ("analyze", "--until", "1h"),
    ("analyze", "--resolution", "60"), ("report", "--resolution", "60"),
    ("export", "--resolution", "60")])
def test_an_option_only_prometheus_reads_is_refused_without_it(tmp_path, command, option,
                                                              value):
    """`analyze demo.csv --since 1h` replayed the whole trace and exited 0, as if --since
    had been obeyed (a newcomer's run of the README)."""
    path = tmp_path / "t.csv"
    write_trace(generate_trace("healthy", duration_s=600, poll_interval_s=30, chips=1,
                               seed=1), path, "csv")
    args = [command, str(path)] if command != "export" else [
        command, "--state-dir", str(tmp_path), "-o", str(tmp_path / "out.csv")]
    out = CliRunner().invoke(main, [*args, option, value])
    assert out.exit_code == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1] == f"Error: {option} needs --prometheus URL"
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("name,header,message", [
    ("notes.txt", "hello world, this is not a trace",
     ":1: missing required column 'time', 'host', 'chip', 'hbm_used_bytes', "
     "'hbm_total_bytes' in the header"),
    ("t.csv", "time,host,chip,step,hbm_used_bytes,hbm_total_bytes",
     ": no samples to analyze (only a header?)")])
def test_a_file_of_one_line_is_told_by_its_header(tmp_path, name, header, message):
    """A one-line file that is no trace was "no samples to analyze (only a header?)": its
    header is checked as a longer file's is (a newcomer's run of the README)."""
    path = tmp_path / name
    path.write_text(header + "\n")
    out = CliRunner().invoke(main, ["analyze", str(path)])
    assert out.exit_code == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"Error: {path}{message}"]


def test_a_trace_that_ends_with_the_floor_at_capacity_is_told_as_the_agent_tells_the_end():
    """The demo's agent said its job ended in an HBM OOM (floor plus in-step swing at 98 %),
    and `analyze` of the same polls, exported, said "HBM did not fill up in the trace": no
    poll lands on a step's peak. The post-mortem now judges the trace's end as the agent
    judges a job's end, and says what is estimated."""
    from tpumon.cli.analyze import post_mortem
    from tpumon.detect import Assessment, Verdict
    from tpumon.detect.job_replay import SeriesResult

    total = 32 * 2**30
    alert = {"time": 1000.0, "step": 100, "predicted_oom_time": 5000.0,
             "predicted_oom_step": 500.0, "predicted_oom_time_low": 4000.0,
             "predicted_oom_time_high": 6000.0, "predicted_oom_step_low": 400.0,
             "predicted_oom_step_high": 600.0}

    def ended_at(floor: float) -> str | None:
        a = Assessment(Verdict.LEAK, "x", floor_bytes=floor * total,
                       transient_bytes=0.12 * total, total_bytes=total, step=27_969.0)
        return post_mortem(SeriesResult("h", "0", 100, a, alert))

    assert ended_at(0.86) == (
        "forecast at alert: step 500 (400-600); no sample 98% full, but at the detector's "
        "last fit (step 27,969) the floor plus the in-step swing came to 98.0% of HBM: an OOM, "
        "as the agent judges a job's end")
    assert ended_at(0.70).endswith("; HBM did not fill up in the trace")


def test_a_chip_whose_trace_ends_at_an_oom_is_told_as_the_agent_tells_an_ended_job():
    """After the demo's OOM, `analyze` still said "this one 452 KiB/step; OOM in 22 min" for
    each chip, a job still running to the reader; the agent says "job ended (...); before
    it: ...". A full sample before a restart is not the trace's end."""
    from tpumon.cli.analyze import _reason
    from tpumon.detect import Assessment, Verdict
    from tpumon.detect.job_replay import SeriesResult

    total = 32 * 2**30
    alert = {"time": 1000.0, "step": 100}

    def reason(floor: float, full_at: float | None, job_start: float = 0.0,
               paged: dict | None = alert) -> str:
        a = Assessment(Verdict.LEAK, "OOM in 22 min", floor_bytes=floor * total,
                       transient_bytes=0.05 * total, total_bytes=total, job_start=job_start)
        full = None if full_at is None else {"time": full_at, "step": 500}
        return _reason(SeriesResult("h", "0", 100, a, paged, full_after_alert=full))

    assert reason(0.60, 2000.0) == "the trace ends at an OOM; before it: OOM in 22 min"
    assert reason(0.94, None) == "the trace ends at an OOM; before it: OOM in 22 min"
    assert reason(0.60, None) == "OOM in 22 min"
    assert reason(0.60, 2000.0, job_start=3000.0) == "OOM in 22 min"  # restarted after it
    # a trace that merely stops is no job's end: no alert, no claim (a review found a
    # healthy chip at 92 % with a wide swing read "the trace ends at an OOM")
    assert reason(0.94, None, paged=None) == "OOM in 22 min"


def test_an_alert_whose_job_restarted_is_held_against_that_jobs_end():
    """The demo run twice: the first run's job ran out of HBM (the agent said hbm_oom) and
    the second began; analyze of the history said "forecast at alert: ...; HBM did not fill
    up in the trace", judged on the second run's floors. The alert's post-mortem is its
    own job's end."""
    import numpy as np

    from tpumon.cli.analyze import post_mortem
    from tpumon.detect.job_replay import replay_series
    from tpumon.sim.tracegen import generate_trace

    from tpumon.detect.job_replay import replay_job
    from tpumon.trace.schema import SeriesColumns

    first = list(generate_trace("fast-leak", duration_s=8 * 3600, poll_interval_s=15, chips=2))
    gap = first[-1].time + 600 - 1_750_000_000.0
    second = list(generate_trace("fast-leak", duration_s=2 * 3600, poll_interval_s=15,
                                 chips=2, seed=1, start_time=1_750_000_000.0 + gap))

    def columns(chip: str) -> SeriesColumns:
        return SeriesColumns(*[np.array(v, dtype=float) for v in zip(*[
            (r.time, np.nan if r.step is None else r.step, r.hbm_used_bytes, r.hbm_total_bytes)
            for r in first + second if r.chip == chip], strict=True)])

    alone = replay_series("h", "0", *columns("0"))  # its samples replayed to the restart
    pooled = replay_job("h", [("h", c, columns(c)) for c in "01"])  # its detector's log
    for result in (alone, *pooled):
        assert result.alert is not None and result.alert["time"] < first[-1].time
        assert result.assessment.restarts == 1 and result.alert_job_end is not None
        said = post_mortem(result)
        assert "HBM did not fill up" not in said, said
        assert ("before it restarted" in said and "an OOM" in said) or "HBM full at" in said, \
            said
    assert pooled[0].alert_job_end[1] == alone.alert_job_end[1]  # the second job's start
