"""The reporter's half of a snapshot request: two snapshots ``steps`` apart, sent back.

The agent asks (tpumon.instrument.protocol); the reporter takes the first snapshot at the
next step boundary it reports at, starts creation-site tracking if the request wants it
and the process allows it, and takes the second once the step has advanced by ``steps``.
Everything runs inside ``Reporter.step()`` on the training thread, only while a request
is open: between requests a step pays one attribute test. A snapshot that does not fit in
the queue to the agent right now (a fast loop's reports can fill it; as datagrams, the
kernel queues just 10 for every sender) is sent again at the next steps, for up to
``SEND_SECONDS``.
"""

from __future__ import annotations

import time
from typing import Callable

from tpumon.instrument.protocol import SNAPSHOT_JSON_BYTES, encode_part
from tpumon.instrument.snapshot import Snapshot

SEND_SECONDS = 60.0


class SnapshotJob:
    """One open request; ``at_step`` advances it, ``done`` once both parts went out."""

    def __init__(self, request_id: str, steps: int, sites: bool) -> None:
        self.request_id = request_id
        self.steps = steps
        self.sites = sites
        self.done = False
        self._second_at: int | None = None
        self._outgoing: bytes | None = None
        self._give_up_at = 0.0
        self._tracking = False

    def at_step(self, step: int, take: Callable[[int], Snapshot | None],
                start_tracking: Callable[[], bool], stop_tracking: Callable[[], None],
                send: Callable[[bytes], bool]) -> None:
        """Called at every step boundary while the job is open."""
        if self._outgoing is not None:
            self._send(send)
            return
        if self._second_at is None:
            self._tracking = self.sites and start_tracking()
            self._outgoing = self._encode(0, take(step))
            self._second_at = step + self.steps
            self._send(send)
        elif step >= self._second_at:
            snap = take(step)
            self.stop(stop_tracking)
            self._second_at = -1  # no third: the job is done once this part is out
            self._outgoing = self._encode(1, snap)
            self.done = self._outgoing is None
            self._send(send)

    def stop(self, stop_tracking: Callable[[], None]) -> None:
        if self._tracking:
            stop_tracking()
            self._tracking = False

    def _encode(self, part: int, snap: Snapshot | None) -> bytes | None:
        if snap is None:  # the framework could not take one: the agent times the request out
            return None
        self._give_up_at = time.monotonic() + SEND_SECONDS
        return encode_part(self.request_id, part, snap.to_json(SNAPSHOT_JSON_BYTES))

    def _send(self, send: Callable[[bytes], bool]) -> None:
        if self._outgoing is None:
            return
        if send(self._outgoing) or time.monotonic() >= self._give_up_at:
            self._outgoing = None
            self.done = self._second_at == -1
