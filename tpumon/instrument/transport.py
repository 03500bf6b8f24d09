"""Fire-and-forget datagrams to the agent: a training step never waits for tpumon.

The socket is non-blocking and unconnected (``sendto`` each time), so an agent that is
absent, restarting or too busy costs the training loop one failed system call, counted
in ``dropped``, and a restarted agent is reached again without reconnecting.
"""

from __future__ import annotations

import socket


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

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
