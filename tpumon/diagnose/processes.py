"""Reporting training processes: their count and host-memory trends, and which chip each
one drives.

Fed each poll with the reporter socket's reading. Keeps, per process, the trend of its
live tensor count, of its uncached compiles and of its resident host memory
(``diagnose.counts``: Sen's slope and Mann-Kendall over steps), forgets processes that
stopped reporting, and attributes chips to processes so that the HBM detector gets step
numbers and the diagnosis can name a cause.

Two verdicts per process, because a run dies of either:

- ``verdict`` (device tensors): a live count that rises steadily is a ``leak`` only when
  memory grows with it (the HBM floor of a chip it drives, or its own RSS: on a CPU backend
  device buffers are host memory); a rise alone is ``growing``. A count can rise with
  nothing new alive (torch_xla's counters under SPMD can; see instrument/torch_xla.py), and
  a leak of a few bytes a step never kills a job, so the count alone never calls a leak.
- ``host_verdict``: the process's RSS, step-indexed, as reported: a host-side leak (a
  Python list of losses or arrays, ``total_loss += loss`` keeping graphs, a growing cache)
  grows it and never HBM, and ends in the kernel's OOM killer. Forecast against the host's
  available memory.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Collection, Iterable, Mapping

from tpumon.detect import Assessment, Verdict
from tpumon.diagnose.counts import (Cause, CountSettings, CountTracker, CountTrend, diagnose,
                                    host_memory_cause)
from tpumon.diagnose.known_issues import known_issue
from tpumon.sources.reports import ProcessReport, ReporterReading

log = logging.getLogger("tpumon.processes")

#: RSS trends: Python's heap and the framework's caches settle over more steps than the
#: live count does, and a few MiB of drift is not a leak; 64 MiB of steady growth since
#: warm-up is (or will be, at that rate, within the forecast).
RSS_SETTINGS = CountSettings(warmup_steps=100, min_points=24, min_steps=200,
                             min_growth=64 * 2**20)


@dataclass(frozen=True)
class ProcessState:
    """One reporting process as exported and shown."""

    report: ProcessReport
    live: CountTrend
    compiles: CountTrend
    rss: CountTrend = CountTrend(False)
    #: Host memory the process could still take (the host's available bytes, last poll).
    host_available: int | None = None
    #: Whether HBM grows on a chip this process drives (set by the agent after detection).
    hbm_growing: bool = False

    @property
    def verdict(self) -> str:
        """``leak`` when live tensors grow steadily and memory grows with them, ``growing``
        when they grow and no memory does (yet), ``ok`` when a trend was fitted and they do
        not, ``warming_up`` before that, ``unknown`` without a live count."""
        if self.report.live is None and not self.live.points:
            return "unknown"
        if self.live.growing:
            return "leak" if self.hbm_growing or self.rss.growing else "growing"
        return "ok" if self.live.per_step is not None else "warming_up"

    @property
    def verdict_reason(self) -> str | None:
        """Why :attr:`verdict` is what it is where the word alone does not say (``unknown``,
        ``warming_up``, ``growing``); None for the others."""
        verdict = self.verdict
        if verdict == "unknown":
            return ("it reports no live-tensor count, so its tensors are not judged "
                    "(docs/reporters.md: what each framework reports)")
        if verdict == "warming_up":
            return "too few reports of its live tensors yet for a trend"
        if verdict == "growing":
            return "its live tensors grow; no memory grows with them (yet)"
        return None

    @property
    def host_verdict(self) -> str:
        """``leak`` when the RSS grows steadily over steps, else as :attr:`verdict`."""
        if self.report.rss is None:
            return "unknown"
        if self.rss.growing:
            return "leak"
        return "ok" if self.rss.per_step is not None else "warming_up"

    @property
    def host_oom_seconds(self) -> float | None:
        """Seconds until the RSS, at its trend, takes all the host's available memory."""
        steps = self.host_oom_steps
        rate = self.report.steps_per_second
        return None if steps is None or not rate else steps / rate

    @property
    def host_oom_steps(self) -> float | None:
        if not self.rss.growing or not self.rss.per_step or self.host_available is None:
            return None
        return self.host_available / self.rss.per_step

    def diagnosis(self, hbm_leak: bool = False) -> Cause | None:
        cause = diagnose(self.live, self.compiles, hbm_leak or self.hbm_growing,
                         self.report.framework)
        if cause is None and self.rss.growing:
            cause = host_memory_cause(self.rss, self.live)
        known = known_issue(self.report.framework, self.report.framework_version,
                            cause.code if cause else None)
        return cause if known is None or cause is None else \
            Cause(cause.code, f"{cause.text}; {known.text()}")


