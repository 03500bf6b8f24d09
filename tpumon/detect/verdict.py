"""What the leak detector says of a chip, and the settings it says it under: the verdicts,
:class:`Assessment` (exported, shown and alerted on), :class:`DetectorSettings`, and the
forecast's and an alert's fields. Every reader of the detector (the agent, metrics, web,
notify, analyze, report) imports these; none needs the algorithm in ``detector.py``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from tpumon.detect.forecast_band import oom_band
from tpumon.detect.jumps import Jump


class Verdict(str, enum.Enum):
    OK = "ok"
    WARMING_UP = "warming_up"
    GROWING = "growing"  # growth that would fill HBM within the horizon, not yet a leak
    LEAK = "leak"  # the page
    STEP_CHANGE = "step_change"
    INSUFFICIENT_DATA = "insufficient_data"


@dataclass(frozen=True)
class DetectorSettings:
    """Defaults shared by the agent and ``tpumon analyze``; none is fitted to one workload."""

    samples_per_bucket: int = 32      # polls per floor: enough that one lands between steps
    bucket_min_seconds: float = 60.0
    bucket_max_seconds: float = 180.0  # >= 10 floors in the shortest window, at any poll rate
    warmup_seconds: float = 600.0     # after a (re)start: compiling and loading, not trend
    warmup_max_seconds: float = 3600.0
    min_window_seconds: float = 1800.0  # no trend verdict on less evidence than this
    fit_points: int = 64              # floors per fit (older ones merged): bounded cost
    z_threshold: float = 4.0          # Mann-Kendall; floors are autocorrelated, so strict
    horizon_seconds: float = 7 * 86400.0
    max_extrapolation: float = 5.0    # time to OOM at most this many evidence windows
    # detect/saturation.py: no page while a fill settling under capacity (by this share of
    # HBM at least) fits the window's floors this much better than a line (F statistic)
    fill_f_limit: float = 15.0
    fill_margin_fraction: float = 0.02
    restart_gap_seconds: float = 120.0
    restart_drop_fraction: float = 0.05  # floor this much (of HBM) lower after a gap: new job
    jump_sigmas: float = 6.0
    jump_min_fraction: float = 0.002  # of HBM: smaller shifts are treated as trend
    jump_confirm_buckets: int = 5     # at least; more when buckets hold few polls:
    jump_confirm_polls: int = 96      # polls on each side of a level shift to confirm it
    envelope_polls: int = 24          # polls in a lower envelope (a level, under noise)
    step_change_min_fraction: float = 0.01  # of HBM: smaller permanent jumps are just "ok"
    staircase_min_jumps: int = 3
    shape_change_fraction: float = 0.3  # growth per third rising this much: onset inside
    slowdown_fraction: float = 0.15     # growth per third falling this much: saturating
    transient_recurrences: int = 3      # buckets a transient is seen in before it counts


@dataclass(frozen=True)
class Assessment:
    """What the detector says about one chip now; exported, shown and alerted on."""

    verdict: Verdict
    reason: str
    floor_bytes: float | None = None
    transient_bytes: float | None = None
    total_bytes: float | None = None
    slope_bytes_per_second: float | None = None
    slope_bytes_per_second_low: float | None = None
    slope_bytes_per_second_high: float | None = None
    slope_bytes_per_step: float | None = None
    slope_bytes_per_step_low: float | None = None
    slope_bytes_per_step_high: float | None = None
    predicted_oom_time: float | None = None
    predicted_oom_step: float | None = None
    # the forecast's band, calibrated on the detector's own errors (forecast_band):
    # earliest and latest OOM, the forecast between them
    predicted_oom_time_low: float | None = None
    predicted_oom_time_high: float | None = None
    predicted_oom_step_low: float | None = None
    predicted_oom_step_high: float | None = None
    window_start: float | None = None
    window_seconds: float | None = None
    points: int = 0
    z: float | None = None
    jumps: int = 0
    # the jumps behind the verdict (a leak's staircase, a step change's permanent jumps;
    # empty otherwise) and the span of a floor envelope, within which two chips' jumps are
    # one moment: chips of a job whose jumps are the same stairs share them (pooling)
    level_jumps: tuple[Jump, ...] = ()
    envelope_seconds: float | None = None
    step: float | None = None
    job_start: float | None = None
    restarts: int = 0

    @property
    def slope_bytes_per_hour(self) -> float | None:
        return None if self.slope_bytes_per_second is None else self.slope_bytes_per_second * 3600


#: What a leak alert keeps of the assessment that raised it.
_ALERT_FIELDS = ("predicted_oom_time", "predicted_oom_time_low", "predicted_oom_time_high",
                 "predicted_oom_step", "predicted_oom_step_low", "predicted_oom_step_high",
                 "slope_bytes_per_second", "slope_bytes_per_step", "window_seconds")


def slope_fields(per_s: float, low: float, high: float,
                 steps_per_second: float | None) -> dict[str, float]:
    """An assessment's slopes per second and, where steps are known, per step (the same
    growth, rescaled)."""
    out = dict(slope_bytes_per_second=per_s, slope_bytes_per_second_low=low,
               slope_bytes_per_second_high=high)
    if steps_per_second:
        out.update(slope_bytes_per_step=per_s / steps_per_second,
                   slope_bytes_per_step_low=low / steps_per_second,
                   slope_bytes_per_step_high=high / steps_per_second)
    return out


def oom_forecast(now: float, step: float, time_to_oom: float, window: float,
                 steps_per_second: float | None) -> dict[str, float | None]:
    """An assessment's OOM forecast fields: the time (and step, where steps are known)
    ``time_to_oom`` seconds after ``now`` (at ``step``, NaN if unknown), with the band
    calibrated on the detector's own errors for a forecast made on ``window`` seconds of
    evidence (``forecast_band``)."""
    earliest, latest = oom_band(time_to_oom, window)
    ttos = (time_to_oom, earliest, latest)
    times = [now + t for t in ttos]
    steps: list[float | None] = [None, None, None]
    if steps_per_second and not math.isnan(step):
        steps = [step + t * steps_per_second for t in ttos]
    return dict(predicted_oom_time=times[0], predicted_oom_time_low=times[1],
                predicted_oom_time_high=times[2], predicted_oom_step=steps[0],
                predicted_oom_step_low=steps[1], predicted_oom_step_high=steps[2])


def moment(time: float, step: float) -> dict:
    """A sample's time and step (None if unknown), as alerts and warnings keep it."""
    return {"time": time, "step": None if math.isnan(step) else int(step)}


def leak_alert(time: float, step: float, assessment: Assessment) -> dict:
    """A leak alert raised at the sample (time, step; NaN if unknown) by an assessment: when,
    and what was forecast and measured then, for a post-mortem against the OOM that came."""
    return {**moment(time, step), "reason": assessment.reason,
            **{k: getattr(assessment, k) for k in _ALERT_FIELDS}}
