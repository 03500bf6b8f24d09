"""Chips of one job share evidence: an SPMD program leaks alike on every chip it runs on.

Each chip's detector decides on its own evidence, so a leak on one rank only (rank 0
keeping logs, say) is still caught alone. But when some chips of a job are called
``leak``, a chip of the same job whose own floor grows alike is taken to be leaking too,
on weaker evidence of its own than a chip alone would need: its growth must be significant
at 95 % (the lower bound of its slope interval above zero, where a chip alone needs a
Mann-Kendall z of 4) and of the same size (its own estimate at least half the leaking
chips' median rate, its interval's lower end at most twice it: a healthy chip whose cache
still fills, at a quarter of a one-rank leak's rate, does not join it at that rate). It
then gets the job's rate and its own forecast (its floor, its largest transient, its
capacity). So the chips of a job that grow alike get one verdict,
and the reason says so ("all 16 chips of job 4242 grow; this one 39.1 KiB/step", each
chip's own figures, as every view shows them beside it); chips that do not
keep their own.

A job's leak may be a staircase (jumps that keep coming, ``Assessment.level_jumps`` of a
leak): a chip of the job whose floor rose in the very same stairs, flat between them, has
a trend of ~0 and its own verdict ``step_change``, and its growth is no evidence of joining
at all. It joins when it climbs one leaking chip's staircase: its own permanent jumps, at
least two, are each one of that chip's stairs, within a floor envelope in time (both
chips' detectors call that one moment) and of its size (half to twice, as rates join),
and that chip's stairs between its first jump and its last (not at either, and of a step
change's size: smaller jumps a step change does not list) are each one of its own. One
rank's staircase does not pull in chips whose jumps, if any, came at other moments or at
other sizes, nor chips that share only some of its stairs: a rank whose floor climbs a
staircase beside the job's two step changes counts them as stairs too, and the chips
that rose in those two alone do not leak. Another rank's staircase neither keeps a chip
out nor lets it in.

A job is what the caller knows: the agent groups chips by the process that holds them,
``tpumon analyze`` by slice (a host name less its ``-w-N`` worker suffix). Pure and
deterministic: the pooled verdicts are a function of the chips' assessments at one moment,
so the agent (every poll) and ``analyze`` (at every moment an assessment changed) agree.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections import defaultdict
from typing import Iterable, Mapping, Sequence

import numpy as np

from tpumon.common.describe import describe_growth
from tpumon.detect.verdict import (Assessment, DetectorSettings, Verdict, oom_forecast,
                                   slope_fields)
from tpumon.detect.jumps import Jump
from tpumon.detect.robust import median
from tpumon.common.describe import describe_oom, time_to_oom

#: The smallest jump a step change lists, as a share of HBM (the detector's setting).
_STEP_CHANGE_FRACTION = DetectorSettings.step_change_min_fraction


def pool_jobs(assessments: Mapping[str, Assessment],
              job_of: Mapping[str, str]) -> dict[str, Assessment]:
    """The assessments with evidence shared within each job (``job_of``: chip -> job name;
    chips without a job, and jobs of one chip, are left as they are)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for chip in assessments:
        job = job_of.get(chip)
        if job is not None:
            groups[job].append(chip)
    pooled = dict(assessments)
    for job, chips in groups.items():
        if len(chips) > 1 and any(assessments[c].verdict is Verdict.LEAK for c in chips):
            pooled.update(pool_job(job, {c: assessments[c] for c in chips}))
    return pooled


def pool_job(job: str, chips: Mapping[str, Assessment]) -> dict[str, Assessment]:
    """One job's chips with evidence shared (see the module docstring)."""
    leaks = [a for a in chips.values() if _evidence(a)]
    if not leaks:
        return dict(chips)
    rate = median(np.array([a.slope_bytes_per_second or 0.0 for a in leaks]))
    stairs = Stairs(leaks)
    leaking = {c for c, a in chips.items() if _pooled_leak(a, rate, stairs)}
    shared = JobLeak(job, leaks, rate, len(leaking), len(chips))
    return {c: shared.assessment(a) if c in leaking else a for c, a in chips.items()}


