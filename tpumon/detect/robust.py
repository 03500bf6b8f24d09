"""Sen's slope with its confidence interval and the Mann-Kendall trend test, in one pass.

Both are built on the same n(n-1)/2 pairwise differences, so computing them together
costs one gather instead of three (scipy.stats.theilslopes and a separate Kendall test
would each redo the pairs), and a fit of a window's recent part reuses them too. Robust
by construction: a sawtooth, eval bumps or a few wild floors move a median of pairwise
slopes very little, unlike least squares.

Order statistics come from numpy's vectorised sort, which at these sizes (tens to a few
thousand values) beats ``np.partition``; they are the same values (should both +0.0 and
-0.0 occur, which floors never give, a zero's sign may differ).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


@dataclass(frozen=True, slots=True)
class TrendFit:
    """A robust line through (x, y): slope with a 95% interval, level at ``x_ref``, MK z."""

    slope: float
    slope_low: float
    slope_high: float
    level: float  # the fitted value at x_ref
    z: float  # Mann-Kendall statistic, normalised; > 0 means increasing
    n: int


def median(values: np.ndarray) -> float:
    """The median by sorting: np.median's generality costs more than the work here."""
    n = len(values)
    half = n // 2
    ordered = values.copy()
    ordered.sort()
    if n % 2:
        return float(ordered[half])
    return float(ordered[half - 1] + ordered[half]) / 2.0


