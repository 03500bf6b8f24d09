"""The framework-neutral half of a reporter: sampling, the common fields, sending.

A reporter's ``step()`` runs inside the training loop, so it must cost microseconds and
must never raise: anything that goes wrong while building a report drops that report
(counted in ``dropped``) and training goes on. For the same reason the report is
formatted directly (its scalars are numbers and fixed names; ``json.dumps`` of the whole
dict costs several times more) and the RSS is read at most once a second.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tpumon.instrument.protocol import PROTOCOL_VERSION, socket_path
from tpumon.instrument.transport import DatagramSender

_PAGE = os.sysconf("SC_PAGE_SIZE")


class Reporter:
    """Call :meth:`step` once per training step; every ``every``-th call sends a report,
    and never more often than every ``min_interval`` seconds.

    The interval keeps a fast loop (a small model can take a few ms per step) from
    flooding the agent: the kernel queues only a handful of datagrams per Unix socket
    (net.unix.max_dgram_qlen, 10 by default) and drops beyond. Trends need steady
    sampling, not every step.
    """

    framework = "python"

    def __init__(self, every: int = 1, socket: str | None = None,
                 min_interval: float = 0.05) -> None:
        self.every = max(int(every), 1)
        self.min_interval = min_interval
        self.last_sent_step: int | None = None
        self._next_send = 0.0
        self._sender = DatagramSender(socket_path(socket))
        self._calls = 0
        self._pid = os.getpid()
        self._statm = _open_statm()
        self._rss_value: int | None = None
        self._rss_due = 0.0
        self._head = f'{{"v":{PROTOCOL_VERSION},"pid":{self._pid},"framework":"{self.framework}"'

    @property
    def sent(self) -> int:
        return self._sender.sent

    @property
    def dropped(self) -> int:
        return self._sender.dropped

    def step(self, step: int | None = None) -> None:
        """Report after a training step (``step`` defaults to the number of calls)."""
        self._calls += 1
        if (self._calls - 1) % self.every:
            return
        now = time.monotonic()
        if now < self._next_send:
            return
        self._next_send = now + self.min_interval
        step = self._calls if step is None else int(step)
        try:
            payload = self.encode(step)
        except Exception:  # noqa: BLE001 - never break the training loop
            self._sender.dropped += 1
            return
        if self._sender.send(payload):
            self.last_sent_step = step

    def encode(self, step: int) -> bytes:
        """This step's report as a datagram (the fields of tpumon.instrument.protocol)."""
        now = time.time()
        if now >= self._rss_due:
            self._rss_value, self._rss_due = self._rss(), now + 1.0
        f = self.framework_fields()
        c = f.get("compiles") or {}
        devices = f.get("devices")
        tail = ',"devices":' + json.dumps(devices, separators=(",", ":")) if devices else ""
        return (f'{self._head},"step":{int(step)},"time":{now!r},"rss":{_int(self._rss_value)},'
                f'"rank":{_int(f.get("rank"))},"ordinal":{_int(f.get("ordinal"))},'
                f'"live":{_int(f.get("live"))},"compiles":{{"cached":{_int(c.get("cached"))},'
                f'"uncached":{_int(c.get("uncached"))}}}{tail}}}').encode()

    def framework_fields(self) -> dict[str, Any]:
        """rank, ordinal, live, compiles ({"cached", "uncached"}), devices: whatever the
        framework knows. Values are ints, None, or (compiles, devices) small dicts."""
        return {}

    def _rss(self) -> int | None:
        if self._statm is None:
            return None
        try:
            return int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        self._sender.close()
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None


def _open_statm() -> int | None:
    """/proc/self/statm kept open: one pread per report instead of open/read/close."""
    try:
        return os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None


def _int(value: Any) -> str:
    return "null" if value is None else str(int(value))
