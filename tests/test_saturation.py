"""The benign fill a page must rule out (tpumon/detect/saturation.py): its least squares
checked against numpy's, and what it says of a fill, a line and a fill over capacity."""

from __future__ import annotations

import numpy as np
import pytest

from tpumon.detect import saturation
from tpumon.detect.saturation import best_fill

GIB = 2.0**30
HOUR = 3600.0


def _fill(t: np.ndarray, level: float, size: float, start: float, tau: float) -> np.ndarray:
    return level + size * -np.expm1(-np.maximum(t - start, 0.0) / tau)


def test_every_fill_is_least_squares_with_a_size_that_never_shrinks():
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0, 1, 40))
    y = _fill(t, 5.0, 2.0, 0.3, 0.2) + rng.normal(0, 0.05, len(t))
    shapes = -np.expm1(-np.maximum(t[None, :] - np.array([[0.0], [0.3], [0.6]]), 0)
                       / np.array([[0.05], [0.2], [1.0]]))
    rss, asymptote = saturation._fits(shapes, y)
    for row, shape in enumerate(shapes):
        design = np.stack([np.ones_like(t), shape], 1)
        (c, a), *_ = np.linalg.lstsq(design, y, rcond=None)
        if a < 0:  # a fill never shrinks: the best then is flat
            c, a = y.mean(), 0.0
        assert asymptote[row] == pytest.approx(c + a, rel=1e-9)
        assert rss[row] == pytest.approx(float(((y - c - a * shape) ** 2).sum()), rel=1e-6)


def test_a_fill_that_would_shrink_is_flat_at_the_floors_mean():
    """Falling floors: the unbounded least squares of every shape has a negative size; the
    best fill that never shrinks is then no fill at all, the floors' mean (checked against
    scipy's bounded least squares)."""
    from scipy.optimize import lsq_linear
    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(0, 1, 30))
    y = 9.0 - 2.0 * t + rng.normal(0, 0.05, len(t))
    shapes = -np.expm1(-np.maximum(t[None, :] - np.array([[0.0], [0.4]]), 0)
                       / np.array([[0.3], [0.1]]))
    rss, asymptote = saturation._fits(shapes, y)
    for row, shape in enumerate(shapes):
        bounded = lsq_linear(np.stack([np.ones_like(t), shape], 1), y,
                             bounds=([-np.inf, 0.0], [np.inf, np.inf]))
        c, a = bounded.x
        assert a == pytest.approx(0.0, abs=1e-9) and c == pytest.approx(y.mean())
        assert asymptote[row] == pytest.approx(y.mean())
        assert rss[row] == pytest.approx(float(((y - y.mean()) ** 2).sum()))


def test_the_line_is_least_squares():
    rng = np.random.default_rng(4)
    u = np.sort(rng.uniform(0, 1, 30))
    y = 3 + 2 * u + rng.normal(0, 0.1, len(u))
    fitted = np.polyval(np.polyfit(u, y, 1), u)
    assert saturation._line_rss(u, y) == pytest.approx(float(((y - fitted) ** 2).sum()))


def test_a_cache_filling_is_found_with_its_asymptote_and_beats_the_line():
    """Floors of a cache of 6 GiB filling from 20 GiB with a 10-minute time constant, 12
    minutes into a 50-minute window, under 28 GiB of room: the fill's asymptote is the
    cache's, and a line fits far worse."""
    rng = np.random.default_rng(5)
    t = np.arange(0, 50 * 60, 120.0)
    y = _fill(t, 20 * GIB, 6 * GIB, 12 * 60, 600) + rng.normal(0, 0.05 * GIB, len(t))
    fill = best_fill(t, y, 28 * GIB)
    assert fill is not None
    assert fill.asymptote == pytest.approx(26 * GIB, abs=0.15 * GIB)
    assert 300 < fill.tau < 1200 and abs(fill.start - 12 * 60) <= 300
    assert fill.f > 50


@pytest.mark.parametrize("seed", range(8))
def test_a_line_shows_no_fill_better_than_itself(seed):
    """A leak's floors (a line under noise that reads high, as floors do) fit no fill much
    better than the line: no evidence of saturation, whatever the noise draws."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 2 * HOUR, 48))
    y = 14 * GIB + 0.5 * GIB * t / HOUR + rng.exponential(0.08 * GIB, len(t))
    fill = best_fill(t, y, 30 * GIB)
    assert fill is None or fill.f < 15, fill  # DetectorSettings.fill_f_limit


def test_a_fill_that_would_settle_over_capacity_is_none():
    """The same cache with only 24 GiB of room: the fill the floors show settles over it,
    so it explains nothing benign (None), nor does any fill that fits about as well."""
    rng = np.random.default_rng(6)
    t = np.arange(0, 50 * 60, 120.0)
    y = _fill(t, 20 * GIB, 6 * GIB, 12 * 60, 600) + rng.normal(0, 0.05 * GIB, len(t))
    assert best_fill(t, y, 24 * GIB) is None


def test_a_ceiling_that_some_fill_as_good_as_the_best_crosses_is_none():
    """Noisier floors of a slower fill allow a range of asymptotes (the fills that fit
    within 3.84 residual variances of the best): a ceiling inside that range, over the best
    fill's own asymptote, still finds no benign fill."""
    rng = np.random.default_rng(4)
    t = np.arange(0, 50 * 60, 120.0)
    y = _fill(t, 20 * GIB, 6 * GIB, 0.0, 2400) + rng.normal(0, 0.1 * GIB, len(t))
    found = best_fill(t, y, 60 * GIB)
    assert found is not None
    taus, starts = saturation._shape_grid()
    u = t / t[-1]
    rss, asymptote = saturation._fits(
        -np.expm1(-np.maximum(u[None, :] - starts[:, None], 0) / taus[:, None]), y - y.mean())
    alike = y.mean() + asymptote[rss <= rss.min() + 3.84 * rss.min() / (len(t) - 4)]
    assert alike.max() > found.asymptote + 0.1 * GIB  # the range is there to cross
    assert best_fill(t, y, (found.asymptote + alike.max()) / 2) is None
    assert best_fill(t, y, alike.max() + 1.0) == found  # a byte over: rounding


def test_too_few_floors_no_window_or_no_number_say_nothing():
    t = np.arange(7, dtype=float)
    assert best_fill(t, t, 100.0) is None
    assert best_fill(np.zeros(10), np.arange(10.0), 100.0) is None
    t = np.arange(20, dtype=float)
    for bad in (np.nan, np.inf):
        y = np.sqrt(t)
        y[5] = bad
        assert best_fill(t, y, 100.0) is None
        assert best_fill(np.where(t == 5, bad, t), np.sqrt(t), 100.0) is None
