"""A slice's history from Prometheus: query_range in chunks under Prometheus' 11,000
points per series, and one clear error line for an unreachable Prometheus, an unknown
slice, a range with no samples and an empty range (a real Prometheus on loopback; the
end-to-end replay is in tests/test_pod_e2e.py)."""

from __future__ import annotations

import subprocess
import time

import pytest

from tools import TPUMON, Processes, clean_env, free_port, ready, require_tool, wait_for
from tpumon.prometheus_history import (CHUNK_POINTS, MAX_POINTS, PrometheusError, chunks,
                                       query_range, slice_rows)


@pytest.mark.parametrize("start,end,step", [(0, 100, 1), (0, 10_000, 1), (0, 172_800, 1),
                                            (5, 1e6, 15), (0, 0, 1)])
def test_chunks_cover_the_range_once_under_the_limit(start, end, step):
    windows = list(chunks(start, end, step))
    assert windows[0][0] == start and windows[-1][1] == end
    for lo, hi in windows:
        assert (hi - lo) / step + 1 <= CHUNK_POINTS < MAX_POINTS
    for (_, hi), (lo, _) in zip(windows, windows[1:], strict=False):
        assert lo == hi + step  # no point asked twice, none skipped


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus that scrapes nothing (so holds no tpumon series)."""
    binary = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prom")
    (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    port = free_port()
    procs = Processes(tmp)
    procs.start("prometheus", [binary, f"--config.file={tmp / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp / 'data'}",
                               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"])
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: ready(f"{url}/-/ready"), timeout=60, interval=0.2)
    yield url
    procs.stop_all()


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
    from tpumon.prometheus_history import _get

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
    from tpumon.trace import SeriesColumns

    def series(times, used):
        n = len(times)
        return SeriesColumns(np.array(times, float), np.full(n, np.nan),
                             np.array(used, np.int64), np.full(n, 100, np.int64))

    data = {("pod-w-10", "0"): series([0, 1000], [10, 20]),
            ("pod-w-2", "1"): series([0, 1000], [50, 90]),
            ("pod-w-2", "0"): series([0, 500, 501], [30, 40, 70])}
    keys, edges, ratios = heatmap(data)
    assert keys == [("pod-w-2", "0"), ("pod-w-2", "1"), ("pod-w-10", "0")]
    assert ratios.shape == (3, BINS) and edges[0] == 0 and edges[-1] == 1000
    assert ratios[0, 0] == 0.3 and ratios[1, -1] == 0.9 and ratios[2, -1] == 0.2
    assert ratios[0, BINS // 2] == 0.7  # the highest of the bin's samples
    assert np.isnan(ratios[2, 1])  # no sample there: shown as a hole, never as 0
    assert render_slice_png(data, [], "slice pod").startswith(b"\x89PNG")
