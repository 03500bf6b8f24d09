"""What the detector keeps of one run of the training process (a *job*, from its first
sample to a restart): its floors, the level shifts found in them, the transient that
recurs, and where its fits stand. ``ChipDetector`` (``detector.py``) decides; this holds.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from tpumon.detect.floors import FloorHistory
from tpumon.detect.jumps import Jump
from tpumon.detect.robust import median


def floor_noise(floors: np.ndarray) -> float:
    """The scatter of single floors: MAD of successive differences around their median (a
    steady trend is not scatter), as a standard deviation."""
    diffs = np.diff(floors)
    return 1.4826 * median(np.abs(diffs - median(diffs))) / math.sqrt(2) if len(diffs) else 0.0


@dataclass
class Job:
    """One run of the training process, from its first sample to a restart."""

    start: float
    trend_start: float | None = None
    history: FloorHistory = field(default_factory=FloorHistory)
    warm_floors: list[float] = field(default_factory=list)
    first_step: float = math.nan  # the job's first known step: no trend before it advances
    jumps: list[Jump] = field(default_factory=list)
    scanned: int = 0  # next boundary (index over all buckets appended) to scan for jumps
    longest_transient: int = 0  # buckets: the longest rise-and-return of the floor so far
    transients_scanned: int = 0  # next bucket (index as ``scanned``) to look for one at
    appended: int = 0
    largest: list[float] = field(default_factory=list)  # bucket transients: the largest
    # few, ascending (note_transient)
    sigma: float = 0.0
    sigma_due: int = 0
    sigma_measured: bool = False  # sigma is an estimate, not level_noise's floor
    scatter: float = 0.0  # of single floors (at least sigma): see floor_noise
    last_fit: float = -math.inf
    rise_limit: float = math.inf  # a floor above this (level at the last fit, plus a jump's
    # threshold) is news on a floor counted flat: it is refit at once
    growing: bool = False
    slope: float = 0.0  # continuous trend (bytes/s) at the last fit: jumps are found around it
    leaking: bool = False
    # the last few floors (one envelope): a restart is a floor far below all of them
    last_floors: list[float] = field(default_factory=list)
    last_step: float = math.nan
    jump_times: np.ndarray = field(default_factory=lambda: np.empty(0))  # of ``jumps``
    jump_levels: np.ndarray = field(  # 0, then the cumulative sizes of ``jumps``
        default_factory=lambda: np.zeros(1))

    def note_transient(self, value: float, recurrences: int) -> None:
        """Keep the ``recurrences`` largest bucket transients (peak less floor); the
        transient is the smallest of them: one that came back in that many buckets. The
        largest alone is often no in-step memory at all: the bucket where the warm-up's
        last ramp, a restart or a poll gap lands reads the floor's own rise of many GiB as
        transient, and the forecast, floor plus transient, then filled a healthy chip
        hours early. An eval's or checkpoint's buffers recur, and count once they do."""
        top = self.largest
        if len(top) < recurrences:
            bisect.insort(top, value)
        elif value > top[0]:
            top[0] = value
            top.sort()

    @property
    def transient(self) -> float:
        """The in-step transient that recurs (:meth:`note_transient`); 0 before any."""
        return self.largest[0] if self.largest else 0.0

    def add_jumps(self, found: list[Jump]) -> None:
        """Keep the last 1024 jumps; the arrays that correct floors for them change only
        here, so fits reuse them instead of rebuilding them twice each."""
        self.jumps.extend(found)
        del self.jumps[:-1024]
        if found:
            self.jump_times = np.array([j.time for j in self.jumps])
            self.jump_levels = np.concatenate(([0.0], np.cumsum([j.size for j in self.jumps])))

    def corrected(self, data: np.ndarray) -> np.ndarray:
        """The floors of ``data`` (rows time, step, floor, ...) with the jumps taken out,
        expressed at today's level."""
        if not self.jumps:
            return data[2]
        levels = self.jump_levels
        return data[2] - levels.take(self.jump_times.searchsorted(data[0], side="right")) \
            + levels[-1]


@dataclass(frozen=True)
class JobView:
    """The detector's current job, read-only (``tpumon report`` draws it): when it began,
    when its trend phase began (None while warming up), and the level shifts found in it
    (the last 1024)."""

    start: float
    trend_start: float | None
    jumps: tuple[Jump, ...]