class JobLeak:
    """What a job's leaking chips say, lent to each chip whose pooled verdict is leak:
    ``leaks`` (its chips whose own verdict is leak, at a rate), their median ``rate``, and
    how many of the job's ``chips`` are ``leaking`` (pooled). What several chips share
    (the span of the leaks' intervals, their growth) is worked out once, when first used."""

    def __init__(self, job: str, leaks: Sequence[Assessment], rate: float, leaking: int,
                 chips: int) -> None:
        self.job, self.leaks, self.rate = job, leaks, rate
        self.leaking, self.chips = leaking, chips
        self._interval: tuple[float, float] | None = None

    def interval(self) -> tuple[float, float]:
        """The slowest and the fastest of the leaks' intervals: a joined chip's."""
        if self._interval is None:  # (functools.cached_property locks: slower, per poll)
            self._interval = (min(b.slope_bytes_per_second_low or self.rate for b in self.leaks),
                              max(b.slope_bytes_per_second_high or self.rate for b in self.leaks))
        return self._interval

    def assessment(self, a: Assessment) -> Assessment:
        """A chip's pooled assessment, its pooled verdict being leak: the job's rate if its
        own verdict is not leak; the reason says how many of the job's chips leak."""
        if a.verdict is not Verdict.LEAK:
            a = _joined(a, self.rate, self.interval())
        if self.leaking == self.chips:
            # the chip's own figures, as the views show them beside the reason; the job's
            # median rate is what it forecasts with only where it joined (_joined)
            own = describe_growth(a.slope_bytes_per_step, a.slope_bytes_per_hour)
            return dataclasses.replace(a, reason=f"all {self.chips} chips of {self.job} grow; "
                                       f"this one {own}; {_oom_in(a)}")
        return dataclasses.replace(
            a, reason=f"{a.reason} ({self.leaking} of {self.chips} chips of {self.job})")


def _evidence(a: Assessment) -> bool:
    """Whether a chip lends its rate to its job: its own verdict is leak, at a rate."""
    return a.verdict is Verdict.LEAK and bool(a.slope_bytes_per_second)


def _pooled_leak(a: Assessment, rate: float, stairs: Stairs) -> bool:
    """Whether a chip's pooled verdict is leak, its job's leaking chips growing at ``rate``
    (``stairs``: their staircases' jumps)."""
    return a.verdict is Verdict.LEAK or _grows_alike(a, rate) or (
        _may_climb(a) and stairs.has_all(a))


class Stairs:
    """The stairs of a job's staircase leaks (``Assessment.level_jumps`` of its chips whose
    own verdict is leak at a rate): all of them at once, and each leak's own; sorted when
    first asked (most polls of a job no step change may join)."""

    def __init__(self, leaks: Iterable[Assessment]) -> None:
        self._leaks: Iterable[Assessment] | None = leaks
        self._all = _Staircase([])
        self._each: list[_Staircase] = []

    def has_all(self, a: Assessment) -> bool:
        """Whether a chip climbs one leaking chip's stairs: each of its own jumps is one of
        them, and each of them between its first jump and its last is one of its own
        (``_Staircase.none_missed``). Another rank's staircase, of its own or at other
        times, neither keeps it out nor lets it in."""
        if self._leaks is not None:
            leaks, self._leaks = [b for b in self._leaks if b.level_jumps], None
            self._all = _Staircase([(j, b) for b in leaks for j in b.level_jumps])
            self._each = [_Staircase([(j, b) for j in b.level_jumps]) for b in leaks]
        span = a.envelope_seconds or 0.0
        jumps = a.level_jumps
        if not jumps or not self._all.has_each(jumps, span):
            return False  # (all the leaks' stairs at once: most chips stop here, cheaply)
        # a step change lists only jumps of a step change's size (1 % of HBM); a leak's
        # stairs smaller than that are no stairs it could show
        least = _STEP_CHANGE_FRACTION * (a.total_bytes or 0.0)
        return any(leak.has_each(jumps, span) and leak.none_missed(jumps, span, least)
                   for leak in self._each)


