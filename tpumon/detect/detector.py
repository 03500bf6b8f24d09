"""The streaming leak detector for one chip.

Method (docs/detector.md explains the reasoning):

1. **Floors.** Samples are grouped into buckets of about ``samples_per_bucket`` polls; a
   bucket's minimum is the floor (memory alive across steps), its max minus min the
   transient. Everything below works on floors, never on raw samples.
2. **Jobs.** A step counter going back, or a poll gap after which the floor is far lower,
   starts a new job: memory back at baseline is a restart, not a miracle cure. Each job
   begins with a warm-up (compilation, weights, optimizer state at step 1) that is never
   trend: at least ``warmup_seconds`` and until the floor stops moving.
3. **Jumps.** A persistent level shift of the floor (confirmed on both sides by medians)
   is a jump. Jumps are taken out before fitting the continuous trend; one or two big ones
   are a ``step_change``, a regular series of them a staircase leak.
4. **Trend.** Over the longest recent window in which growth is not accelerating (a leak
   that began mid-run must not be diluted by the flat hours before it), Sen's slope with
   its interval and the Mann-Kendall test on the jump-corrected floors, per second and
   per step. A growth that is slowing down (a cache saturating) is not a leak.
5. **Verdict.** ``leak`` when growth is significant, still going on in the recent half of
   the window, and the floor plus the largest transient seen would reach HBM capacity
   within ``horizon_seconds`` and within ``max_extrapolation`` times the evidence window
   (we do not extrapolate an hour of data to next month).

Pure computation: no clocks, no I/O; the same input always gives the same output.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from tpumon.detect.floors import FloorHistory, group_by_bucket
from tpumon.detect.robust import TrendFit, sen_mann_kendall


class Verdict(str, enum.Enum):
    OK = "ok"
    WARMING_UP = "warming_up"
    LEAK = "leak"
    STEP_CHANGE = "step_change"
    INSUFFICIENT_DATA = "insufficient_data"


@dataclass(frozen=True)
class DetectorSettings:
    """Defaults shared by the agent and ``tpumon analyze``; none is fitted to one workload."""

    samples_per_bucket: int = 32      # polls per floor: enough that one lands between steps
    bucket_min_seconds: float = 60.0
    bucket_max_seconds: float = 180.0  # >= 10 floors in the shortest window, at any poll rate
    warmup_seconds: float = 600.0     # after a (re)start: compiling and loading, not trend
    warmup_max_seconds: float = 3600.0
    min_window_seconds: float = 1800.0  # no trend verdict on less evidence than this
    fit_points: int = 64              # floors per fit (older ones merged): bounded cost
    z_threshold: float = 4.0          # Mann-Kendall; floors are autocorrelated, so strict
    horizon_seconds: float = 7 * 86400.0
    max_extrapolation: float = 6.0    # time to OOM at most this many evidence windows
    restart_gap_seconds: float = 120.0
    restart_drop_fraction: float = 0.05  # floor this much (of HBM) lower after a gap: new job
    jump_sigmas: float = 6.0
    jump_min_fraction: float = 0.002  # of HBM: smaller shifts are treated as trend
    jump_confirm_buckets: int = 5     # at least; more when buckets hold few polls:
    jump_confirm_polls: int = 96      # polls on each side of a level shift to confirm it
    envelope_polls: int = 24          # polls in a lower envelope (a level, under noise)
    step_change_min_fraction: float = 0.01  # of HBM: smaller permanent jumps are just "ok"
    staircase_min_jumps: int = 3
    shape_change_fraction: float = 0.3  # growth per third rising this much: onset inside
    slowdown_fraction: float = 0.15     # growth per third falling this much: saturating


@dataclass(frozen=True)
class Assessment:
    """What the detector says about one chip now; exported, shown and alerted on."""

    verdict: Verdict
    reason: str
    floor_bytes: float | None = None
    transient_bytes: float | None = None
    total_bytes: float | None = None
    slope_bytes_per_second: float | None = None
    slope_bytes_per_second_low: float | None = None
    slope_bytes_per_second_high: float | None = None
    slope_bytes_per_step: float | None = None
    slope_bytes_per_step_low: float | None = None
    slope_bytes_per_step_high: float | None = None
    predicted_oom_time: float | None = None
    predicted_oom_step: float | None = None
    window_start: float | None = None
    window_seconds: float | None = None
    points: int = 0
    z: float | None = None
    jumps: int = 0
    step: float | None = None
    job_start: float | None = None
    restarts: int = 0

    @property
    def slope_bytes_per_hour(self) -> float | None:
        return None if self.slope_bytes_per_second is None else self.slope_bytes_per_second * 3600


@dataclass
class _Job:
    """One run of the training process, from its first sample to a restart."""

    start: float
    trend_start: float | None = None
    history: FloorHistory = field(default_factory=FloorHistory)
    warm_floors: list[float] = field(default_factory=list)
    jumps: list[tuple[float, float, float]] = field(default_factory=list)  # time, step, size
    last_jump_index: int = -1
    appended: int = 0
    transient: float = 0.0
    sigma: float = 0.0
    last_fit: float = -math.inf
    growing: bool = False
    last_floor: float | None = None
    last_step: float = math.nan


@dataclass(frozen=True, slots=True)
class _Bucket:
    start: float
    floor: float
    peak: float
    first_step: float
    last_step: float
    trigger_time: float  # the sample whose arrival closed the bucket
    trigger_step: float


class ChipDetector:
    """Feed with :meth:`update`; read :attr:`assessment` and :attr:`alert`."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.s = settings or DetectorSettings()
        self.width: float | None = None
        self.per_bucket = 1.0  # polls per bucket, from the poll interval
        self.total: float | None = None
        self.alert: dict | None = None  # first leak alert: time, step, predicted OOM then
        self.assessment = Assessment(Verdict.INSUFFICIENT_DATA, "no samples yet")
        self.restarts = 0
        self._pending: list[np.ndarray] = []
        self._open: tuple[int, float, float, float, float] | None = None  # id, floor, peak, first/last step
        self._last: tuple[float, float] | None = None  # time, step of the last sample
        self._job: _Job | None = None
        self._after_break = False

    # ------------------------------------------------------------------ input

    def update(self, times, steps, used, totals) -> None:
        """Add samples (arrays or sequences of equal length; steps NaN where unknown)."""
        t = np.asarray(times, dtype=float)
        if t.size == 0:
            return
        batch = np.vstack([t, np.asarray(steps, dtype=float), np.asarray(used, dtype=float)])
        self.total = float(np.asarray(totals, dtype=float)[-1])
        if self.width is None:
            self._pending.append(batch)
            batch = np.concatenate(self._pending, axis=1)
            if batch.shape[1] < 9:
                return
            self._pending = []
            self.width = self._bucket_width(batch[0, :9])  # the same however samples arrive
        for segment, breaks in self._segments(batch):
            if breaks:
                self._close_open(segment[0, 0], segment[1, 0])
                self._after_break = True
            self._add_segment(segment)

    def _bucket_width(self, times: np.ndarray) -> float:
        """About ``samples_per_bucket`` polls per bucket, in whole minutes where possible."""
        interval = max(float(np.median(np.diff(times))), 1e-3) if len(times) > 1 else 1.0
        width = min(max(interval * self.s.samples_per_bucket, self.s.bucket_min_seconds),
                    self.s.bucket_max_seconds)
        width = float(math.ceil(width / 60.0) * 60.0) if width >= 60 else width
        self.per_bucket = max(width / interval, 1.0)
        return width

    @property
    def _confirm(self) -> int:
        """Buckets on each side of a level shift needed to confirm it as a jump."""
        return max(self.s.jump_confirm_buckets,
                   math.ceil(self.s.jump_confirm_polls / self.per_bucket))

    @property
    def _envelope(self) -> int:
        return max(2, math.ceil(self.s.envelope_polls / self.per_bucket))

    def _segments(self, batch: np.ndarray) -> Iterator[tuple[np.ndarray, bool]]:
        """Split where time jumps ahead by a restart gap or goes back, or the step goes back;
        yields each piece and whether it starts after such a break."""
        t, st = batch[0], batch[1]
        prev_t, prev_st = self._last if self._last else (t[0], math.nan)
        dt = np.diff(np.r_[prev_t, t])
        with np.errstate(invalid="ignore"):
            back = np.diff(np.r_[prev_st, st]) < 0
        cut = (dt >= self.s.restart_gap_seconds) | (dt < 0) | back
        cut[0] |= self._last is None
        self._last = (float(t[-1]), float(st[-1]))
        bounds = np.unique(np.r_[0, np.flatnonzero(cut), len(t)])
        for a, b in zip(bounds[:-1], bounds[1:]):
            yield batch[:, a:b], bool(cut[a])

    def _add_segment(self, seg: np.ndarray) -> None:
        assert self.width is not None
        g = group_by_bucket(seg[0], seg[1], seg[2], self.width)
        for k in range(len(g.ids)):
            bucket_id = int(g.ids[k])
            floor, peak = float(g.floor[k]), float(g.peak[k])
            first_step, last_step = float(g.first_step[k]), float(g.last_step[k])
            if self._open is not None and self._open[0] == bucket_id:
                _, f0, p0, s0, _ = self._open
                self._open = (bucket_id, min(f0, floor), max(p0, peak), s0, last_step)
                continue
            trigger = int(g.first[k])
            self._close_open(float(seg[0, trigger]), float(seg[1, trigger]))
            self._open = (bucket_id, floor, peak, first_step, last_step)

    def _close_open(self, trigger_time: float, trigger_step: float) -> None:
        if self._open is None:
            return
        bucket_id, floor, peak, first_step, last_step = self._open
        self._open = None
        assert self.width is not None
        self._on_bucket(_Bucket(bucket_id * self.width, floor, peak, first_step, last_step,
                                trigger_time, trigger_step))

    # ------------------------------------------------------------------ jobs

    def _on_bucket(self, b: _Bucket) -> None:
        job = self._job
        if job is None or (self._after_break and self._is_restart(job, b)):
            if job is not None:
                self.restarts += 1
            job = self._job = _Job(start=b.start)
        self._after_break = False
        job.last_floor = b.floor
        if not math.isnan(b.last_step):
            job.last_step = b.last_step
        if job.trend_start is None:
            self._warm_up(job, b)
        else:
            self._trend_bucket(job, b)
        self._assess(job, b)

    def _is_restart(self, job: _Job, b: _Bucket) -> bool:
        """A new job: the step went back, or the floor is far below where it was."""
        if b.first_step < job.last_step:  # False when either is unknown (NaN)
            return True
        drop = self.s.restart_drop_fraction * (self.total or 0.0)
        return job.last_floor is not None and b.floor < job.last_floor - drop

    def _warm_up(self, job: _Job, b: _Bucket) -> None:
        """Warm-up ends once it lasted ``warmup_seconds`` and the last floors agree."""
        job.warm_floors.append(b.floor)
        age = b.start - job.start
        recent = job.warm_floors[-2:]
        settled = len(recent) == 2 and max(recent) - min(recent) <= \
            self.s.step_change_min_fraction * (self.total or 0.0)
        if age >= self.s.warmup_seconds and (settled or age >= self.s.warmup_max_seconds):
            job.trend_start = b.start
            job.warm_floors = []
            self._trend_bucket(job, b)

    def _trend_bucket(self, job: _Job, b: _Bucket) -> None:
        job.history.append(b.start, b.last_step, b.floor, b.peak)
        job.appended += 1
        job.transient = max(job.transient, b.peak - b.floor)
        if job.appended % (16 * self._envelope) == 1:
            job.sigma = self._noise(job)
        self._detect_jump(job)

    def _noise(self, job: _Job) -> float:
        """Robust scale of the noise of a level (a lower envelope of ``e`` buckets, as the
        jump test uses): MAD of successive envelope differences around their median (so
        a steady trend is not taken for noise), with a small floor."""
        e = self._envelope
        floors = job.history.recent(65 * e)[2]
        floors = floors[len(floors) % e:]
        diffs = np.diff(floors.reshape(-1, e).min(axis=1))
        spread = 1.4826 * float(np.median(np.abs(diffs - np.median(diffs)))) / math.sqrt(2) \
            if len(diffs) > 4 else 0.0
        return max(spread, 1e-4 * (self.total or 0.0))

    def _jump_threshold(self, job: _Job) -> float:
        return max(self.s.jump_sigmas * job.sigma, self.s.jump_min_fraction * (self.total or 0.0))

    def _detect_jump(self, job: _Job) -> None:
        """A persistent level shift ``k`` buckets back, confirmed on both sides.

        Each side's level is its second-lowest floor, not its median: a bucket in which no
        poll fell between steps reads high (often, and only upwards), so medians of a
        handful of floors see shifts that are not there; a lower envelope does not.
        """
        k = self._confirm
        if job.appended < 2 * k or job.appended - k <= job.last_jump_index + k:
            return
        rows = job.history.recent(2 * k)
        floors = rows[2]
        shift = float(np.partition(floors[k:], 1)[1] - np.partition(floors[:k], 1)[1])
        if abs(shift) > self._jump_threshold(job) and self._is_step(floors, k, shift, self._envelope):
            job.jumps.append((float(rows[0, k]), float(rows[1, k]), shift))
            job.last_jump_index = job.appended - k
            del job.jumps[:-1024]

    @staticmethod
    def _is_step(floors: np.ndarray, k: int, shift: float, e: int) -> bool:
        """Most of the shift happens at the boundary and each side is level (lower
        envelopes of ``e`` buckets): a steep ramp moves as far over k buckets, gradually."""
        def envelope(a: int) -> float:
            return float(floors[max(a, 0):a + e].min())

        step_up = envelope(k) - envelope(k - e)
        left_rise = envelope(k - e) - envelope(0)
        right_rise = envelope(len(floors) - e) - envelope(k)
        return (abs(step_up) >= 0.6 * abs(shift) and step_up * shift > 0
                and abs(left_rise) <= 0.3 * abs(shift) and abs(right_rise) <= 0.3 * abs(shift))

    def _pending_jump(self, job: _Job) -> bool:
        """A shift in the last ``k`` buckets that may yet be confirmed as a jump: until it
        is, a fit would mistake it for steep growth, so no leak is called meanwhile."""
        k, e = self._confirm, self._envelope
        floors = job.history.recent(2 * k)[2]
        thr = self._jump_threshold(job)
        for c in range(max(k, len(floors) - k + 1), len(floors)):
            shift = float(floors[c:].min() - np.partition(floors[c - k:c], 1)[1])
            step_up = float(floors[c:c + e].min() - floors[c - e:c].min())
            if shift > thr and step_up >= 0.6 * shift:
                return True
        return False

    # ------------------------------------------------------------------ assessment

    def _assess(self, job: _Job, b: _Bucket) -> None:
        base = dict(total_bytes=self.total, job_start=job.start, restarts=self.restarts,
                    step=None if math.isnan(b.last_step) else b.last_step,
                    floor_bytes=b.floor)
        if job.trend_start is None:
            self._set(Assessment(Verdict.WARMING_UP, "job starting: compiling and loading", **base), b)
            return
        span = b.start - job.trend_start
        if span < self.s.min_window_seconds:
            self._set(Assessment(Verdict.INSUFFICIENT_DATA,
                                 f"{span / 60:.0f} of {self.s.min_window_seconds / 60:.0f} min of "
                                 "floors since warm-up", transient_bytes=job.transient, **base), b)
            return
        interval = self._refit_interval(job, span)
        if b.start - job.last_fit < interval and self.assessment.verdict not in (
                Verdict.INSUFFICIENT_DATA, Verdict.WARMING_UP):
            return
        job.last_fit = b.start
        self._set(self._fit(job, b, base), b)

    def _refit_interval(self, job: _Job, span: float) -> float:
        """Refit often while something grows, rarely on a flat floor: bounded CPU."""
        assert self.width is not None
        if job.growing:
            return min(max(span / 32, self.width), 600.0)
        return min(max(span / 16, self.width), 1800.0)

    def _set(self, assessment: Assessment, b: _Bucket) -> None:
        self.assessment = assessment
        if assessment.verdict is Verdict.LEAK and self.alert is None:
            self.alert = {"time": b.trigger_time,
                          "step": None if math.isnan(b.trigger_step) else int(b.trigger_step),
                          "predicted_oom_time": assessment.predicted_oom_time,
                          "predicted_oom_step": assessment.predicted_oom_step}

    def _corrected(self, job: _Job, data: np.ndarray) -> np.ndarray:
        """Floors with the jumps taken out, expressed at today's level."""
        if not job.jumps:
            return data[2]
        times = np.array([j[0] for j in job.jumps])
        sizes = np.cumsum([j[2] for j in job.jumps])
        idx = np.searchsorted(times, data[0], side="right")
        offset = np.where(idx > 0, sizes[np.maximum(idx - 1, 0)], 0.0)
        return data[2] - offset + sizes[-1]

    def _choose_window(self, job: _Job, now: float) -> tuple[float, bool]:
        """The longest window, back to the trend start, whose growth does not accelerate;
        and whether growth in it decelerates (saturating, not a leak)."""
        assert job.trend_start is not None
        length = now - job.trend_start
        while True:
            start = now - length
            shorter = length / math.sqrt(2)
            last_try = shorter < self.s.min_window_seconds
            data = job.history.window(start, self.s.fit_points)
            if data.shape[1] < 9:
                return start, False
            y = self._corrected(job, data)
            l1, l2, l3 = (float(np.median(part)) for part in np.array_split(y, 3))
            early, late = l2 - l1, l3 - l2
            # 3 sigma of (l3 - l2) - (l2 - l1) for medians of n/3 floors each
            noise = 3 * 1.25 * job.sigma * math.sqrt(18.0 / len(y))
            change = self.s.shape_change_fraction
            accelerating = late - early > max(noise, change * abs(late))
            if not accelerating or last_try:
                slowing = early - late > max(noise, self.s.slowdown_fraction * early)
                return start, early > 0 and slowing
            length = shorter

    def _fit(self, job: _Job, b: _Bucket, base: dict) -> Assessment:
        now = b.start
        start, decelerating = self._choose_window(job, now)
        data = job.history.window(start, self.s.fit_points)
        y = self._corrected(job, data)
        fit = sen_mann_kendall(data[0], y, now)
        if fit is None:
            return Assessment(Verdict.INSUFFICIENT_DATA, "too few floors", **base)
        window = now - float(data[0, 0])
        jumps = [j for j in job.jumps if j[0] >= data[0, 0]]
        step_fit = self._step_fit(data, y)
        continuous = fit.z >= self.s.z_threshold and fit.slope_low > 0
        stair_rate, stair_step_rate = self._staircase(jumps, now, data)
        if stair_rate and not continuous and not self._significant(data, now):
            stair_rate = stair_step_rate = 0.0
        job.growing = fit.z >= 2.0 or stair_rate > 0
        rate = (fit.slope if continuous else 0.0) + stair_rate
        step_rate = None
        if step_fit is not None:
            step_rate = (step_fit.slope if continuous else 0.0) + stair_step_rate
        elif stair_step_rate:
            step_rate = stair_step_rate
        common = dict(base, floor_bytes=fit.level, transient_bytes=job.transient,
                      slope_bytes_per_second=fit.slope + stair_rate,
                      slope_bytes_per_second_low=fit.slope_low + stair_rate,
                      slope_bytes_per_second_high=fit.slope_high + stair_rate,
                      window_start=float(data[0, 0]), window_seconds=window,
                      points=fit.n, z=fit.z, jumps=len(jumps))
        if step_fit is not None:
            common.update(slope_bytes_per_step=step_fit.slope + stair_step_rate,
                          slope_bytes_per_step_low=step_fit.slope_low + stair_step_rate,
                          slope_bytes_per_step_high=step_fit.slope_high + stair_step_rate)
        if rate > 0 and continuous and not decelerating:
            recent = self._recent_rate(data, y, now) + stair_rate
            if recent < rate:  # forecast from the slower of the window and its recent half
                step_rate = step_rate * recent / rate if step_rate else step_rate
                rate = recent
        if rate > 0 and not decelerating:
            return self._forecast(common, rate, step_rate, fit.level, job, window, b)
        return self._no_leak(job, common, decelerating)

    def _step_fit(self, data: np.ndarray, y: np.ndarray) -> TrendFit | None:
        steps = data[1]
        ok = ~np.isnan(steps)
        if ok.sum() < 9 or np.ptp(steps[ok]) <= 0:
            return None
        return sen_mann_kendall(steps[ok], y[ok], float(steps[ok][-1]))

    def _staircase(self, jumps, now: float, data: np.ndarray) -> tuple[float, float]:
        """Growth per second and per step from a staircase: upward jumps, evenly spaced
        (a retained buffer every N steps), still going on; (0, 0) for anything else."""
        ups = [j for j in jumps if j[2] > 0]
        if len(ups) < self.s.staircase_min_jumps or len(ups) < 0.8 * len(jumps):
            return 0.0, 0.0
        gaps = np.diff([j[0] for j in ups])
        spacing = float(np.median(gaps))
        if spacing <= 0 or float(np.std(gaps)) > 0.5 * float(np.mean(gaps)) \
                or now - ups[-1][0] > 2.5 * spacing:
            return 0.0, 0.0
        span = now - float(data[0, 0])
        total_up = sum(j[2] for j in ups)
        steps = data[1][~np.isnan(data[1])]
        step_span = float(np.ptp(steps)) if len(steps) > 1 else 0.0
        return total_up / span, (total_up / step_span if step_span > 0 else 0.0)

    def _significant(self, data: np.ndarray, now: float) -> bool:
        """Growth of the raw floors (jumps left in) is significant: a staircase must be."""
        raw = sen_mann_kendall(data[0], data[2], now)
        return raw is not None and raw.z >= self.s.z_threshold and raw.slope_low > 0

    @staticmethod
    def _recent_rate(data: np.ndarray, y: np.ndarray, now: float) -> float:
        """The slope over the recent half of the window: growth must still be going on."""
        half = data.shape[1] // 2
        fit = sen_mann_kendall(data[0, half:], y[half:], now)
        if fit is None or fit.slope_low <= 0:
            return 0.0
        return fit.slope

    def _forecast(self, common: dict, rate: float, step_rate: float | None, level: float,
                  job: _Job, window: float, b: _Bucket) -> Assessment:
        total = self.total or 0.0
        headroom = total - job.transient - level
        tto = max(headroom, 0.0) / rate
        oom_time = b.start + tto
        oom_step = None
        if step_rate and step_rate > 0 and not math.isnan(b.last_step):
            oom_step = b.last_step + max(headroom, 0.0) / step_rate
        common = dict(common, predicted_oom_time=oom_time, predicted_oom_step=oom_step)
        if self._pending_jump(job):
            return Assessment(Verdict.OK, "a level shift is being confirmed", **common)
        if tto <= self.s.horizon_seconds and tto <= self.s.max_extrapolation * window:
            per = f"{step_rate / 1e3:.1f} KB/step" if step_rate else f"{rate * 3.6e3 / 1e6:.1f} MB/h"
            return Assessment(Verdict.LEAK, f"floor grows {per}; OOM in {tto / 3600:.1f} h",
                              **common)
        return Assessment(Verdict.OK, f"slow growth: OOM would take {tto / 3600:.0f} h",
                          **common)

    def _no_leak(self, job: _Job, common: dict, decelerating: bool) -> Assessment:
        total = self.total or 0.0
        big = [j for j in job.jumps if j[2] >= self.s.step_change_min_fraction * total]
        if big:
            size = sum(j[2] for j in big)
            return Assessment(Verdict.STEP_CHANGE,
                              f"{len(big)} permanent jump(s), {size / 1e9:.2f} GB in all; flat otherwise",
                              **common)
        why = "growth is slowing down (saturating)" if decelerating else "no significant growth"
        return Assessment(Verdict.OK, why, **common)
