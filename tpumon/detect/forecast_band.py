"""How far to trust an OOM forecast: a band calibrated on the detector's own errors.

The forecast is the time at which floor plus transient reaches capacity if the floor keeps
growing at its measured rate. Its error is rarely the slope's noise (the 95 % interval of
the slope held the real OOM for only 18-50 % of leaks): it is the growth itself changing,
a cache filling under the leak, a staircase's next stair. So the band is not derived from
the fit. It is split-conformal: the detector was replayed over leaks whose OOM is known,
and at every page the ratio of the real time left to the forecast one was kept; the band
is that ratio's central 92 % in the page's bin of extrapolation (forecast time to OOM over
the evidence window: a forecast 4 windows ahead errs more than one a window ahead).

The table below is ``bench/forecast_band.py``'s, calibrated on the simulator's leaks
(``bench/detect.py`` seeds 0-3, ``bench/nuisances.py`` seed 0) and judged on seeds the
calibration never saw (docs/benchmarks.md, the forecast's band); a change to the detector
that moves the pages is followed by a new table.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple


class Band(NamedTuple):
    """For forecasts at most ``up_to`` evidence windows ahead: the real time left was
    between ``low`` and ``high`` times the forecast one at 92 % of the pages."""

    up_to: float
    low: float
    high: float


#: the share of pages whose OOM the band held, on the data it was calibrated on
COVERAGE = 0.92
#: how views label the band ("92%: 14:10 to 17:40")
BAND_LABEL = f"{COVERAGE:.0%}"

#: bench/forecast_band.py, 2026-11-29 (detector of this tree)
BANDS: tuple[Band, ...] = (
    Band(1.0, 0.358, 35.434),
    Band(2.0, 0.318, 9.097),
    Band(3.0, 0.300, 4.633),
    Band(4.0, 0.252, 4.209),
    Band(float("inf"), 0.242, 2.243),
)

_UP_TO = [b.up_to for b in BANDS]


def band_for(time_to_oom: float, window: float) -> Band:
    """The band of a forecast ``time_to_oom`` seconds ahead, made on ``window`` seconds of
    evidence (a window of 0 counts as the longest extrapolation)."""
    ahead = time_to_oom / window if window > 0 else float("inf")
    return BANDS[min(bisect.bisect_left(_UP_TO, ahead), len(BANDS) - 1)]


def oom_band(time_to_oom: float, window: float) -> tuple[float, float]:
    """Earliest and latest time to OOM (seconds from the forecast), the forecast between
    them."""
    band = band_for(time_to_oom, window)
    return time_to_oom * min(band.low, 1.0), time_to_oom * max(band.high, 1.0)
