"""The sd_notify protocol, spoken directly: READY, WATCHDOG, STATUS and STOPPING datagrams
to $NOTIFY_SOCKET. A few lines of socket code instead of a libsystemd binding.

Under `Type=notify` systemd starts the agent, waits for READY=1 (sent after the first poll,
so "active" means "polling"), and with `WatchdogSec=` restarts it when WATCHDOG=1 stops
coming: the poll loop sends it, so a wedged poll loop is restarted even though the process
still lives. STATUS= is the one-line summary `systemctl status tpumon` shows. Without
$NOTIFY_SOCKET (not under systemd) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Callable, Mapping

from tpumon.detect import Verdict
from tpumon.common.describe import describe_oom, time_to_oom
from tpumon.state import PollState
from tpumon.store.writer import StoreHealth

log = logging.getLogger("tpumon.systemd")


class SystemdNotify:
    """Sends sd_notify messages; never raises (a failed send is logged once)."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 store: Callable[[], StoreHealth] | None = None) -> None:
        """``store``: the history store's own health, for the status line (None: none)."""
        env = os.environ if env is None else env
        self._store = store
        address = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_interval = self._watchdog_interval(env)
        self._failed = False
        self._ready = False
        self._next_watchdog = 0.0
        self._status = ""

    @staticmethod
    def _watchdog_interval(env: Mapping[str, str]) -> float | None:
        """Seconds between WATCHDOG=1: a third of WatchdogSec (sd_watchdog_enabled wants
        under half), or None when no watchdog is set for this process."""
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
            return None
        return int(usec) / 1e6 / 3

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def after_poll(self, snap: PollState) -> None:
        """READY=1 after the first poll; then WATCHDOG=1 when due and STATUS= when it
        changed. Called by the poll loop, so the watchdog stops when polling stops."""
        if not self.address:
            return
        fields = {}
        if not self._ready:
            fields["READY"] = "1"
            self._ready = True
        now = time.monotonic()
        if self.watchdog_interval is not None and now >= self._next_watchdog:
            fields["WATCHDOG"] = "1"
            self._next_watchdog = now + self.watchdog_interval
        status = status_line(snap, None if self._store is None else self._store())
        if status != self._status:
            fields["STATUS"] = self._status = status
        if fields:
            self.send(**fields)

    def stopping(self) -> None:
        self.send(STOPPING="1", STATUS="stopping")

    def send(self, **fields: str) -> None:
        """One datagram of KEY=VALUE lines (READY="1", STATUS="...")."""
        if not self.address:
            return
        message = "\n".join(f"{k}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message, self.address)
        except OSError as exc:
            if not self._failed:
                log.warning("cannot notify systemd at %s: %s", self.address.lstrip("\0"),
                            exc.strerror or exc)
                self._failed = True


def status_line(snap: PollState, store: StoreHealth | None = None) -> str:
    """What `systemctl status` shows: chips polled, leaks, the nearest OOM, source trouble."""
    answered = len(snap.runtime.chips) if snap.runtime is not None else 0
    leaking = sorted((c for c, a in snap.assessments.items() if a.verdict is Verdict.LEAK),
                     key=lambda c: snap.assessments[c].predicted_oom_time or float("inf"))
    parts = [f"{answered} chip(s) polled" if answered else "no TPU runtime answering"]
    if leaking:
        first = snap.assessments[leaking[0]]
        now = snap.runtime.time if snap.runtime is not None else snap.time
        oom = describe_oom(time_to_oom(first, now))  # as every view of this poll says it
        eta = f", chip {leaking[0]} {oom}" if oom else ""
        parts.append(f"{len(leaking)} leaking{eta}")
    down = [h.name for h in snap.health if not h.up and h.name != "tpu_runtime"]
    if down:
        parts.append("down: " + ", ".join(down))
    if store is not None and not store.up:
        parts.append("history store not writing")
    return "; ".join(parts)
