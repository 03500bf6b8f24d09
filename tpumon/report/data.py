"""What a report shows, computed by replaying the agent's detector over the samples.

Each (host, chip) series is fed to a :class:`~tpumon.detect.ChipDetector` with the agent's
default settings, in time slices, exactly as the agent would have seen it poll by poll
(the detector gives the same result however its input is batched, so the verdict at the
end is what ``tpumon analyze`` says). Between slices the report notes what the detector
said then: its verdict over time, each job's start and warm-up, the level shifts it found.
At the end it takes the evidence window, the fitted trend with its 95 % interval and the
OOM forecast from the final :class:`~tpumon.detect.Assessment`.

Everything here is numbers; ``render.py`` draws them and ``html.py`` tabulates them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from tpumon.common.describe import describe_growth
from tpumon.detect import Assessment, ChipDetector, DetectorSettings, Verdict
from tpumon.detect.floors import group_by_bucket
from tpumon.detect.jumps import Jump
from tpumon.detect.pooling import pool_job
from tpumon.common.samples import StoredEnd
from tpumon.detect.job_replay import FULL_FRACTION, group_jobs, replay_pooling
from tpumon.diagnose.job_ends import stopped_at_oom
from tpumon.trace.schema import SeriesColumns, SeriesSource, TraceRow
from tpumon.trace.spill import Keep

#: Bins of the raw-sample envelope: at most about one per pixel of the PNG's plot width,
#: and at least SAMPLES_PER_BIN samples to a bin on average (a bin of one sample is a line
#: of no height: the min to max of a few is the band of the sawtooth).
ENVELOPE_BINS = 1400
SAMPLES_PER_BIN = 4
#: The detector is replayed in slices of this many seconds (its state changes only when a
#: bucket of 1-3 minutes closes), or longer to stay within MAX_SLICES per series: the
#: resolution of the verdict over time. Each slice costs an update call (~0.2 ms).
SLICE_SECONDS = 180.0
MAX_SLICES = 1000
#: A bucket whose in-step transient is this many times the job's typical transient (and
#: at least EXCURSION_MIN_FRACTION of HBM above it) is drawn as an excursion.
EXCURSION_FACTOR = 1.5
EXCURSION_MIN_FRACTION = 0.02


@dataclass(frozen=True)
class JobSpan:
    """One run of the training process as the detector saw it."""

    start: float
    trend_start: float | None  # end of warm-up; None if it never ended
    end: float
    start_step: float | None


@dataclass(frozen=True)
class Excursion:
    """A bucket whose peak stands far above the usual sawtooth (an eval, a checkpoint,
    a spike); or, with ``drop``, whose floor fell far below the level around it."""

    time: float
    value: float  # the peak (or the floor, for a drop)
    drop: bool = False


@dataclass(frozen=True)
class Trend:
    """The fitted floor over the evidence window (level shifts put back where the detector
    took them out, when that fits the floors better than a straight line) and the band of
    the slope's 95 % interval, through the level at the last fit."""

    times: np.ndarray
    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    now: float  # the last fit
    level: float
    with_jumps: bool


@dataclass(frozen=True)
class Forecast:
    """Floor plus the transient reaching HBM capacity: the detector's OOM."""

    now: float
    level: float
    time: float
    step: float | None
    limit: float  # the floor at which it happens: total less the largest transient
    earliest: float | None  # the forecast's band (tpumon.detect.forecast_band)
    latest: float | None


