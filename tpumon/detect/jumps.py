"""Level shifts of the floor: a one-off permanent jump is not a leak, nor is a ramp a jump.

A bucket in which no poll fell between two steps reads high (often, and only upwards),
so levels are lower envelopes (the second-lowest floor of ``k`` buckets, the minimum of
``e``), never medians or means. A jump must be large against the noise of such a level,
happen at one boundary, and leave both sides level: a steep but steady ramp moves the
level as far over ``k`` buckets, only gradually, and stays trend.

Scans look only at the boundaries that arrived since the last one, a handful per fit, in
plain Python over lists: at tens of floors numpy's per-call overhead costs more than the
work, and the size of the level shift rules out most boundaries before any envelope is
taken. Floors are finite (bytes, less a finite trend).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tpumon.detect.robust import median


@dataclass(frozen=True, slots=True)
class Jump:
    time: float  # start of the first bucket at the new level
    step: float  # NaN when unknown
    size: float  # bytes, negative for a drop


def level_noise(floors: np.ndarray, e: int, minimum: float) -> float:
    """Noise scale of a lower-envelope level of ``e`` buckets: MAD of successive envelope
    differences around their median (a steady trend is not noise), at least ``minimum``."""
    floors = floors[len(floors) % e:]
    diffs = np.diff(floors.reshape(-1, e).min(axis=1))
    if len(diffs) < 12:  # a MAD of a handful, one of them perhaps the jump, is no estimate
        return minimum
    return max(1.4826 * median(np.abs(diffs - median(diffs))) / math.sqrt(2), minimum)


def _second_lowest(values: list[float]) -> float:
    """The level of a run of floors: one bucket that reads low is not a level."""
    return sorted(values)[1]


def _drop_is_bias(f: list[float], c: int, lo: int, threshold: float) -> bool:
    """Whether a drop at ``c`` is only the levels' unequal lengths: a level is a low order
    statistic, and the second-lowest of a few floors sits far higher in their scatter than
    the second-lowest of ``k``. Where the left side is short (just after the last jump, or
    early in the job), compared with a right side as short, the drop must still be one: on
    floors scattered by a GiB, each stair found was followed by a drop of most of a GiB,
    and a drop taken out of the trend is a rise put into it. (Rises are left as they are:
    the bias only ever hides them.)"""
    return _second_lowest(f[lo:c]) - _second_lowest(f[c:c + (c - lo)]) <= threshold


def _tolist(values: Sequence[float] | np.ndarray) -> list[float]:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def scan(times: Sequence[float], steps: Sequence[float], floors: Sequence[float] | np.ndarray,
         first: int, k: int, e: int, threshold: float, last: int = -1,
         burst_threshold: float = math.inf, early: int = 0,
         origin: int = 0, drop_threshold: float | None = None) -> tuple[list[Jump], int]:
    """Jumps at boundaries ``first``.. ``len - k``: ``k`` buckets confirm the new level on
    the right; on the left, up to ``k`` (fewer early in a job, or soon after the last jump,
    but at least ``e``).

    ``last`` is the boundary of the last jump found (-1: none), in this call or an earlier
    one: the level before a boundary is taken from there on, so a stair that comes less
    than ``k`` buckets after the one before is a jump of its own, measured from the level
    that one left, not skipped and lost.
    Two stairs closer together than ``k`` buckets (a burst) are two jumps when each is
    larger than ``burst_threshold`` as well (see ``_burst``).
    With ``early`` (fewer than ``k`` buckets), a rise larger than ``burst_threshold`` too is
    confirmed once ``early`` buckets stand level after it (see ``_early``).
    A rise of several stairs too close together for either test (``_compound``) is one
    jump; it needs a whole window level before it, so floors from ``origin - k`` on are
    given; the other tests look no further back than ``origin``.
    A drop must exceed ``drop_threshold`` (default ``threshold``): the caller's is larger
    while the noise of levels is not known yet (``ChipDetector._drop_threshold``).
    Returns the jumps found and the next boundary to scan; jumps are at least ``e`` apart.
    """
    f = _tolist(floors)
    drops = threshold if drop_threshold is None else drop_threshold
    first = max(first, origin + e, last + e)
    end = len(f) - k
    if end < first:
        return [], first
    found: list[Jump] = []
    c = first
    while c <= end:
        lo = max(c - k, last, origin)
        # level after minus level before (levels: second-lowest floors, inline as this is
        # the loop that runs once per bucket)
        shift = sorted(f[c:c + k])[1] - sorted(f[lo:c])[1]
        limit = threshold if shift >= 0 else drops
        if abs(shift) <= limit or (shift < 0 and _drop_is_bias(f, c, lo, limit)):
            c += 1
        elif _is_jump(f, c, e, shift, lo, c + k):
            found.append(Jump(float(times[c]), float(steps[c]), shift))
            last = c
            c += e
        else:
            # two stairs with a plateau between them, else a rise of several stairs
            pair = _burst(f, c, k, e, max(threshold, burst_threshold), last, origin) or \
                _compound(f, c, k, e, threshold, burst_threshold, last)
            if pair is None:
                c += 1
                continue
            c1, size1, size2 = pair
            found += [Jump(float(times[c1]), float(steps[c1]), size1),
                      Jump(float(times[c]), float(steps[c]), size2)]
            last = c
            c += e
    if early and early < k:
        c = max(c, first)
        while c <= len(f) - early:
            jump = _early(f, c, k, e, early, max(threshold, burst_threshold), last, origin)
            if jump is None:
                c += 1
                continue
            found.append(Jump(float(times[c]), float(steps[c]), jump))
            last = c
            c += e
    return found, max(end + 1, last + e)


def _early(f: list[float], c: int, k: int, e: int, early: int, threshold: float,
           last: int, origin: int = 0) -> float | None:
    """The size of a rise at ``c`` that ``early`` buckets after it confirm, or None: larger
    than ``threshold``, in one step, level before it and over those buckets.

    A confirmation window is as long as it is so that a shift outlasts the transients
    (buffers held for some minutes) that would otherwise pass for one; the caller gives a
    shorter one only where the chip's own floors showed no transient that long
    (``longest_transient``). A staircase is called at its third confirmed stair, so each
    stair confirmed sooner calls it sooner. Only rises: a drop is no leak's evidence."""
    lo = max(c - k, last, origin)
    shift = _second_lowest(f[c:c + early]) - _second_lowest(f[lo:c])
    if shift <= threshold or not _is_jump(f, c, e, shift, lo, c + early):
        return None
    # a short right side cannot tell a level from a steep ramp by its rise against the
    # shift (a ramp's shift spans the whole left side): the rise over the envelope before
    # the step and over the one after must each be small against the step itself
    step_up = min(f[c:c + e]) - min(f[c - e:c])
    before = min(f[c - e:c]) - min(f[max(c - 2 * e, lo):max(c - e, lo + 1)])
    after = min(f[c + e:c + 2 * e]) - min(f[c:c + e])
    if max(abs(before), abs(after)) > 0.3 * step_up:
        return None
    return shift


