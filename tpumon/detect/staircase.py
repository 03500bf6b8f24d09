"""A staircase leak: upward level shifts of the floor that keep coming, as a jump process.

One permanent jump is an event (a new executable, a buffer allocated once); jumps that keep
coming are a leak, whether they come every N steps (a retained buffer per interval) or at
irregular times (recompilations, a cache that never stops growing). Either way the floor
grows on average by the jump rate times the mean jump size, and that growth reaches
capacity like any other: the detector forecasts the OOM from it.

The jumps are counted as a Poisson process, the model that assumes least about their
timing: the rate is jumps per second of evidence, its 95 % interval the count's exact
(Garwood) Poisson interval, and the process is still going on while the quiet time since
the last jump is not improbably long for that rate (P < 5 % under the model). A staircase
is called on few jumps (from 2 after the first), where the normal approximation
n +- 1.96 sqrt(n) is far off: for 2 jumps it gave 0-4.8 where the exact interval is
0.24-7.2, so forecasts made on few jumps claimed an earliest OOM far too late.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

from tpumon.detect.jumps import Jump
from tpumon.common.units import format_bytes

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
        """95 % interval of the growth, from the count's exact Poisson interval."""
        low, high = poisson_interval(self.jumps)
        per_jump = self.mean_size / self.span_seconds
        return low * per_jump, high * per_jump

    def describe(self) -> str:
        """As people read it: "9 jumps in 14 h, 295.6 MiB each, every ~1.6 h"."""
        every = 1.0 / self.jumps_per_second
        return (f"{self.jumps + 1} jumps in {_duration(self.span_seconds)}, "
                f"{_size(self.mean_size)} each, every ~{_duration(every)}")


@lru_cache(maxsize=2048)
def poisson_interval(count: int) -> tuple[float, float]:
    """Exact (Garwood) 95 % interval of a Poisson mean, having counted ``count``: the means
    under which so few (so many) counts or fewer (more) have probability 2.5 %. Found by
    bisection on the Poisson tail (plain sums: counts are at most a few thousand), cached."""
    if count == 0:
        return 0.0, math.log(1 / 0.025)
    return (_bisect(lambda mean: 1.0 - _cdf(count - 1, mean), count),
            _bisect(lambda mean: _cdf(count, mean), count, upper=True))


def _cdf(k: int, mean: float) -> float:
    """P(X <= k) for X ~ Poisson(mean): the terms summed; where exp(-mean) underflows
    (means above ~700, so counts of hundreds) the normal approximation, exact enough there."""
    term = math.exp(-mean)
    if term == 0.0:
        return 0.5 * math.erfc(-(k + 0.5 - mean) / math.sqrt(2 * mean))
    total = term
    for i in range(1, k + 1):
        term *= mean / i
        total += term
    return min(total, 1.0)


def _bisect(tail: Callable[[float], float], count: int, upper: bool = False) -> float:
    """The mean at which ``tail(mean)`` (increasing for the lower bound, decreasing for the
    upper) crosses 2.5 %."""
    lo, hi = (count, 4.0 * count + 10.0) if upper else (0.0, float(count))
    for _ in range(60):
        mid = (lo + hi) / 2
        above = tail(mid) > 0.025
        if upper:
            lo, hi = (mid, hi) if above else (lo, mid)
        else:
            lo, hi = (lo, mid) if above else (mid, hi)
    return (lo + hi) / 2


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
