"""Prometheus metrics built at scrape time, one collector per subsystem (as node_exporter's
collectors): chips, detector, host, sources, reporters, job ends and build info from the
agent's published poll state; the history store and the notifiers, where the agent has
them, from their own health, and the alert thresholds from the settings in force (a
reload changes them). Nothing a reader of the poll state owns flows back through it.

Custom collectors rather than long-lived Gauge objects: a chip or a process that goes
away simply stops being exported (no stale series to delete by hand), and a scrape reads
one snapshot, so all values in one scrape come from the same poll. Every tpumon series
carries the identity labels (host, worker, accelerator_type, slice): pod-wide rules and
dashboards group by them without joins. docs/metrics.md lists every metric.

A label value that a process wrote (its name, a reporter's framework, a tensor group's
dtype and device) goes through :func:`~tpumon.common.untrusted_text.for_label`: the text format
escapes newlines and quotes, not the escape sequences a terminal running curl obeys.
"""

from __future__ import annotations

import platform
from collections import Counter
from typing import Callable, Iterator

from prometheus_client import (CollectorRegistry, PlatformCollector, ProcessCollector,
                               disable_created_metrics)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tpumon import __version__, package_version
from tpumon.detect import Verdict
from tpumon.metrics.job_end_families import job_end_metrics
from tpumon.metrics.pod_labels import PodLabels
from tpumon.metrics.replay_families import replay_metrics
from tpumon.metrics.runtime_families import RuntimeMetricsCollector
from tpumon.common.identity import LABELS
from tpumon.notify.health import FAILURE_REASONS, GIVE_UP_REASONS, NotifierHealth
from tpumon.notify.settings import AlertSettings
from tpumon.state import PollState
from tpumon.store.writer import StoreHealth
from tpumon.common.untrusted_text import for_label

IDENTITY = list(LABELS)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=IDENTITY + labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=IDENTITY + labels)


def _identity_values(snap: PollState) -> list[str]:
    return [snap.identity.labels()[k] for k in IDENTITY]


class _PollCollector(Collector):
    """One subsystem's families, from the poll's snapshot: one scrape reads one snapshot,
    so its values all come from the same poll."""

    def __init__(self, get_snapshot: Callable[[], PollState]) -> None:
        self._get_snapshot = get_snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._get_snapshot()
        return self.families(snap, _identity_values(snap))

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        raise NotImplementedError


class ChipCollector(_PollCollector):
    """HBM, duty cycle, up and owner of each chip, as the runtime reported them."""

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        used = _gauge("tpumon_hbm_used_bytes", "HBM in use on the chip, as libtpu reports it.",
                      ["chip"])
        total = _gauge("tpumon_hbm_total_bytes", "HBM capacity of the chip.", ["chip"])
        duty = _gauge("tpumon_tensorcore_duty_cycle_ratio",
                      "Fraction of time the TensorCore was busy (0-1).", ["chip"])
        up = _gauge("tpumon_chip_up",
                    "1 if the chip answered the last poll, 0 if expected but missing.", ["chip"])
        owner = _gauge("tpumon_chip_owner_info",
                       "Process holding the chip's device open: always 1.",
                       ["chip", "pid", "process"])
        runtime = snap.runtime
        names = {p.pid: for_label(p.name) for p in (snap.host.processes if snap.host else ())}
        for chip in snap.chips():
            sample = runtime.chips.get(chip) if runtime else None
            up.add_metric(ident + [chip], 1 if sample else 0)
            if sample is None:
                continue
            used.add_metric(ident + [chip], sample.hbm_used_bytes)
            if sample.hbm_total_bytes is not None:
                total.add_metric(ident + [chip], sample.hbm_total_bytes)
            if sample.duty_cycle is not None:
                duty.add_metric(ident + [chip], sample.duty_cycle)
        for chip, pid in sorted(snap.owners.items()):
            owner.add_metric(ident + [chip, str(pid), names.get(pid, "")], 1)
        expected = _gauge("tpumon_chips_expected",
                          "Chips (HBM devices) this VM should report; 0 when unknown.", [])
        expected.add_metric(ident, len(snap.inventory.devices))
        yield from (used, total, duty, up, owner, expected)
        yield from replay_metrics(snap, ident)  # the clock of these very HBM samples