@dataclass
class ChipReport:
    host: str
    chip: str
    samples: int
    start: float
    end: float
    total: float
    assessment: Assessment
    alert: dict | None
    envelope_times: np.ndarray  # bin centres; NaN bounds where a bin has no sample
    envelope_low: np.ndarray
    envelope_high: np.ndarray
    floor_times: np.ndarray  # bucket starts
    floors: np.ndarray
    peaks: np.ndarray
    jobs: list[JobSpan]
    jumps: list[Jump]
    excursions: list[Excursion]
    verdicts: list[tuple[float, float, str]]  # (from, to, verdict) as the detector said
    #: the series itself, read again for the steps at a few times (the step axis): the
    #: report keeps no per-sample array, so its memory does not grow with the samples
    #: (a spilled series stays on disk until then)
    series: SeriesSource = field(repr=False)
    has_steps: bool  # whether any sample has its step
    gaps: list[tuple[float, float]] = field(default_factory=list)  # no samples from, to
    #: the host's job ends the agent saw in this chip's span (from its history store)
    ends: list[StoredEnd] = field(default_factory=list)
    trend: Trend | None = None
    forecast: Forecast | None = None
    #: the detector's own assessments as they changed (time, step, assessment): what
    #: pooling the chips of a job replays (emptied once it has: nothing draws them)
    said: list = field(default_factory=list, repr=False)

    @property
    def verdict(self) -> str:
        return self.assessment.verdict.value

    @property
    def restarts(self) -> list[JobSpan]:
        return self.jobs[1:]

    @property
    def ended_at_oom(self) -> bool:
        """Whether the chip's last job ran out of HBM where its samples end, judged as
        ``tpumon analyze`` judges it (after its alert, a bucket's peak all but full in the
        last job, or the floor plus the in-step swing at capacity): the report drew such a chip's
        last forecast as an OOM still to come, where analyze said the trace ended at one."""
        if self.alert is None:
            return False
        full = np.flatnonzero((self.floor_times >= self.alert["time"]) &
                              (self.peaks >= FULL_FRACTION * self.total))  # as analyze asks
        return stopped_at_oom(self.assessment, True,
                              float(self.floor_times[full[0]]) if full.size else None)

    @property
    def growth(self) -> str:
        a = self.assessment
        return describe_growth(a.slope_bytes_per_step, a.slope_bytes_per_hour)

    def steps_at(self, moments: Sequence[float], slack: float = 0.0) -> list[float | None]:
        """The training step at each of ``moments`` (nearest sample with a step), within
        the data (give or take ``slack`` seconds); the series is read once for them all."""
        if not self.has_steps:
            return [None for _ in moments]
        c = self.series.load()
        known = ~np.isnan(c.steps)
        times, steps = c.times[known], c.steps[known]
        out: list[float | None] = []
        for t in moments:
            if not self.start - slack <= t <= self.end + slack:
                out.append(None)
                continue
            i = int(np.clip(times.searchsorted(t), 0, len(times) - 1))
            if i > 0 and abs(times[i - 1] - t) < abs(times[i] - t):
                i -= 1
            out.append(float(steps[i]))
        return out


@dataclass
class HostReport:
    host: str
    chips: list[ChipReport]
    source: str
    version: str
    generated_at: float
    start: float = field(init=False)
    end: float = field(init=False)
    #: the worker id as the agent knows it (its config, TPU_WORKER_ID, tpu-env), when told:
    #: noted in its history store, or given with `tpumon report --worker`
    worker_id: str | None = None

    def __post_init__(self) -> None:
        self.start = min(c.start for c in self.chips)
        self.end = max(c.end for c in self.chips)

    @property
    def worker(self) -> str | None:
        """The worker id the agent gave, else the host name's: TPU VM host names end in
        '-w-N', N the worker of the slice. None when neither says."""
        if self.worker_id:
            return self.worker_id
        match = re.search(r"-w-(\d+)$", self.host)
        return match.group(1) if match else None

    @property
    def samples(self) -> int:
        return sum(c.samples for c in self.chips)


# ---------------------------------------------------------------------------- replay


END_MARGIN_SECONDS = 600.0  # an end noticed this long after a chip's last sample is its own


def _chip_sort_key(chip: str) -> tuple:
    return (0, int(chip), "") if chip.isdigit() else (1, 0, chip)


