"""Which alerts hold on this host now, and when one is raised or resolved.

The agent's direct notifiers page on the same conditions, under the same names, as the
Prometheus rules in deploy/prometheus/ (docs/alerts.md): a site that routes through
Alertmanager and a small team whose agents post to Slack themselves read the same alerts.
Everything here is computed from a PollState and the times in it, so it is deterministic
and testable without clocks; hold-downs keep a condition that flickers at its threshold
from paging twice.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping

from tpumon.common.describe import describe_growth
from tpumon.detect import Assessment, Verdict
from tpumon.common.describe import time_to_oom
from tpumon.detect.forecast_band import BAND_LABEL
from tpumon.notify.settings import AlertSettings
from tpumon.state import PollState
from tpumon.common.units import format_hours, utc

log = logging.getLogger("tpumon.notify")

LEAK = "TPUMonHBMLeakSuspected"
OOM = "TPUMonOOMForecast"
HIGH = "TPUMonHBMHigh"
STALLED = "TPUMonTrainingStalled"
#: Conditions of the SPMD program rather than of one VM: every worker of a slice sees them
#: at once, so they page once per slice (PagerDuty's dedup_key names the slice, not the host)
SLICE_WIDE = (LEAK, OOM)
ENDED = "TPUMonJobEnded"
SEVERITY = {LEAK: "warning", OOM: "critical", HIGH: "warning", STALLED: "warning",
            ENDED: "warning"}
#: A job that died of memory pages; one that exited with memory far from full (often a run
#: that finished) or of an unknown cause is a warning.
END_SEVERITY = {"hbm_oom": "critical", "host_oom": "critical"}
RAISE_AFTER = {HIGH: 300.0}  # seconds a condition must hold first; the others are sustained
# by construction (a leak verdict needs 30 min of evidence; a stall is a duration itself)
INCIDENT_OPEN = "incident_still_open"  # a resolve's detail: the shared incident stays open
SNAPSHOT_WAIT = 600.0  # a leak warning waits this long at most for its tensor snapshots
UID_BURST = 10  # alerts about one user's processes raised at most this many times...
UID_WINDOW = 600.0  # ...in this many seconds; past that, theirs wait (UidBudget)


@dataclass(frozen=True)
class Alert:
    """One alert as a person and a pager read it. ``key`` is stable for the life of the
    condition (host, alert, chip or pid): PagerDuty's dedup_key, the outbox's identity."""

    name: str
    severity: str
    key: str
    host: str
    worker: str
    slice: str
    accelerator_type: str
    subject: str                 # "chip 2" or "pid 4242"
    summary: str                 # one line
    details: Mapping[str, Any] = field(default_factory=dict)  # numbers, cause, step
    dashboard: str = ""
    report: str = ""
    raised: float = 0.0          # when it was raised (the tracker sets it)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Alert":
        return cls(**data)

    @property
    def where(self) -> str:
        """Host, worker and slice as a person locates a VM of a pod (worded as the
        Alertmanager templates word it: 'h (worker 3, slice llama-pod-a, v4-32)')."""
        parts = (f"worker {self.worker}" if self.worker else "",
                 f"slice {self.slice}" if self.slice else "", self.accelerator_type)
        extra = ", ".join(p for p in parts if p)
        return f"{self.host} ({extra})" if extra else self.host

    @property
    def incident_key(self) -> str:
        """PagerDuty's dedup_key: for a slice-wide condition the slice and the alert, so
        that N workers (and their chips) seeing one leak open one incident; else ``key``."""
        if self.slice and self.name in SLICE_WIDE:
            return f"tpumon/slice/{self.slice}/{self.name}"
        return self.key


def describe_band(a: Assessment, now: float) -> str:
    """The forecast's calibrated band as a page says it: ", 92% between 14:10 and 17:40
    UTC, step 61,000-68,500" (dates where it leaves today); empty without one. The band is
    what the forecast has been worth on replayed leaks (tpumon.detect.forecast_band): a
    reader at 3 a.m. plans for its earlier end."""
    low, high = a.predicted_oom_time_low, a.predicted_oom_time_high
    if low is None or high is None:
        return ""
    day = time.strftime("%Y-%m-%d", time.gmtime(now))
    same_day = all(time.strftime("%Y-%m-%d", time.gmtime(t)) == day for t in (low, high))
    fmt = "%H:%M" if same_day else "%m-%d %H:%M"
    text = (f", {BAND_LABEL} between {time.strftime(fmt, time.gmtime(low))} and "
            f"{time.strftime(fmt, time.gmtime(high))} UTC")
    if a.predicted_oom_step_low is not None and a.predicted_oom_step_high is not None:
        text += f", step {a.predicted_oom_step_low:,.0f}-{a.predicted_oom_step_high:,.0f}"
    return text


def evaluate(snap: PollState, settings: AlertSettings) -> dict[str, Alert]:
    """Every condition that holds in this snapshot, by key (before any hold-down)."""
    found: dict[str, Alert] = {}
    answered = snap.runtime.chips if snap.runtime is not None else {}
    now = snap.runtime.time if snap.runtime is not None else snap.time  # the samples' clock
    for chip, a in snap.assessments.items():
        if chip in answered:  # a chip that stopped answering holds no condition
            for alert in _chip_alerts(snap, chip, a, now, settings):
                found[alert.key] = alert
    for alert in _stalls(snap, settings):
        found[alert.key] = alert
    for alert in _ends(snap, settings):
        found[alert.key] = alert
    return found


def _alert(snap: PollState, name: str, subject: str, summary: str, details: dict,
           settings: AlertSettings, chip: str = "") -> Alert:
    ident = snap.identity
    fill = dict(host=ident.host, worker=ident.worker, slice=ident.slice, chip=chip)
    return Alert(name=name, severity=SEVERITY[name],
                 key=f"tpumon/{ident.host}/{name}/{subject.replace(' ', '')}",
                 host=ident.host, worker=ident.worker, slice=ident.slice,
                 accelerator_type=ident.accelerator_type, subject=subject, summary=summary,
                 details={k: v for k, v in details.items() if v is not None},
                 dashboard=settings.dashboard_url.format(**fill),
                 report=settings.report_url.format(**fill))


def _interval(low: float | None, high: float | None) -> list[float | None] | None:
    return None if low is None and high is None else [low, high]


def _chip_alerts(snap: PollState, chip: str, a: Assessment, now: float,
                 settings: AlertSettings) -> Iterable[Alert]:
    ratio = a.floor_bytes / a.total_bytes if a.floor_bytes is not None and a.total_bytes \
        else math.nan
    high = ratio >= settings.hbm_used_ratio_threshold and math.isfinite(ratio)
    if a.verdict is not Verdict.LEAK and not high:
        return  # the usual poll: no alert, so no details gathered (every chip, every poll)
    cause = snap.chip_cause(chip)
    details = {"chip": chip, "verdict": a.verdict.value, "step": snap.chip_steps.get(chip),
               **_tensor_details(snap, chip, settings),
               "hbm_floor_bytes": a.floor_bytes, "hbm_total_bytes": a.total_bytes,
               "growth_bytes_per_step": a.slope_bytes_per_step,
               "growth_bytes_per_hour": a.slope_bytes_per_hour,
               "predicted_oom_time": a.predicted_oom_time,
               "predicted_oom_step": a.predicted_oom_step,
               # the forecast's interval (earliest, latest) as it stands when the alert fires
               "predicted_oom_time_interval": _interval(a.predicted_oom_time_low,
                                                        a.predicted_oom_time_high),
               "predicted_oom_step_interval": _interval(a.predicted_oom_step_low,
                                                        a.predicted_oom_step_high),
               "cause": cause.code if cause else None, "cause_text": cause.text if cause else None}
    if a.verdict is Verdict.LEAK:
        growth = describe_growth(a.slope_bytes_per_step, a.slope_bytes_per_hour)
        # from the assessment's moment, as every other view of this poll says it
        eta = time_to_oom(a, now)
        details["time_to_oom_seconds"] = eta
        at_step = "" if a.predicted_oom_step is None else f" (~step {a.predicted_oom_step:,.0f})"
        band = describe_band(a, now)
        oom = "" if eta is None else f"; OOM in {format_hours(eta)}{at_step}{band}"
        yield _alert(snap, LEAK, f"chip {chip}", f"HBM leak on chip {chip}: floor grows "
                     f"{growth}{oom}", details, settings, chip)
        if eta is not None and eta <= settings.oom_horizon_seconds:
            yield _alert(snap, OOM, f"chip {chip}", f"OOM forecast on chip {chip} in "
                         f"{format_hours(eta)}{at_step}{band}: floor grows {growth}",
                         details, settings, chip)
    if high:
        details = {**details, "hbm_used_ratio": ratio}
        yield _alert(snap, HIGH, f"chip {chip}", f"HBM floor of chip {chip} at "
                     f"{100 * ratio:.1f}% of capacity", details, settings, chip)


def _tensor_details(snap: PollState, chip: str, settings: AlertSettings) -> dict[str, Any]:
    """What the chip's process's tensor snapshots found, or that they are on their way
    (the agent asks for them when the leak is called; the warning waits a little)."""
    pid = snap.chip_processes.get(chip)
    state = snap.processes.get(pid) if pid is not None else None
    if pid is None or state is None:
        return {}
    result = snap.tensor_snapshot(pid)
    coming = settings.wait_for_snapshots and state.report.snapshots and (
        result is None or result.pending)
    return {"tensors": snap.tensor_summary(pid), "tensors_pending": True if coming else None}


def _stalls(snap: PollState, settings: AlertSettings) -> Iterable[Alert]:
    """Reporting processes with no step for the stall time while their own chips (those
    they hold, or whose step they drive) hold memory. Never this host's chips at large: a
    silent process of another user would be paged as stuck while the real job's chips
    hold memory."""
    chips = snap.runtime.chips if snap.runtime is not None else {}
    for pid, state in snap.processes.items():
        silent = snap.time - state.report.received
        if silent < settings.training_stall_seconds:
            continue
        mine = sorted({c for c, p in [*snap.owners.items(), *snap.chip_processes.items()]
                       if p == pid})
        held = sum(chips[c].hbm_used_bytes for c in mine if c in chips)
        if held > 0:
            yield _alert(snap, STALLED, f"pid {pid}", f"training process {pid} "
                         f"({state.report.framework}) stuck at step {state.report.step} for "
                         f"{format_hours(silent)} while its chips hold "
                         f"{held / 2**30:.1f} GiB",
                         {"pid": pid, "uid": state.report.uid, "step": state.report.step,
                          "silent_seconds": silent, "hbm_held_bytes": held,
                          "chips": ",".join(mine)}, settings)


def _ends(snap: PollState, settings: AlertSettings) -> Iterable[Alert]:
    """Each job that ended in the last hour: one notification an end. Its key names the
    process (pid and start time, or when it ended where the start could not be read), so
    a later job under a reused pid is another, and one process's end is one key."""
    for end in snap.job_ends:
        alert = _alert(snap, ENDED, f"pid {end.pid} at {utc(end.time, seconds=True)}",
                       end.summary(),
                       {"pid": end.pid, "uid": end.view.uid, "cause": end.cause,
                        "step": end.view.step, "evidence": end.evidence,
                        "forecast": end.forecast_comparison()}, settings)
        started = f"/started{end.view.start}" if end.view.start is not None else \
            f"/at{end.time:.0f}"
        yield replace(alert, severity=END_SEVERITY.get(end.cause, "warning"),
                      key=f"tpumon/{snap.identity.host}/{ENDED}/pid{end.pid}{started}")


