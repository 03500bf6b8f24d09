"""tpumon report: the picture and the self-contained page, from traces and from the store."""

from __future__ import annotations

import base64
import math
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tpumon.cli import main
from tpumon.detect.job_replay import replay_series
from tpumon.detect.replay import analyze_file
from tpumon.report import file_stem
from tpumon.report.data import build_reports, chip_report, select, series_from_rows
from tpumon.sim.tracegen import generate_trace
from tpumon.store.database import Retention, open_database
from tpumon.common.samples import Sample
from tpumon.trace.read import read_trace_columns
from tpumon.trace.write import write_trace

HOST = "t1v-n-report-w-1"
HOURS = 10.0
SCENARIOS = ("linear-leak", "healthy", "job-restart", "step-change", "staircase-leak")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def rows_of(scenario: str, hours: float = HOURS, chips: int = 2, seed: int = 1, **kw):
    return list(generate_trace(scenario, duration_s=hours * 3600, poll_interval_s=5.0,
                               chips=chips, seed=seed, host=HOST, **kw))


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    """10 h at 5 s polls on 2 chips of each scenario, as CSV (linear-leak also as JSONL)."""
    root = tmp_path_factory.mktemp("traces")
    out = {}
    for scenario in SCENARIOS:
        rows = rows_of(scenario)
        out[scenario] = root / f"{scenario}.csv"
        write_trace(rows, out[scenario])
        if scenario == "linear-leak":
            out["linear-leak.jsonl"] = root / "linear-leak.jsonl"
            write_trace(rows, out["linear-leak.jsonl"], "jsonl")
    return out


@pytest.fixture(scope="module")
def reports(traces, tmp_path_factory) -> dict[str, tuple[str, Path, Path]]:
    """`tpumon report` of each scenario's trace (in process): (stdout, png, html)."""
    out = {}
    for scenario in SCENARIOS:
        outdir = tmp_path_factory.mktemp(scenario)
        result = CliRunner().invoke(main, ["report", str(traces[scenario]), "-o", str(outdir)])
        assert result.exit_code == 0, result.output
        out[scenario] = (result.output, outdir / f"{file_stem(HOST)}.png",
                         outdir / f"{file_stem(HOST)}.html")
    return out


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (after checking the signature)."""
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


def assert_self_contained(html: str) -> None:
    assert re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I) is None
    assert "<script" not in html.lower() and "<link" not in html.lower()
    assert "url(" not in html and "@import" not in html


def summary_rows(html: str) -> list[str]:
    """The chips table's rows (its header left out), each cell as a plain <td> (the page
    names each cell's column in data-label, for the cards it becomes on a phone)."""
    table = re.search(r'<table class="summary">(.*?)</table>', html, re.S).group(1)
    return [re.sub(r'<td data-label="[^"]*">', "<td>", row)
            for row in re.findall(r"<tr>(.*?)</tr>", table, re.S)]