def lower_quartiles(values: np.ndarray, bounds: Sequence[int]) -> list[float]:
    """Lower quartiles of the consecutive parts ``values[bounds[i]:bounds[i + 1]]``: one
    copy, each part sorted in place."""
    ordered = values.copy()
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        part = ordered[a:b]
        part.sort()
        out.append(part.item((b - a - 1) // 4))
    return out


CACHED_PAIRS = 64  # the HBM fits' sizes (fit_points): reused every fit, 32 KB at most
WINDOW_POINTS = 256  # the count trends' windows (CountSettings.max_points): one table for all


def _differences(xy: np.ndarray) -> np.ndarray:
    """``xy[j] - xy[i]`` for every pair i < j, ordered by i, then j.

    The HBM fits' small sizes have their index pairs cached. The count trends' windows
    (65 to 256 points, sizes drifting as they thin) take theirs from one table for
    WINDOW_POINTS points: the pairs among its last n points are the table's last pairs
    (as in :meth:`PairwiseSlopes.tail`), so the points go at the end of a buffer of
    WINDOW_POINTS and the table's suffix indexes it. Built afresh for each fit, the index
    arrays would take ~1 MiB of new memory a fit, and new pages cost more than the
    arithmetic."""
    n = len(xy)
    if CACHED_PAIRS < n <= WINDOW_POINTS:
        i, j = _window_pairs()
        skip = WINDOW_POINTS - n
        padded = np.empty(WINDOW_POINTS, xy.dtype)
        padded[skip:] = xy
        first = _pairs_before(skip, WINDOW_POINTS)
        return padded.take(j[first:]) - padded.take(i[first:])
    i, j = _cached_pairs(n) if n <= CACHED_PAIRS else _index_pairs(n)
    return xy.take(j) - xy.take(i)  # take: a fraction of fancy indexing's overhead


def _pairs_before(start: int, n: int) -> int:
    """How many of the pairs of ``n`` points (ordered by their first point) begin before
    point ``start``."""
    return start * (n - 1) - start * (start - 1) // 2


@lru_cache(maxsize=CACHED_PAIRS)
def _cached_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return _index_pairs(n)


@lru_cache(maxsize=1)
def _window_pairs() -> tuple[np.ndarray, np.ndarray]:
    """The pairs of WINDOW_POINTS points as 16-bit indices: 128 KiB, made at the first
    count trend's fit (take casts them as it reads)."""
    i, j = np.triu_indices(WINDOW_POINTS, k=1)
    return i.astype(np.int16), j.astype(np.int16)


def _index_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(n, k=1)
    return i.astype(np.intp, copy=False), j.astype(np.intp, copy=False)


def mk_variance(n: int) -> float:
    """Var(S) of the Mann-Kendall statistic without ties (floors are rarely tied)."""
    return n * (n - 1) * (2 * n + 5) / 18.0


def sen_mann_kendall(x: np.ndarray, y: np.ndarray, x_ref: float) -> TrendFit | None:
    """Fit y ~ x robustly; None when fewer than 3 points or no two distinct x values."""
    return PairwiseSlopes(x, y).fit(x_ref) if len(x) >= 3 else None


class PairwiseSlopes:
    """The n(n-1)/2 pairwise differences of points (x, y), pairs in order of x (time or
    step), that Sen's slope and the Mann-Kendall test are both built on. x and y are
    float64 arrays.

    Pairs are ordered by their first point, so the pairs among the points from ``start``
    on are a suffix of them: a fit over the recent part of a window (is growth still
    going on?) reuses the differences instead of gathering them again.
    """

    __slots__ = ("n", "dx", "dy", "_x", "_y")

    def __init__(self, x: np.ndarray, y: np.ndarray, dx: np.ndarray | None = None,
                 dy: np.ndarray | None = None) -> None:
        self.n, self._x, self._y = len(x), x, y
        if dx is None or dy is None:
            # (x, y) as one complex array: one gather of 16-byte points and one subtraction
            # give both differences, exactly (complex subtraction is the two real ones)
            xy = np.empty(self.n, complex)
            xy.real, xy.imag = x, y
            d = _differences(xy)
            dx, dy = d.real, d.imag
        self.dx, self.dy = dx, dy

    def tail(self, start: int) -> PairwiseSlopes:
        """The pairs among points ``start``.. only (views, nothing recomputed)."""
        first = _pairs_before(start, self.n)
        return PairwiseSlopes(self._x[start:], self._y[start:], self.dx[first:],
                              self.dy[first:])

    def sen(self) -> tuple[float, float, float] | None:
        """Sen's slope with its 95% interval (low, high); None when fewer than 3 points or
        no two distinct x values."""
        return self._sen(self._sorted_slopes()) if self.n >= 3 else None

    def fit(self, x_ref: float) -> TrendFit | None:
        """Sen's slope and interval, the level at ``x_ref`` and the Mann-Kendall z."""
        if self.n < 3:
            return None
        slopes = self._sorted_slopes()
        sen = self._sen(slopes)
        if sen is None:
            return None
        slope, low, high = sen
        s = self._sign_sum(slopes)
        z = 0.0 if s == 0 else (s - math.copysign(1.0, s)) / math.sqrt(mk_variance(self.n))
        level = median(self._y - slope * (self._x - x_ref))
        return TrendFit(slope, low, high, level, z, self.n)

    def _sorted_slopes(self) -> np.ndarray:
        """The slopes of the pairs with distinct x, in order."""
        dx, dy = self.dx, self.dy
        if np.minimum.reduce(dx) > 0:  # x strictly increasing, as in every fit: all pairs
            slopes = dy / dx
        else:
            valid = dx > 0
            slopes = dy[valid] / dx[valid]
        slopes.sort()
        return slopes

    def _sen(self, slopes: np.ndarray) -> tuple[float, float, float] | None:
        """Sen's slope and interval from the sorted slopes; None if there are none."""
        m = len(slopes)
        if m == 0:
            return None
        # Sen's interval: ranks of the ordered slopes around the median (as scipy computes it).
        c = Z_95 * math.sqrt(mk_variance(self.n))
        lo = max(int(round((m - c) / 2.0)) - 1, 0)
        hi = min(int(round((m + c) / 2.0)), m - 1)
        mid_lo, mid_hi = (m - 1) // 2, m // 2
        item = slopes.item  # a Python float, without the numpy scalar in between
        return (item(mid_lo) + item(mid_hi)) / 2.0, item(lo), item(hi)

    def _sign_sum(self, slopes: np.ndarray) -> float:
        """The Mann-Kendall S: the sum of sign(dy) over all pairs. When every pair has a
        slope (dx > 0) and none is 0 or NaN, each slope has the sign of its dy, so one
        binary search in the sorted slopes counts them instead of a pass over dy."""
        m = len(slopes)
        if m == len(self.dy) and not math.isnan(slopes.item(-1)):
            below = int(slopes.searchsorted(0.0))
            if below == m or slopes.item(below) > 0:
                return float(m - 2 * below)
        return float(np.sign(self.dy).sum())