def build_reports(series: Mapping[tuple[str, str], SeriesSource], source: str, version: str,
                  generated_at: float, settings: DetectorSettings | None = None,
                  ends: Sequence[StoredEnd] = (),
                  replayed: Callable[[int], None] | None = None) -> list[HostReport]:
    """One report per host, in host order, chips in numeric order: :func:`host_reports`
    all at once."""
    return sorted(host_reports(series, source, version, generated_at, settings, ends,
                               replayed), key=lambda r: r.host)


def host_reports(series: Mapping[tuple[str, str], SeriesSource], source: str, version: str,
                 generated_at: float, settings: DetectorSettings | None = None,
                 ends: Sequence[StoredEnd] = (),
                 replayed: Callable[[int], None] | None = None) -> Iterator[HostReport]:
    """One report per host, chips in numeric order, job by job (:func:`group_jobs`: a slice,
    or a host; jobs in the order of their first host name, a job's hosts in order): each
    job's chips are replayed and pooled, then its hosts' reports are given, so a caller
    that draws each and lets it go holds one job's reports at a time. Series without
    samples are left out. ``ends``: job ends the agent kept (docs/job-ends.md), marked on
    their host's chips. ``replayed`` is told each chip's samples once its replay is done
    (a progress bar). A series may be spilled (:func:`tpumon.detect.replay.spilled_path`):
    each is read when it is replayed and let go of after, so memory holds one series at a
    time."""
    by_job: dict[str, list[tuple[str, str, SeriesSource]]] = {}
    named = group_jobs(key for key, columns in series.items() if columns.samples)
    for (host, chip), columns in series.items():
        if columns.samples:
            by_job.setdefault(named[host, chip], []).append((host, chip, columns))
    for job, members in sorted(by_job.items(), key=lambda j: min(h for h, _, _ in j[1])):
        chips: list[tuple[ChipReport, SeriesSource]] = []
        for host, chip, columns in members:
            report = chip_report(host, chip, columns, settings)
            report.ends = [e for e in ends if e.host == host
                           and report.start <= e.time <= report.end + END_MARGIN_SECONDS]
            chips.append((report, columns))
            if replayed is not None:
                replayed(columns.samples)
        if len(chips) > 1:
            pool_reports(job, chips)
        by_host: dict[str, list[ChipReport]] = {}
        for report, _ in chips:
            report.said = []  # what pooling replays, and nothing draws: let go
            by_host.setdefault(report.host, []).append(report)
        for host, reports in sorted(by_host.items()):
            yield HostReport(host, sorted(reports, key=lambda c: _chip_sort_key(c.chip)),
                             source, version, generated_at)


def chip_report(host: str, chip: str, series: SeriesSource,
                settings: DetectorSettings | None = None) -> ChipReport:
    """One chip's report: ``series`` read (``load``) and replayed; what the report keeps
    of it is bounded whatever its length (envelope bins, buckets, fits)."""
    columns = series.load()
    times = np.asarray(columns.times, dtype=float)
    steps = np.asarray(columns.steps, dtype=float)
    used = np.asarray(columns.used, dtype=float)
    totals = np.asarray(columns.total, dtype=float)
    detector = ChipDetector(settings)
    said: list[tuple[float, float, Assessment]] = []
    detector.log = said
    job_starts: dict[float, float | None] = {}  # job start -> trend start (as last seen)
    jumps: dict[tuple[float, float], Jump] = {}
    for a, b in _slices(times):
        detector.update(times[a:b], steps[a:b], used[a:b], totals[a:b])
        job = detector.job
        if job is not None:
            job_starts[job.start] = job.trend_start
            for j in job.jumps:
                jumps[(j.time, j.size)] = j
    assessment = detector.assessment
    end = float(times[-1])
    total = float(totals[-1])
    jobs = _jobs(job_starts, end, times, steps)
    width = detector.width or 60.0
    groups = group_by_bucket(times, steps, used, width)
    floor_times = groups.ids * width
    known = ~np.isnan(steps)
    report = ChipReport(
        host, chip, len(times), float(times[0]), end, total, assessment, detector.alert,
        *_envelope(times, used, gap_seconds(times, settings or DetectorSettings())),
        floor_times.astype(float), groups.floor, groups.peak, jobs,
        sorted(jumps.values(), key=lambda j: j.time),
        _excursions(floor_times, groups.floor, groups.peak, jobs, total),
        _timeline(float(times[0]), end, [(t, a.verdict.value) for t, _, a in said]),
        series, bool(known.any()), said=said)
    report.gaps = gaps(times, settings or DetectorSettings())
    report.trend = _trend(report)
    report.forecast = _forecast(report)
    return report


