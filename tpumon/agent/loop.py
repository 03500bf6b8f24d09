"""The poll loop: sources -> state, on a fixed cadence, until told to stop.

One thread polls; everything else (HTTP scrapes, later the notifiers and the store) reads
the published poll state. The cadence runs on the monotonic clock, so a wall-clock jump
(NTP, a VM resumed from maintenance) neither bunches polls nor stops them; sample times
use the wall clock because that is what people and Prometheus read.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from prometheus_client import CollectorRegistry, Histogram

from tpumon.common.config import Config
from tpumon.common.describe import describe_growth, verdict_label
from tpumon.detect import Assessment, ChipDetector, DetectorSettings, Verdict
from tpumon.detect.verdict import leak_alert
from tpumon.detect.pooling import pool_jobs
from tpumon.common.identity import LABELS
from tpumon.diagnose.leak_snapshots import LeakSnapshots
from tpumon.agent.lifecycle import Component, take
from tpumon.common.samples import HostSample, RuntimeReading
from tpumon.sources.health import SourceTracker
from tpumon.sources.host import HostSource
from tpumon.sources.kernel_log import KernelLog, OomKill
from tpumon.sources.pod_resources import PodAssignment
from tpumon.sources.tpu_runtime import TpuRuntimeSource
from tpumon.notify.alerts import AlertLog
from tpumon.diagnose.job_ends import JobEnd, JobEndTracker
from tpumon.sources.last_words import LastWords
from tpumon.diagnose.processes import (ChipClaims, ProcessState, ProcessTracker, growing_chips,
                                       trusted_uids, with_hbm_growth)
from tpumon.sources.reports import ReporterSocket
from tpumon.state import AgentState, PollState
from tpumon.store.checkpoint import dump_detector
from tpumon.common.samples import StoredEnd
from tpumon.common.samples import Sample
from tpumon.store.writer import PollRecord, StoreWriter
from tpumon.common.units import utc

log = logging.getLogger("tpumon.agent")

FRESH_SECONDS = 60.0  # a chip's step comes from a report at most this old
HOST_SECONDS = 5.0  # host memory and owners' RSS at most this often (exported, not detected)
POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


QUIET_START = (Verdict.WARMING_UP, Verdict.INSUFFICIENT_DATA)  # every chip starts so


def log_verdict_changes(before: Mapping[str, Assessment],
                        after: Mapping[str, Assessment]) -> None:
    """One log line per chip whose verdict changed, with the reason and the forecast: the
    journal says when a leak was called or cleared, with or without Slack and PagerDuty.
    A restart of the chip's job gets its own line: without it, a leak's verdict going back
    to warming up read as a leak that cured itself."""
    for chip, a in sorted(after.items()):
        was = before.get(chip)
        if was is not None and a.restarts > was.restarts:
            log.info("chip %s: its job restarted (the step went back or memory fell to a "
                     "new baseline; %d restart(s) seen): the trend starts over", chip,
                     a.restarts)
        if was is not None and was.verdict is a.verdict:
            continue
        if a.verdict in QUIET_START and (was is None or was.verdict in QUIET_START):
            continue  # starting up: not news
        level = logging.WARNING if a.verdict in (Verdict.LEAK, Verdict.STEP_CHANGE) \
            else logging.INFO
        # written as every view writes a verdict ("collecting", not insufficient_data)
        since = "" if was is None else f" (was {verdict_label(was.verdict.value)})"
        log.log(level, "chip %s: verdict %s%s: %s%s", chip, verdict_label(a.verdict.value),
                since, a.reason, forecast_text(a))


def forecast_text(a: Assessment) -> str:
    """'; floor grows 118.5 KiB/step; OOM at step ~62,000 (2026-11-25 18:02 UTC)' when the
    floor grows (the growth only where the reason does not give it); '' otherwise."""
    if a.predicted_oom_time is None or not (a.slope_bytes_per_second or 0) > 0:
        return ""
    growth = describe_growth(a.slope_bytes_per_step, a.slope_bytes_per_hour)
    at_step = "" if a.predicted_oom_step is None else f" at step ~{a.predicted_oom_step:,.0f}"
    said = "" if growth in a.reason else f"; floor grows {growth}"
    return f"{said}; OOM{at_step} ({utc(a.predicted_oom_time)})"


class OwnerScanner:
    """Chip -> owning PID, rescanned at most every ``interval`` seconds (a /proc walk)."""

    def __init__(self, scan: Callable[[], Mapping[str, int]], interval: float) -> None:
        self._scan = scan
        self._interval = interval
        self._owners: Mapping[str, int] = {}
        self._next = 0.0

    def __call__(self) -> Mapping[str, int]:
        now = time.monotonic()
        if now >= self._next:
            self._owners = dict(self._scan())
            self._next = now + self._interval
        return self._owners


@dataclass
class AgentInputs:
    """What an agent polls, where it publishes and what it feeds: built from the
    configuration by ``bootstrap.build`` (or by hand in a test) and given to Agent whole.
    A source or reader the agent runs without is None."""

    state: AgentState
    runtime: TpuRuntimeSource
    owners: OwnerScanner
    interval: float
    registry: CollectorRegistry  # where the poll's own histogram goes
    detector_settings: DetectorSettings | None = None
    detectors: Mapping[str, ChipDetector] = field(default_factory=dict)  # resumed ones
    store: StoreWriter | None = None
    checkpoint_interval: float = 60.0
    reporters: ReporterSocket | None = None
    # without a notifier (no Slack, no PagerDuty) alerts are still raised, in the log
    alert_log: AlertLog | None = None
    leak_snapshots: LeakSnapshots | None = None
    kernel_log: KernelLog | None = None
    pod_resources: SourceTracker[PodAssignment] | None = None  # kubelet's, on Kubernetes


class Agent(Component):
    """Polls the runtime and the host each interval and publishes a poll state. As a
    component its loop is run by ``run``; a reload changes its interval."""

    name = "poll loop"

    def __init__(self, inputs: AgentInputs) -> None:
        self.state = state = inputs.state
        self._detector_settings = inputs.detector_settings
        self._detectors: dict[str, ChipDetector] = dict(inputs.detectors)
        #: each chip's first pooled leak (its job's evidence shared): the alert that was
        #: logged and notified, which a job end holds its forecast to
        self._pooled_alerts: dict[str, dict] = {}
        self._holder: dict[str, int] = {}  # chip -> the last process seen holding it
        self._store = inputs.store
        self._checkpoint_interval = inputs.checkpoint_interval
        self._next_checkpoint = time.monotonic() + inputs.checkpoint_interval
        self.interval = inputs.interval
        self._runtime_source = runtime = inputs.runtime
        self._owners = inputs.owners
        self._runtime = SourceTracker("tpu_runtime", runtime.poll)
        self._host = SourceTracker("host",
                                   HostSource(inputs.owners, min_interval=HOST_SECONDS).poll)
        reporters = self._reporter_socket = inputs.reporters
        self._reporters = None if reporters is None else SourceTracker("reporter", reporters.poll)
        self._chip_claims = ChipClaims()
        self._processes = ProcessTracker()
        self._kernel = None if inputs.kernel_log is None else SourceTracker(
            "kernel_log", inputs.kernel_log.poll)
        self._ends = JobEndTracker(inputs.interval)
        self._pods = inputs.pod_resources  # polled on its own, slower cadence
        self._chip_pods: PodAssignment | None = None if self._pods is None else \
            PodAssignment({})  # the last answer stands while the kubelet does not answer
        self._unstored_ends: list[StoredEnd] = []  # for the store's next record
        self._leak_snapshots = inputs.leak_snapshots
        self._alert_log = inputs.alert_log
        self._polls = 0
        self._clock_offset = 0.0  # the samples' clock minus the wall clock (simulated time)
        self._poll_seconds = Histogram(
            "tpumon_poll_duration_seconds", "Time taken by one poll of all sources.",
            labelnames=LABELS, buckets=POLL_BUCKETS, registry=inputs.registry,
        ).labels(**state.current.identity.labels())

    def reload(self, config: Config, changed: frozenset[str]) -> frozenset[str]:
        """A new poll interval applies from the next tick."""
        mine = take(changed, ["agent.poll_interval"])
        if mine:
            self.interval = config["agent.poll_interval"]
        return changed - mine

    def poll_once(self) -> PollState:
        """Poll every source once and publish the result; never raises for a source."""
        started = time.monotonic()
        runtime = self._runtime.poll()
        host = self._host.poll()
        reported = None if self._reporters is None else self._reporters.poll()
        processes = self._processes.update(
            reported, None if host is None else host.memory_available_bytes)
        owners = self._owners()
        attributed = self._chip_claims(
            runtime.chips if runtime else (), owners, processes,
            self._reporter_socket.allowed_uids if self._reporter_socket else ())
        steps = self._steps(attributed, processes)
        samples = self._samples(runtime, steps)
        self._polls += 1
        assessments = self._detect(samples, owners)
        log_verdict_changes(self.state.current.assessments, assessments)
        processes = with_hbm_growth(processes, attributed, growing_chips(assessments))
        self._notice_ends(runtime, owners, attributed, processes, assessments, host,
                          reported.last_words if reported is not None else {})
        if self._leak_snapshots is not None:
            self._leak_snapshots.update(assessments, attributed, processes, time.time())
        previous = self.state.current
        wall = time.time()
        if runtime is not None:
            self._clock_offset = runtime.time - wall
        if self._pods is not None:
            self._chip_pods = self._pods.poll() or self._chip_pods
        health = (self._runtime.health, self._host.health) + tuple(
            t.health for t in (self._reporters, self._kernel, self._pods) if t is not None)
        polled = PollState(
            time=wall, clock_offset=self._clock_offset, identity=previous.identity,
            inventory=previous.inventory,
            runtime=runtime, host=host, owners=owners, health=health,
            runtime_ports_up=dict(self._runtime_source.ports_up),
            runtime_servers=dict(self._runtime_source.servers),
            assessments=assessments,
            runtime_malformed_total=self._runtime_source.malformed_total,
            polls_total=self._polls,
            processes=processes, chip_processes=attributed, chip_steps=steps,
            reporter=reported, job_ends=tuple(self._ends.recent),
            job_ends_total=dict(self._ends.totals), chip_pods=self._chip_pods)
        self.state.publish(polled)
        if self._alert_log is not None:
            self._alert_log(polled)
        if self._store is not None:
            self._record(self._store, samples)
        self._poll_seconds.observe(time.monotonic() - started)
        return polled

    def _notice_ends(self, runtime: RuntimeReading | None, owners: Mapping[str, int],
                     attributed: Mapping[str, int], processes: Mapping[int, ProcessState],
                     assessments: Mapping[str, Assessment], host: HostSample | None,
                     last_words: Mapping[int, LastWords]) -> None:
        """Jobs that ended since the last poll: one log line each (docs/job-ends.md), with
        what each said as it ended where its reporter heard it."""
        kills = self._kernel_kills()
        alerts = {name: self._pooled_alerts.get(name) or d.alert
                  for name, d in self._detectors.items()}
        trusted = trusted_uids(self._reporter_socket.allowed_uids
                               if self._reporter_socket else ())
        self._tell_ends(self._ends.update(time.time(), runtime, owners, processes,
                                          assessments, alerts, host, kills, attributed,
                                          trusted, last_words))

    def _tell_ends(self, ends: list[JobEnd]) -> None:
        for end in ends:
            log.warning("%s", end.summary())
            if self._store is not None:
                self._unstored_ends.append(end.stored())

    def _flush_ends(self) -> None:
        """As the agent stops: the ends held a poll for last words still on their way
        are told with what the reporters heard by now (a stop within that poll lost them)."""
        if not self._ends.holding:
            return
        reported = None if self._reporters is None else self._reporters.poll()
        words = reported.last_words if reported is not None else {}
        self._tell_ends(self._ends.flush(self._kernel_kills(), words))

    def _kernel_kills(self) -> Mapping[int, OomKill]:
        """The kernel's OOM kills lately, by pid (none without its log)."""
        return (self._kernel.poll() if self._kernel is not None else None) or {}

    @staticmethod
    def _steps(attributed: Mapping[str, int],
               processes: Mapping[int, ProcessState]) -> dict[str, int]:
        """Each chip's training step now: its process's latest report, if one came within
        FRESH_SECONDS (a report older than that is a stalled or finished job)."""
        now = time.time()
        return {chip: processes[pid].report.step for chip, pid in attributed.items()
                if now - processes[pid].report.received <= FRESH_SECONDS}

    @staticmethod
    def _samples(reading: RuntimeReading | None, steps: Mapping[str, int]) -> dict[str, Sample]:
        """This poll's sample of each chip that reported its capacity, with its step: what
        the detectors are fed and the store keeps."""
        if reading is None:
            return {}
        return {name: Sample(reading.time, steps.get(name), chip.hbm_used_bytes,
                             chip.hbm_total_bytes)
                for name, chip in reading.chips.items() if chip.hbm_total_bytes is not None}

    def _record(self, store: StoreWriter, samples: Mapping[str, Sample],
                final: bool = False) -> None:
        """Hand the poll's samples to the store (a queue append) and, every
        ``checkpoint_interval`` or when stopping, the detectors' state after them."""
        checkpoints = {}
        if final or time.monotonic() >= self._next_checkpoint:
            checkpoints = {name: dump_detector(d) for name, d in self._detectors.items()}
            self._next_checkpoint = time.monotonic() + self._checkpoint_interval
        ends, self._unstored_ends = tuple(self._unstored_ends), []
        if samples or checkpoints or ends:
            store.submit(PollRecord(self.state.current.identity.host,
                                    tuple(samples.items()), checkpoints, ends))

    def _detect(self, samples: Mapping[str, Sample],
                owners: Mapping[str, int]) -> dict[str, Assessment]:
        """Feed each chip's sample to its detector (the same code ``tpumon analyze`` runs),
        and pool the evidence of the chips one process holds (one job: ``pool_jobs``).

        A chip that does not answer gets no sample: to its detector that is a poll gap,
        and a gap followed by memory back at baseline is a job restart.
        """
        for name, s in samples.items():
            detector = self._detectors.get(name)
            if detector is None:
                detector = self._detectors[name] = ChipDetector(self._detector_settings)
            detector.update((s.time,), (math.nan if s.step is None else s.step,), (s.used,),
                            (s.total,))
        # a chip's job is the last process seen holding it: a poll whose owner scan misses
        # the holder (a runtime that timed out, /proc under load) must not split the job
        # and flip its pooled verdicts back and forth
        self._holder.update(owners)
        pooled = pool_jobs({name: d.assessment for name, d in self._detectors.items()},
                           {chip: f"process {pid}" for chip, pid in self._holder.items()})
        for name, a in pooled.items():
            now = samples.get(name)
            if a.verdict is Verdict.LEAK and name not in self._pooled_alerts and now is not None:
                self._pooled_alerts[name] = leak_alert(
                    now.time, math.nan if now.step is None else now.step, a)
        return pooled

    def run(self, stop: threading.Event,
            after_poll: Callable[[PollState], None] | None = None) -> None:
        """Poll on a fixed monotonic cadence until ``stop`` is set; overruns skip ticks.
        ``after_poll`` (systemd's READY and watchdog) runs after each poll that published."""
        next_tick = time.monotonic()
        while not stop.is_set():
            try:
                snap = self.poll_once()
                if after_poll is not None:
                    after_poll(snap)
            except Exception:  # noqa: BLE001 - last line of defence: log and keep polling
                log.exception("poll failed unexpectedly; continuing")
            next_tick += self.interval
            now = time.monotonic()
            if next_tick < now:  # a poll overran: skip the ticks it ate instead of bursting
                next_tick = now + self.interval - (now - next_tick) % self.interval
            stop.wait(next_tick - now)
        try:
            self._flush_ends()
        except Exception:  # noqa: BLE001 - as a poll: the store's last write must still come
            log.exception("telling the ends held for last words failed")
        if self._store is not None:
            self._record(self._store, {}, final=True)
        self._runtime_source.close()