def _waits_for_snapshots(alert: Alert) -> bool:
    """A leak warning waiting for its process's tensor snapshots (SNAPSHOT_WAIT at most)."""
    return alert.name == LEAK and bool(alert.details.get("tensors_pending"))


def _held_long_enough(alert: Alert, held: float, held_wall: float) -> bool:
    """Whether an alert whose condition has held ``held`` seconds on the samples' clock
    (``held_wall`` on the wall clock) is raised now. Hold-downs run on the clock of the
    verdicts they hold back; the wait for tensor snapshots on the wall clock, as the
    process's steps it waits for run (a simulated job's too: on the samples' clock a
    simulation at 480x gave them a second)."""
    if _waits_for_snapshots(alert):
        return held_wall >= SNAPSHOT_WAIT
    return held >= RAISE_AFTER.get(alert.name, 0.0)


@dataclass(frozen=True)
class Transition:
    """An alert raised or resolved: what the outbox turns into deliveries."""

    action: str  # "trigger" or "resolve"
    alert: Alert
    time: float


def log_transition(t: Transition) -> None:
    """One log line per alert raised or resolved (a raise at WARNING: journalctl -p
    warning shows it), whether or not a notifier delivers it anywhere."""
    level = logging.WARNING if t.action == "trigger" else logging.INFO
    log.log(level, "alert %s: %s on %s (%s): %s", t.action, t.alert.name, t.alert.subject,
            t.alert.severity, t.alert.summary)


