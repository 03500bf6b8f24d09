"""Growth as people read it, for every command and message that shows it. Free of numpy,
so that a command that only prints (``tpumon status``) does not load the detector."""

from __future__ import annotations

from tpumon.units import format_growth


def describe_growth(bytes_per_step: float | None, bytes_per_hour: float | None) -> str:
    """Growth as people read it: per step when steps are known, else per hour."""
    return format_growth(bytes_per_step, bytes_per_hour)
