"""A slice's history from Prometheus: query_range in chunks under Prometheus' 11,000
points per series, and one clear error line for an unreachable Prometheus, an unknown
slice, a range with no samples and an empty range (a real Prometheus on loopback; the
end-to-end replay is in tests/test_pod_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest

from tools import TPUMON, Processes, clean_env, free_port, ready, require_tool, wait_for
from tpumon.trace.prometheus import (CHUNK_POINTS, MAX_POINTS, RAW_WINDOW_SECONDS,
                                     PrometheusError, chunks, query_range, slice_rows,
                                     windows)


@pytest.mark.parametrize("start,end,step", [(0, 100, 1), (0, 10_000, 1), (0, 172_800, 1),
                                            (5, 1e6, 15), (0, 0, 1)])
def test_chunks_cover_the_range_once_under_the_limit(start, end, step):
    windows = list(chunks(start, end, step))
    assert windows[0][0] == start and windows[-1][1] == end
    for lo, hi in windows:
        assert (hi - lo) / step + 1 <= CHUNK_POINTS < MAX_POINTS
    for (_, hi), (lo, _) in zip(windows, windows[1:], strict=False):
        assert lo == hi + step  # no point asked twice, none skipped


@pytest.mark.parametrize("start,end", [(0, 100), (0, 3600), (0, 3601), (5, 86_400.5),
                                       (7, 7)])
def test_raw_windows_cover_the_range_end_to_end(start, end):
    """Every sample is read by range selectors over these windows: they must leave no
    moment of [start, end] out (a sample on a shared edge is read twice, kept once)."""
    found = list(windows(start, end))
    assert found[0][0] == start and found[-1][1] == end
    assert all(0 <= hi - lo <= RAW_WINDOW_SECONDS for lo, hi in found)
    assert all(a[1] == b[0] for a, b in zip(found, found[1:], strict=False))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus that scrapes nothing (so holds no tpumon series)."""
    tmp = tmp_path_factory.mktemp("prom")
    procs, url = start_prometheus(require_tool("prometheus"), tmp, tmp / "data")
    yield url
    procs.stop_all()


def start_prometheus(binary: str, tmp, data) -> tuple[Processes, str]:
    """A real Prometheus on ``data`` that scrapes nothing, ready; its processes and URL."""
    (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    port = free_port()
    procs = Processes(tmp)
    procs.start("prometheus", [binary, f"--config.file={tmp / 'prometheus.yml'}",
                               f"--storage.tsdb.path={data}",
                               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"])
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: ready(f"{url}/-/ready"), timeout=60, interval=0.2)
    return procs, url


@pytest.mark.e2e
def test_a_long_range_at_fine_resolution_is_asked_in_chunks(prometheus):
    """Two days at 1 s: 172,801 points, which Prometheus refuses in one query."""
    now = time.time()
    with pytest.raises(PrometheusError, match="11,000|11000"):  # in one query: refused
        _one_query(prometheus, now - 172_800, now)
    asked = []
    assert query_range(prometheus, "up", now - 172_800, now, 1.0,
                       progress=lambda: asked.append(1)) == {}
    assert len(asked) == 18


def _one_query(url: str, start: float, end: float) -> None:
    from tpumon.trace.prometheus import _get

    _get(url, "query_range", {"query": "up", "start": start, "end": end, "step": 1}, 30)


@pytest.mark.e2e
def test_unknown_slice_names_what_prometheus_has(prometheus):
    now = time.time()
    with pytest.raises(PrometheusError, match=r"slice 'nope' is not in Prometheus at .* "
                                              r"\(it has: no tpumon series\)"):
        slice_rows(prometheus, "nope", now - 3600, now, 15)


def test_an_empty_range_is_refused_before_asking():
    with pytest.raises(PrometheusError, match="empty range"):
        slice_rows("http://127.0.0.1:1", "s", 100.0, 100.0, 15)


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TPUMON, "analyze", *args], capture_output=True, text=True,
                          env=clean_env(), timeout=60)


