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
   are a ``step_change``; jumps that keep coming, at regular or irregular times, are a
   staircase leak (a jump process with a rate: ``staircase.py``).
4. **Trend.** Over the longest recent window in which growth is not accelerating (a leak
   that began mid-run must not be diluted by the flat hours before it), Sen's slope with
   its interval and the Mann-Kendall test on the jump-corrected floors, per second and
   per step. A growth that is slowing down (a cache saturating) is not a leak.
5. **Verdict.** ``leak`` when growth is significant, still going on in the recent half of
   the window, and the floor plus the transient that recurs would reach HBM capacity
   within ``horizon_seconds`` and within ``max_extrapolation`` times the evidence window
   (we do not extrapolate an hour of data to next month).

Pure computation: no clocks, no I/O; the same input always gives the same output.
"""

from __future__ import annotations

import math
from typing import Iterator, NamedTuple

import numpy as np

from tpumon.common.describe import describe_growth, describe_oom, describe_time_left
from tpumon.detect import jumps as level_shifts
from tpumon.detect.floors import group_by_bucket
from tpumon.detect.job import Job, JobView, floor_noise
from tpumon.detect.robust import (PairwiseSlopes, TrendFit, lower_quartiles, median,
                                  sen_mann_kendall)
from tpumon.detect.saturation import Fill, best_fill
from tpumon.detect.staircase import Staircase, find_staircase
from tpumon.detect.verdict import (Assessment, DetectorSettings, Verdict, leak_alert, moment,
                                   oom_forecast, slope_fields)
from tpumon.common.units import format_bytes


_UNFITTED = (Verdict.INSUFFICIENT_DATA, Verdict.WARMING_UP)
_GROWTH = (Verdict.GROWING, Verdict.LEAK)
_PENDING = "a level shift is being confirmed"
_RESUMING = "samples resume after a gap: a restarted job or the same one, told at the next floor"


class _Said(NamedTuple):
    """What an assessment says; the frozen :class:`Assessment` is built from it only when
    read. Replaying a series sets thousands of assessments that nobody reads, and
    building one costs ~5 us (a frozen dataclass sets its 21 fields one by one)."""

    verdict: Verdict
    reason: str
    fields: dict


class _Bucket(NamedTuple):
    start: float
    floor: float
    peak: float
    first_step: float
    last_step: float
    trigger_time: float  # the sample whose arrival closed the bucket
    trigger_step: float


class _OpenBucket:
    """The bucket still taking samples: later ones may lower its floor or raise its peak."""

    __slots__ = ("bucket_id", "floor", "peak", "first_step", "last_step")

    def __init__(self, bucket_id: int, floor: float, peak: float, first_step: float,
                 last_step: float) -> None:
        self.bucket_id, self.floor, self.peak = bucket_id, floor, peak
        self.first_step, self.last_step = first_step, last_step


class _LastSample(NamedTuple):
    time: float
    step: float


class ChipDetector:
    """Feed with :meth:`update`; read :attr:`assessment` and :attr:`alert`."""

    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.width: float | None = None
        self.per_bucket = 1.0  # polls per bucket, from the poll interval
        self._confirm, self._envelope = self._level_sizes()
        self.total: float | None = None
        self.alert: dict | None = None  # the first leak alert: see _set
        #: the first moment the verdict was growing or leak (time, step): the warning
        self.growing: dict | None = None
        #: with a list here, every assessment as it is set: (time, step, assessment) of the
        #: sample that closed the bucket (``analyze`` pools the chips of a job over these)
        self.log: list[tuple[float, float, Assessment]] | None = None
        self._said = _Said(Verdict.INSUFFICIENT_DATA, "no samples yet", {})
        self._assessment: Assessment | None = None  # built from _said when read
        self.restarts = 0
        self._pending: list[np.ndarray] = []
        self._open: _OpenBucket | None = None
        self._last: _LastSample | None = None
        self._job: Job | None = None
        self._after_break = False

    @property
    def assessment(self) -> Assessment:
        """What the detector says about the chip now. Between samples that resume after a
        gap and the first floor after it, which tells a restarted job from the same one
        going on (``_is_restart``), it does not know, and says so: the verdict from before
        the gap would be raised and dropped a second later (an agent resumed from its
        saved state raised 8 alerts of the last run's job, then said warming_up)."""
        if self._after_break and self._job is not None:
            return Assessment(Verdict.INSUFFICIENT_DATA, _RESUMING,
                              total_bytes=self.total, job_start=self._job.start,
                              restarts=self.restarts)
        if self._assessment is None:
            self._assessment = Assessment(self._said.verdict, self._said.reason,
                                          **self._said.fields)
        return self._assessment

    @property
    def job(self) -> JobView | None:
        """A read-only copy of the current job; None before its first bucket closed."""
        job = self._job
        return None if job is None else JobView(job.start, job.trend_start, tuple(job.jumps))

    # ------------------------------------------------------------------ input

    def update(self, times, steps, used, totals) -> None:
        """Add samples (arrays or sequences of equal length; steps NaN where unknown). A
        sample whose time, usage or capacity is not a finite number is no sample: one NaN in
        a bucket made its floor NaN, and the trend's every fit over it came out flat."""
        if len(times) == 1 and self._extend_open(times[0], steps[0], used[0], totals[0]):
            return
        batch = np.vstack([np.asarray(times, dtype=float), np.asarray(steps, dtype=float),
                           np.asarray(used, dtype=float), np.asarray(totals, dtype=float)])
        finite = np.isfinite(batch[0]) & np.isfinite(batch[2]) & np.isfinite(batch[3])
        if not finite.all():
            batch = batch[:, finite]
        if batch.shape[1] == 0:
            return
        self.total = float(batch[3, -1])
        batch = batch[:3]
        if self.width is None:
            self._pending.append(batch)
            batch = np.concatenate(self._pending, axis=1)
            if batch.shape[1] < 9:
                return
            self._pending = []
            self.width = self._bucket_width(batch[0, :9])  # the same however samples arrive
        for segment, after_break in self._segments(batch):
            if after_break:
                self._close_open(segment[0, 0], segment[1, 0])
                self._after_break = True
            self._add_segment(segment)

    def _extend_open(self, time: float, step: float, used: float, total: float) -> bool:
        """One sample that falls in the open bucket, with no break before it: the agent's
        every poll but about one a minute. It only moves the bucket's floor, peak and last
        step, so this does in plain Python what the batch path does with ~100 us of numpy
        on one-element arrays; False (nothing changed) for anything else."""
        t, st, u = float(time), float(step), float(used)
        if self._open is None or self._last is None or self.width is None \
                or not (math.isfinite(t) and math.isfinite(u) and math.isfinite(total)):
            return False
        last, bucket = self._last, self._open
        if not 0 <= t - last.time < self.settings.restart_gap_seconds or st < last.step \
                or math.floor(t / self.width) != bucket.bucket_id:
            return False
        bucket.floor, bucket.peak, bucket.last_step = min(bucket.floor, u), max(bucket.peak, u), st
        self._last = _LastSample(t, st)
        self.total = float(total)
        return True

    def _bucket_width(self, times: np.ndarray) -> float:
        """About ``samples_per_bucket`` polls per bucket, in whole minutes where possible.
        (robust.median, not np.median: np.median imports numpy.ma, ~0.65 MiB of the
        agent's RSS, for this one call.)"""
        interval = max(median(np.diff(times)), 1e-3)
        cfg = self.settings
        width = min(max(interval * cfg.samples_per_bucket, cfg.bucket_min_seconds),
                    self.settings.bucket_max_seconds)
        width = float(math.ceil(width / 60.0) * 60.0) if width >= 60 else width
        self.per_bucket = max(width / interval, 1.0)
        self._confirm, self._envelope = self._level_sizes()
        return width

    def _level_sizes(self) -> tuple[int, int]:
        """Buckets on each side of a level shift needed to confirm it as a jump, and in a
        lower envelope; fixed with the bucket width, so computed once, not at every fit."""
        confirm = max(self.settings.jump_confirm_buckets,
                      math.ceil(self.settings.jump_confirm_polls / self.per_bucket))
        return confirm, max(2, math.ceil(self.settings.envelope_polls / self.per_bucket))

    def _segments(self, batch: np.ndarray) -> Iterator[tuple[np.ndarray, bool]]:
        """Split where time jumps ahead by a restart gap or goes back, or the step goes back;
        yields each piece and whether it starts after such a break."""
        t, st = batch[0], batch[1]
        prev_t, prev_st = self._last if self._last else _LastSample(t[0], math.nan)
        dt = np.diff(np.r_[prev_t, t])
        with np.errstate(invalid="ignore"):
            back = np.diff(np.r_[prev_st, st]) < 0
        cut = (dt >= self.settings.restart_gap_seconds) | (dt < 0) | back
        cut[0] |= self._last is None
        self._last = _LastSample(float(t[-1]), float(st[-1]))
        starts = np.flatnonzero(cut)  # sorted; not np.unique, which imports numpy.ma
        bounds = np.r_[0, starts[starts > 0], len(t)]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            yield batch[:, a:b], bool(cut[a])

    def _add_segment(self, seg: np.ndarray) -> None:
        """Close every bucket of ``seg`` but the last, which later samples may yet join;
        each is closed by the first sample of the next."""
        assert self.width is not None
        g = group_by_bucket(seg[0], seg[1], seg[2], self.width)
        ids, floors, peaks = g.ids.tolist(), g.floor.tolist(), g.peak.tolist()
        first_steps, last_steps = g.first_step.tolist(), g.last_step.tolist()
        trigger_times, trigger_steps = seg[0, g.first].tolist(), seg[1, g.first].tolist()
        open_bucket = self._open
        if open_bucket is not None and open_bucket.bucket_id == ids[0]:  # it goes on
            first_steps[0] = open_bucket.first_step
            floors[0] = min(open_bucket.floor, floors[0])
            peaks[0] = max(open_bucket.peak, peaks[0])
        else:
            self._close_open(trigger_times[0], trigger_steps[0])
        starts = (g.ids * self.width).tolist()
        # every bucket but the last, which stays open
        for bucket in map(_Bucket._make, zip(starts[:-1], floors, peaks, first_steps, last_steps,
                                             trigger_times[1:], trigger_steps[1:], strict=False)):
            self._on_bucket(bucket)
        self._open = _OpenBucket(ids[-1], floors[-1], peaks[-1], first_steps[-1], last_steps[-1])

    def _close_open(self, trigger_time: float, trigger_step: float) -> None:
        if self._open is None or self.width is None:
            return
        b, self._open = self._open, None
        self._on_bucket(_Bucket(b.bucket_id * self.width, b.floor, b.peak, b.first_step,
                                b.last_step, trigger_time, trigger_step))

    # ------------------------------------------------------------------ jobs

    def _on_bucket(self, b: _Bucket) -> None:
        job = self._job
        if job is None or (self._after_break and self._is_restart(job, b)):
            if job is not None:
                self.restarts += 1
            job = self._job = Job(start=b.start)
        self._after_break = False
        job.last_floors.append(b.floor)
        del job.last_floors[:-self._envelope]
        if not math.isnan(b.last_step):
            job.last_step = b.last_step
        if job.trend_start is None:
            self._warm_up(job, b)
        else:
            self._trend_bucket(job, b)
        if job.trend_start is None or self._fit_due(job, b.start, b.floor):
            self._assess(job, b)  # else, between fits, the last assessment stands

    def _is_restart(self, job: Job, b: _Bucket) -> bool:
        """A new job: the step went back, or the floor is far below where it was: below
        the lower envelope of the last floors, not the last floor alone. The bucket that a
        poll gap cuts short holds few polls, and its floor reads high (no poll between two
        steps) by up to the in-step transient, several GiB: against it, the next floor at
        the level where memory always was would look like a drop, and a gap of a few
        dropped polls would restart the job (warm-up again, its jumps and evidence lost)."""
        if b.first_step < job.last_step:  # False when either is unknown (NaN)
            return True
        drop = self.settings.restart_drop_fraction * (self.total or 0.0)
        return bool(job.last_floors) and b.floor < min(job.last_floors) - drop

    def _warm_up(self, job: Job, b: _Bucket) -> None:
        """Warm-up ends once it lasted ``warmup_seconds``, the last two floors agree and,
        where steps are known, the step has advanced: a process loading its weights and
        compiling sits at step 0 on a plateau well under its training level, and the rise
        when training starts, read as a level shift of the trend, began a staircase with
        the job's next step changes."""
        job.warm_floors.append(b.floor)
        if math.isnan(job.first_step):
            job.first_step = b.first_step
        age = b.start - job.start
        recent = job.warm_floors[-2:]
        settled = len(recent) == 2 and max(recent) - min(recent) <= \
            self.settings.step_change_min_fraction * (self.total or 0.0)
        settled = settled and not b.first_step <= job.first_step  # False when unknown (NaN)
        cfg = self.settings
        if age >= cfg.warmup_seconds and (settled or age >= cfg.warmup_max_seconds):
            job.trend_start = b.start
            job.warm_floors = []
            self._trend_bucket(job, b)

    def _trend_bucket(self, job: Job, b: _Bucket) -> None:
        job.history.append(b.start, b.last_step, b.floor, b.peak)
        job.appended += 1
        job.note_transient(b.peak - b.floor, self.settings.transient_recurrences)

    # ------------------------------------------------------------------ level shifts

    def _jump_threshold(self, job: Job) -> float:
        cfg = self.settings
        return max(cfg.jump_sigmas * job.sigma, cfg.jump_min_fraction * (self.total or 0.0))

    def _drop_threshold(self, job: Job) -> float:
        """The smallest drop that is a level shift. Until a dozen envelopes measure the
        noise of levels, a jump's threshold is its floor, a fraction of a percent of HBM,
        and a drop must clear the scatter of single floors instead: on floors that
        scattered by a GiB, drops of a third of one were found in the first hours, and a
        drop taken out of the trend is a rise put into it (a flat chip paged). A rise keeps
        the low bar: a step change early in the job, missed, would read as growth."""
        if job.sigma_measured:
            return self._jump_threshold(job)
        return max(self._jump_threshold(job), self.settings.jump_sigmas * job.scatter)

    def _step_change_size(self) -> float:
        """The smallest permanent jump reported as a step change (bytes); also the smallest
        stair of a burst (``jumps.scan``)."""
        return self.settings.step_change_min_fraction * (self.total or 0.0)

    def _update_jumps(self, job: Job) -> None:
        """Refresh the noise scale and scan the boundaries that arrived since the last fit."""
        k, e = self._confirm, self._envelope
        if job.appended >= job.sigma_due:  # the noise scale changes slowly: refresh it rarely
            recent = job.history.recent(65 * e)[2]
            job.sigma = level_shifts.level_noise(recent, e, 1e-4 * (self.total or 0.0))
            job.scatter = max(job.sigma, floor_noise(recent))
            job.sigma_measured = len(recent) >= 13 * e  # a dozen envelope differences
            job.sigma_due = job.appended + 16 * e
        # the tests look back k buckets from the first new boundary, and a rise of several
        # stairs a window further
        rows, first, start = self._kept_since(job, job.scanned, 2 * k)
        last = int(rows[0].searchsorted(job.jumps[-1].time)) if job.jumps else -1
        found, next_local = level_shifts.scan(rows[0], rows[1], self._detrended(job, rows),
                                              first, k, e, self._jump_threshold(job), last,
                                              self._step_change_size(), self._early(job),
                                              max(first - k, 0), self._drop_threshold(job))
        job.scanned = start + next_local
        job.add_jumps(found)

    def _update_transients(self, job: Job) -> None:
        """Look for rises-and-returns in the floors since the last look: only on a chip
        where a staircase may have begun (``_early``), the first time over the whole
        history kept, so a chip without stairs costs nothing."""
        k, e = self._confirm, self._envelope
        big = max(self._jump_threshold(job), self._step_change_size())
        rows, first, start = self._kept_since(job, job.transients_scanned, e)
        longest, next_local = level_shifts.longest_transient(
            self._detrended(job, rows), first, e, big / 2, 4 * k)
        job.transients_scanned = start + next_local
        job.longest_transient = max(job.longest_transient, longest)

    @staticmethod
    def _kept_since(job: Job, scanned: int, look_back: int) -> tuple[np.ndarray, int, int]:
        """For an incremental scan that goes on from bucket ``scanned`` (an index counted
        from the job's first bucket, as the scans' bookmarks are), looking ``look_back``
        buckets behind it: the kept floors from there on (rows time, step, floor, peak),
        where ``scanned`` is in them, and the index of their first bucket (the scan's next
        bookmark is that plus the position it returns)."""
        oldest = job.appended - len(job.history)  # the oldest kept bucket
        begin = max(scanned - look_back - oldest, 0)
        return (job.history.recent(len(job.history) - begin), scanned - oldest - begin,
                oldest + begin)

    def _early(self, job: Job) -> int:
        """Buckets that confirm a rise of a step change's size on this chip, once a
        staircase may have begun (at least two such jumps: the next one calls it): twice
        the chip's longest rise-and-return so far and two more (the level after a shift is
        the second-lowest floor: two floors back at the old level unmask a transient), at
        least two envelopes (the step and the level after it are envelopes of their own),
        at most the full confirmation. A chip whose floor has never risen and come back
        confirms sooner; one where an eval's buffers stay for twenty minutes waits for
        forty and more. Before two stairs, the full window: a shorter one finds jumps in a
        steady leak's scattered floors and takes them out of its trend, so linear leaks are
        called later. Brings the chip's longest rise-and-return up to date when it is
        needed."""
        k, e = self._confirm, self._envelope
        least = self._step_change_size()
        if sum(j.size >= least for j in job.jumps) < self.settings.staircase_min_jumps - 1:
            return k
        self._update_transients(job)
        return min(max(2 * job.longest_transient + 2, 2 * e), k)

    @staticmethod
    def _detrended(job: Job, rows: np.ndarray) -> np.ndarray:
        """Floors less the trend of an established leak: a steady leak is then level and a
        step still stands out. Not before: an unconfirmed step would itself be the trend."""
        if not len(rows[0]) or job.slope <= 0 or not job.leaking:
            return rows[2]
        return rows[2] - job.slope * (rows[0] - rows[0, -1])

    # ------------------------------------------------------------------ assessment

    def _assess(self, job: Job, b: _Bucket) -> None:
        base = dict(total_bytes=self.total, job_start=job.start, restarts=self.restarts,
                    step=None if math.isnan(b.last_step) else b.last_step, floor_bytes=b.floor)
        if job.trend_start is None:
            self._set(_Said(Verdict.WARMING_UP, "job starting: compiling and loading", base), b)
            return
        span = b.start - job.trend_start
        if span < self.settings.min_window_seconds:
            self._set(_Said(Verdict.INSUFFICIENT_DATA,
                            f"{span / 60:.0f} of "
                            f"{self.settings.min_window_seconds / 60:.0f} min of "
                            "floors since warm-up", dict(base, transient_bytes=job.transient)), b)
            return
        job.last_fit = b.start
        self._update_jumps(job)
        self._set(self._fit(job, b, base), b)

    def _fit_due(self, job: Job, now: float, floor: float) -> bool:
        """Whether a bucket at ``now``, in the trend phase, is assessed: at every bucket
        until a fit gave a verdict; then refit often while something grows, rarely on a
        flat floor (bounded CPU), unless its floor rose clear of the last fit's level
        (a leak that starts on a flat floor is not left unseen for up to an hour)."""
        assert job.trend_start is not None and self.width is not None
        span = now - job.trend_start
        if span < self.settings.min_window_seconds or self._said.verdict in _UNFITTED \
                or floor > job.rise_limit:
            return True
        if job.growing:
            interval = min(max(span / 16, self.width), 600.0)
        else:
            interval = min(max(span / 4, self.width), 3600.0)
        return now - job.last_fit >= interval

    def _set(self, said: _Said, b: _Bucket) -> None:
        self._said, self._assessment = said, None
        if self.log is not None:
            self.log.append((b.trigger_time, b.trigger_step, self.assessment))
        if said.verdict in _GROWTH and self.growing is None:
            self.growing = moment(b.trigger_time, b.trigger_step)
        if said.verdict is Verdict.LEAK and self.alert is None:
            # when it fired, and what was forecast and measured then: a post-mortem holds
            # the forecast against the OOM that came
            self.alert = leak_alert(b.trigger_time, b.trigger_step, self.assessment)

    def _choose_window(self, job: Job, now: float) -> tuple[float, bool]:
        """The longest window, back to the trend start, whose growth neither accelerates
        (a leak that began mid-run must not be diluted by flat hours before it) nor slows
        down, and whether growth in it slows down (a cache saturating, not a leak).

        Halving from the trend start; a window that slows down but whose last third still
        grows is halved too (a cache that filled early in the job must not hide growth
        that began since; one whose last third is flat is a cache that filled), down to the
        minimum window, where slowing down is the verdict. Once halved, the window one and
        a half times as long is tried: halving alone could leave half the evidence out."""
        assert job.trend_start is not None
        data = job.history.window(job.trend_start, 4096)
        y_all = job.corrected(data)
        length, rejected = now - job.trend_start, False
        while True:
            shape = self._shape(job, y_all[data[0].searchsorted(now - length):])
            if shape is None:
                return now - length, False
            accelerating, slowing, growing = shape
            if (accelerating or (slowing and growing)) and \
                    length / 2 >= self.settings.min_window_seconds:
                length, rejected = length / 2, True
                continue
            if rejected and not (accelerating or slowing):
                longer = self._shape(job, y_all[data[0].searchsorted(now - 1.5 * length):])
                if longer is not None and not (longer[0] or longer[1]):
                    length *= 1.5
            return now - length, slowing

    def _shape(self, job: Job, y: np.ndarray) -> tuple[bool, bool, bool] | None:
        """Whether the growth of floors ``y`` accelerates, whether it slows down, and
        whether its last third still grows (beyond noise), from the levels of its thirds;
        None with fewer than 9 floors."""
        if len(y) < 9:
            return None
        third = len(y) // 3
        bounds = (0, third, len(y) - third, len(y))
        # levels of the thirds as lower quartiles: floors only ever read high
        l1, l2, l3 = lower_quartiles(y, bounds)
        # per floor between where each level sits on a straight line (a part's lower
        # quartile is its ((size - 1) // 4)-th floor, counted from its end where the
        # floors fall): the middle third is a floor or two longer when the floors do not
        # divide by three, and on 13 floors a line's levels stepped by 5 floors' growth,
        # then 4: a leak read as growth slowing down by a fifth
        falling = l3 < l1
        p1, p2, p3 = ((b - 1 - (b - a - 1) // 4) if falling else (a + (b - a - 1) // 4)
                      for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        span = (p3 - p1) / 2
        early, late = (l2 - l1) * span / (p2 - p1), (l3 - l2) * span / (p3 - p2)
        # about 3 sigma of (l3 - l2) - (l2 - l1) for levels of n/3 floors each, from the
        # scatter of single floors (with few polls per bucket, floors read high often: far
        # noisier than the envelopes that ``job.sigma`` measures; both are refreshed
        # together, rarely)
        noise = 3 * 1.25 * job.scatter * math.sqrt(18.0 / len(y))
        accelerating = late - early > max(noise, self.settings.shape_change_fraction * abs(late))
        slowing = not accelerating and early > 0 and \
            early - late > max(noise, self.settings.slowdown_fraction * early)
        return accelerating, slowing, late > noise

    def _fit(self, job: Job, b: _Bucket, base: dict) -> _Said:
        now = b.start
        start, decelerating = self._choose_window(job, now)
        data, fit, recent = self._window_fit(job, start, now)
        if fit is None:
            return _Said(Verdict.INSUFFICIENT_DATA, "too few floors", base)
        first = data.item(0, 0)
        window = now - first
        in_window = [j for j in job.jumps if j.time >= first]
        # hysteresis: a leak is called at z >= z_threshold, and stays one while its growth
        # is significant at 95 % (the interval above zero): one refit on a shorter window
        # that falls below z 4 must not resolve an alert and raise it again a bucket later
        continuous = fit.slope_low > 0 and (job.leaking or fit.z >= self.settings.z_threshold)
        start = job.trend_start if job.trend_start is not None else first
        since = [j for j in job.jumps if j.time >= start]
        stairs = find_staircase(since, now, self.settings.staircase_min_jumps)
        if stairs and not continuous and not self._significant(
                job.history.window(now - stairs.span_seconds, self.settings.fit_points), now):
            stairs = None
        stair = stairs.growth if stairs else 0.0
        stair_low, stair_high = stairs.growth_interval if stairs else (0.0, 0.0)
        self._plan_refits(job, fit, stair)
        job.slope = fit.slope if continuous else 0.0
        steps_per_second = self._step_rate(data)
        common = dict(base, floor_bytes=fit.level, transient_bytes=job.transient,
                      window_start=first, window_seconds=window, points=fit.n,
                      z=fit.z, jumps=len(in_window),
                      level_jumps=tuple(j for j in since if j.size > 0) if stairs else (),
                      envelope_seconds=self._envelope * (self.width or 0.0),
                      **slope_fields(fit.slope + stair, fit.slope_low + stair_low,
                                     fit.slope_high + stair_high, steps_per_second))
        rate = (fit.slope if continuous else 0.0) + stair
        if rate > 0 and continuous and not decelerating:
            rate = min(rate, self._recent_rate(recent, job.leaking, fit.slope) + stair)
        if decelerating and stair > 0 and not job.leaking:
            # what slows is the growth between the stairs (a cache filling early in the
            # job); the staircase itself goes on, so it alone is the leak's rate
            rate = stair
        if rate > 0 and (not decelerating or job.leaking or stair > 0):
            said = self._forecast(common, rate, steps_per_second, fit.level, job, data, b,
                                  stairs if stair and not continuous else None)
            if said.reason == _PENDING and stairs and continuous and self._significant(
                    job.history.window(now - stairs.span_seconds, self.settings.fit_points),
                    now):
                # the trend's call waits for a rise to be confirmed as a jump (it would pass
                # for steep growth); the staircase's rate counts confirmed jumps only, so it
                # is called on its own meanwhile
                alone = dict(common, **slope_fields(stair, stair_low, stair_high,
                                                    steps_per_second))
                said = self._forecast(alone, stair, steps_per_second, fit.level, job, data,
                                      b, stairs)
            return said
        job.leaking = False
        return self._no_leak(job, common, decelerating)

    def _plan_refits(self, job: Job, fit: TrendFit, stair: float) -> None:
        """How soon the next fit comes (``_fit_due``). Often while the floor grows
        (significant at 95 %) fast enough to fill HBM within the horizon, or a staircase
        goes on, not only once it is a leak: a leak that starts mid-run sits just short of
        z 4 for a fit or two, and the hourly refits of a flat floor would hold its call back
        by an hour (slower growth could not become a leak so soon). On a floor counted flat,
        as soon as a bucket's floor rises clear of this fit's level."""
        headroom = (self.total or 0.0) - job.transient - fit.level
        job.growing = stair > 0 or (
            fit.slope_low > 0 and headroom < fit.slope * self.settings.horizon_seconds)
        job.rise_limit = math.inf if job.growing else fit.level + self._jump_threshold(job)

    def _window_fit(self, job: Job, start: float, now: float) -> tuple[
            np.ndarray, TrendFit | None, tuple[float, float, float] | None]:
        """Floors from ``start`` on, their fit, and Sen's slope of their recent half;
        narrowed to the recent half while that half grows significantly faster than the
        whole (its slope interval above the whole's): the growth began inside the window,
        and the flat floors before it would dilute its rate. The shape test of
        ``_choose_window`` compares levels of thirds, which scattered floors blur; this
        compares the fits' own 95 % intervals."""
        while True:
            data = job.history.window(start, self.settings.fit_points)
            pairs = PairwiseSlopes(data[0], job.corrected(data))
            fit = pairs.fit(now)
            half = pairs.n // 2
            recent = pairs.tail(half).sen() if fit is not None else None
            if fit is None or recent is None or recent[1] <= fit.slope_high or \
                    now - data.item(0, half) < self.settings.min_window_seconds:
                return data, fit, recent
            start = data.item(0, half)

    @staticmethod
    def _step_rate(data: np.ndarray) -> float | None:
        """Training steps per second over the window; None without step numbers."""
        steps = data[1]
        if math.isnan(steps.item(0)) or math.isnan(steps.item(-1)):  # else known at both ends
            known = (~np.isnan(steps)).nonzero()[0]
            if len(known) < 2:
                return None
            a, b = int(known[0]), int(known[-1])
        else:
            a, b = 0, len(steps) - 1
        elapsed = data.item(0, b) - data.item(0, a)
        rate = (data.item(1, b) - data.item(1, a)) / elapsed if elapsed > 0 else 0.0
        return rate if rate > 0 else None

    def _significant(self, data: np.ndarray, now: float) -> bool:
        """Growth of the raw floors (jumps left in) is significant: a staircase must be."""
        raw = sen_mann_kendall(data[0], data[2], now)
        return raw is not None and raw.z >= self.settings.z_threshold and raw.slope_low > 0

    @staticmethod
    def _recent_rate(sen: tuple[float, float, float] | None, leaking: bool,
                     whole: float) -> float:
        """The slope over the recent half of the window (Sen's, with its interval), where
        growth must still be going on. To call a leak, the recent half grows significantly
        at 95 %, or it grows and its interval reaches the whole window's rate ``whole``:
        nothing says the growth slowed. (A half window of a dozen floors scattered by slow
        polls is rarely significant on its own, so a steep leak's call waited for more
        floors; a cache that did stop is told apart by the window's shape, and its recent
        slope, the one forecast, is small.) Once called, while the recent half still grows
        (hysteresis)."""
        if sen is None:
            return 0.0
        slope, low, high = sen
        going_on = slope > 0 if leaking else low > 0 or (slope > 0 and high >= whole)
        return slope if going_on else 0.0

    def _forecast(self, common: dict, rate: float, steps_per_second: float | None,
                  level: float, job: Job, floors: np.ndarray, b: _Bucket,
                  stairs: Staircase | None) -> _Said:
        """When floor plus the transient (``Job.note_transient``) reaches capacity, at this rate;
        ``floors``: the fit's window (rows as ``FloorHistory.window``); ``stairs`` when the
        growth is a staircase alone (the reason describes it)."""
        window = b.start - floors.item(0, 0)
        headroom = max((self.total or 0.0) - job.transient - level, 0.0)
        tto = headroom / rate
        fit_only = common
        common = dict(common, **oom_forecast(b.start, b.last_step, tto, window,
                                             steps_per_second))
        if not job.leaking:  # hysteresis: a leak stays one while growth stays significant
            not_yet = self._not_a_leak_yet(job, tto, floors, window, stairs, rate)
            if not_yet:
                # a rise not yet confirmed as a jump is no rate to forecast with: 'ok' beside
                # "OOM in 4.5 h" would tell two stories; the other verdicts say theirs
                return _Said(*not_yet, fit_only if not_yet[1] == _PENDING else common)
            job.leaking = True
        # the reason gives the assessment's own figures (its slope, its forecast), as every
        # view that shows them beside it does (tpumon.common.describe)
        per = describe_growth(common.get("slope_bytes_per_step"),
                              common["slope_bytes_per_second"] * 3600)
        growth = stairs.describe() if stairs else f"floor grows {per}"
        return _Said(Verdict.LEAK, f"{growth}; {describe_oom(tto)}", common)

    def _not_a_leak_yet(self, job: Job, tto: float, floors: np.ndarray, window: float,
                        stairs: Staircase | None, rate: float) -> tuple[Verdict, str] | None:
        """What growth that would OOM in ``tto`` seconds is while it is not (yet) a leak,
        and why; None if it is a leak. Growth that would fill HBM within the horizon, on
        too little evidence yet to page for (it may still be a cache that settles), is
        ``growing``: a warning.

        A rise not yet confirmed as a jump would pass for steep growth in a trend fit, so it
        holds a trend's call back; a staircase's rate counts confirmed jumps only, so such a
        rise (most likely its next step) does not hold it back, and its evidence is the
        whole span of its jumps, not the trend fit's window."""
        if stairs is not None:
            window = max(window, stairs.span_seconds)
        else:
            recent = job.history.recent(2 * self._confirm)
            if level_shifts.pending(self._detrended(job, recent), self._confirm,
                                    self._envelope, self._jump_threshold(job)):
                return Verdict.OK, _PENDING
        if tto > self.settings.horizon_seconds:
            return Verdict.OK, f"slow growth: OOM would take {describe_time_left(tto)}"
        full = f"HBM full in {describe_time_left(tto)} at this rate"
        if tto > self.settings.max_extrapolation * window:
            return Verdict.GROWING, (f"{full}, on {window / 3600:.1f} h of evidence (a cache "
                                     "may yet settle)")
        if stairs is None:
            stalled = self._stalled(job, floors, rate)
            if stalled:
                return Verdict.GROWING, (f"{full}, but the floor grew more slowly in the "
                                         f"last {stalled} (a cache may have filled)")
            fill = self._benign_fill(job, floors)
            if fill is not None:
                return Verdict.GROWING, (f"{full}, but the floor fits a cache filling to "
                                         f"{format_bytes(fill.asymptote)} better than a line")
        return None

    def _benign_fill(self, job: Job, data: np.ndarray) -> Fill | None:
        """A fill under capacity (``saturation.best_fill``) that fits the window's floors
        much better than a line does, if one does: a cache is filling."""
        total = self.total or 0.0
        ceiling = total - job.transient - self.settings.fill_margin_fraction * total
        fill = best_fill(data[0], job.corrected(data), ceiling)
        return fill if fill is not None and fill.f >= self.settings.fill_f_limit else None

    def _stalled(self, job: Job, data: np.ndarray, rate: float) -> str | None:
        """How long the floor has grown slower than ``rate`` (the window's), when it has:
        the last eighth of the window's floors (12 at least) grow significantly slower (Sen's
        95 % interval under it). A cache that filled at the end of a long flat window fits
        a line through the window, and the floors since it filled are flat; a leak's go
        on growing at its rate. Not asked of a window with an upward level shift: a
        staircase is flat between its stairs."""
        if data.shape[1] < 24 or any(
                j.size > 0 and j.time >= data.item(0, 0) for j in job.jumps):
            return None
        k = max(12, data.shape[1] // 8)
        t, y = data[0, -k:], job.corrected(data[:, -k:])
        sen = PairwiseSlopes(t, y).sen()
        if sen is None or sen[2] >= rate:
            return None
        return describe_time_left(t[-1] - t[0])

    def _no_leak(self, job: Job, common: dict, decelerating: bool) -> _Said:
        least = self._step_change_size()
        big = [j for j in job.jumps if j.size >= least]
        if big:
            size = sum(j.size for j in big)
            return _Said(Verdict.STEP_CHANGE,
                         f"{len(big)} permanent jump(s), {format_bytes(size)} in all; "
                         "flat otherwise", dict(common, level_jumps=tuple(big)))
        why = "growth is slowing down (saturating)" if decelerating else "no significant growth"
        return _Said(Verdict.OK, why, common)
