"""Signals (SIGTERM, SIGHUP) turned into threading.Events without a lock in a handler.

A Python signal handler runs in the main thread between two bytecodes, which can be
inside ``Event.wait()`` just after it took the event's internal lock back. A handler
that calls ``Event.set()`` then waits for that lock forever: the agent, asleep in its
poll loop's ``stop.wait()``, would hang on SIGTERM once in a while (and systemd would
have to kill it, losing the store's queued writes). So the handlers here do nothing;
the interpreter's C-level handler writes each signal's number to a wakeup socket
(``signal.set_wakeup_fd``, as asyncio does) and a small thread reads it and sets the
events, from outside the main thread, where taking the lock is safe.
"""

from __future__ import annotations

import signal
import socket
import threading
from contextlib import contextmanager
from typing import Iterator, Mapping


class Stop(threading.Event):
    """An event that is set once and never cleared (the agent's stop), whose ``wait`` is
    one lock acquire.

    Why: the poll loop sleeps in ``stop.wait()`` between polls, and ``Event.wait`` runs
    ``Condition.wait``'s Python each time (a waiter lock made, queued, released and taken
    back), ~0.1 ms of CPU with the caches cold after a second asleep: a fortieth of the
    agent at 1 s polls. Here ``set`` opens a gate, a lock held from the start, and each
    waiter that gets through it opens it again for the next."""

    def __init__(self) -> None:
        super().__init__()
        self._gate = threading.Lock()
        self._gate.acquire()
        self._opening = threading.Lock()

    def set(self) -> None:
        with self._opening:
            if not self.is_set():
                super().set()
                self._gate.release()

    def clear(self) -> None:
        raise TypeError("a stop is final: it cannot be cleared")

    def wait(self, timeout: float | None = None) -> bool:
        if self._gate.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
            self._gate.release()
            return True
        return self.is_set()


def _noted(signum: int, frame: object) -> None:
    """The Python-level handler: the wakeup socket already carries the signal."""


@contextmanager
def signals_to_events(events: Mapping[int, threading.Event]) -> Iterator[None]:
    """While inside, each signal in ``events`` sets its event; then the previous handlers
    are back. Call from the main thread (only it can install handlers)."""
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    thread = threading.Thread(target=_relay, args=(reader, dict(events)),
                              name="tpumon-signals", daemon=True)
    previous_fd = previous = None
    try:
        previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        thread.start()
        previous = {sig: signal.signal(sig, _noted) for sig in events}
        yield
    finally:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)
        if previous_fd is not None:
            signal.set_wakeup_fd(previous_fd)
        writer.close()  # the relay reads end-of-stream and returns
        if thread.is_alive():
            thread.join(5.0)
        reader.close()


def _relay(reader: socket.socket, events: Mapping[int, threading.Event]) -> None:
    while data := reader.recv(64):
        for signum in data:
            if signum in events:
                events[signum].set()
