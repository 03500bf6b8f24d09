"""Reporting training processes: their count trends, and which chip each one drives.

Fed each poll with the reporter socket's reading. Keeps, per process, the trend of its
live tensor count and of its uncached compiles (``detect.counts``), forgets processes
that stopped reporting, and attributes chips to processes so that the HBM detector gets
step numbers and the diagnosis can name a cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from tpumon.detect.counts import Cause, CountSettings, CountTracker, CountTrend, diagnose
from tpumon.sources.reporter import ProcessReport, ReporterReading


@dataclass(frozen=True)
class ProcessState:
    """One reporting process as exported and shown."""

    report: ProcessReport
    live: CountTrend
    compiles: CountTrend

    @property
    def verdict(self) -> str:
        """``leak`` when live tensors grow steadily, ``ok`` when a trend was fitted and they
        do not, ``warming_up`` before that, ``unknown`` without a live count."""
        if self.report.live is None:
            return "unknown"
        if self.live.growing:
            return "leak"
        return "ok" if self.live.per_step is not None else "warming_up"

    def diagnosis(self, hbm_leak: bool = False) -> Cause | None:
        return diagnose(self.live, self.compiles, hbm_leak)


class ProcessTracker:
    """Count trends per reporting process, rebuilt as processes come and go."""

    def __init__(self, settings: CountSettings | None = None) -> None:
        self._settings = settings
        self._trackers: dict[int, tuple[CountTracker, CountTracker]] = {}

    def update(self, reading: ReporterReading | None) -> dict[int, ProcessState]:
        if reading is None:
            return {}
        for pid in set(self._trackers) - set(reading.processes):
            del self._trackers[pid]
        states = {}
        for pid, report in reading.processes.items():
            live, compiles = self._trackers.setdefault(
                pid, (CountTracker(self._settings), CountTracker(self._settings)))
            for point in reading.points.get(pid, ()):
                live.update(point.step, point.live)
                compiles.update(point.step, point.compiles_uncached)
            states[pid] = ProcessState(report, live.trend(), compiles.trend())
        return states


def chip_processes(chips: Iterable[str], owners: Mapping[str, int],
                   processes: Mapping[int, ProcessState]) -> dict[str, int]:
    """Which reporting process drives each chip: the chip's owner (from /proc) when it
    reports; else the process whose report names the chip's device (PyTorch/XLA's
    process-per-chip runs); else, when exactly one process reports, that one."""
    by_device: dict[str, int] = {}
    for pid, state in processes.items():
        for device in state.report.devices:
            by_device.setdefault(device, pid)
        if state.report.ordinal is not None and not state.report.devices:
            by_device.setdefault(str(state.report.ordinal), pid)
    only = next(iter(processes)) if len(processes) == 1 else None
    out = {}
    for chip in chips:
        owner = owners.get(chip)
        driver = owner if owner in processes else by_device.get(chip, only)
        if driver is not None:
            out[chip] = driver
    return out
