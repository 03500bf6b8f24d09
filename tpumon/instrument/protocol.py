"""What a training process tells the agent, one datagram per report.

A report is one JSON object, at most ``MAX_DATAGRAM`` bytes, sent over a Unix datagram
socket. The agent validates every field (a report is untrusted input from another
process) and takes the sender's pid and uid from the kernel, not from the report.

Fields (``None``/absent where the framework does not give them):

=================  ==========================================================
``v``              protocol version (``PROTOCOL_VERSION``)
``pid``            sender's pid (informative; the agent trusts SO_PASSCRED's)
``framework``      ``"torch_xla"`` or ``"jax"``
``rank``           global rank / process index in the job
``ordinal``        local device ordinal (torch_xla) or first local device id
``step``           the training step this report follows
``time``           Unix time of the report
``live``           live XLA tensors (torch_xla) or live arrays (JAX)
``compiles``       cached and uncached compile counts: ``{"cached": n, "uncached": n}``
``devices``        per device id: ``{"used": b, "limit": b, "peak": b}`` in bytes
``rss``            the process's resident memory, bytes
=================  ==========================================================
"""

from __future__ import annotations

import os

PROTOCOL_VERSION = 1
MAX_DATAGRAM = 8192
DEFAULT_SOCKET = "/run/tpumon/reporter.sock"
SOCKET_ENV = "TPUMON_REPORTER_SOCKET"


def socket_path(path: str | None = None) -> str:
    """Where reports go: the argument, else $TPUMON_REPORTER_SOCKET, else the default."""
    return path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET

