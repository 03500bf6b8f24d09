"""Replays the streaming detector over a recorded trace (``tpumon analyze``).

Each (host, chip) series is fed to its own ChipDetector with the agent's default settings,
in time order, exactly as the agent would have seen it poll by poll; the result is the
verdict at the end and the first moment the leak alert would have fired.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpumon.detect.detector import Assessment, ChipDetector, DetectorSettings
from tpumon.trace import read_trace_columns


def _opt(value: float | None, digits: int | None = None) -> float | int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return round(value, digits) if digits is not None else value


def _interval_per_hour(a: Assessment) -> list[float] | None:
    """The 95 % interval of the floor's growth, bytes per hour."""
    low, high = a.slope_bytes_per_second_low, a.slope_bytes_per_second_high
    if low is None or high is None:
        return None
    return [round(low * 3600, 1), round(high * 3600, 1)]


@dataclass(frozen=True)
class SeriesResult:
    """One series' outcome, serialised in the shape of contracts.md §2."""

    host: str
    chip: str
    samples: int
    assessment: Assessment
    alert: dict | None

    @property
    def verdict(self) -> str:
        return self.assessment.verdict.value

    @property
    def slope_bytes_per_step(self) -> float | None:
        return _opt(self.assessment.slope_bytes_per_step, 3)

    @property
    def slope_bytes_per_hour(self) -> float | None:
        return _opt(self.assessment.slope_bytes_per_hour, 1)

    @property
    def predicted_oom(self) -> dict | None:
        a = self.assessment
        if a.predicted_oom_time is None:
            return None
        step = a.predicted_oom_step
        return {"time": round(a.predicted_oom_time, 3), "step": None if step is None else int(step)}

    @property
    def alert_forecast(self) -> dict | None:
        """The OOM forecast as it stood when the alert fired (scored by the benchmark)."""
        if self.alert is None or self.alert["predicted_oom_time"] is None:
            return None
        step = self.alert["predicted_oom_step"]
        return {"time": self.alert["predicted_oom_time"],
                "step": None if step is None else int(step)}

    def to_json(self) -> dict[str, Any]:
        a = self.assessment
        return {
            "host": self.host,
            "chip": self.chip,
            "verdict": self.verdict,
            "alert": None if self.alert is None else {"time": self.alert["time"],
                                                      "step": self.alert["step"]},
            "slope_bytes_per_step": self.slope_bytes_per_step,
            "slope_bytes_per_hour": self.slope_bytes_per_hour,
            "predicted_oom": self.predicted_oom,
            "reason": a.reason,
            "floor_bytes": _opt(a.floor_bytes, 0),
            "slope_bytes_per_hour_interval": _interval_per_hour(a),
            "window_seconds": _opt(a.window_seconds, 1),
            "z": _opt(a.z, 2),
            "samples": self.samples,
            "restarts": a.restarts,
        }


def replay_series(host: str, chip: str, times: np.ndarray, steps: np.ndarray,
                  used: np.ndarray, totals: np.ndarray,
                  settings: DetectorSettings | None = None) -> SeriesResult:
    """Run one detector over one series' arrays (the agent's code path, in one batch)."""
    detector = ChipDetector(settings)
    detector.update(times, steps, used, totals)
    return SeriesResult(host, chip, len(times), detector.assessment, detector.alert)


def analyze_file(path: str, settings: DetectorSettings | None = None) -> list[SeriesResult]:
    """Read a trace (CSV or JSON Lines) into per-series arrays and replay each series.

    Raises TraceFormatError (with the line number) before any result exists, so a caller
    prints all or nothing.
    """
    columns = read_trace_columns(path)
    return [replay_series(host, chip, c.times, c.steps, c.used, c.total, settings)
            for (host, chip), c in columns.items()]