def longest_transient(floors: Sequence[float] | np.ndarray, start: int, e: int,
                      threshold: float, limit: int) -> tuple[int, int]:
    """The longest rise-and-return among the floors from ``start`` on, in buckets, and
    where to look next time: a run of floors above the lower envelope of the ``e`` before
    it by more than ``threshold``, which comes back within it. A run still open at the end
    is looked at again (the next start is its own); one that outlasts ``limit`` buckets is
    a permanent shift, not a transient, and is passed over. One bucket that reads high (no
    poll between two steps) is a transient of 1: a shift must outlast those as well."""
    f = _tolist(floors)
    n, i, longest = len(f), max(start, e), 0
    while i < n:
        base = min(f[i - e:i]) + threshold
        if f[i] <= base:
            i += 1
            continue
        j = i + 1
        while j < n and j - i <= limit and f[j] > base:
            j += 1
        if j - i > limit:
            i = j
        elif j == n:
            return longest, i
        else:
            longest, i = max(longest, j - i), j
    return longest, i


def _burst(f: list[float], c2: int, k: int, e: int, threshold: float,
           last: int, origin: int = 0) -> tuple[int, float, float] | None:
    """Two stairs closer together than a confirmation window, the second at ``c2`` (the
    level after it confirmed over ``k`` buckets) and the first at some ``c`` ``2 e`` to
    ``k`` buckets before it: (c, the first stair's size, the second's), or None.

    Stairs that come at random times (recompilations, a cache that never stops growing)
    often come closer together than a confirmation window; each fails the test of a single
    jump (the level after the first rises on, the level before the second is not level),
    and the whole burst would be lost. Each stair must pass the test of a single jump on its
    own size: a sharp step, level on both sides, the side between the two being the plateau
    (at least two envelopes long, so that its start and end are different envelopes). So
    a ramp, however steep or noisy, is not a burst (its plateau and sides rise as much as
    its steps), nor is a buffer held for a while (the level after it falls back).
    ``threshold`` is the size both stairs exceed: the caller's is a step change's, not a
    jump's, as a burst of small stairs (early in a saturating cache, or a staircase of
    hundreds) is growth that the trend measures, and only large stairs, few to the OOM,
    need counting one by one."""
    step2 = min(f[c2:c2 + e]) - min(f[c2 - e:c2])
    if abs(step2) <= threshold:
        return None
    sign = 1.0 if step2 > 0 else -1.0
    right = _second_lowest(f[c2:c2 + k])
    for c in range(max(c2 - k, last + e, origin + e), c2 - 2 * e + 1):
        lo = max(c - k, last, origin)
        middle = _second_lowest(f[c:c2])
        first, second = middle - _second_lowest(f[lo:c]), right - middle
        if sign * first <= threshold or sign * second <= threshold:
            continue
        # each stair a single jump, the plateau between them the right side of the first
        # and the left side of the second
        if _is_jump(f, c, e, first, lo, c2) and _is_jump(f, c2, e, second, c, c2 + k):
            return c, first, second
    return None