class AlertLog:
    """Alerts raised and resolved, with the notifier's hold-downs, only logged: what the
    agent does when no Slack or PagerDuty is configured (then no notifier runs)."""

    def __init__(self, settings: AlertSettings) -> None:
        self.tracker = AlertTracker(settings)  # a reload sets tracker.settings

    def __call__(self, snap: PollState) -> None:
        for t in self.tracker.update(snap):
            log_transition(t)


class UidBudget:
    """At most UID_BURST raises of alerts about one user's processes in any UID_WINDOW
    seconds: past that, that user's wait (pending, raised as the window moves on), said
    once in the log. Any local user can start processes, so no user may page at will."""

    def __init__(self) -> None:
        self._raised: dict[int, deque[float]] = {}
        self._held: set[int] = set()

    def allow(self, uid: int | None, now: float) -> bool:
        """Whether an alert about a process of ``uid`` may be raised now (counted if so);
        an alert about no process (a chip's) always may."""
        if uid is None:
            return True
        times = self._raised.setdefault(uid, deque())
        while times and now - times[0] >= UID_WINDOW:
            times.popleft()
        if len(times) >= UID_BURST:
            if uid not in self._held:
                log.warning("alerts about uid %d's processes: %d raised in %g s, the most "
                            "allowed; the next wait", uid, UID_BURST, UID_WINDOW)
                self._held.add(uid)
            return False
        self._held.discard(uid)
        times.append(now)
        return True


