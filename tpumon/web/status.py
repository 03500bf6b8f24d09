"""The status document: one JSON shape for ``tpumon status --format json`` and its table.

Built from a PollState and, in the agent, the health its history store and notifiers
report of themselves (``Readers``: read at the time of the request, never carried by the
poll state), so whatever shows status reports the same fields under the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tpumon import __version__
from tpumon.common.describe import time_to_oom
from tpumon.diagnose.counts import Cause
from tpumon.diagnose.processes import ProcessState
from tpumon.notify.health import NotifierHealth
from tpumon.state import PollState
from tpumon.store.writer import StoreHealth

TOP_GROUPS = 10  # tensor groups that grew, per process, in the document


@dataclass(frozen=True)
class Readers:
    """The health of the components that read the poll state (the history store, the
    notifiers), each asked itself; None where the agent runs without one."""

    store: Callable[[], StoreHealth] | None = None
    notifier: Callable[[], NotifierHealth] | None = None


NO_READERS = Readers()  # a one-off status: no store, no notifier


def _assessment(snap: PollState, chip: str) -> dict[str, Any]:
    a = snap.assessments.get(chip)
    reported = {"step": snap.chip_steps.get(chip), "reporting_pid": snap.chip_processes.get(chip),
                **_cause(snap.chip_cause(chip))}
    if a is None:
        return {"verdict": None, "reason": None, **reported}
    end = snap.ended_job(chip)
    if end is not None:
        # a forecast for a job that died is no forecast: "leak, OOM in 26 min" would stay on
        # every view after the job ran out of memory
        step = f" at step {end.view.step:,}" if end.view.step is not None else ""
        return {**reported, "verdict": a.verdict.value,
                "reason": f"job ended ({end.cause}){step}; before it: {a.reason}",
                "floor_bytes": a.floor_bytes, "growth_bytes_per_hour": None,
                "growth_bytes_per_step": None, "predicted_oom_time": None,
                "time_to_oom_seconds": None, "predicted_oom_step": None,
                "evidence_window_seconds": a.window_seconds}
    return {**reported,
        "verdict": a.verdict.value,
        "reason": a.reason,
        "floor_bytes": a.floor_bytes,
        "growth_bytes_per_hour": a.slope_bytes_per_hour,
        "growth_bytes_per_step": a.slope_bytes_per_step,
        "predicted_oom_time": a.predicted_oom_time,
        # from the assessment's own moment: every view of this poll shows the same figure
        "time_to_oom_seconds": time_to_oom(a),
        "predicted_oom_step": a.predicted_oom_step,
        "evidence_window_seconds": a.window_seconds,
    }


def status_document(snap: PollState, source: str = "agent",
                    readers: Readers = NO_READERS) -> dict[str, Any]:
    """Per-chip HBM, duty cycle, owner and leak verdict, plus source health and identity,
    and the store's and notifiers' own health from ``readers``.

    ``source`` says where it came from: the running agent (with its history, so with
    verdicts) or a one-off read of the runtime (no history, so no verdict yet).
    """
    procs = {p.pid: p for p in (snap.host.processes if snap.host else ())}
    chips = []
    for name in snap.chips():
        sample = snap.runtime.chips.get(name) if snap.runtime else None
        pid = snap.owners.get(name)
        proc = procs.get(pid) if pid is not None else None
        total = sample.hbm_total_bytes if sample else None
        chips.append({
            "chip": name,
            "up": sample is not None,
            "hbm_used_bytes": sample.hbm_used_bytes if sample else None,
            "hbm_total_bytes": total,
            "hbm_used_ratio": (sample.hbm_used_bytes / total) if sample and total else None,
            "duty_cycle": sample.duty_cycle if sample else None,
            "owner_pid": pid,
            "owner_process": proc.name if proc else None,
            "owner_rss_bytes": proc.rss_bytes if proc else None,
            **_assessment(snap, name),
        })
    host = snap.host
    store = None if readers.store is None else readers.store()
    return {
        "version": __version__,
        "source": source,
        "time": snap.samples_time,  # the clock of the verdicts and OOM forecasts
        "wall_time": snap.time,
        "polls_total": snap.polls_total,
        "identity": snap.identity.labels(),
        "chip_type": snap.inventory.chip_type,
        "sources": {h.name: {"up": h.up, "error": h.error} for h in snap.health},
        "runtime_ports": {str(p): up for p, up in sorted(snap.runtime_ports_up.items())},
        "runtime_servers": {str(p): server.to_json()
                            for p, server in sorted(snap.runtime_servers.items())},
        "chips": chips,
        "host": None if host is None else {
            "memory_total_bytes": host.memory_total_bytes,
            "memory_available_bytes": host.memory_available_bytes,
            "memory_used_bytes": host.memory_used_bytes,
        },
        "processes": [{**_process(pid, state), "tensor_snapshot": _tensor_snapshot(snap, pid)}
                      for pid, state in sorted(snap.processes.items())],
        "notifications": _notifications(None if readers.notifier is None
                                        else readers.notifier()),
        "job_ends": [end.to_json() for end in reversed(snap.job_ends)],
        "store": None if store is None else {
            "path": store.path, "up": store.up, "error": store.error,
            "size_bytes": store.size_bytes, "polls_written_total": store.polls_written_total,
            "dropped_polls_total": store.dropped_polls_total,
        },
    }


def _process(pid: int, state: ProcessState) -> dict[str, Any]:
    r = state.report
    return {"pid": pid, "uid": r.uid, "framework": r.framework, "rank": r.rank,
            "step": r.step, "steps_per_second": r.steps_per_second, "live_tensors": r.live,
            "live_tensors_per_step": state.live.per_step, "verdict": state.verdict,
            "verdict_reason": state.verdict_reason,
            "compiles_cached": r.compiles_cached, "compiles_uncached": r.compiles_uncached,
            "recompiling": state.compiles.growing, "rss_bytes": r.rss,
            "rss_growth_bytes_per_step": state.rss.per_step, "host_verdict": state.host_verdict,
            "host_oom_seconds": state.host_oom_seconds, "exited": r.exited,
            "framework_version": r.framework_version,
            "devices": dict(r.devices), **_cause(state.diagnosis())}


def _tensor_snapshot(snap: PollState, pid: int) -> dict[str, Any] | None:
    """The process's latest snapshot request: pending, failed, or what grew between the two."""
    result = snap.tensor_snapshot(pid)
    if result is None:
        return None
    growth = snap.process_growth_per_step(pid)
    found = result.diff
    return {
        "request_id": result.request_id, "reason": result.reason, "steps": result.steps,
        "requested": result.requested, "completed": result.completed,
        "pending": result.pending, "error": result.error,
        "from_step": result.before.step if result.before else None,
        "to_step": result.after.step if result.after else None,
        "summary": None if found is None else found.summary(
            growth, live_per_step=snap.live_per_step(pid)),
        "explained_fraction": None if found is None else found.explained_fraction(growth),
        "grown": [] if found is None else [
            {"group": g.label(), "count_per_step": g.count_per_step,
             "bytes_per_step": g.bytes_per_step, "bytes_each": g.bytes_each,
             "count_delta": g.count_delta, "bytes_delta": g.bytes_delta,
             "sites": dict(g.sites)} for g in found.grown[:TOP_GROUPS]],
    }


def _cause(cause: Cause | None) -> dict[str, str | None]:
    return {"cause": cause.code if cause else None, "diagnosis": cause.text if cause else None}


def _notifications(h: NotifierHealth | None) -> dict[str, Any] | None:
    """Active alerts and each channel's delivery state; no URL or key ever."""
    if h is None:
        return None
    return {"active_alerts": [dict(a) for a in h.active],
            "channels": [{"name": c.name, "up": c.up, "pending": c.pending,
                          "delivered_total": c.delivered_total, "last_error": c.last_error,
                          "last_delivery": c.last_delivery,
                          "given_up_total": sum(c.given_up_total.values())}
                         for c in h.channels]}
