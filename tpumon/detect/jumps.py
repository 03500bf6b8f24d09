"""Level shifts of the floor: a one-off permanent jump is not a leak, nor is a ramp a jump.

A bucket in which no poll fell between two steps reads high (often, and only upwards),
so levels are lower envelopes (the second-lowest floor of ``k`` buckets, the minimum of
``e``), never medians or means. A jump must be large against the noise of such a level,
happen at one boundary, and leave both sides level: a steep but steady ramp moves the
level as far over ``k`` buckets, only gradually, and stays trend.

Scans are vectorised over all new boundaries at once, so their cost per fit does not
depend on how many buckets arrived since the last one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

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


def _left_padded(values: np.ndarray, width: int, reduce) -> np.ndarray:
    """``out[j] = reduce(values[j - width:j])`` (shorter at the start: padding is +inf)."""
    padded = np.concatenate((np.full(width, np.inf), values))
    return reduce(sliding_window_view(padded, width))


def _second_lowest(windows: np.ndarray) -> np.ndarray:
    return np.partition(windows, 1, axis=1)[:, 1]


def scan(times: np.ndarray, steps: np.ndarray, floors: np.ndarray, first: int, k: int, e: int,
         threshold: float) -> tuple[list[Jump], int]:
    """Jumps at boundaries ``first``.. ``len - k``: ``k`` buckets confirm the new level on
    the right; on the left, up to ``k`` (fewer early in a job, but at least ``e``).

    Returns the jumps found and the next boundary to scan. Accepted jumps are at least
    ``k`` buckets apart (the second would be confirmed by the first one's own buckets).
    """
    n = len(floors)
    first = max(first, e)
    last = n - k
    if last < first:
        return [], first
    level = _left_padded(floors, k, _second_lowest)  # level[j]: floors[j-k:j]
    env = _left_padded(floors, e, lambda w: w.min(axis=1))  # env[j]: floors[j-e:j]
    c = np.arange(first, last + 1)
    shift = level[c + k] - level[c]
    step_up = env[c + e] - env[c]
    left_rise = env[c] - env[np.maximum(c - k + e, e)]
    right_rise = env[c + k] - env[c + e]
    size = np.abs(shift)
    with np.errstate(invalid="ignore"):
        ok = ((size > threshold) & (np.abs(step_up) >= 0.6 * size) & (step_up * shift > 0)
              & (np.abs(left_rise) <= 0.3 * size) & (np.abs(right_rise) <= 0.3 * size))
    found: list[Jump] = []
    next_free = first
    for i in np.flatnonzero(ok):
        if c[i] >= next_free:
            found.append(Jump(float(times[c[i]]), float(steps[c[i]]), float(shift[i])))
            next_free = c[i] + k
    return found, max(last + 1, next_free)


def pending(floors: np.ndarray, k: int, e: int, threshold: float) -> bool:
    """A rise in the last ``k`` buckets, already ``e`` buckets long, that may yet be
    confirmed as a jump: until it is, a fit would mistake it for steep growth. (One
    bucket that reads high is noise, not the start of a jump.)"""
    n = len(floors)
    for c in range(max(e, n - k + 1), n - e + 1):
        left = floors[max(c - k, 0):c]
        shift = float(np.partition(floors[c:], 1)[1] - np.partition(left, 1)[1])
        step_up = float(floors[c:c + e].min() - floors[c - e:c].min())
        left_rise = float(floors[c - e:c].min() - left[:e].min())
        if shift > threshold and step_up >= 0.6 * shift and abs(left_rise) <= 0.3 * shift:
            return True
    return False
