"""Bounds on the exporter's connections, so that no local user or scanner can starve it.

Any local user can connect to the agent's port. Unbounded, a slowloris (thousands of
connections, each sending a header every few seconds) holds a thread per connection for as
long as it likes, and when the connections close, every held thread renders a full
/metrics for a client that has gone: minutes of both cores, and scrapes time out
throughout. Here:

- at most MAX_CONNECTIONS are open at once; a new one past that pushes out the connection
  that has been reading its request longest (an attacker's, since a scraper sends its whole
  request at once), so a scraper is always let in;
- the request line, headers and body must all arrive within REQUEST_SECONDS in total,
  however slowly they trickle (each receive waits only for what is left of that time);
- a request that did not arrive whole (the client closed, was pushed out, or was too slow)
  gets no answer: nothing is rendered for it.
"""

from __future__ import annotations

import socket
import threading
import time

MAX_CONNECTIONS = 64
REQUEST_SECONDS = 5.0
MAX_HEAD_BYTES = 64 << 10  # request line and headers
MAX_BODY_BYTES = 64 << 10  # nothing the agent takes has a body of any size
HEAD_END = b"\r\n\r\n"


class Connections:
    """The open connections, and which are still reading their request (evictable)."""

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._open: dict[int, tuple[socket.socket, float, bool]] = {}  # id -> sock, since,
        self.evicted_total = 0                                          # reading
        self.refused_total = 0

    def admit(self, sock: socket.socket) -> bool:
        """Take a new connection, pushing out the oldest one still reading its request if
        the limit is reached; False (refuse it) when every open one is being answered."""
        with self._lock:
            if len(self._open) >= self.limit:
                reading = [(since, key) for key, (_, since, r) in self._open.items() if r]
                if not reading:
                    self.refused_total += 1
                    return False
                _, oldest = min(reading)
                victim = self._open.pop(oldest)[0]
                self.evicted_total += 1
                _shut(victim)
            self._open[id(sock)] = (sock, time.monotonic(), True)
            return True

    def replace(self, old: socket.socket, new: socket.socket) -> None:
        """The same connection under a new socket object (TLS wraps the accepted one)."""
        with self._lock:
            entry = self._open.pop(id(old), None)
            if entry is not None:
                self._open[id(new)] = (new, entry[1], entry[2])

    def answering(self, sock: socket.socket) -> None:
        """The request is read: this connection is no longer pushed out for a new one."""
        with self._lock:
            entry = self._open.get(id(sock))
            if entry is not None:
                self._open[id(sock)] = (entry[0], entry[1], False)

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(id(sock), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


def _shut(sock: socket.socket) -> None:
    """Wake whatever thread waits on this socket (its receive ends) without closing the
    file descriptor under it: that thread closes it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def receive_until(sock: socket.socket, buffered: bytes, done, deadline: float,
                  limit: int) -> bytes | None:
    """Receive until ``done(data)``; None when the client closes first, the deadline passes
    or more than ``limit`` bytes came. Each receive waits only for what is left of the
    deadline, so a byte at a time cannot stretch it."""
    data = bytearray(buffered)
    while not done(data):
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > limit:
            return None
        try:
            sock.settimeout(left)
            chunk = sock.recv(16384)
        except (OSError, ValueError):  # timeout, reset, pushed out, a TLS error
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def client_gone(sock: socket.socket) -> bool:
    """Whether a plain TCP client has closed its end (a look that takes nothing); False
    for TLS, whose records cannot be peeked at (its request arrived whole anyway)."""
    if type(sock) is not socket.socket:
        return False
    timeout = sock.gettimeout()
    sock.settimeout(0)  # with a timeout, Python waits for data whatever the flags say
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)