#: What a chip whose job ended does not export (the status document drops the same): a
#: growth and an OOM forecast for a job that is gone
_OF_A_LIVE_JOB = frozenset({"slope_bytes_per_second", "slope_bytes_per_second_low",
                            "slope_bytes_per_step", "predicted_oom_time",
                            "predicted_oom_step"})


class DetectorCollector(_PollCollector):
    """The leak detector's view of each chip: floor, growth, forecast, verdict."""

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        gauges = {
            "floor_bytes": _gauge(
                "tpumon_hbm_floor_bytes",
                "HBM floor under the in-step transients (fitted level).", ["chip"]),
            "transient_bytes": _gauge(
                "tpumon_hbm_transient_bytes",
                "Largest in-step transient above the floor this job.", ["chip"]),
            "slope_bytes_per_second": _gauge(
                "tpumon_hbm_growth_bytes_per_second",
                "Growth of the floor (Sen's slope).", ["chip"]),
            "slope_bytes_per_second_low": _gauge(
                "tpumon_hbm_growth_lower_bound_bytes_per_second",
                "Lower end of the 95% interval of the floor's growth.", ["chip"]),
            "slope_bytes_per_step": _gauge(
                "tpumon_hbm_growth_bytes_per_step",
                "Growth of the floor per training step.", ["chip"]),
            "predicted_oom_time": _gauge(
                "tpumon_oom_predicted_timestamp_seconds",
                "When floor plus the recurring transient reaches capacity at the current growth.",
                ["chip"]),
            "predicted_oom_step": _gauge("tpumon_oom_predicted_step",
                                         "Training step at the predicted OOM.", ["chip"]),
            "window_seconds": _gauge("tpumon_leak_evidence_window_seconds",
                                     "Length of the window the growth was fitted on.", ["chip"]),
            "z": _gauge("tpumon_leak_trend_zscore",
                        "Mann-Kendall statistic of the fitted window (> 0: rising).", ["chip"]),
        }
        verdict = _gauge("tpumon_leak_verdict",
                         "Detector verdict: 1 for the chip's current verdict, 0 for the others.",
                         ["chip", "verdict"])
        restarts = _counter("tpumon_job_restarts", "Job restarts the detector has seen.", ["chip"])
        job_ended = _gauge("tpumon_chip_job_ended",
                           "1 while the chip's verdict is about a job that ended (not read "
                           "since): no growth or OOM forecast is exported for it.", ["chip"])
        for chip, a in sorted(snap.assessments.items()):
            ended = snap.ended_job(chip) is not None  # as status shows it: no forecast
            job_ended.add_metric(ident + [chip], 1 if ended else 0)
            for attr, family in gauges.items():
                if ended and attr in _OF_A_LIVE_JOB:
                    continue
                value = getattr(a, attr)
                if value is not None and attr == "predicted_oom_time":
                    value = snap.wall_time_of(value)  # so that `- time()` is the time left
                if value is not None:
                    family.add_metric(ident + [chip], value)
            for v in Verdict:
                verdict.add_metric(ident + [chip, v.value], 1 if a.verdict is v else 0)
            restarts.add_metric(ident + [chip], a.restarts)
        yield from gauges.values()
        yield verdict
        yield restarts
        yield job_ended


class HostCollector(_PollCollector):
    """Host memory and the resident memory of the processes that own chips."""

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        host = snap.host
        if host is None:
            return
        for name, doc, value in (
            ("total", "Host memory in total.", host.memory_total_bytes),
            ("available", "Host memory available without swapping.", host.memory_available_bytes),
            ("used", "Host memory in use (total minus available).", host.memory_used_bytes),
        ):
            family = _gauge(f"tpumon_host_memory_{name}_bytes", doc, [])
            family.add_metric(ident, value)
            yield family
        rss = _gauge("tpumon_training_process_resident_memory_bytes",
                     "Resident memory of a process that owns TPU chips.", ["pid", "process"])
        for proc in host.processes:
            rss.add_metric(ident + [str(proc.pid), proc.name], proc.rss_bytes)
        yield rss