def pool_reports(job: str, chips: Sequence[tuple[ChipReport, SeriesSource]]) -> None:
    """Share evidence between the chips of one job, as the agent and ``tpumon analyze`` do
    (:mod:`tpumon.detect.pooling`): each chip's verdict over time, alert, final assessment,
    trend and forecast become the pooled ones, so the report says what they say."""
    reports = [r for r, _ in chips]
    pooled = replay_pooling(job, [r.said for r in reports], [c for _, c in chips])
    final = pool_job(job, {str(i): r.assessment for i, r in enumerate(reports)})
    for i, r in enumerate(reports):
        r.assessment, r.alert = final[str(i)], pooled.alerts.get(i)
        r.verdicts = _timeline(r.start, r.end, pooled.verdicts[i])
        r.trend = _trend(r)
        r.forecast = _forecast(r)


def _timeline(start: float, end: float,
              said: Sequence[tuple[float, str]]) -> list[tuple[float, float, str]]:
    """(from, to, verdict) spans from the verdicts said at moments, merged where equal;
    before the first moment the detector had too little data."""
    out: list[tuple[float, float, str]] = []
    since, verdict = start, Verdict.INSUFFICIENT_DATA.value
    for moment, now in said:
        if now != verdict:
            moment = min(max(moment, start), end)
            if moment > since:
                out.append((since, moment, verdict))
            since, verdict = moment, now
    out.append((since, end, verdict))
    return out


def _slices(times: np.ndarray) -> Iterable[tuple[int, int]]:
    """Index ranges of consecutive time slices of SLICE_SECONDS, or longer for long
    series, so that a series is replayed in at most MAX_SLICES updates."""
    span = float(times[-1] - times[0])
    width = max(SLICE_SECONDS, span / MAX_SLICES)
    edges = times[0] + width * np.arange(1, math.ceil(span / width) + 1)
    bounds = np.unique(np.r_[0, times.searchsorted(edges, side="right"), len(times)])
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def _jobs(starts: dict[float, float | None], end: float, times: np.ndarray,
          steps: np.ndarray) -> list[JobSpan]:
    ordered = sorted(starts.items())
    out = []
    for i, (start, trend_start) in enumerate(ordered):
        until = ordered[i + 1][0] if i + 1 < len(ordered) else end
        k = min(int(times.searchsorted(start)), len(times) - 1)
        step = steps[k]
        # the detector dates a job from its first bucket's start; the job's first sample
        # is where it is seen to begin
        first = max(start, float(times[k]))
        out.append(JobSpan(first, trend_start, until, None if math.isnan(step) else float(step)))
    return out


def gap_seconds(times: np.ndarray, settings: DetectorSettings) -> float:
    """How long a time without samples is a gap: the detector's restart gap, or several
    poll intervals where polls are slower than that."""
    dt = np.diff(times)
    return max(settings.restart_gap_seconds, 3 * float(np.median(dt)) if len(dt) else 0.0)


