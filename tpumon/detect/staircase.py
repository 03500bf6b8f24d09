"""A staircase leak: upward level shifts of the floor that keep coming, as a jump process.

One permanent jump is an event (a new executable, a buffer allocated once); jumps that keep
coming are a leak, whether they come every N steps (a retained buffer per interval) or at
irregular times (recompilations, a cache that never stops growing). Either way the floor
grows on average by the jump rate times the mean jump size, and that growth reaches
capacity like any other: the detector forecasts the OOM from it.

The jumps are counted as a Poisson process, the model that assumes least about their
timing: the rate is jumps per second of evidence, its 95 % interval the count's
(n +- 1.96 sqrt(n)), and the process is still going on while the quiet time since the last
jump is not improbably long for that rate (P < 5 % under the model).
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

from tpumon.detect.jumps import Jump
from tpumon.units import format_bytes

#: exp(-QUIET_LIMIT): how improbable the quiet since the last jump may be before the
#: staircase is taken to have stopped (3: 5 %).
QUIET_LIMIT = 3.0


class Staircase(NamedTuple):
    """Upward jumps that keep coming: the jumps counted (after the first), the span since
    the first, and the mean jump size."""

    jumps: int
    span_seconds: float
    mean_size: float

    @property
    def jumps_per_second(self) -> float:
        return self.jumps / self.span_seconds

    @property
    def growth(self) -> float:
        """Mean growth of the floor, bytes per second."""
        return self.jumps_per_second * self.mean_size

    @property
    def growth_interval(self) -> tuple[float, float]:
        """95 % interval of the growth, from the count's Poisson interval."""
        spread = 1.96 * math.sqrt(self.jumps)
        per_jump = self.mean_size / self.span_seconds
        return max(self.jumps - spread, 0.0) * per_jump, (self.jumps + spread) * per_jump

    def describe(self) -> str:
        """As people read it: "9 jumps in 14 h, 295.6 MiB each, every ~1.6 h"."""
        every = 1.0 / self.jumps_per_second
        return (f"{self.jumps + 1} jumps in {_duration(self.span_seconds)}, "
                f"{_size(self.mean_size)} each, every ~{_duration(every)}")


def find_staircase(jumps: Sequence[Jump], now: float, min_jumps: int) -> Staircase | None:
    """The staircase among a job's jumps, or None: at least ``min_jumps`` upward jumps, nearly
    all jumps upward, and the last one recent enough for the rate (the jumps keep coming).

    The process is timed from its first jump (before it, nothing says a staircase had begun:
    a leak that starts mid-run is not diluted by the flat hours before it), so the rate
    counts the jumps after that one: n - 1 in ``now - first``."""
    ups = [j for j in jumps if j.size > 0]
    if len(ups) < min_jumps or len(ups) < 0.8 * len(jumps):
        return None
    span = now - ups[0].time
    if span <= 0:
        return None
    stairs = Staircase(len(ups) - 1, span, sum(j.size for j in ups) / len(ups))
    if (now - ups[-1].time) * stairs.jumps_per_second > QUIET_LIMIT:
        return None
    return stairs


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"{seconds / 60:.0f} min"


def _size(size: float) -> str:
    return format_bytes(size)
