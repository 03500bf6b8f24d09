"""Timing helpers the benchmarks share (bench/ is on sys.path when they run as scripts)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 0) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones, ms."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
