"""Trends of what the training process counts: live tensors (or arrays) and compiles.

The reporters give exact counts per step, with none of the HBM sawtooth: a tensor kept
alive across steps (``losses.append(loss)``) adds exactly one per step, a healthy loop
comes back to the same count after every step. So a steady rise of the live count over
steps is the most direct evidence of a leak there is, and combined with a growing HBM
floor it makes a leak verdict certain; and uncached compiles that keep coming after
warm-up mean recompilation.

Method, as for HBM floors (detect/detector.py), on (step, count) points: ignore the first
``warmup_steps`` of a run (model, optimizer state, first compiles), then Sen's slope and
Mann-Kendall over the window since, kept to at most ``max_points`` points by thinning
(every other point, so cost and memory stay bounded over any run). Growing: significant
(z >= ``z_threshold``, lower end of the slope interval above 0), still rising in the
recent half of the window, and by at least ``min_growth`` over the window. Pure
computation, like the leak detector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tpumon.detect.robust import PairwiseSlopes
from tpumon.common.units import format_bytes


@dataclass(frozen=True)
class CountSettings:
    warmup_steps: int = 20
    min_points: int = 24
    min_steps: int = 40
    max_points: int = 256
    z_threshold: float = 4.0
    min_growth: float = 8.0


@dataclass(frozen=True)
class CountTrend:
    """Whether a per-step count is growing, and how fast."""

    growing: bool
    per_step: float | None = None
    per_step_low: float | None = None
    z: float | None = None
    points: int = 0
    window_steps: int = 0
    reason: str = ""


class CountTracker:
    """One count of one process; feed (step, value) with :meth:`update`."""

    def __init__(self, settings: CountSettings | None = None) -> None:
        self.s = settings or CountSettings()
        self._first_step: int | None = None
        self._steps: list[int] = []
        self._values: list[float] = []
        self._stride = 1  # keep every ``stride``-th step once thinned
        self._last_step: int | None = None
        self._fitted: CountTrend | None = None
        self._unfitted = 0  # points kept since ``_fitted``

    def update(self, step: int, value: float | None) -> None:
        if value is None:
            return
        if self._last_step is not None and step < self._last_step:
            CountTracker.__init__(self, self.s)  # the step went back: a new run
        if self._last_step is not None and step == self._last_step:
            return
        self._last_step = step
        if self._first_step is None:
            self._first_step = step
        if step - self._first_step < self.s.warmup_steps or step % self._stride:
            return
        self._steps.append(step)
        self._values.append(float(value))
        self._unfitted += 1
        if len(self._steps) > self.s.max_points:
            self._stride *= 2
            keep = [i for i, s in enumerate(self._steps) if s % self._stride == 0]
            self._steps = [self._steps[i] for i in keep]
            self._values = [self._values[i] for i in keep]

    def trend(self) -> CountTrend:
        """The trend, refitted once the points kept since the last fit reach a sixteenth of
        the window: the agent asks every poll, and a window of up to ``max_points`` points
        hardly moves with one more (a fit of 256 points costs ~1 ms; reports come 10 a
        second)."""
        if self._fitted is None or self._unfitted >= max(1, len(self._steps) // 16):
            self._fitted, self._unfitted = self._fit(), 0
        return self._fitted

    def _fit(self) -> CountTrend:
        n = len(self._steps)
        if n < self.s.min_points or self._steps[-1] - self._steps[0] < self.s.min_steps:
            return CountTrend(False, points=n, reason="too few steps since warm-up")
        if min(self._values) == max(self._values):  # a healthy loop's usual count
            return CountTrend(False, 0.0, 0.0, 0.0, n, self._steps[-1] - self._steps[0], "flat")
        return self._fit_slopes()

    def _fit_slopes(self) -> CountTrend:
        """Sen's slope and Mann-Kendall over the window (~1 ms for 256 points)."""
        n = len(self._steps)
        x = np.array(self._steps, dtype=float)
        y = np.array(self._values)
        pairs = PairwiseSlopes(x, y)
        fit = pairs.fit(x[-1])
        recent = pairs.tail(n // 2).sen()
        window = int(x[-1] - x[0])
        if fit is None or recent is None:
            return CountTrend(False, points=n, window_steps=window, reason="too few points")
        growth = fit.slope * (x[-1] - x[0])
        growing = bool(fit.z >= self.s.z_threshold and fit.slope_low > 0 and recent[0] > 0
                   and growth >= self.s.min_growth)
        reason = (f"+{fit.slope:.2f} per step over {window} steps" if growing else
                  "flat" if abs(growth) < self.s.min_growth else "not a steady rise")
        return CountTrend(growing, fit.slope, fit.slope_low, fit.z, n, window, reason)


class Cause(NamedTuple):
    """A likely cause: a short code (for metrics and alert rules) and words for people."""

    code: str
    text: str


#: What keeps device tensors alive across steps, per framework (the reporter's name).
RETAINERS = {
    "torch_xla": "a list of losses or outputs, a metric accumulating tensors, an in-place "
                 "sharding helper keeping gradients alive",
    "jax": "a list of losses or outputs, a metric accumulating arrays, arrays kept in a "
           "dict or cache keyed by step, or captured by a closure",
}
RETAINERS_ANY = "a list of losses or outputs, a metric accumulating tensors, a cache"


def diagnose(live: CountTrend | None, compiles: CountTrend | None,
             hbm_leak: bool, framework: str = "") -> Cause | None:
    """The likely cause of growth; None when nothing points anywhere."""
    if live is not None and live.growing:
        return Cause("retained_tensors", (
            f"live tensors grow {live.per_step:+.2f} per step: tensors are kept alive "
            f"across steps ({RETAINERS.get(framework, RETAINERS_ANY)})"))
    if compiles is not None and compiles.growing:
        return Cause("recompilation", (
            f"uncached compiles keep coming ({compiles.per_step:.2f} per step after "
            "warm-up): the graph changes between steps (recompilation)"))
    if hbm_leak and live is not None and not live.growing and live.points:
        return Cause("allocator", "HBM grows while live tensors and compiles stay flat: "
                     "allocator fragmentation or the executable cache, not retained tensors")
    return None


def host_memory_cause(rss: CountTrend, live: CountTrend | None) -> Cause:
    """Resident host memory grows over steps while device tensors do not."""
    per_step = format_bytes(rss.per_step or 0.0)
    flat = "" if live is None or live.growing else " while live tensors stay flat"
    return Cause("host_memory", (
        f"host memory (RSS) grows {per_step} per step{flat}: host objects are kept across "
        "steps (a Python list of losses, floats or arrays; total_loss += loss keeping "
        "graphs alive instead of loss.item(); a dataloader or cache that never evicts)"))
