"""bench/forecast_band.py: the conformal band it calibrates holds what it claims on pages
drawn like the calibration's, and never leaves the forecast outside it."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("bench_forecast_band",
                                              ROOT / "bench" / "forecast_band.py")
assert spec is not None and spec.loader is not None
band = importlib.util.module_from_spec(spec)
spec.loader.exec_module(band)


def _pages(rng: np.random.Generator, n: int, spread: float) -> list:
    """Pages whose real time left is the forecast times a lognormal error, wider the
    further ahead the forecast reaches."""
    out = []
    for _ in range(n):
        ahead = float(rng.uniform(0.2, 6.0))
        window = 3600.0
        forecast = ahead * window
        real = forecast * math.exp(rng.normal(0.0, spread * (1 + ahead / 3)))
        out.append(band.Page("synthetic", forecast, real, window))
    return out


def test_a_calibrated_band_holds_new_pages_as_often_as_it_claims():
    rng = np.random.default_rng(3)
    bands = band.calibrate(_pages(rng, 4000, 0.3), 0.9)
    assert [b.up_to for b in bands] == list(band.EDGES)
    assert all(b.low <= 1.0 <= b.high for b in bands)
    widths = [b.high / b.low for b in bands]
    assert widths[-1] > widths[0]  # errors grow with extrapolation here: so does the band
    fresh = _pages(rng, 4000, 0.3)
    held = sum(_inside(bands, p) for p in fresh) / len(fresh)
    assert 0.87 <= held <= 0.93


def _inside(bands: list, p) -> bool:
    b = next(b for b in bands if p.ahead < b.up_to)
    return b.low * p.forecast <= p.real <= b.high * p.forecast


def test_too_few_pages_in_a_bin_is_one_clear_error():
    rng = np.random.default_rng(4)
    few = [p for p in _pages(rng, 400, 0.3) if p.ahead < 4.0]
    with pytest.raises(SystemExit, match="too few for a band"):
        band.calibrate(few, 0.9)