class AlertTracker:
    """Turns each snapshot's conditions into triggers and resolves, with hold-downs.

    ``active`` is what was last raised (and not resolved): restored from the outbox after
    a restart, so an alert that still holds is not raised twice and one that cleared while
    the agent was down is resolved.
    """

    def __init__(self, settings: AlertSettings, active: Mapping[str, Alert] | None = None) -> None:
        self.settings = settings
        self.active: dict[str, Alert] = dict(active or {})
        # key -> since when its condition holds: on the samples' clock, on the wall clock
        self._pending: dict[str, tuple[float, float]] = {}
        self._clearing: dict[str, float] = {}  # key -> since when an active one is false
        self._budget = UidBudget()

    def update(self, snap: PollState) -> list[Transition]:
        # hold-downs run on the clock of the verdicts and forecasts they hold back (the
        # samples'; the wall clock on a TPU VM), but for the wait for tensor snapshots
        # (_held_long_enough)
        now, wall = snap.samples_time, snap.time
        holding = evaluate(snap, self.settings)
        out: list[Transition] = []
        for key in list(self._pending):
            if key not in holding:
                del self._pending[key]
        for key, alert in holding.items():
            self._clearing.pop(key, None)
            if key in self.active:  # newest numbers, for the resolve's message
                self.active[key] = replace(alert, raised=self.active[key].raised)
                continue
            if key not in self._pending and _waits_for_snapshots(alert):
                # said, so that a warning held back is not a warning missing (the journal
                # would show the OOM page and, for minutes, no word of the warning)
                log.info("alert %s on %s waits up to %s for its process's tensor snapshots",
                         alert.name, alert.subject, format_hours(SNAPSHOT_WAIT))
            since, since_wall = self._pending.setdefault(key, (now, wall))
            if _held_long_enough(alert, now - since, wall - since_wall) and \
                    self._budget.allow(alert.details.get("uid"), now):
                del self._pending[key]
                alert = self.active[key] = replace(alert, raised=now)
                out.append(Transition("trigger", alert, now))
        for key in [k for k in self.active if k not in holding]:
            since = self._clearing.setdefault(key, now)
            if now - since >= self.settings.resolve_after_seconds:
                del self._clearing[key]
                out.append(Transition("resolve", self._resolved(self.active.pop(key)), now))
        return out

    def _resolved(self, alert: Alert) -> Alert:
        """The alert as its resolve carries it: marked when another active alert of this
        host shares its incident (a slice-wide leak on another chip), whose incident this
        resolve must not close."""
        shared = alert.incident_key != alert.key and any(
            a.incident_key == alert.incident_key for a in self.active.values())
        return replace(alert, details={**alert.details, INCIDENT_OPEN: True}) if shared \
            else alert
