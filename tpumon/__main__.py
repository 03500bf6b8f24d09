"""Allows ``python -m tpumon``."""

from tpumon.program import run

run()