@pytest.mark.e2e
def test_report_of_a_leak_via_the_command_line(traces, tmp_path):
    trace = traces["linear-leak.jsonl"]
    outdir = tmp_path / "out" / "nested"
    proc = subprocess.run([sys.executable, "-m", "tpumon", "report", str(trace), "-o",
                           str(outdir)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    png_path, html_path = outdir / f"{file_stem(HOST)}.png", outdir / f"{file_stem(HOST)}.html"
    assert proc.stdout.split() == [str(png_path), str(html_path)]
    png = png_path.read_bytes()
    width, height = png_size(png)
    assert width == 1400 and 700 < height < 1400  # two panels, legible at full size
    import matplotlib.image
    pixels = matplotlib.image.imread(png_path)
    assert pixels.shape[:2] == (height, width) and pixels.std() > 0.05  # not blank
    assert 30_000 < len(png) < 1_000_000
    html = html_path.read_text()
    assert_self_contained(html)
    inlined = re.search(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html).group(1)
    assert base64.b64decode(inlined) == png
    # the verdicts and the forecast are what `tpumon analyze` says
    analyzed = [r.to_json() for r in analyze_file(str(trace))]
    rows = summary_rows(html)
    assert len(rows) == len(analyzed) == 2
    for row, series in zip(rows, analyzed, strict=True):
        assert row.startswith(f"<td>{series['chip']}</td>")
        assert series["verdict"] == "leak" and ">leak</span>" in row
        assert f"step {series['predicted_oom']['step']:,}" in row
        assert f"step {series['alert']['step']:,}" in row  # the leak alert
        assert f"forecast then: step {series['alert']['predicted_oom']['step']:,} (" in row
        assert "KiB/step" in row
    assert f"<td>{HOST}</td>" in html and "<td>1</td>" in html  # host and worker
    assert "2 chips: 2 leaking" in html and "tpumon 0." in html


@pytest.mark.e2e
def test_healthy_report_says_ok(reports):
    _, png, html_path = reports["healthy"]
    html = html_path.read_text()
    rows = summary_rows(html)
    assert len(rows) == 2 and all(">ok</span>" in row for row in rows)
    assert ">leak</span>" not in html and "2 chips: no leak" in html
    assert all("never raised" in row for row in rows)
    assert png_size(png.read_bytes())[0] == 1400
    assert_self_contained(html)


@pytest.mark.e2e
@pytest.mark.parametrize("scenario", ["linear-leak", "staircase-leak"])
def test_leaking_reports_forecast_the_oom(reports, traces, scenario):
    html = reports[scenario][2].read_text()
    columns = read_trace_columns(traces[scenario])
    for row, ((host, chip), c) in zip(summary_rows(html), columns.items(), strict=True):
        result = replay_series(host, chip, *c)
        assert result.verdict == "leak" and ">leak</span>" in row
        assert f"at step {result.predicted_oom['step']:,}" in row


@pytest.mark.e2e
def test_a_trace_that_ends_at_an_oom_is_told_so_as_analyze_tells_it(tmp_path):
    """A newcomer's run: analyze said "the trace ends at an OOM" for the demo's trace, and
    the report of the same file drew "OOM in 55 min" as an OOM still to come."""
    from tpumon.cli.analyze import ended_at_oom

    trace = tmp_path / "fast.csv"
    write_trace(rows_of("fast-leak", hours=8, chips=2), trace)
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["report", str(trace), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = (out / f"{file_stem(HOST)}.html").read_text()
    told = []
    for row, ((host, chip), c) in zip(summary_rows(html), read_trace_columns(trace).items(),
                                      strict=True):
        ended = ended_at_oom(replay_series(host, chip, *c))
        assert ("the trace ends at an OOM; before it:" in row) == ended, row
        told.append(ended)
    assert any(told)  # the fast leak reaches the OOM in 8 h


@pytest.mark.e2e
def test_restarts_are_listed(reports, traces):
    html = reports["job-restart"][2].read_text()
    rows = summary_rows(html)
    columns = read_trace_columns(traces["job-restart"])
    steps = columns[(HOST, "0")].steps
    back = int(np.flatnonzero(np.diff(steps) < 0)[0]) + 1  # the job restarted here
    for row in rows:
        cells = re.findall(r"<td>(.*?)</td>", row, re.S)
        assert cells[8].startswith("1<br>")  # restarts
        assert f"step {int(steps[back]):,}" in cells[8]
    report = chip_report(HOST, "0", columns[(HOST, "0")])
    assert len(report.restarts) == 1 and report.restarts[0].start_step == steps[back]
    assert report.gaps and report.gaps[0][0] < report.restarts[0].start <= report.gaps[0][1]


@pytest.mark.e2e
def test_level_jumps_are_listed_and_drawn_as_steps(reports, traces):
    html = reports["step-change"][2].read_text()
    for row in summary_rows(html):
        cells = re.findall(r"<td>(.*?)</td>", row, re.S)
        assert ">stepped up</span>" in cells[1]  # as every view writes it
        assert re.match(r"1 \(\+1\.\d\d GiB in all\)<br>\+1\.\d\d GiB at \d\d:\d\d, step [\d,]+$",
                        cells[9]), cells[9]
    columns = read_trace_columns(traces["step-change"])
    report = chip_report(HOST, "0", columns[(HOST, "0")])
    # the fitted floor puts the jump back where the detector took it out
    assert report.trend.with_jumps
    jump = report.jumps[0]
    before = report.trend.value[report.trend.times < jump.time]
    after = report.trend.value[report.trend.times >= jump.time]
    assert after.min() - before.max() == pytest.approx(jump.size, rel=0.05)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.slow
def test_report_replays_the_detector_exactly(traces, scenario):
    """Replayed in slices, the detector ends where `tpumon analyze` ends, bit for bit, and
    its verdict timeline is the detector's own, moment by moment."""
    for (host, chip), c in read_trace_columns(traces[scenario]).items():
        report = chip_report(host, chip, c)
        result = replay_series(host, chip, *c)
        assert report.assessment == result.assessment
        assert report.alert == result.alert
        assert report.samples == len(c.times)
        leaks = [start for start, _, v in report.verdicts if v == "leak"]
        if result.alert:  # the timeline turns to leak where the alert fired, to the sample
            assert leaks[0] == result.alert["time"]
        else:
            assert not leaks
        # one verdict after another, from the first sample to the last
        assert all(a[1] == b[0] and a[2] != b[2]
                   for a, b in zip(report.verdicts, report.verdicts[1:], strict=False))
        assert report.verdicts[0][0] == report.start and report.verdicts[-1][1] == report.end


def test_excursions_are_marked(tmp_path):
    rows = rows_of("healthy", hours=5, chips=1, seed=4, eval_transient_bytes=(9e9, 10e9),
                   eval_every_steps=(5000, 6000))
    trace = tmp_path / "evals.csv"
    write_trace(rows, trace)
    (key, c), = read_trace_columns(trace).items()
    report = chip_report(*key, c)
    assert 2 <= len([e for e in report.excursions if not e.drop]) <= 6
    typical = np.median(report.peaks - report.floors)
    for e in report.excursions:
        assert e.value - report.floors[report.floor_times.searchsorted(e.time)] > 1.4 * typical


@pytest.mark.e2e
def test_report_from_the_history_store(tmp_path):
    state = tmp_path / "state"
    rows = rows_of("linear-leak", hours=6, chips=3, seed=2)
    db = open_database(state, Retention())
    with db.transaction():
        for r in rows:
            db.add_samples(r.host, [(r.chip, Sample(r.time, r.step, r.hbm_used_bytes,
                                                    r.hbm_total_bytes))])
    db.close()
    since = rows[0].time + 1800
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["report", "--state-dir", str(state), "--chip", "1",
                                       "--chip", "2", "--since", repr(since), "-o", str(out)])
    assert result.exit_code == 0, result.output
    html = (out / f"{file_stem(HOST)}.html").read_text()
    assert [re.match(r"<td>(\w+)</td>", row).group(1) for row in summary_rows(html)] == ["1", "2"]
    assert "history.db" in html
    # the same as the trace of the same selection
    series = select(series_from_rows(rows), chips=["1"], since=since)
    expected = build_reports(series, "x", "0", 0.0)[0].chips[0]
    assert f">{expected.verdict}</span>" in summary_rows(html)[0]
    assert expected.start >= since


@pytest.mark.e2e
def test_one_report_per_host(tmp_path):
    rows = rows_of("healthy", hours=1, chips=1) + [
        r.__class__(r.time, "other host/1", r.chip, r.step, r.hbm_used_bytes, r.hbm_total_bytes)
        for r in rows_of("linear-leak", hours=1, chips=1)]
    trace = tmp_path / "two.csv"
    write_trace(rows, trace)
    result = CliRunner().invoke(main, ["report", str(trace), "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(Path(p).name for p in result.output.split()) == [
        "tpumon-report-other_host_1.html", "tpumon-report-other_host_1.png",
        f"tpumon-report-{HOST}.html", f"tpumon-report-{HOST}.png"]
    html = (tmp_path / "tpumon-report-other_host_1.html").read_text()
    assert "<td>other host/1</td>" in html and len(summary_rows(html)) == 1
    # the worker: from a -w-N host name, else as given (one host), else said unknown
    assert "<th>Worker</th><td>1</td>" in (tmp_path / f"{file_stem(HOST)}.html").read_text()
    assert "<th>Worker</th><td>not known" in html
    result = CliRunner().invoke(main, ["report", str(trace), "--host", "other host/1",
                                       "--worker", "0", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "tpumon-report-other_host_1.html").read_text()
    assert "<th>Worker</th><td>0</td>" in html
    result = CliRunner().invoke(main, ["report", str(trace), "--worker", "0", "-o",
                                       str(tmp_path)])
    assert result.exit_code == 2 and "--worker names one host's worker; the selection has " \
        "2 hosts (give --host)" in result.output and "Traceback" not in result.output


def one_error_line(result) -> str:
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


def test_bad_input_is_one_line(tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    line = one_error_line(runner.invoke(main, ["report", str(tmp_path / "missing.csv"),
                                               "-o", str(out)]))
    assert "missing.csv" in line and "No such file" in line
    binary = tmp_path / "garbage.csv"
    binary.write_bytes(bytes(range(256)) * 20)
    assert "garbage.csv" in one_error_line(runner.invoke(main, ["report", str(binary)]))
    text = tmp_path / "garbage.txt"
    text.write_text("time,host,chip,hbm_used_bytes,hbm_total_bytes\n1,h,0,lots,7\n")
    assert "garbage.txt:2" in one_error_line(runner.invoke(main, ["report", str(text)]))
    assert "no history store" in one_error_line(
        runner.invoke(main, ["report", "--state-dir", str(tmp_path / "nothing")]))
    assert "is not a time" in runner.invoke(main, ["report", str(text), "--since", "soon"]).output
    assert not out.exists()


def test_an_empty_selection_is_an_error(traces):
    line = one_error_line(CliRunner().invoke(main, ["report", str(traces["healthy"]),
                                                    "--chip", "7"]))
    assert "no samples for the given" in line


def test_bad_input_from_a_subprocess_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tpumon", "report", str(tmp_path / "nope.csv"),
                           "-o", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"Error: {tmp_path / 'nope.csv'}: No such file or directory"]


def test_series_from_rows_keeps_missing_steps_as_nan():
    rows = rows_of("healthy", hours=0.1, chips=1)
    rows[3] = rows[3].__class__(rows[3].time, HOST, "0", None, 5, 10)
    (_, c), = series_from_rows(rows).items()
    assert math.isnan(c.steps[3]) and c.used[3] == 5 and len(c.times) == len(rows)


@pytest.mark.e2e
def test_a_trace_on_stdin_and_the_agent_never_loads_matplotlib(traces, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys; from tpumon.cli import main; "
         "assert 'matplotlib' not in sys.modules and 'tpumon.report' not in sys.modules; "
         "main(['report', '-', '--chip', '1', '-o', sys.argv[1]])", str(tmp_path)],
        stdin=traces["healthy"].open(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    html = (tmp_path / f"{file_stem(HOST)}.html").read_text()
    assert "<td>standard input</td>" in html and len(summary_rows(html)) == 1


def colour_columns(png: bytes, colour: str) -> np.ndarray:
    """Which pixel columns of the picture hold at least one pixel of exactly ``colour``."""
    from PIL import Image

    import io

    image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return (image == rgb).all(axis=2).any(axis=0)


@pytest.mark.parametrize("poll", [5.0, 30.0])
def test_the_raw_sample_band_is_drawn_wherever_the_floor_is(poll):
    """The light band of raw samples (min to max per bin), which the legend and
    docs/report.md promise, is drawn along the whole series, above the floor where the
    sawtooth's samples lie: at 5 s polls (more samples than bins) and 30 s (fewer samples
    than the picture has pixels, as Prometheus' scrapes of a demo's accelerated time)."""
    from tpumon.report.render import FLOOR, RAW, render_png

    rows = list(generate_trace("linear-leak", duration_s=4 * 3600, poll_interval_s=poll,
                               chips=1, seed=1, host=HOST))
    [report] = build_reports(series_from_rows(rows), "test", "0", 0.0)
    chip = report.chips[0]
    assert np.nanmax(chip.envelope_high - chip.envelope_low) > 2**30  # a sawtooth of GiB
    png = render_png(report)
    floor, band = colour_columns(png, FLOOR), colour_columns(png, RAW)
    data = np.flatnonzero(floor)
    # the legend's swatch is the band's colour too: look only where the floor is drawn
    assert len(data) > 200
    inside = band[data.min():data.max() + 1]
    assert inside.mean() > 0.95, f"band in {inside.mean():.0%} of the floor's columns"


def test_the_time_axis_reaches_the_forecast_oom():
    """The plot's axis ended before the OOM it named, so its X was never seen: 4 h of a
    leak forecast to OOM about 12 h after the last sample."""
    from tpumon.report.render import _x_end

    rows = list(generate_trace("linear-leak", duration_s=4 * 3600, poll_interval_s=30.0,
                               chips=1, seed=1, host=HOST))
    [report] = build_reports(series_from_rows(rows), "test", "0", 0.0)
    forecast = report.chips[0].forecast
    assert forecast is not None and forecast.time - report.end > 2 * (report.end - report.start)
    assert _x_end(report) > forecast.time


def test_a_line_label_near_the_right_edge_is_written_on_its_left():
    """The demo's job ended near the end of the data: its label "job ended: hbm_oom (step
    27,959)", written rightwards from its line, was cut off at the panel's edge and hid
    the "HBM 31.75 GiB" label there. A label that would run past the edge is written on
    the left of its line; one with room keeps the right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tpumon.report.render import _top_labels

    fig, ax = plt.subplots(figsize=(14, 3), dpi=100)
    ax.set_xlim(0, 6.2)
    _top_labels(ax, [(1.1, "leak alert 08:00, step 5,314", "red"),
                     (5.73, "job ended: hbm_oom (step 27,959)", "black")], 6.2)
    fig.canvas.draw()
    panel = ax.get_window_extent()
    texts = {t.get_text().strip(): t for t in ax.texts}
    for text in texts.values():
        box = text.get_window_extent()
        assert panel.x0 <= box.x0 and box.x1 <= panel.x1, text.get_text()
    assert texts["leak alert 08:00, step 5,314"].get_ha() == "left"
    assert texts["job ended: hbm_oom (step 27,959)"].get_ha() == "right"
    plt.close(fig)
