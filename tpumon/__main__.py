"""Allows ``python -m tpumon``."""

from tpumon.cli import main

main()
