"""Snapshot requests the agent has sent to reporting processes, and what came back.

A request names a process (the kernel's pid), how many steps apart its two snapshots
should be, and why it was made (a leak on a chip, or a person running `tpumon snapshot`).
The two answers are untrusted input: each must come from the process asked (the kernel's
pid, not anything in the datagram), for an open request, and pass the snapshot format's
strict parser. Once both are in, they are diffed (tpumon.sources.tensor_diff); a request
that gets no answer in ``timeout`` seconds ends with an error instead, since an old
reporter, a framework that cannot list its tensors, or a stopped loop never answer.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Collection, Mapping

from tpumon.sources.tensor_diff import SnapshotDiff, diff
from tpumon.instrument.snapshot import Snapshot

REQUEST_TIMEOUT = 3600.0  # seconds for both answers (the steps, at the job's pace)
MAX_OPEN = 64


@dataclass(frozen=True)
class SnapshotResult:
    """One request's outcome, as `tpumon status`, the metrics and the alerts show it."""

    pid: int
    request_id: str
    reason: str
    requested: float
    steps: int
    completed: float | None = None
    before: Snapshot | None = None
    after: Snapshot | None = None
    diff: SnapshotDiff | None = None
    error: str | None = None

    @property
    def pending(self) -> bool:
        return self.completed is None


@dataclass
class _Open:
    pid: int
    reason: str
    requested: float
    steps: int
    parts: dict[int, Snapshot] = field(default_factory=dict)


class SnapshotRequests:
    """Open requests and each process's latest result; used under the socket's lock."""

    def __init__(self, timeout: float = REQUEST_TIMEOUT) -> None:
        self.timeout = timeout
        self._open: dict[str, _Open] = {}
        self.results: dict[int, SnapshotResult] = {}

    def open(self, pid: int, steps: int, reason: str, now: float) -> str | None:
        """A new request's id; None when one is already open for the process, or too many
        are."""
        if any(o.pid == pid for o in self._open.values()) or len(self._open) >= MAX_OPEN:
            return None
        request_id = secrets.token_hex(8)
        self._open[request_id] = _Open(pid, reason, now, steps)
        self.results[pid] = SnapshotResult(pid, request_id, reason, now, steps)
        return request_id

    def cancel(self, request_id: str, error: str, now: float) -> None:
        """The request could not be sent: it ends at once, with why."""
        self._end(request_id, now, error=error)

    def answer(self, pid: int, request_id: str, part: int, body: bytes, now: float) -> str | None:
        """Take one answer; the drop reason when it is not a valid one for an open request."""
        request = self._open.get(request_id)
        if request is None or request.pid != pid:
            return "forbidden"
        try:
            request.parts[part] = Snapshot.from_json(body)
        except ValueError:
            return "malformed"
        if len(request.parts) == 2:
            self._finish(request_id, request, now)
        return None

    def expire(self, now: float, alive: Mapping[int, object],
               exited: Collection[int] = ()) -> None:
        """End requests unanswered for ``timeout``, or whose process is gone: exited (its
        pid no longer exists: it will never answer) or forgotten."""
        for request_id, request in list(self._open.items()):
            if request.pid in exited:
                self._end(request_id, now, error=f"process {request.pid} exited before "
                          "answering")
            elif request.pid not in alive:
                self._end(request_id, now, error="the process stopped reporting")
            elif now - request.requested > self.timeout:
                self._end(request_id, now, error=f"no answer within {self.timeout:.0f} s (a "
                          "reporter without snapshots, or the loop stopped stepping)")
        for pid in [p for p in self.results if p not in alive]:
            del self.results[pid]

    def _finish(self, request_id: str, request: _Open, now: float) -> None:
        before, after = request.parts[0], request.parts[1]
        try:
            found = diff(before, after)
        except ValueError as exc:  # a restart between the two, or two frameworks
            self._end(request_id, now, before=before, after=after, error=str(exc))
            return
        self._end(request_id, now, before=before, after=after, found=found)

    def _end(self, request_id: str, now: float, before: Snapshot | None = None,
             after: Snapshot | None = None, found: SnapshotDiff | None = None,
             error: str | None = None) -> None:
        request = self._open.pop(request_id, None)
        if request is None:
            return
        self.results[request.pid] = SnapshotResult(
            request.pid, request_id, request.reason, request.requested, request.steps, now,
            before, after, found, error)