class ProcessTracker:
    """Count trends per reporting process, rebuilt as processes come and go."""

    def __init__(self, settings: CountSettings | None = None,
                 rss_settings: CountSettings = RSS_SETTINGS) -> None:
        self._settings = settings
        self._rss_settings = rss_settings
        self._trackers: dict[int, tuple[CountTracker, CountTracker, CountTracker]] = {}

    def update(self, reading: ReporterReading | None,
               host_available: int | None = None) -> dict[int, ProcessState]:
        if reading is None:
            return {}
        for pid in set(self._trackers) - set(reading.processes):
            del self._trackers[pid]
        states = {}
        for pid, report in reading.processes.items():
            live, compiles, rss = self._trackers.setdefault(pid, (
                CountTracker(self._settings), CountTracker(self._settings),
                CountTracker(self._rss_settings)))
            for point in reading.points.get(pid, ()):
                live.update(point.step, point.live)
                compiles.update(point.step, point.compiles_uncached)
                rss.update(point.step, point.rss)
            states[pid] = ProcessState(report, live.trend(), compiles.trend(), rss.trend(),
                                       host_available)
        return states


def growing_chips(assessments: Mapping[str, Assessment]) -> list[str]:
    """Chips whose HBM floor grows: a leak called, or growth whose whole confidence
    interval is above zero (evidence of growth before a verdict's 30 minutes)."""
    return [chip for chip, a in assessments.items()
            if a.verdict is Verdict.LEAK or (a.slope_bytes_per_second_low or 0.0) > 0.0]


def with_hbm_growth(processes: Mapping[int, ProcessState], chip_processes: Mapping[str, int],
                    growing_chips: Iterable[str]) -> dict[int, ProcessState]:
    """The processes, each told whether HBM grows on a chip it drives."""
    growing = {chip_processes[c] for c in growing_chips if c in chip_processes}
    return {pid: replace(s, hbm_growing=True) if pid in growing else s
            for pid, s in processes.items()}


def trusted_uids(allowed_uids: Collection[int]) -> frozenset[int]:
    """The users whose processes may page without holding a chip: reporter.allowed_uids,
    root and the agent's own user. Anyone may send a report, so a report alone is no
    job: a stranger's short-lived reporters would each raise a JobEnded."""
    return frozenset({0, os.geteuid(), *allowed_uids})


def chip_processes(chips: Iterable[str], owners: Mapping[str, int],
                   processes: Mapping[int, ProcessState],
                   allowed_uids: Collection[int] = ()) -> dict[str, int]:
    """Which reporting process drives each chip's step axis; a process whose pid is gone
    drives nothing.

    The kernel's word first: a chip whose holder the owner scan saw (/proc/PID/fd) is
    driven by that process if it reports, and by no one else: any local user can send a
    report naming any device, and a stranger's restarting step counter hides a leak
    (docs/security.md). Only where the scan saw no holder for the chip (an agent without
    the capability to read other users' fds, or a PID namespace apart) does a report's word
    count, and then only reports of trusted users: ``allowed_uids`` (reporter.allowed_uids)
    or, when that is empty (every user heard), root and the agent's own user. Among those,
    the process whose report names the chip's device (PyTorch/XLA's process-per-chip runs),
    else, when exactly one trusted process reports, that one."""
    running = {pid: s for pid, s in processes.items() if not s.report.exited}
    uids = set(allowed_uids) or {0, os.geteuid()}
    trusted = {pid: s for pid, s in running.items() if s.report.uid in uids}
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
        driver = (owner if owner in running else None) if owner is not None else \
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
