"""Sen's slope with its confidence interval and the Mann-Kendall trend test, in one pass.

Both are built on the same n(n-1)/2 pairwise differences, so computing them together
costs one gather instead of three (scipy.stats.theilslopes and a separate Kendall test
would each redo the pairs). Robust by construction: a sawtooth, eval bumps or a few wild
floors move a median of pairwise slopes very little, unlike least squares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

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
    """The median by partial sort: np.median's generality costs more than the work here."""
    n = len(values)
    half = n // 2
    if n % 2:
        return float(np.partition(values, half)[half])
    part = np.partition(values, (half - 1, half))
    return float(part[half - 1] + part[half]) / 2.0


def lower_quartile(values: np.ndarray) -> float:
    """The 25th percentile (by rank): a level under noise that only ever reads high."""
    q = (len(values) - 1) // 4
    return float(np.partition(values, q)[q])


@lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    i, j = np.triu_indices(n, k=1)
    return i.astype(np.intp), j.astype(np.intp)


def mk_variance(n: int) -> float:
    """Var(S) of the Mann-Kendall statistic without ties (floors are rarely tied)."""
    return n * (n - 1) * (2 * n + 5) / 18.0


def sen_mann_kendall(x: np.ndarray, y: np.ndarray, x_ref: float) -> TrendFit | None:
    """Fit y ~ x robustly; None when fewer than 3 points or no two distinct x values."""
    n = len(x)
    if n < 3:
        return None
    i, j = _pairs(n)
    dx = x[j] - x[i]
    dy = y[j] - y[i]
    s = float(np.sign(dy).sum())  # pairs are in order of x (time or step)
    var_s = mk_variance(n)
    z = 0.0 if s == 0 else (s - math.copysign(1.0, s)) / math.sqrt(var_s)
    valid = dx > 0
    slopes = dy[valid] / dx[valid]
    m = len(slopes)
    if m == 0:
        return None
    # Sen's interval: ranks of the ordered slopes around the median (as scipy computes it).
    c = Z_95 * math.sqrt(var_s)
    lo = max(int(round((m - c) / 2.0)) - 1, 0)
    hi = min(int(round((m + c) / 2.0)), m - 1)
    mid_lo, mid_hi = (m - 1) // 2, m // 2
    ordered = np.partition(slopes, sorted({lo, mid_lo, mid_hi, hi}))
    slope = float(ordered[mid_lo] + ordered[mid_hi]) / 2.0
    level = median(y - slope * (x - x_ref))
    return TrendFit(slope, float(ordered[lo]), float(ordered[hi]), level, z, n)