class SourceCollector(_PollCollector):
    """Each data source's last poll (node_exporter's scrape_collector_success and
    _duration_seconds, per source), the runtime's ports and its unreadable entries."""

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        up = _gauge("tpumon_source_up", "1 if the source's last poll succeeded.", ["source"])
        polls = _counter("tpumon_source_polls", "Polls of the source.", ["source"])
        errors = _counter("tpumon_source_errors", "Failed polls of the source.", ["source"])
        duration = _gauge("tpumon_source_poll_duration_seconds",
                          "Duration of the source's last poll.", ["source"])
        last_ok = _gauge("tpumon_source_last_success_timestamp_seconds",
                         "Unix time of the source's last successful poll.", ["source"])
        for h in snap.health:
            up.add_metric(ident + [h.name], 1 if h.up else 0)
            polls.add_metric(ident + [h.name], h.polls_total)
            errors.add_metric(ident + [h.name], h.errors_total)
            duration.add_metric(ident + [h.name], h.last_duration_seconds)
            if h.last_success is not None:
                last_ok.add_metric(ident + [h.name], h.last_success)
        ports = _gauge("tpumon_runtime_port_up",
                       "1 if the runtime metric service answered on this port.", ["port"])
        for port, ok in sorted(snap.runtime_ports_up.items()):
            ports.add_metric(ident + [str(port)], 1 if ok else 0)
        untrusted = _gauge("tpumon_runtime_port_untrusted", "1 if a process the agent does "
                           "not trust listens on this runtime port (its figures are ignored).",
                           ["port"])
        for port, server in sorted(snap.runtime_servers.items()):
            untrusted.add_metric(ident + [str(port)],
                                 0 if server.trusted or server.uid is None else 1)
        malformed = _counter("tpumon_runtime_malformed_entries",
                             "Runtime metric entries ignored because they could not be read.", [])
        malformed.add_metric(ident, snap.runtime_malformed_total)
        yield from (up, polls, errors, duration, last_ok, ports, untrusted, malformed)


