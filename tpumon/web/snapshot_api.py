"""POST /api/snapshot: ask a reporting process for live-tensor snapshots (`tpumon snapshot`).

Only from this machine (a loopback client): the endpoint that Prometheus scrapes is often
reachable from the whole network, and a snapshot costs the training process a walk of its
objects. The request's outcome is read back from /api/status (each process's
``tensor_snapshot``), where it stays until the next one.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs

from tpumon.diagnose.leak_snapshots import snapshot_steps
from tpumon.sources.snapshots import SnapshotResult
from tpumon.state import PollState

Request = Callable[[int, int, str], SnapshotResult]


def handle(environ: Mapping[str, Any], snap: PollState,
           request: Request | None) -> tuple[str, dict[str, Any]]:
    """(HTTP status, JSON document) for one POST."""
    if environ.get("REQUEST_METHOD") != "POST":
        return "405 Method Not Allowed", {"error": "POST to ask for a snapshot"}
    if not _loopback(environ.get("REMOTE_ADDR", "")):
        return "403 Forbidden", {"error": "snapshots are asked for from this machine only"}
    if request is None:
        return "404 Not Found", {"error": "no reporter socket: the agent hears no training "
                                          "process (reporter.socket)"}
    query = parse_qs(environ.get("QUERY_STRING", ""))
    try:
        pid = _chosen_pid(snap, _int(query, "pid"))
        steps = snapshot_steps(_int(query, "steps") or 0,
                               snap.processes[pid].report.steps_per_second)
    except ValueError as exc:
        return "400 Bad Request", {"error": str(exc)}
    result = request(pid, steps, "asked")
    status = "409 Conflict" if result.error else "202 Accepted"
    return status, {"pid": pid, "steps": steps, "request_id": result.request_id,
                    "pending": result.pending, "error": result.error}


def _chosen_pid(snap: PollState, pid: int | None) -> int:
    """The process asked for, or the only one that can answer."""
    able = sorted(p for p, s in snap.processes.items()
                  if s.report.snapshots and not s.report.exited)
    if pid is not None:
        if pid not in snap.processes:
            raise ValueError(f"no reporting process {pid}")
        if snap.processes[pid].report.exited:
            raise ValueError(f"process {pid} has exited")
        return pid
    if len(able) != 1:
        raise ValueError("no reporting process takes snapshots" if not able else
                         f"several processes report ({', '.join(map(str, able))}): give --pid")
    return able[0]


def _int(query: Mapping[str, list[str]], name: str) -> int | None:
    values = query.get(name)
    if not values:
        return None
    if not values[0].isdigit() or not 0 < int(values[0]) <= 1_000_000:
        raise ValueError(f"{name} must be a whole number from 1 to 1000000")
    return int(values[0])


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False
