"""Reporting training processes: their count trends, and which chip each one drives.

Fed each poll with the reporter socket's reading. Keeps, per process, the trend of its
live tensor count and of its uncached compiles (``detect.counts``), forgets processes
that stopped reporting, and attributes chips to processes so that the HBM detector gets
step numbers and the diagnosis can name a cause.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

from tpumon.detect.counts import Cause, CountSettings, CountTracker, CountTrend, diagnose
from tpumon.sources.reporter import ProcessReport, ReporterReading

log = logging.getLogger("tpumon.processes")


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
                   processes: Mapping[int, ProcessState],
                   allowed_uids: Collection[int] = ()) -> dict[str, int]:
    """Which reporting process drives each chip's step axis.

    The kernel's word first: a chip whose holder the owner scan saw (/proc/PID/fd) is
    driven by that process if it reports, and by no one else: any local user can send a
    report naming any device, and a stranger's restarting step counter hides a leak
    (docs/security.md). Only where the scan saw no holder for the chip (an agent without
    the capability to read other users' fds, or a PID namespace apart) does a report's word
    count, and then only reports of trusted users: ``allowed_uids`` (reporter.allowed_uids)
    or, when that is empty (every user heard), root and the agent's own user. Among those,
    the process whose report names the chip's device (PyTorch/XLA's process-per-chip runs),
    else, when exactly one trusted process reports, that one."""
    uids = set(allowed_uids) or {0, os.geteuid()}
    trusted = {pid: s for pid, s in processes.items() if s.report.uid in uids}
    by_device: dict[str, int] = {}
    for pid, state in trusted.items():
        for device in state.report.devices:
            by_device.setdefault(device, pid)
        if state.report.ordinal is not None and not state.report.devices:
            by_device.setdefault(str(state.report.ordinal), pid)
    only = next(iter(trusted)) if len(trusted) == 1 else None
    out = {}
    for chip in chips:
        owner = owners.get(chip)
        driver = (owner if owner in processes else None) if owner is not None else \
            by_device.get(chip, only)
        if driver is not None:
            out[chip] = driver
    return out


class ChipClaims:
    """:func:`chip_processes`, saying (once per change) which chips were given to a process
    on its own report, because the kernel could not say who holds them."""

    def __init__(self) -> None:
        self._on_report: dict[str, int] = {}

    def __call__(self, chips: Iterable[str], owners: Mapping[str, int],
                 processes: Mapping[int, ProcessState],
                 allowed_uids: Collection[int]) -> dict[str, int]:
        chosen = chip_processes(chips, owners, processes, allowed_uids)
        on_report = {c: p for c, p in chosen.items() if c not in owners}
        if on_report != self._on_report:
            for chip, pid in sorted(on_report.items()):
                if self._on_report.get(chip) != pid:
                    log.info("chip %s: no holder seen in /proc; its step comes from pid %d "
                             "(uid %d, trusted: reporter.allowed_uids, else root and the "
                             "agent's user) on its own report", chip, pid,
                             processes[pid].report.uid)
            self._on_report = on_report
        return chosen