class ReporterCollector(_PollCollector):
    """Per reporting training process (tpumon.instrument), and the socket's counts."""

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        if snap.reporter is None:
            return
        yield from self._processes(snap, ident)
        received = _counter("tpumon_reporter_reports", "Reports received from training "
                            "processes.", [])
        received.add_metric(ident, snap.reporter.reports_total)
        dropped = _counter("tpumon_reporter_dropped_reports", "Reports (datagrams or "
                           "messages on a connection) dropped by the agent, by reason (oversized, "
                           "malformed, version, forbidden, backlog).",
                           ["reason"])
        for reason, count in snap.reporter.dropped_total.items():
            dropped.add_metric(ident + [reason], count)
        yield from (received, dropped)
        yield from _tensor_growth_metrics(snap, ident)

    @staticmethod
    def _processes(snap: PollState, ident: list[str]) -> Iterator[Metric]:
        labels = ["pid", "framework", "rank"]
        families = {
            "step": _gauge("tpumon_process_step", "Training step of the last report.", labels),
            "rate": _gauge("tpumon_process_steps_per_second",
                           "Training steps per second over the last two minutes.", labels),
            "live": _gauge("tpumon_process_live_tensors",
                           "Live XLA tensors (torch_xla) or arrays (JAX) after the last step.",
                           labels),
            "growth": _gauge("tpumon_process_live_tensors_growth_per_step",
                             "Growth of the live tensor count per step since warm-up (Sen's "
                             "slope); absent before a trend is fitted.", labels),
            "leak": _gauge("tpumon_process_leak_suspected",
                           "1 when live tensors grow steadily with steps and memory grows "
                           "with them (HBM of a chip it drives, or its RSS): tensors kept "
                           "alive across steps.", labels),
            "host_leak": _gauge("tpumon_process_host_leak_suspected",
                                "1 when the process's resident host memory grows steadily "
                                "with steps: host objects kept across steps.", labels),
            "rss_growth": _gauge("tpumon_process_resident_memory_growth_bytes_per_step",
                                 "Growth of the process's RSS per step since warm-up "
                                 "(Sen's slope); absent before a trend is fitted.", labels),
            "host_oom": _gauge("tpumon_process_host_oom_predicted_timestamp_seconds",
                               "When the process's RSS, at its trend, would take all the "
                               "host's available memory; only while a host leak is "
                               "suspected.", labels),
            "exited": _gauge("tpumon_process_exited",
                             "1 once the process's pid is gone (kept a few minutes for "
                             "status and post-mortems).", labels),
            "rss": _gauge("tpumon_process_resident_memory_bytes",
                          "Resident host memory of the process, as it reports it.", labels),
            "heard": _gauge("tpumon_process_last_report_timestamp_seconds",
                            "When the agent received the process's latest report (a process "
                            "is kept while it lives: old values mean a stalled step).", labels),
        }
        compiles = _counter("tpumon_process_compiles",
                            "XLA compilations by the process; uncached ones growing after "
                            "warm-up mean recompilation.", labels + ["cache"])
        device = _gauge("tpumon_process_device_memory_bytes",
                        "Device memory as the framework reports it (where it can).",
                        labels + ["device", "kind"])
        for pid, state in snap.processes.items():
            r = state.report
            key = ident + [str(pid), for_label(r.framework), "" if r.rank is None else str(r.rank)]
            families["step"].add_metric(key, r.step)
            families["heard"].add_metric(key, r.received)
            host_oom = state.host_oom_seconds
            for name, value in (("rate", r.steps_per_second), ("live", r.live),
                                ("growth", state.live.per_step), ("rss", r.rss),
                                ("rss_growth", state.rss.per_step),
                                ("host_oom", None if host_oom is None else snap.time + host_oom)):
                if value is not None:
                    families[name].add_metric(key, value)
            families["leak"].add_metric(key, 1 if state.verdict == "leak" else 0)
            families["host_leak"].add_metric(key, 1 if state.host_verdict == "leak" else 0)
            families["exited"].add_metric(key, 1 if r.exited else 0)
            for cache, value in (("hit", r.compiles_cached), ("miss", r.compiles_uncached)):
                if value is not None:
                    compiles.add_metric(key + [cache], value)
            for dev, stats in r.devices.items():
                for kind, value in stats.items():
                    if value is not None:
                        device.add_metric(key + [dev, kind], value)
        yield from families.values()
        yield from (compiles, device)
        cause = _gauge("tpumon_leak_cause_info", "1 for a chip's likely cause of growth, from "
                       "its training process's reports: retained_tensors, recompilation, "
                       "host_memory (RSS grows), allocator (HBM grows, tensors and compiles "
                       "flat).", ["chip", "cause"])
        for chip in snap.chip_processes:
            found = snap.chip_cause(chip)
            if found is not None:
                cause.add_metric(ident + [chip, found.code], 1)
        yield cause


class AlertSettingsCollector(Collector):
    """The alert thresholds this agent uses: the Prometheus rules compare against them, so
    one configuration drives both paths. Read from the settings in force at scrape time."""

    def __init__(self, get_snapshot: Callable[[], PollState],
                 settings: Callable[[], AlertSettings]) -> None:
        self._get_snapshot, self._settings = get_snapshot, settings

    def collect(self) -> Iterator[Metric]:
        alerts, ident = self._settings(), _identity_values(self._get_snapshot())
        for name, doc, value in (
            ("tpumon_alert_oom_horizon_seconds", "Critical alert when a forecast OOM is "
             "nearer than this (alerts.oom_horizon_hours).", alerts.oom_horizon_seconds),
            ("tpumon_alert_hbm_used_ratio_threshold", "Warning when a chip's HBM floor stays "
             "above this fraction of capacity (alerts.hbm_used_ratio_threshold).",
             alerts.hbm_used_ratio_threshold),
            ("tpumon_alert_training_stall_seconds", "Warning when a live training process "
             "has reported no step for this long (alerts.training_stall_minutes).",
             alerts.training_stall_seconds)):
            family = _gauge(name, doc, [])
            family.add_metric(ident, value)
            yield family