@pytest.mark.parametrize("args,message", [
    (["--prometheus", "http://127.0.0.1:{free}", "--slice", "s"],
     "Prometheus at http://127.0.0.1:{free}: cannot reach it"),
    (["--prometheus", "{prom}", "--slice", "nope"], "slice 'nope' is not in Prometheus"),
    (["--prometheus", "{prom}", "--slice", "s", "--since", "2h", "--until", "3h"],
     "empty range"),
    (["--slice", "s"], "--slice needs --prometheus URL"),
    (["--prometheus", "{prom}"], "--prometheus needs --slice NAME"),
])
@pytest.mark.e2e
def test_cli_errors_are_one_line(prometheus, args, message):
    free = str(free_port())
    fill = {"free": free, "prom": prometheus}
    result = analyze(*[a.format(**fill) for a in args])
    assert result.returncode != 0 and result.stdout == ""
    assert "Traceback" not in result.stderr
    assert message.format(**fill) in result.stderr.strip().splitlines()[-1], result.stderr


def test_slice_heatmap_rows_by_worker_then_chip_with_gaps_empty():
    import numpy as np

    from tpumon.report.slice_heatmap import BINS, heatmap, render_slice_png
    from tpumon.trace.schema import SeriesColumns

    def series(times, used):
        n = len(times)
        return SeriesColumns(np.array(times, float), np.full(n, np.nan),
                             np.array(used, np.int64), np.full(n, 100, np.int64))

    polls = np.arange(0, 1001, 10.0)
    down = (polls > 400) & (polls < 900)  # no sample for 500 s: more than the restart gap
    data = {("pod-w-10", "0"): series(polls[~down], np.where(polls[~down] < 500, 10, 20)),
            ("pod-w-2", "1"): series([0, 1000], [50, 90]),
            ("pod-w-2", "0"): series([0, 500, 501], [30, 40, 70])}
    keys, edges, ratios = heatmap(data)
    assert keys == [("pod-w-2", "0"), ("pod-w-2", "1"), ("pod-w-10", "0")]
    assert ratios.shape == (3, BINS) and edges[0] == 0 and edges[-1] == 1000
    assert ratios[0, 0] == 0.3 and ratios[1, -1] == 0.9 and ratios[2, -1] == 0.2
    assert ratios[0, BINS // 2] == 0.7  # the highest of the bin's samples
    # between two samples the level holds (two polls 1000 s apart are a slow poll, not
    # a gap: 3 poll intervals make one); in a gap, a hole, never 0
    assert np.all(ratios[1, :-1] == 0.5) and np.all(ratios[0, 1:BINS // 2 - 1] == 0.3)
    hole = (edges[:-1] > 400) & (edges[1:] < 900)  # the bins wholly inside the gap
    assert hole.any() and np.isnan(ratios[2, hole]).all()
    assert not np.isnan(ratios[2, ~hole]).any()
    assert render_slice_png(data, [], "slice pod").startswith(b"\x89PNG")


def test_slice_picture_names_each_leaking_chip_beside_its_floors(monkeypatch):
    """make demo-pod's picture: the legend of 16 leaking chips' floors lay on the panel,
    over the floors of the first hours, and named them in 10 colours (two chips a
    colour). It is beside the panel now, inside the picture, one colour a chip."""
    from matplotlib.figure import Figure

    from tpumon.report import slice_heatmap
    from tpumon.report.data import build_reports, series_from_rows
    from tpumon.sim.tracegen import generate_trace

    rows = [row for w in range(4) for row in generate_trace(
        "linear-leak", duration_s=6 * 3600, poll_interval_s=60.0, chips=4, seed=w,
        host=f"pod-w-{w}")]
    series = series_from_rows(rows)
    reports = build_reports(series, "test", "0", 0.0)
    assert sum(c.assessment.verdict.value == "leak" for r in reports for c in r.chips) == 16
    drawn: list[Figure] = []

    class Kept(Figure):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            drawn.append(self)

    monkeypatch.setattr(slice_heatmap, "Figure", Kept)
    slice_heatmap.render_slice_png(series, reports, "slice pod")
    [figure] = drawn
    [floors] = [axes for axes in figure.axes if axes.get_legend() is not None]
    renderer = figure.canvas.get_renderer()
    legend = floors.get_legend().get_window_extent(renderer)
    panel, whole = floors.get_window_extent(renderer), figure.bbox
    assert legend.x0 >= panel.x1 and legend.x1 <= whole.x1 and legend.y0 >= whole.y0
    solid = [line for line in floors.get_lines() if line.get_linestyle() == "-"]
    assert len(solid) == 16 and len({line.get_color() for line in solid}) == 16


def test_slice_heatmap_fills_its_time_axis_at_any_poll_rate():
    """Fewer samples than columns (a minute's scrapes of hours of a slice, or a demo's
    accelerated time): every column between a chip's first and last sample is coloured;
    the heatmap was white but for a stripe per sample."""
    import numpy as np

    from tpumon.report.slice_heatmap import BINS, heatmap
    from tpumon.trace.schema import SeriesColumns

    rng = np.random.default_rng(0)
    data = {}
    for worker in range(2):
        for chip in range(4):
            # a scrape every ~100 s, each a little late
            times = (np.linspace(0, 6000, 60) + rng.uniform(0, 20, 60)).round(3)
            data[(f"pod-w-{worker}", str(chip))] = SeriesColumns(
                times, np.full(60, np.nan), rng.integers(10, 90, 60), np.full(60, 100))
    _, _, ratios = heatmap(data)
    assert ratios.shape == (8, BINS) and not np.isnan(ratios).any()


# ------------------------------------------- the post-mortem at any scrape interval

#: slice -> (Prometheus seconds between scrapes, polls per scrape): each scrape sees the
#: latest poll. "fast": Prometheus scrapes each poll twice, a demo's accelerated time
#: (the agent's clock runs 20x Prometheus'), where query_range at the former default step
#: of 15 s saw one poll in 15; "s15": one scrape a poll; "sparse": a scrape every third
#: poll; "slow": a scrape a minute.
SCRAPED = {"fast": (0.25, 0.5), "s15": (15.0, 1.0), "sparse": (15.0, 3.0),
           "slow": (60.0, 1.0)}
POST_MORTEM_HOURS = 5.0
POLL = 10.0  # the agents' poll interval, in their clock


def _openmetrics(slices: dict[str, list], first_scrape: float) -> str:
    """The slices' scrapes as OpenMetrics with timestamps, what `promtool tsdb
    create-blocks-from openmetrics` backfills: per slice, the scrapes' (time, poll) pairs
    of its rows."""
    families: dict[str, dict[str, list[str]]] = {
        "tpumon_hbm_used_bytes": {}, "tpumon_hbm_total_bytes": {}, "tpumon_chip_step": {},
        "tpumon_runtime_sample_timestamp_seconds": {}}
    for name, scrapes in slices.items():
        for when, rows in scrapes:
            for r in rows:
                labels = f'chip="{r.chip}",host="{r.host}",slice="{name}"'
                for family, value in (("tpumon_hbm_used_bytes", r.hbm_used_bytes),
                                      ("tpumon_hbm_total_bytes", r.hbm_total_bytes),
                                      ("tpumon_chip_step", r.step)):
                    families[family].setdefault(labels, []).append(
                        f"{family}{{{labels}}} {value} {when:.3f}")
            host = rows[0].host
            families["tpumon_runtime_sample_timestamp_seconds"].setdefault(host, []).append(
                f'tpumon_runtime_sample_timestamp_seconds{{host="{host}",slice="{name}"}} '
                f"{rows[0].time:.3f} {when:.3f}")
    out = []
    for family, series in families.items():
        out.append(f"# TYPE {family} gauge")
        for lines in series.values():
            out.extend(lines)
    return "\n".join(out) + "\n# EOF\n"


@pytest.fixture(scope="module")
def scraped_slices(tmp_path_factory):
    """A real Prometheus holding the slices of SCRAPED (2 workers of 2 chips each, a leak
    on every chip), backfilled with promtool so that hours of scrapes take seconds; the
    last scrape 10 minutes ago. Yields (url, {slice: (first scrape, its polls as rows)})."""
    from tpumon.sim.tracegen import generate_trace

    prometheus, promtool = require_tool("prometheus"), require_tool("promtool")
    tmp = tmp_path_factory.mktemp("backfill")
    now = time.time()
    slices, held = {}, {}
    for name, (every, polls_per_scrape) in SCRAPED.items():
        hosts = [list(generate_trace("linear-leak", duration_s=POST_MORTEM_HOURS * 3600,
                                     poll_interval_s=POLL, chips=2, seed=worker,
                                     host=f"{name}-w-{worker}"))
                 for worker in range(2)]
        polls = [[rows[i:i + 2] for i in range(0, len(rows), 2)] for rows in hosts]
        count = int(min(len(p) for p in polls) / polls_per_scrape)
        first = now - 600 - count * every
        scrapes = []
        for k in range(count):
            poll = int(k * polls_per_scrape)
            for worker in range(2):
                scrapes.append((first + k * every + 0.001 * worker, polls[worker][poll]))
        slices[name] = scrapes
        kept = {(r.host, r.chip, r.time): r for _, rows in scrapes for r in rows}
        held[name] = (first, sorted(kept.values(), key=lambda r: (r.host, r.chip, r.time)))
    (tmp / "scrapes.om").write_text(_openmetrics(slices, now))
    data = tmp / "data"
    made = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics",
                           str(tmp / "scrapes.om"), str(data)], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    procs, url = start_prometheus(prometheus, tmp, data)
    yield url, held
    procs.stop_all()


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(SCRAPED))
def test_the_post_mortem_reaches_the_agents_verdicts_at_any_scrape_interval(
        scraped_slices, name, tmp_path):
    """`analyze --prometheus` with its default options replays exactly the polls
    Prometheus holds, whatever the scrape interval: the verdicts, alerts and sample counts
    of `tpumon analyze` of those polls as the agents' traces (here: a leak on every chip,
    the agents' verdict), and `report --prometheus` draws a heatmap with no empty column
    and the floors panel. With query_range at 15 s, "fast" gave `ok` on every chip."""
    from tpumon.trace.prometheus import slice_rows
    from tpumon.report.data import series_from_rows
    from tpumon.report.slice_heatmap import heatmap
    from tpumon.trace.write import write_trace

    url, held = scraped_slices
    first, rows = held[name]
    traces = tmp_path / "traces"
    traces.mkdir()
    for host in sorted({r.host for r in rows}):
        write_trace([r for r in rows if r.host == host], traces / f"{host}.csv")
    expected = _series(analyze(str(traces), "--format", "json"))
    got = _series(analyze("--prometheus", url, "--slice", name, "--since", repr(first - 1),
                          "--format", "json"))
    assert {k: s["verdict"] for k, s in expected.items()} == \
        {(f"{name}-w-{w}", str(c)): "leak" for w in range(2) for c in range(2)}
    assert {k: (s["verdict"], s["samples"]) for k, s in got.items()} == \
        {k: (s["verdict"], s["samples"]) for k, s in expected.items()}
    for key, s in got.items():
        assert (s["alert"]["time"], s["alert"]["step"]) == pytest.approx(
            (expected[key]["alert"]["time"], expected[key]["alert"]["step"]), abs=0.01)
    series = series_from_rows(slice_rows(url, name, first - 1, time.time()))
    _, _, ratios = heatmap(series)
    assert not np.isnan(ratios).any(), f"{np.isnan(ratios).all(axis=0).sum()} empty columns"
    result = subprocess.run([*TPUMON, "report", "--prometheus", url, "--slice", name,
                             "--since", repr(first - 1), "-o", str(tmp_path)],
                            capture_output=True, text=True, env=clean_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    # the floors panel under the heatmap (drawn for the leaking chips)
    from PIL import Image

    from tpumon.report.slice_heatmap import DPI, FLOORS_IN, ROW_IN

    with Image.open(tmp_path / f"tpumon-report-slice-{name}.png") as picture:
        assert picture.height >= DPI * (3.0 + ROW_IN * len(got) + FLOORS_IN) - 1, picture.size


def _series(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return {(s["host"], s["chip"]): s for s in json.loads(result.stdout)["series"]}


def test_nan_points_are_no_samples(tmp_path):
    """A staleness marker comes back as NaN from VictoriaMetrics (remote_write carries
    Prometheus' markers when a target goes); a NaN value, capacity or step is no sample
    and no step, never a crash converting it."""
    import http.server
    import threading
    import urllib.parse

    at = [1000.0, 1001.0, 1002.0, 1003.0]
    values = {"tpumon_hbm_used_bytes": ["100", "NaN", "300", "400"],
              "tpumon_hbm_total_bytes": ["1000", "1000", "NaN", "1000"],
              "tpumon_chip_step": ["1", "2", "3", "NaN"]}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
            metric = query.split("{", 1)[0]
            result = [] if metric not in values else [{
                "metric": {"__name__": metric, "slice": "s", "host": "s-w-0", "chip": "0"},
                "values": [[t, v] for t, v in zip(at, values[metric], strict=True)]}]
            body = json.dumps({"status": "success",
                               "data": {"resultType": "matrix", "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rows = slice_rows(f"http://127.0.0.1:{server.server_address[1]}", "s", 999.0, 1004.0)
    finally:
        server.shutdown()
        server.server_close()
    assert [(r.time, r.step, r.hbm_used_bytes, r.hbm_total_bytes) for r in rows] == [
        (1000.0, 1, 100, 1000), (1003.0, None, 400, 1000)]
