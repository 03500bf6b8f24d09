"""A slice's history from Prometheus, as trace rows (`analyze/export/report --prometheus`).

A pod already keeps every worker's history in Prometheus; a post-mortem should not need a
trace exported from each worker by hand. This asks for the slice's HBM used and total,
each chip's step (``tpumon_chip_step``) and each host's sample clock
(``tpumon_runtime_sample_timestamp_seconds``) and turns the answers into the rows of a
trace (contracts §1), dated by the agent's own clock where the agent exports it: the
replay then sees the polls the agent saw (those Prometheus scraped), at the times it saw
them.

By default every sample Prometheus holds is read as it was scraped: range selectors
(``metric[1h]``) evaluated at the end of each hour of the range, whatever the scrape
interval, so the replay needs no guess of it. (``query_range`` at a fixed step, the
former default of 15 s, sees one scrape per step, and where Prometheus scrapes faster
than that, as of an accelerated demo, the detector got a fraction of the polls and found
no growth where the agents called a leak.) ``--resolution`` still asks ``query_range``
at that step, in chunks under Prometheus' limit of 11,000 points per series and query:
fewer points for a long range.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from typing import Any, Callable, Iterator

from tpumon.trace.schema import TraceRow

MAX_POINTS = 11_000   # Prometheus refuses a range query with more points per series
CHUNK_POINTS = 10_000  # what this asks for at most, with room to spare
MAX_ANSWER_BYTES = 512 * 2**20


class PrometheusError(Exception):
    """Prometheus cannot be asked, or has nothing for the slice: one line saying which."""


def _get(url: str, path: str, params: dict[str, Any], timeout: float) -> Any:
    """One API call's ``data``; PrometheusError naming the server on any failure."""
    full = f"{url.rstrip('/')}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(full, timeout=timeout) as response:
            body = json.loads(response.read(MAX_ANSWER_BYTES))
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read(65536)).get("error", exc.reason)
        except ValueError:
            detail = exc.reason
        raise PrometheusError(f"Prometheus at {url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise PrometheusError(f"Prometheus at {url}: cannot reach it: {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise PrometheusError(f"Prometheus at {url}: {exc}") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else "not a Prometheus API answer"
        raise PrometheusError(f"Prometheus at {url}: {error}")
    return body["data"]


def chunks(start: float, end: float, step: float,
           points: int = CHUNK_POINTS) -> Iterator[tuple[float, float]]:
    """[start, end] in windows of at most ``points`` evaluation points each, none shared."""
    span = step * (points - 1)
    at = start
    while at <= end:
        upto = min(end, at + span)
        yield at, upto
        at = upto + step


Series = dict[tuple, list[tuple[float, float]]]  # labels -> [(time, value)]


def query_range(url: str, expr: str, start: float, end: float, step: float,
                timeout: float = 30.0, progress: Callable[[], None] | None = None) -> Series:
    """Every series of ``expr`` over [start, end] at ``step``: labels -> [(time, value)]."""
    series: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for lo, hi in chunks(start, end, step):
        data = _get(url, "query_range", {"query": expr, "start": repr(lo), "end": repr(hi),
                                         "step": repr(step)}, timeout)
        for item in data.get("result", []):
            key = tuple(sorted(item["metric"].items()))
            series[key].extend((float(t), float(v)) for t, v in item["values"])
        if progress is not None:
            progress()
    return dict(series)


RAW_WINDOW_SECONDS = 3600.0  # each raw query reads this much of the range


def windows(start: float, end: float,
            width: float = RAW_WINDOW_SECONDS) -> Iterator[tuple[float, float]]:
    """[start, end] in consecutive windows of at most ``width`` seconds (one at least)."""
    at = start
    while True:
        upto = min(end, at + width)
        yield at, upto
        if upto >= end:
            return
        at = upto


def query_raw(url: str, expr: str, start: float, end: float, timeout: float = 30.0,
              progress: Callable[[], None] | None = None) -> Series:
    """Every sample of ``expr``'s series in [start, end] as Prometheus stored it (its
    scrape's timestamp): labels -> [(time, value)] in time order. ``expr`` is a selector;
    each window is read with a range selector evaluated at the window's end."""
    series: dict[tuple, dict[float, float]] = defaultdict(dict)
    for lo, hi in windows(start, end):
        # a millisecond more than the window (Prometheus' range selector is left-open
        # from 3.0 on); what falls outside [lo, hi] is the neighbour window's
        reach = max(1, math.ceil((hi - lo) * 1000) + 1)
        data = _get(url, "query", {"query": f"{expr}[{reach}ms]", "time": repr(hi)}, timeout)
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"Prometheus at {url}: {expr} is not a series selector "
                                  f"(a {data.get('resultType')} answer)")
        for item in data.get("result", []):
            points = series[tuple(sorted(item["metric"].items()))]
            for t, v in item["values"]:
                if lo <= float(t) <= hi:
                    points[float(t)] = float(v)
        if progress is not None:
            progress()
    return {key: sorted(points.items()) for key, points in series.items() if points}


def queries(start: float, end: float, step: float | None) -> int:
    """How many API calls one series' history takes (for a progress bar)."""
    if not end > start:
        return 1
    return sum(1 for _ in (windows(start, end) if step is None else chunks(start, end, step)))


def known_slices(url: str, timeout: float = 30.0) -> list[str]:
    return sorted(s for s in _get(url, "label/slice/values",
                                  {"match[]": "tpumon_hbm_used_bytes"}, timeout) if s)


def _by(series: dict[tuple, list[tuple[float, float]]],
        *names: str) -> dict[tuple[str, ...], dict[float, float]]:
    out: dict[tuple[str, ...], dict[float, float]] = {}
    for key, values in series.items():
        labels = dict(key)
        out[tuple(labels.get(n, "") for n in names)] = dict(values)
    return out


def slice_rows(url: str, slice_name: str, start: float, end: float,
               step: float | None = None, timeout: float = 30.0,
               progress: Callable[[], None] | None = None) -> list[TraceRow]:
    """The slice's trace rows, in time order per (host, chip): every sample Prometheus
    holds, or with ``step`` points that far apart (``query_range``). PrometheusError when
    the range is empty, the slice unknown or the range holds none of its samples."""
    if not end > start:
        raise PrometheusError(f"empty range: --since must be before --until "
                              f"({start:.0f} >= {end:.0f})")
    selector = f'{{slice="{_escape(slice_name)}"}}'

    def ask(metric: str) -> Series:
        if step is None:
            return query_raw(url, metric + selector, start, end, timeout, progress)
        return query_range(url, metric + selector, start, end, step, timeout, progress)
    used = ask("tpumon_hbm_used_bytes")
    if not used:
        slices = known_slices(url, timeout)
        if slice_name not in slices:
            raise PrometheusError(f"slice {slice_name!r} is not in Prometheus at {url} "
                                  f"(it has: {', '.join(slices) or 'no tpumon series'})")
        raise PrometheusError(f"slice {slice_name!r}: no samples in Prometheus at {url} "
                              f"between {start:.0f} and {end:.0f}")
    total = _by(ask("tpumon_hbm_total_bytes"), "host", "chip")
    steps = _by(ask("tpumon_chip_step"), "host", "chip")
    clocks = _by(ask("tpumon_runtime_sample_timestamp_seconds"), "host")
    rows: list[TraceRow] = []
    for (host, chip), points in sorted(_by(used, "host", "chip").items()):
        rows.extend(_series_rows(host, chip, points, total.get((host, chip), {}),
                                 steps.get((host, chip), {}), clocks.get((host,), {})))
    return rows


def _series_rows(host: str, chip: str, used: dict[float, float], total: dict[float, float],
                 steps: dict[float, float], clock: dict[float, float]) -> Iterator[TraceRow]:
    """One chip's rows: each sample (or evaluation point) dated by the agent's clock when
    exported (a poll scraped twice, or seen at several points, is kept once), else by
    Prometheus'. A scrape's series share its timestamp, so they are matched by it.
    A NaN is no sample: a staleness marker (Prometheus writes one when a series goes
    missing from a scrape or its target goes; its own API hides them, but remote_write
    forwards them and VictoriaMetrics returns them) or a NaN written as one."""
    last = -math.inf
    for at in sorted(used):
        when = clock.get(at, None if clock else at)  # never two clocks in one series
        capacity, value = total.get(at), used[at]
        if when is None or not math.isfinite(when) or when <= last or capacity is None \
                or not math.isfinite(capacity) or not math.isfinite(value):
            continue
        last = when
        step = steps.get(at)
        yield TraceRow(when, host, chip, None if step is None or not math.isfinite(step)
                       else int(step), int(value), int(capacity))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