class NotifierCollector(Collector):
    """The direct notifiers' (Slack, PagerDuty) deliveries and the alerts they hold, read
    from the notifier itself at scrape time."""

    def __init__(self, get_snapshot: Callable[[], PollState],
                 health: Callable[[], NotifierHealth]) -> None:
        self._get_snapshot, self._health = get_snapshot, health

    def collect(self) -> Iterator[Metric]:
        h, ident = self._health(), _identity_values(self._get_snapshot())
        up = _gauge("tpumon_notifier_up", "1 if the notifier's last delivery attempt "
                    "succeeded (or none was needed).", ["notifier"])
        pending = _gauge("tpumon_notifier_pending_notifications", "Notifications waiting in "
                         "the outbox.", ["notifier"])
        delivered = _counter("tpumon_notifier_deliveries", "Requests the service accepted.",
                             ["notifier"])
        failures = _counter("tpumon_notifier_failures", "Failed delivery attempts, retried: "
                            "rate_limited, server_error, network.", ["notifier", "reason"])
        given_up = _counter("tpumon_notifier_given_up_notifications", "Notifications "
                            "abandoned: rejected (a 4xx), expired (undeliverable for a day).",
                            ["notifier", "reason"])
        for c in h.channels:
            key = ident + [c.name]
            up.add_metric(key, 1 if c.up else 0)
            pending.add_metric(key, c.pending)
            delivered.add_metric(key, c.delivered_total)
            for reason in FAILURE_REASONS:
                failures.add_metric(key + [reason], c.failures_total.get(reason, 0))
            for reason in GIVE_UP_REASONS:
                given_up.add_metric(key + [reason], c.given_up_total.get(reason, 0))
        active = _gauge("tpumon_alerts_active", "Alerts this agent has raised and not yet "
                        "resolved, by alert and severity.", ["alert", "severity"])
        counts = Counter((a["name"], a["severity"]) for a in h.active)
        for (name, severity), n in sorted(counts.items()):
            active.add_metric(ident + [name, severity], n)
        yield from (up, pending, delivered, failures, given_up, active)


class StoreCollector(Collector):
    """The history store's writes, errors and size, read from the store at scrape time."""

    def __init__(self, get_snapshot: Callable[[], PollState],
                 health: Callable[[], StoreHealth]) -> None:
        self._get_snapshot, self._health = get_snapshot, health

    def collect(self) -> Iterator[Metric]:
        h, ident = self._health(), _identity_values(self._get_snapshot())
        up = _gauge("tpumon_store_up", "1 if the history store's last write succeeded.", [])
        up.add_metric(ident, 1 if h.up else 0)
        error = _gauge("tpumon_store_error_info",
                       "1 while the history store cannot be written, by kind (read_only, "
                       "disk_full, corrupt, io).", ["kind"])
        if h.error_kind:
            error.add_metric(ident + [h.error_kind], 1)
        size = _gauge("tpumon_store_size_bytes",
                      "Bytes on disk of the history store (database and WAL).", [])
        size.add_metric(ident, h.size_bytes)
        queued = _gauge("tpumon_store_queued_polls", "Polls waiting to be written.", [])
        queued.add_metric(ident, h.queued_polls)
        yield from (up, error, size, queued)
        for name, doc, value in (
            ("polls_written", "Polls written to the history store.", h.polls_written_total),
            ("write_errors", "Failed writes to the history store.", h.write_errors_total),
            ("dropped_polls", "Polls never written: the queue was full while the store "
             "could not be written.", h.dropped_polls_total),
            ("write_seconds", "Time spent writing the history store.", h.write_seconds_total),
            ("moved_aside", "Damaged history databases moved aside.", h.moved_aside_total),
        ):
            family = _counter(f"tpumon_store_{name}", doc, [])
            family.add_metric(ident, value)
            yield family


TOP_TENSOR_GROUPS = 3  # per process: bounded cardinality, the groups that matter