def _compound(f: list[float], c2: int, k: int, e: int, threshold: float,
              burst_threshold: float, last: int) -> tuple[int, float, float] | None:
    """A rise that ends at ``c2`` (the level after it confirmed over ``k`` buckets) and
    began at some ``c`` ``e`` to ``k`` buckets before it, in stairs too close together for
    ``_burst`` to tell apart: (c, the first stair's size, the rest), or None.

    Three or more stairs within one confirmation window (a burst of recompilations) fail
    every other test: no boundary has a level on both sides, and the plateaus between them
    are shorter than two envelopes. The rise they made would be lost (no jump, and a
    "saturating" trend: a rise, then flat), though the floor is level for a whole window
    before it and after it. What the floors show is a stair of a step change's size
    (``burst_threshold``) where the rise begins, held, and one where it ends, level at
    once after it: two jumps, the first the level held after the first stair, the second
    the rest (at least two stairs made it; how many more, so few noisy floors do not
    tell). The tests, each against what else rises that far that fast:

    - a whole window level before ``c`` (after the last jump) and after ``c2``, each side
      moving by less than a jump's ``threshold`` and, per bucket, by under a third of the
      rise's own rate: a steady leak's ramp, however its floors scatter, rises on its
      sides at its own rate;
    - a stair at each end, each larger than a step change: a small rise is trend;
    - level at once after the last stair, and no level above the one after it: a cache
      that fills and saturates ends by slowing down, and a buffer held over a step change
      falls back to it;
    - the first stair holds until the last (no floor falls back below it): a buffer
      held and released before a step change is no part of a rise.

    Only rises: a drop is no leak's evidence."""
    right = _second_lowest(f[c2:c2 + k])
    right_floor = min(f[c2:c2 + e])
    last_step = right_floor - min(f[c2 - e:c2])
    if last_step <= max(threshold, burst_threshold) or \
            abs(min(f[c2 + e:c2 + 2 * e]) - right_floor) > 0.3 * last_step or \
            _second_lowest(f[c2:c2 + e]) - right > 0.3 * last_step:
        # the rise must end in a stair of a step change's size, level at once after it: a
        # cache that fills and saturates is one rise too, but it ends by slowing down; and
        # a level above the one after (a buffer held over a step change) is no stair
        return None
    for c in range(max(c2 - k, last + k, k), c2 - e + 1):
        lo = c - k
        size = right - _second_lowest(f[lo:c])
        if size <= max(threshold, burst_threshold):
            continue
        before = min(f[c - e:c])
        step_up = min(f[c:c + e]) - before
        left_rise = before - min(f[lo:lo + e])
        right_rise = min(f[c2 + k - e:c2 + k]) - right_floor
        held = min(f[c:c2])
        # level sides: less than a jump (a fraction of the rise, as a single jump's sides
        # are allowed, let a steady leak's scattered ramp pass) and, per bucket, under a
        # third of the rise's own rate (as _early's ramp test)
        side = 0.3 * size / (c2 - c + e) * (k - e)
        if step_up > max(threshold, burst_threshold) and \
                abs(left_rise) <= min(threshold, side) and \
                abs(right_rise) <= min(threshold, side) and \
                held >= before + step_up - threshold:
            # at least two stairs: the one it begins with, held, and the one it ends with
            first = held - (right - size)
            return c, first, size - first
    return None


def _is_jump(f: list[float], c: int, e: int, shift: float, lo: int, hi: int) -> bool:
    """The level, moving by ``shift`` at boundary ``c``, does so in one step and is level
    on both sides: from ``lo`` to ``c`` and from ``c`` to ``hi``; the size test, which
    rules out most boundaries, is the caller's."""
    size = abs(shift)
    before = min(f[c - e:c])
    step_up = min(f[c:c + e]) - before
    left_rise = before - min(f[lo:lo + e])
    right_rise = min(f[hi - e:hi]) - min(f[c:c + e])
    return (abs(step_up) >= 0.6 * size and step_up * shift > 0
            and abs(left_rise) <= 0.3 * size and abs(right_rise) <= 0.3 * size)


def pending(floors: Sequence[float] | np.ndarray, k: int, e: int, threshold: float) -> bool:
    """A rise in the last ``k`` buckets, already ``e`` buckets long, that may yet be
    confirmed as a jump: until it is, a fit would mistake it for steep growth. (One
    bucket that reads high is noise, not the start of a jump.)"""
    f = _tolist(floors)
    n = len(f)
    for c in range(max(e, n - k + 1), n - e + 1):
        left = f[max(c - k, 0):c]
        shift = _second_lowest(f[c:]) - _second_lowest(left)
        before = min(f[c - e:c])
        step_up = min(f[c:c + e]) - before
        left_rise = before - min(left[:e])
        if shift > threshold and step_up >= 0.6 * shift and abs(left_rise) <= 0.3 * shift:
            return True
    return False
