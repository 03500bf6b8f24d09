"""The agent's state: the latest consistent poll state (PollState), published whole.

The poll thread is the only writer. It builds a new immutable :class:`PollState` after each
poll and publishes it with one reference assignment, so a scrape (another thread) always
reads one whole poll, never half of one, and never waits for a poll in progress.

Data flows one way: sources -> detector -> diagnosis -> this state -> the store, notifiers,
metrics, web. So the poll state holds what the poll found and nothing of its readers: the history
store's and the notifiers' health and the alert thresholds are read from those components
themselves (their collectors, the status document), and this module imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from tpumon.detect import Assessment, Verdict
from tpumon.diagnose.counts import Cause
from tpumon.common.identity import Identity
from tpumon.diagnose.job_ends import JobEnd
from tpumon.common.samples import HostSample, RuntimeReading, chip_sort_key
from tpumon.sources.chips import ChipInventory
from tpumon.sources.health import SourceHealth
from tpumon.sources.pod_resources import PodAssignment
from tpumon.diagnose.processes import ProcessState
from tpumon.sources.reports import ReporterReading
from tpumon.sources.runtime_server import RuntimeServer
from tpumon.sources.snapshots import SnapshotResult


@dataclass(frozen=True)
class PollState:
    """Everything one poll found (not a tensor snapshot: that is
    ``tpumon.instrument.snapshot.Snapshot``); metrics, web and the CLI read it."""

    time: float
    identity: Identity
    inventory: ChipInventory
    runtime: RuntimeReading | None = None
    host: HostSample | None = None
    owners: Mapping[str, int] = field(default_factory=dict)
    health: tuple[SourceHealth, ...] = ()
    runtime_ports_up: Mapping[int, bool] = field(default_factory=dict)
    # port -> who serves it and whether its figures are believed (empty: not checked)
    runtime_servers: Mapping[int, RuntimeServer] = field(default_factory=dict)
    assessments: Mapping[str, Assessment] = field(default_factory=dict)
    runtime_malformed_total: int = 0
    polls_total: int = 0
    processes: Mapping[int, ProcessState] = field(default_factory=dict)  # reporting, by pid
    chip_processes: Mapping[str, int] = field(default_factory=dict)  # chip -> reporting pid
    chip_steps: Mapping[str, int] = field(default_factory=dict)  # chip -> its training step
    reporter: ReporterReading | None = None  # None: no reporter socket configured
    job_ends: tuple[JobEnd, ...] = ()  # training jobs that ended in the last hour
    job_ends_total: Mapping[str, int] = field(default_factory=dict)  # by cause, since start
    # The samples' clock minus the wall clock: 0 on a TPU VM; under --simulate the simulated
    # time runs ahead. Verdicts and forecasts are on the samples' clock (samples_time).
    clock_offset: float = 0.0
    chip_pods: PodAssignment | None = None  # None: not on Kubernetes (pod-resources off)

    @property
    def samples_time(self) -> float:
        """Now on the clock the samples, verdicts and OOM forecasts are dated by."""
        return self.time + self.clock_offset

    def wall_time_of(self, samples_time: float) -> float:
        """A time on the samples' clock as the wall clock's (for Prometheus' time())."""
        return samples_time - self.clock_offset

    def chip_cause(self, chip: str) -> Cause | None:
        """The likely cause of the chip's growth, from the reports of the process that
        drives it (knowing whether its HBM floor leaks); None without one."""
        pid = self.chip_processes.get(chip)
        if pid is None:
            return None
        a = self.assessments.get(chip)
        return self.processes[pid].diagnosis(a is not None and a.verdict is Verdict.LEAK)

    def tensor_snapshot(self, pid: int) -> SnapshotResult | None:
        """The process's latest snapshot request and, once both answers came, their diff."""
        return None if self.reporter is None else self.reporter.snapshots.get(pid)

    def process_growth_per_step(self, pid: int) -> float | None:
        """HBM floor growth per step summed over the chips the process drives: what its
        tensors' growth is compared with (bytes are counted per device on both sides)."""
        slopes = [a.slope_bytes_per_step for c, p in self.chip_processes.items() if p == pid
                  for a in (self.assessments.get(c),)
                  if a is not None and a.slope_bytes_per_step is not None]
        return sum(slopes) if slopes else None

    def tensor_summary(self, pid: int) -> str | None:
        """"likely leak: +1 f32[] per step ..." from a finished snapshot diff; None when
        there is none (yet)."""
        result = self.tensor_snapshot(pid)
        if result is None or result.diff is None:
            return None
        return result.diff.summary(self.process_growth_per_step(pid),
                                   live_per_step=self.live_per_step(pid))

    def live_per_step(self, pid: int) -> float | None:
        state = self.processes.get(pid)
        return None if state is None else state.live.per_step

    def ended_job(self, chip: str) -> JobEnd | None:
        """The job end that left this chip's verdict about a job that is gone: the chip was
        not read this poll and the latest end that held it says so. Every view (status,
        /metrics, the index page) then shows no growth and no OOM forecast for it: "OOM in
        26 min" stayed on /metrics after the job ran out of memory, and kept the critical
        TPUMonOOMForecast firing beside TPUMonJobDiedOOM."""
        if self.runtime is not None and chip in self.runtime.chips:
            return None
        a = self.assessments.get(chip)
        start = None if a is None else a.job_start
        for end in reversed(self.job_ends):
            if any(c.chip == chip for c in end.view.chips):
                seen = end.view.reading_time  # on the samples' clock, as the job's start
                if seen is None:
                    seen = end.time + self.clock_offset
                if start is not None and seen < start:
                    return None  # an earlier job's: the chip's job now is another, missed once
                return end
        return None

    def chips(self) -> list[str]:
        """Every chip to report: those that answered and those expected but missing."""
        if self.runtime is None:
            return list(self.inventory.devices)
        names = set(self.runtime.chips) | set(self.runtime.missing)
        return sorted(names, key=chip_sort_key)


class AgentState:
    """Holds the published poll state: the one thing the agent's readers (the metrics,
    /api/status, the alert log) share with the poll loop."""

    def __init__(self, identity: Identity, inventory: ChipInventory) -> None:
        self._current = PollState(0.0, identity, inventory)

    @property
    def current(self) -> PollState:
        """The latest poll's state (published whole, so always one consistent poll)."""
        return self._current

    def publish(self, poll: PollState) -> None:
        """Make a poll's state visible (one reference swap: readers see one poll whole)."""
        self._current = poll