def _tensor_growth_metrics(snap: PollState, ident: list[str]) -> Iterator[Metric]:
    """What the latest live-tensor snapshot diff of each process found: the top groups that
    grew (``group`` is "f32[]", "bf16[4096,14336]"...; at most TOP_TENSOR_GROUPS each) and
    the share of the HBM growth they explain."""
    labels = ["pid", "framework", "group"]
    count = _gauge("tpumon_tensor_growth_per_step", "Tensors gained per step by a shape/dtype "
                   "group between the last two live-tensor snapshots (top groups only).", labels)
    size = _gauge("tpumon_tensor_growth_bytes_per_step", "Bytes gained per step by a "
                  "shape/dtype group between the last two live-tensor snapshots.", labels)
    explained = _gauge("tpumon_tensor_growth_explained_ratio", "Share of the HBM floor's "
                       "growth per step that the grown tensor groups account for (0-1).",
                       ["pid", "framework"])
    taken = _gauge("tpumon_tensor_snapshot_timestamp_seconds", "When the last live-tensor "
                   "snapshot pair of the process was completed.", ["pid", "framework"])
    for pid, state in snap.processes.items():
        result = snap.tensor_snapshot(pid)
        if result is None or result.diff is None or result.completed is None:
            continue
        key = ident + [str(pid), for_label(state.report.framework)]
        taken.add_metric(key, result.completed)
        for g in result.diff.grown[:TOP_TENSOR_GROUPS]:
            per_count, per_bytes = g.count_per_step, g.bytes_per_step
            if per_count is not None and per_bytes is not None:  # None: the same step
                group = for_label(g.label())  # its dtype and device: the reporter's words
                count.add_metric(key + [group], per_count)
                size.add_metric(key + [group], per_bytes)
        share = result.diff.explained_fraction(snap.process_growth_per_step(pid))
        if share is not None:
            explained.add_metric(key, share)
    yield from (count, size, explained, taken)


class JobEndCollector(_PollCollector):
    """Training jobs' ends (tpumon.diagnose.job_ends)."""

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        return job_end_metrics(snap, ident)


class BuildInfoCollector(_PollCollector):
    """tpumon_build_info: the versions tpumon runs with, in labels."""

    def __init__(self, get_snapshot: Callable[[], PollState]) -> None:
        super().__init__(get_snapshot)
        self._build = [__version__, package_version("tpu-info"), platform.python_version()]

    def families(self, snap: PollState, ident: list[str]) -> Iterator[Metric]:
        info = _gauge("tpumon_build_info", "tpumon build: always 1, versions in labels.",
                      ["version", "tpu_info_version", "python_version"])
        info.add_metric(ident + self._build, 1)
        yield info


def register_collectors(registry: CollectorRegistry, get_snapshot: Callable[[], PollState],
                        store_health: Callable[[], StoreHealth] | None = None,
                        notifier_health: Callable[[], NotifierHealth] | None = None,
                        alert_settings: Callable[[], AlertSettings] = AlertSettings) -> None:
    """tpumon's collectors, one per subsystem: the store's and the notifiers' only where
    there is one, reading its own health; ``alert_settings`` gives the thresholds in force
    (the defaults unless given)."""
    for collector in (ChipCollector, DetectorCollector, HostCollector, SourceCollector):
        registry.register(collector(get_snapshot))
    if store_health is not None:
        registry.register(StoreCollector(get_snapshot, store_health))
    registry.register(ReporterCollector(get_snapshot))
    registry.register(AlertSettingsCollector(get_snapshot, alert_settings))
    registry.register(JobEndCollector(get_snapshot))
    if notifier_health is not None:
        registry.register(NotifierCollector(get_snapshot, notifier_health))
    registry.register(BuildInfoCollector(get_snapshot))


def build_registry(get_snapshot: Callable[[], PollState],
                   store_health: Callable[[], StoreHealth] | None = None,
                   notifier_health: Callable[[], NotifierHealth] | None = None,
                   alert_settings: Callable[[], AlertSettings] = AlertSettings
                   ) -> CollectorRegistry:
    """A registry with tpumon's metrics and the agent's own process and platform metrics."""
    disable_created_metrics()  # *_created gauges per histogram: noise for a per-VM agent
    tpumon = CollectorRegistry()  # tpumon's families, given each chip's pod labels at once
    register_collectors(tpumon, get_snapshot, store_health, notifier_health, alert_settings)
    tpumon.register(RuntimeMetricsCollector(get_snapshot))
    registry = CollectorRegistry()
    registry.register(PodLabels(tpumon, get_snapshot))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry
