"""Fire-and-forget datagrams to the agent: a training step never waits for tpumon.

The socket is non-blocking and unconnected (``sendto`` each time), so an agent that is
absent, restarting or too busy costs the training loop one failed system call, counted
in ``dropped``, and a restarted agent is reached again without reconnecting.

It is bound to an abstract address the kernel picks (autobind), so that the agent can
answer: its snapshot requests come back to it (``receive``). Only datagrams sent from the
agent's own socket path are taken; no other process can bind that path.
"""

from __future__ import annotations

import os
import socket

CONTROL_MAX = 512  # a request from the agent is one short line


class DatagramSender:
    """Sends reports to one Unix datagram socket; never raises, never blocks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sent = 0
        self.dropped = 0
        self._sock: socket.socket | None = None
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
            self._sock.bind("")  # autobind: an address for the agent's requests
        except OSError:
            self._sock = None

    def send(self, payload: bytes) -> bool:
        """True if the kernel took the datagram; False (and counted) otherwise."""
        if self._sock is None:
            self.dropped += 1
            return False
        try:
            self._sock.sendto(payload, self.path)
        except OSError:  # no agent, socket buffer full, permission: dropped, by design
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def receive(self) -> bytes | None:
        """The next datagram the agent sent us, if any (non-blocking; others are dropped)."""
        while self._sock is not None:
            try:
                data, sender = self._sock.recvfrom(CONTROL_MAX)
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

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
