"""Fire-and-forget reports to the agent: a training step never waits for tpumon.

Each reporter holds its own connection to the agent (a non-blocking Unix
``SOCK_SEQPACKET`` socket at :func:`~tpumon.instrument.protocol.connection_path`), so its
reports wait in a kernel queue of their own: another local user flooding the agent fills
only his. A report the kernel cannot take at once (the agent far behind, so this queue
is full) is dropped and counted in ``dropped``; sending costs one system call.

Where no connection can be made (an agent of an earlier version listens only on the
datagram socket, none is running, or it refused this one), reports go as datagrams to the
socket path itself, as every earlier reporter sent them, and a connection is tried again
at most every RETRY_SECONDS: an agent that was restarted or upgraded is reached again
without restarting the job. The datagram socket is bound to an abstract address the
kernel picks (autobind) so that the agent can answer there; only datagrams sent from the
agent's own socket path are taken (no other process can bind that path).
"""

from __future__ import annotations

import os
import socket
import time
import weakref
from typing import Callable

from tpumon.instrument.protocol import connection_path

CONTROL_MAX = 512  # a request from the agent is one short line
RETRY_SECONDS = 5.0
_SEND = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL  # an agent gone: EPIPE, not SIGPIPE


#: every sender alive in this process: a forked child drops their connections (one hook
#: for all, registered once; a sender collected leaves nothing behind)
_SENDERS: weakref.WeakSet[ReportSender] = weakref.WeakSet()


def _in_forked_child() -> None:
    for sender in list(_SENDERS):
        sender._in_forked_child()


os.register_at_fork(after_in_child=_in_forked_child)


class ReportSender:
    """Sends reports over a connection to the agent, else as datagrams; never raises,
    never blocks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.connection_path = connection_path(path)
        self.sent = 0
        self.dropped = 0
        self._connection: socket.socket | None = None
        self._datagrams: socket.socket | None = None
        self._retry_at = 0.0
        self._held: bytes | None = None  # a request read off a connection as it closed
        #: called with each new connection (the last words hand the agent a pipe on it)
        self.on_connect: Callable[[socket.socket], None] | None = None
        self._connect()
        _SENDERS.add(self)

    def _in_forked_child(self) -> None:
        """A forked child (a data loader's worker) drops its copy of the connection: the
        agent sees the job's connection close when the job dies (its fatal signal's
        traceback is read then), not when the last of its workers does. A report the child
        sends goes on a connection of its own."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
            self._retry_at = 0.0

    @property
    def connected(self) -> bool:
        """Whether reports go over a connection (else as datagrams)."""
        return self._connection is not None

    @property
    def connection(self) -> socket.socket | None:
        return self._connection

    def send(self, payload: bytes, count: bool = True) -> bool:
        """True if the kernel took the message; False (and counted) otherwise. ``count``
        False: not counted in ``sent`` or ``dropped`` (last words, not reports)."""
        if self._connection is not None:
            try:
                self._connection.send(payload, _SEND)
                self.sent += count
                return True
            except BlockingIOError:  # our own queue is full: the agent is far behind
                self.dropped += count
                return False
            except OSError:  # the agent closed it (restarted, or refused us): datagrams
                self._disconnect()
        elif time.monotonic() >= self._retry_at:
            self._connect()
            return self.send(payload, count)
        return self._send_datagram(payload, count)

    def receive(self) -> bytes | None:
        """The next request the agent sent us, if any (non-blocking)."""
        if self._held is not None:
            held, self._held = self._held, None
            return held
        if self._connection is not None:
            try:
                data = self._connection.recv(CONTROL_MAX, socket.MSG_DONTWAIT)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data == b"":  # closed by the agent
                self._disconnect()
            return data or None
        return self._receive_datagram()

    def close(self) -> None:
        for sock in (self._connection, self._datagrams):
            if sock is not None:
                sock.close()
        self._connection = self._datagrams = None

    def _connect(self) -> None:
        """One try at a connection; on failure, datagrams until RETRY_SECONDS from now."""
        self._retry_at = time.monotonic() + RETRY_SECONDS
        sock = None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK
                                 | socket.SOCK_CLOEXEC)
            sock.connect(self.connection_path)  # a full listen backlog: EAGAIN, not a wait
        except OSError:
            if sock is not None:
                sock.close()
            return
        self._connection = sock
        if self.on_connect is not None:
            try:
                self.on_connect(sock)
            except Exception:  # noqa: BLE001 - never raise into the training loop
                pass

    def _disconnect(self) -> None:
        """Close the connection, keeping a request the agent sent before it went."""
        if self._connection is not None:
            try:
                self._held = self._connection.recv(CONTROL_MAX, socket.MSG_DONTWAIT) or None
            except OSError:
                pass
            self._connection.close()
            self._connection = None
        self._retry_at = time.monotonic() + RETRY_SECONDS

    def _send_datagram(self, payload: bytes, count: bool = True) -> bool:
        try:
            self._datagram_socket().sendto(payload, self.path)
        except OSError:  # no agent, its queue full, permission: dropped, by design
            self.dropped += count
            return False
        self.sent += count
        return True

    def _datagram_socket(self) -> socket.socket:
        if self._datagrams is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
            try:
                sock.bind("")  # autobind: an address for the agent's requests
            except OSError:
                sock.close()
                raise
            self._datagrams = sock
        return self._datagrams

    def _receive_datagram(self) -> bytes | None:
        """The next datagram the agent sent us, if any (others are dropped)."""
        while self._datagrams is not None:
            try:
                data, sender = self._datagrams.recvfrom(CONTROL_MAX)
            except OSError:  # nothing waiting (EAGAIN), or the socket is gone
                return None
            if self._from_agent(sender):
                return data
        return None

    def _from_agent(self, sender: object) -> bool:
        if sender == self.path:
            return True
        try:
            return isinstance(sender, str) and os.path.samefile(sender, self.path)
        except OSError:
            return False