def gaps(times: np.ndarray, settings: DetectorSettings) -> list[tuple[float, float]]:
    """Times without samples (runtime gone, agent down), :func:`gap_seconds` or longer."""
    dt = np.diff(times)
    gap = gap_seconds(times, settings)
    return [(float(times[i]), float(times[i + 1])) for i in np.flatnonzero(dt >= gap)]


def _envelope(times: np.ndarray, used: np.ndarray, gap: float,
              most: int = ENVELOPE_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Min and max of the raw samples per time bin: every sample's extent, at the cost of
    a few thousand points whatever the length of the series.

    A bin without a sample of its own, between two samples closer than ``gap`` (polls
    sparser than the bins), spans the two samples around it: the series passes through it,
    and a band of isolated one-bin islands would be drawn zero pixels wide. Bins inside a
    gap of ``gap`` seconds or more are NaN: a time without samples is drawn as a gap."""
    bins = max(1, min(most, len(times) // SAMPLES_PER_BIN))
    t0, t1 = float(times[0]), float(times[-1])
    width = max((t1 - t0) / bins, 1e-9)
    ids = np.minimum(((times - t0) / width).astype(np.int64), bins - 1)
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    centres = t0 + (np.arange(bins) + 0.5) * width
    low = np.full(bins, np.nan)
    high = np.full(bins, np.nan)
    low[ids[first]] = np.minimum.reduceat(used, first)
    high[ids[first]] = np.maximum.reduceat(used, first)
    empty = np.flatnonzero(np.isnan(low))
    after = times.searchsorted(t0 + empty * width)  # the first sample after the bin
    inside = (after > 0) & (after < len(times))
    empty, after = empty[inside], after[inside]
    near = times[after] - times[after - 1] < gap
    empty, after = empty[near], after[near]
    around = np.vstack([used[after - 1], used[after]]).astype(float)
    low[empty], high[empty] = around.min(axis=0), around.max(axis=0)
    return centres, low, high


def _excursions(times: np.ndarray, floors: np.ndarray, peaks: np.ndarray, jobs: list[JobSpan],
                total: float) -> list[Excursion]:
    """Buckets, in each job's trend phase, whose peak stands far above the job's usual
    sawtooth, or whose floor drops far below its neighbours' (and comes back)."""
    out: list[Excursion] = []
    margin = EXCURSION_MIN_FRACTION * total
    for job in jobs:
        if job.trend_start is None:
            continue
        sel = np.flatnonzero((times >= job.trend_start) & (times < job.end))
        if len(sel) < 16:
            continue
        f, p = floors[sel], peaks[sel]
        transient = p - f
        usual = float(np.median(transient))
        for i in np.flatnonzero(transient > max(EXCURSION_FACTOR * usual, usual + margin)):
            out.append(Excursion(float(times[sel[i]]), float(p[i])))
        # a drop: the floor far below the lower of the floors just before and after
        around = np.minimum(np.r_[f[:1], f[:-1]], np.r_[f[1:], f[-1:]])
        for i in np.flatnonzero(f < around - margin):
            out.append(Excursion(float(times[sel[i]]), float(f[i]), drop=True))
    return sorted(out, key=lambda e: e.time)


def _trend(r: ChipReport) -> Trend | None:
    """The fitted floor over the evidence window, with the 95 % band of its slope."""
    a = r.assessment
    slope, slope_low, slope_high = (a.slope_bytes_per_second, a.slope_bytes_per_second_low,
                                    a.slope_bytes_per_second_high)
    if a.window_start is None or a.floor_bytes is None \
            or slope is None or slope_low is None or slope_high is None:
        return None
    now = a.window_start + (a.window_seconds or 0.0)
    level = a.floor_bytes
    inside = [j for j in r.jumps if a.window_start <= j.time <= now]
    knots = [t for j in inside for t in (j.time - 1e-3, j.time)]
    times = np.unique(np.r_[np.linspace(a.window_start, now, 64), knots])
    straight = level + slope * (times - now)
    # the detector fits floors with the jumps taken out: put them back, if that matches the
    # floors (a step change) better than one straight line (a staircase, whose jumps are
    # its growth and are in the slope already)
    shifted = straight - _later_jumps(inside, times)
    with_jumps = bool(inside) and _misfit(r, shifted, times) < _misfit(r, straight, times)
    value = shifted if with_jumps else straight
    low = value + (slope_low - slope) * (times - now)
    high = value + (slope_high - slope) * (times - now)
    return Trend(times, value, np.minimum(low, high), np.maximum(low, high), now, level,
                 with_jumps)


def _later_jumps(jumps: list[Jump], times: np.ndarray) -> np.ndarray:
    """Sum of the sizes of the jumps after each time (what correcting for them added)."""
    out = np.zeros(len(times))
    for j in jumps:
        out += np.where(times < j.time, j.size, 0.0)
    return out


def _misfit(r: ChipReport, model: np.ndarray, times: np.ndarray) -> float:
    sel = (r.floor_times >= times[0]) & (r.floor_times <= times[-1])
    if not sel.any():
        return math.inf
    return float(np.mean(np.abs(r.floors[sel] - np.interp(r.floor_times[sel], times, model))))


def _forecast(r: ChipReport) -> Forecast | None:
    a, trend = r.assessment, r.trend
    if a.predicted_oom_time is None or trend is None:
        return None
    limit = r.total - (a.transient_bytes or 0.0)
    return Forecast(trend.now, trend.level, a.predicted_oom_time, a.predicted_oom_step,
                    limit, a.predicted_oom_time_low, a.predicted_oom_time_high)


# ---------------------------------------------------------------------------- input


def series_from_rows(rows: Iterable[TraceRow]) -> dict[tuple[str, str], SeriesColumns]:
    """Trace rows (e.g. the history store's, as ``tpumon export`` reads them) as arrays
    per (host, chip) series, in order of first appearance."""
    lists: dict[tuple[str, str], tuple[list, list, list, list]] = {}
    for r in rows:
        key = (r.host, r.chip)
        columns = lists.get(key)
        if columns is None:
            columns = lists[key] = ([], [], [], [])
        columns[0].append(r.time)
        columns[1].append(math.nan if r.step is None else r.step)
        columns[2].append(r.hbm_used_bytes)
        columns[3].append(r.hbm_total_bytes)
    return {key: SeriesColumns(np.array(t, dtype=float), np.array(s, dtype=float),
                               np.array(u, dtype=np.int64), np.array(n, dtype=np.int64))
            for key, (t, s, u, n) in lists.items()}


def selection(hosts: Iterable[str] = (), chips: Iterable[str] = (),
              since: float = -math.inf, until: float = math.inf) -> Keep:
    """The rows of a series (or of a part of it) that the report selects: those of the
    given hosts and chips (all when empty) in [since, until]; None for another's series.
    What :func:`select` cuts, and what a trace is spilled through (``Spill``'s ``keep``)."""
    hosts, chips = set(hosts), set(chips)

    def keep(key: tuple[str, str], c: SeriesColumns) -> SeriesColumns | None:
        host, chip = key
        if (hosts and host not in hosts) or (chips and chip not in chips):
            return None
        if since > -math.inf or until < math.inf:
            inside = (c.times >= since) & (c.times <= until)
            c = SeriesColumns(*(column[inside] for column in c))
        return c
    return keep


def select(series: Mapping[tuple[str, str], SeriesColumns], hosts: Iterable[str] = (),
           chips: Iterable[str] = (), since: float = -math.inf,
           until: float = math.inf) -> dict[tuple[str, str], SeriesColumns]:
    """The series of the given hosts and chips (all when empty), cut to [since, until];
    series left without samples are dropped."""
    keep = selection(hosts, chips, since, until)
    out = {}
    for key, c in series.items():
        kept = keep(key, c)
        if kept is not None and len(kept.times):
            out[key] = kept
    return out