class _Staircase:
    """Stairs sorted by time, each with its leaking chip's envelope span."""

    def __init__(self, stairs: list[tuple[Jump, Assessment]]) -> None:
        ordered = sorted((j.time, j.size, b.envelope_seconds or 0.0) for j, b in stairs)
        self.times = [t for t, _, _ in ordered]
        self.sizes = [s for _, s, _ in ordered]
        self.spans = [e for _, _, e in ordered]
        self.widest = max(self.spans, default=0.0)

    def has_each(self, jumps: Sequence[Jump], span: float) -> bool:
        """Whether each of a chip's ``jumps`` is one of these stairs (``span``: its
        envelope)."""
        return bool(self.times) and all(self._has(j, span) for j in jumps)

    def _has(self, jump: Jump, span: float) -> bool:
        reach = max(span, self.widest)
        lo = bisect.bisect_left(self.times, jump.time - reach)
        hi = bisect.bisect_right(self.times, jump.time + reach)
        return any(self._alike(i, jump, span) for i in range(lo, hi))

    def none_missed(self, jumps: Sequence[Jump], span: float, least: float) -> bool:
        """Whether each of these stairs of ``least`` bytes or more, between a chip's first
        jump and its last (not one moment with either: ``span``, its envelope), is one of
        its ``jumps``."""
        first, last = min(j.time for j in jumps), max(j.time for j in jumps)
        lo = bisect.bisect_right(self.times, first)
        hi = bisect.bisect_left(self.times, last)
        return all(any(self._alike(i, j, span) for j in jumps) for i in range(lo, hi)
                   if self.sizes[i] >= least
                   and first + max(span, self.spans[i]) < self.times[i]
                   < last - max(span, self.spans[i]))

    def _alike(self, i: int, jump: Jump, span: float) -> bool:
        """Whether stair ``i`` and a chip's ``jump`` are one moment (within the wider of
        the two chips' envelopes) and of one size (half to twice)."""
        return (abs(self.times[i] - jump.time) <= max(span, self.spans[i])
                and self.sizes[i] / 2 <= jump.size <= 2 * self.sizes[i])


def _may_climb(a: Assessment) -> bool:
    """A step change (flat between permanent jumps, at least two) that may join a job's
    staircase leak whose jumps its own are (``Stairs.has_all``)."""
    return (a.verdict is Verdict.STEP_CHANGE and len(a.level_jumps) >= 2
            and a.floor_bytes is not None and a.total_bytes is not None
            and a.window_start is not None and a.window_seconds is not None)


def _grows_alike(a: Assessment, rate: float) -> bool:
    """A fitted chip whose growth is significant at 95 % and the size of the job's: its
    interval within twice the job's rate, its own estimate at least half of it."""
    return _may_join(a) and _joins_at(a, rate)


def _may_join(a: Assessment) -> bool:
    """A fitted chip (not itself a leak) whose growth is significant at 95 %: it joins a
    leak of its job whose rate is of its size (``_joins_at``)."""
    low, high, own = (a.slope_bytes_per_second_low, a.slope_bytes_per_second_high,
                      a.slope_bytes_per_second)
    return (a.verdict in (Verdict.OK, Verdict.GROWING, Verdict.STEP_CHANGE) and low is not None
            and high is not None and own is not None and low > 0
            and a.floor_bytes is not None and a.total_bytes is not None
            and a.window_start is not None and a.window_seconds is not None)


def _joins_at(a: Assessment, rate: float) -> bool:
    """Whether a chip that may join (``_may_join``) grows at the size of ``rate``: its
    interval's lower end within twice it, its own estimate at least half of it."""
    low, own = a.slope_bytes_per_second_low, a.slope_bytes_per_second
    assert low is not None and own is not None
    return low <= 2 * rate and own >= rate / 2


def _joined(a: Assessment, rate: float, interval: tuple[float, float]) -> Assessment:
    """``a`` as a leak at the job's rate: its own headroom over that rate."""
    assert a.total_bytes is not None and a.floor_bytes is not None
    assert a.window_start is not None and a.window_seconds is not None
    now = a.window_start + a.window_seconds
    headroom = max(a.total_bytes - (a.transient_bytes or 0.0) - a.floor_bytes, 0.0)
    steps_per_second = _steps_per_second(a)
    slowest, fastest = interval
    forecast = oom_forecast(now, math.nan if a.step is None else a.step, headroom / rate,
                            a.window_seconds, steps_per_second)
    fields: dict = {**forecast, **slope_fields(rate, slowest, fastest, steps_per_second)}
    joined = dataclasses.replace(a, verdict=Verdict.LEAK, **fields)
    # its own figures, as every view shows them beside the reason (tpumon.common.describe)
    growth = describe_growth(joined.slope_bytes_per_step, joined.slope_bytes_per_hour)
    how = f"grows {growth} like the job's leaking chips" if _may_join(a) else \
        f"rose in the same jumps as the job's leaking chips ({growth})"
    return dataclasses.replace(joined, reason=f"floor {how}; {_oom_in(joined)}")


def _steps_per_second(a: Assessment) -> float | None:
    """The chip's training steps per second, from any of its slopes given per second and
    per step (a step change's own trend may be exactly flat: its interval's ends are not)."""
    for per_s, per_step in ((a.slope_bytes_per_second, a.slope_bytes_per_step),
                            (a.slope_bytes_per_second_low, a.slope_bytes_per_step_low),
                            (a.slope_bytes_per_second_high, a.slope_bytes_per_step_high)):
        if per_s and per_step:
            return per_s / per_step
    return None


