"""Do the floors show a cache filling up under capacity? Then a line through them is no page.

A line through a window of floors reaches capacity whether the growth is a leak or a cache
that will settle: a compile cache, optimizer state built lazily, a prefetch buffer. What
tells them apart is the shape. A cache fills as ``size * (1 - exp(-(t - start) / tau))``,
slowing down as it fills, and settles under capacity; a leak goes on at its rate. So
before a page, the floors of the fit's window are fitted with every such fill: flat until
``start``, then filling with time constant ``tau`` (both from a grid, from a step to a
fill over the whole window), its level and size by least squares. When the best fill fits
the floors much better than the least-squares line (an F statistic of its two more
parameters), and it and every fill that fits about as well settle under the
ceiling (capacity less the in-step transient and a margin), the page waits: the floors
themselves say the growth is settling under capacity.

This asks for evidence of saturation, not for its absence: a leak whose window is a line
fits no fill better than the line, and pages as before. What it costs is the leak whose
window holds a cache filling beside it: its page waits for the cache to fill
(bench/nuisances.py, seeds 1, 3 and 5: the leak families' median leads fell by 0-0.04,
their 10th percentiles by up to 0.15; docs/benchmarks.md, "Session 29").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

#: Time constants tried, in windows: from a step (a fill over a fiftieth of the window) to a
#: window. A fill slower than that bends too little within the window to be told from a
#: leak whose rate changes (with fills up to 30 windows, the rate-change leaks of
#: bench/nuisances.py seed 1 paged at a median lead of 0.66, not 0.69).
_TAUS = np.geomspace(0.02, 1.0, 20)
#: Where in the window the fill starts (flat before), as a share of the window; a fill that
#: began before the window is one that starts at 0 with a larger size.
_STARTS = np.arange(0.0, 0.9, 0.05)
#: Fills whose residual sum of squares is within this many residual variances of the
#: best's fit the floors about as well (chi-squared, one degree of freedom, 95 %): the
#: asymptote's range that the floors allow is theirs.
_ALIKE = 3.84
#: Fewer floors than this say nothing of a shape.
MIN_FLOORS = 8


@dataclass(frozen=True, slots=True)
class Fill:
    """The best fill under the ceiling: its asymptote (bytes), time constant and start
    (seconds), and ``f``, how much better than the line it fits the floors: the F
    statistic of its two more parameters (the drop in the residual sum of squares, per
    parameter, over the fill's residual variance). The grid search makes it no F
    variate: the limit on it was measured, not looked up."""

    asymptote: float
    tau: float
    start: float
    f: float


@lru_cache(maxsize=1)
def _shape_grid() -> tuple[np.ndarray, np.ndarray]:
    """(tau, start) of every fill tried, flattened, in windows."""
    taus, starts = np.meshgrid(_TAUS, _STARTS, indexing="ij")
    return taus.ravel(), starts.ravel()


def best_fill(t: np.ndarray, y: np.ndarray, ceiling: float) -> Fill | None:
    """The fill that fits ``y`` (floors at times ``t``) best in least squares, when it and
    every fill of the grid that fits about as well (each at its own least-squares level
    and size) settle at ``ceiling`` or under; None when one does not, with fewer than
    ``MIN_FLOORS`` floors, a number that is not finite, or a window of no length. (Levels
    and sizes a little off each shape's least squares, within the same bound, can settle
    up to a few hundred MiB higher: the margin under capacity is there for them.)"""
    n = len(t)
    if n < MIN_FLOORS or not (np.isfinite(t).all() and np.isfinite(y).all()) \
            or t[-1] <= t[0]:
        return None
    width = t[-1] - t[0]
    u = (t - t[0]) / width
    taus, starts = _shape_grid()
    shapes = -np.expm1(-np.maximum(u[None, :] - starts[:, None], 0.0) / taus[:, None])
    mean = float(y.mean())
    y = y - mean  # bytes near 1e10 squared: sums about the mean keep the residuals' digits
    rss, asymptote = _fits(shapes, y)
    best = int(np.argmin(rss))
    noise = max(rss[best] / (n - 4), np.finfo(float).tiny)
    if asymptote[rss <= rss[best] + _ALIKE * noise].max() + mean > ceiling:
        return None  # the floors allow a fill that settles over capacity: no benign one
    gain = max(_line_rss(u, y) - rss[best], 0.0)
    return Fill(float(asymptote[best] + mean), float(taus[best] * width),
                float(t[0] + starts[best] * width), gain / 2 / noise)


def _fits(shapes: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Residual sum of squares and asymptote ``c + a`` of the least-squares
    ``y ~ c + a * shape`` for every row of ``shapes`` (each rising from 0 towards 1), with
    ``a >= 0``: a fill never shrinks."""
    n = len(y)
    s, ss, sy = shapes.sum(1), (shapes * shapes).sum(1), shapes @ y
    y_sum, yy = y.sum(), y @ y
    spread = n * ss - s * s
    varies = spread > 1e-12 * n * n
    a = np.where(varies, (n * sy - s * y_sum) / np.where(varies, spread, 1.0), 0.0)
    a = np.maximum(a, 0.0)
    c = (y_sum - a * s) / n
    rss = yy - 2 * c * y_sum - 2 * a * sy + n * c * c + 2 * c * a * s + a * a * ss
    return np.maximum(rss, 0.0), c + a


def _line_rss(u: np.ndarray, y: np.ndarray) -> float:
    """Residual sum of squares of the least-squares line."""
    du = u - u.mean()
    dy = y - y.mean()
    suu = float(du @ du)
    return float(dy @ dy - (du @ dy) ** 2 / suu) if suu > 0 else float(dy @ dy)
