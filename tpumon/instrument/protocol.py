"""What a training process tells the agent, one message per report.

A report is one JSON object, at most ``MAX_DATAGRAM`` bytes, sent as one message on the
reporter's own connection to the agent (a Unix ``SOCK_SEQPACKET`` socket at
:func:`connection_path`: message boundaries kept, and a kernel queue per reporter, so that
no other sender can fill it), or, where that cannot be opened (an agent of an earlier
version), as one datagram to the Unix datagram socket at the socket path itself, which
every earlier reporter uses and the agent keeps. The agent validates every field (a report
is untrusted input from another process) and takes the sender's pid and uid from the
kernel, not from the report.

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
``snapshots``      true when the reporter answers snapshot requests
=================  ==========================================================


Snapshots (``tpumon snapshot``, and on a leak) go the other way first: the agent sends a
request line back on the reporter's connection (or to its datagram socket's address),
and the reporter answers, at step boundaries, with two snapshot messages ``steps`` apart
(a header line, then
``tpumon.instrument.snapshot.Snapshot.to_json``)::

    TPUMON-SNAPSHOT-REQUEST 1 <id> <steps> <sites 0|1>
    TPUMON-SNAPSHOT 1 <id> <part 0|1>\n{...snapshot JSON...}

A process's last words (an uncaught exception, its exit, docs/job-ends.md) are one message
each, at most ``MAX_LAST_WORDS`` bytes, on the same connection::

    TPUMON-LAST-WORDS 1\n{"kind": "armed" | "exception" | "thread_exception" | "exit", ...}

and ``TPUMON-FATAL 1`` with one descriptor (``SCM_RIGHTS``): the read end of the pipe
that faulthandler writes a fatal signal's traceback into; the agent reads it when the
connection closes.
"""

from __future__ import annotations

import os
import re

PROTOCOL_VERSION = 1
MAX_DATAGRAM = 8192          # a report
MAX_SNAPSHOT_DATAGRAM = 65536  # a snapshot: header and Snapshot.to_json(60000)
SNAPSHOT_JSON_BYTES = 60000
MAX_SNAPSHOT_STEPS = 1_000_000
REQUEST = "TPUMON-SNAPSHOT-REQUEST"
PART = b"TPUMON-SNAPSHOT "
_REQUEST = re.compile(rf"{REQUEST} 1 ([0-9a-f]{{8,32}}) ([0-9]{{1,7}}) ([01])\Z")
_PART = re.compile(rb"TPUMON-SNAPSHOT 1 ([0-9a-f]{8,32}) ([01])\Z")
#: A process's last words (tpumon.instrument.last_words): the header, then one JSON object
LAST_WORDS_HEADER = b"TPUMON-LAST-WORDS 1\n"
#: ... and the message that passes the agent the read end of faulthandler's pipe
FATAL_HEADER = b"TPUMON-FATAL 1\n"
MAX_LAST_WORDS = 65536
DEFAULT_SOCKET = "/run/tpumon/reporter.sock"
SOCKET_ENV = "TPUMON_REPORTER_SOCKET"
TRACK_SITES_ENV = "TPUMON_TRACK_SITES"
#: The variables a *training process* reads (docs/reporters.md). They are often exported in
#: a shell or a job spec that also starts tpumon commands, so the agent's configuration
#: loader passes over them rather than calling them unknown keys. TPUMON_REPORTER_SOCKET is
#: both: the reporters' destination and the agent's reporter.socket.
REPORTER_ENV = (SOCKET_ENV, TRACK_SITES_ENV)


def socket_path(path: str | None = None) -> str:
    """Where reports go: the argument, else $TPUMON_REPORTER_SOCKET, else the default."""
    return path or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def connection_path(path: str | os.PathLike[str]) -> str:
    """Where reporters connect, beside the datagram socket ``path``:
    ``/run/tpumon/reporter.sock`` -> ``/run/tpumon/reporter-seqpacket.sock``."""
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}-seqpacket{ext}"


def encode_request(request_id: str, steps: int, sites: bool) -> bytes:
    return f"{REQUEST} 1 {request_id} {steps} {int(sites)}".encode()


def parse_request(data: bytes) -> tuple[str, int, bool] | None:
    """(id, steps, sites) of a request line; None for anything else."""
    try:
        match = _REQUEST.match(data.decode("ascii"))
    except UnicodeDecodeError:
        return None
    if match is None or not 0 < int(match.group(2)) <= MAX_SNAPSHOT_STEPS:
        return None
    return match.group(1), int(match.group(2)), match.group(3) == "1"


def encode_part(request_id: str, part: int, snapshot_json: bytes) -> bytes:
    return f"TPUMON-SNAPSHOT 1 {request_id} {part}\n".encode() + snapshot_json


def parse_part(data: bytes) -> tuple[str, int, bytes]:
    """(id, part, snapshot JSON) of a snapshot datagram; ValueError if it is not one."""
    head, _, body = data.partition(b"\n")
    match = _PART.match(head)
    if match is None:
        raise ValueError("bad snapshot header")
    return match.group(1).decode(), int(match.group(2)), body