def _oom_in(a: Assessment) -> str:
    return describe_oom(time_to_oom(a)) or "no OOM forecast"


class JobPool:
    """A job's pooled verdicts, kept as its chips' own assessments change one at a time:
    what :func:`pool_job` says of them at each moment, decided without building the pooled
    assessments, which only an alert (its reason and forecast) needs. A replay of a slice
    of hundreds of chips has tens of thousands of moments; ``pool_job`` at each rebuilt
    every leaking chip's assessment, chips x moments dataclass copies (most of the replay's
    time on one slice). Chips are named by their index; the job's chips are those said so
    far, as ``pool_job`` of the assessments said so far."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.chips: dict[int, Assessment] = {}  # each chip's own assessment, first said first
        self._evidence: dict[int, Assessment] = {}  # own leaks with a rate (``_evidence``)
        self._rates: list[float] = []  # their rates, sorted: the median is the job's rate
        self._own_leaks: set[int] = set()
        self._may_join: set[int] = set()  # ``_may_join``: join at a rate their size
        self._climbs: set[int] = set()  # ``_may_climb``: join a staircase theirs
        self._leaked: set[int] = set()  # chips whose pooled verdict has been leak
        self._last_rate: float | None = None
        self._stairs: Stairs | None = None  # of the evidence; None: to be rebuilt
        self._stairs_seen = True  # whether first_leaks has looked since they changed

    def update(self, chip: int, a: Assessment) -> None:
        """A chip's own assessment changed."""
        was = self.chips.get(chip)
        if was is not None and chip in self._evidence:
            del self._evidence[chip]
            self._rates.remove(was.slope_bytes_per_second)  # type: ignore[arg-type]
            if was.level_jumps:
                self._stairs, self._stairs_seen = None, False
        self.chips[chip] = a
        if _evidence(a):
            self._evidence[chip] = a
            bisect.insort(self._rates, a.slope_bytes_per_second or 0.0)
            if a.level_jumps:
                self._stairs, self._stairs_seen = None, False
        for group, member in ((self._own_leaks, a.verdict is Verdict.LEAK),
                              (self._may_join, _may_join(a)), (self._climbs, _may_climb(a))):
            if member:
                group.add(chip)
            else:
                group.discard(chip)

    def rate(self) -> float | None:
        """The job's rate: the median of its leaking chips' (``pool_job``'s), None if none."""
        rates, n = self._rates, len(self._rates)
        if not n:
            return None
        return rates[n // 2] if n % 2 else (rates[n // 2 - 1] + rates[n // 2]) / 2

    def leaking(self) -> set[int]:
        """The chips whose pooled verdict is leak now."""
        rate = self.rate()
        return {c for c in self._candidates() if self._pooled(c, rate)}

    def _candidates(self) -> Iterable[int]:
        """The chips whose pooled verdict may be leak: their own is, or they may join."""
        return itertools.chain(self._own_leaks, self._may_join, self._climbs)

    def _pooled(self, chip: int, rate: float | None) -> bool:
        """Whether a chip's pooled verdict is leak, the job's rate ``rate``: ``pool_job``'s
        test (``_pooled_leak``)."""
        if rate is None:
            return chip in self._own_leaks
        return _pooled_leak(self.chips[chip], rate, self.stairs())

    def stairs(self) -> Stairs:
        """The jumps of the job's staircase leaks (``pool_job``'s ``Stairs``)."""
        if self._stairs is None:
            self._stairs = Stairs(list(self._evidence.values()))
        return self._stairs

    def first_leaks(self, changed: Sequence[int]) -> list[int]:
        """The chips whose pooled verdict is leak now and never was before, called after
        each moment's changes (``changed``: the chips set since the last call). A chip's
        pooled verdict is a function of its own assessment, the job's rate and its
        staircases' jumps, so only the changed chips can have turned, unless either of
        those changed."""
        rate = self.rate()
        if rate != self._last_rate or not self._stairs_seen:
            self._last_rate, self._stairs_seen = rate, True
            candidates = self._candidates()
        else:
            candidates = changed
        new = [c for c in dict.fromkeys(candidates)
               if c not in self._leaked and self._pooled(c, rate)]
        self._leaked.update(new)
        return new

    def shared(self, leaking: int) -> JobLeak | None:
        """What the job's leaks lend its chips, ``leaking`` of them (pooled) now; None
        where no chip leaks at a rate (``pool_job`` then leaves every chip as it is)."""
        rate = self.rate()
        if rate is None:
            return None
        return JobLeak(self.job, list(self._evidence.values()), rate, leaking,
                       len(self.chips))
