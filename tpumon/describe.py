"""Growth as people read it, for every command and message that shows it. Free of numpy,
so that a command that only prints (``tpumon status``) does not load the detector."""

from __future__ import annotations


def describe_growth(bytes_per_step: float | None, bytes_per_hour: float | None) -> str:
    """Growth as people read it: per step when steps are known, else per hour."""
    if bytes_per_step is not None:
        return f"{bytes_per_step / 1e3:,.1f} KB/step"
    if bytes_per_hour is not None:
        return f"{bytes_per_hour / 1e6:,.1f} MB/h"
    return "-"
