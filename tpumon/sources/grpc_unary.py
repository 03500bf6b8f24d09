"""Unary gRPC calls from synchronous code: HTTP/2 in libcurl (through pycurl), the gRPC
framing of a unary call on top of it.

Why not grpcio, which the simulator serves with and tpu-info's own client uses: the agent
makes one small call a second, and for that grpcio's C core is the heavier half of the
agent. Importing it costs ~16 MiB of RSS, its channels keep 6-7 threads that wake 12-18
times a second with nothing to do, and a call is handed from the calling thread to those
threads and back. Why not grpclib: its HTTP/2 is h2, in Python, and one call runs ~1,250
Python function calls, cold, every second: over half of the agent's poll thread. libcurl's
HTTP/2 (nghttp2) is C, runs on the calling thread, and has no threads of its own for an
address given as an IP literal or a unix socket; a call here is a few dozen Python calls
(docs/benchmarks.md).

A unary call on the wire (gRPC over HTTP/2, PROTOCOL-HTTP2.md): a POST to
``/package.Service/Method`` with ``content-type: application/grpc`` and ``te: trailers``,
its body one length-prefixed message (a flag byte, four bytes of length); the reply one
such message, then trailers with ``grpc-status`` and ``grpc-message`` (or those alone in
the headers, "Trailers-Only"). That framing is all this module adds to libcurl.

What the agent needs from a client, and this one gives:

* every call has a deadline, sent to the server (``grpc-timeout``) and enforced here;
* every failure is a :class:`CallFailed` with a gRPC status name, never another exception:
  nothing listening is UNAVAILABLE, a reply that does not decode INTERNAL, a peer that
  breaks HTTP/2 UNKNOWN or UNAVAILABLE (a source turns it into a reported state);
* a reply is at most ``max_reply_bytes`` (RESOURCE_EXHAUSTED beyond, as grpcio's default
  4 MiB limit), refused on its announced length before it is read: a port any local user
  can bind between jobs must not make the agent buffer gigabytes;
* the calls of one round run at once, as HTTP/2 streams of one connection per endpoint;
* a connection is kept between calls and one that failed or timed out is not used again:
  the next call dials afresh, so a runtime that comes back (the next job) heals unaided.
"""

from __future__ import annotations

import math
import select
import struct
import time
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar
from urllib.parse import unquote

import pycurl
from google.protobuf.message import DecodeError, Message

from tpumon.common.units import format_bytes

Reply = TypeVar("Reply", bound=Message)

DEFAULT_MAX_REPLY_BYTES = 4 << 20  # grpcio's default receive limit

# gRPC's status codes by number (grpc/doc/statuscodes.md)
STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED")
# An HTTP status with no grpc-status: what gRPC's own clients make of it
# (grpc/doc/http-grpc-status-mapping.md); any other is UNKNOWN.
HTTP_STATUS = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
               404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE",
               503: "UNAVAILABLE", 504: "UNAVAILABLE"}
# libcurl's errors that mean the connection is gone or never was
# (CURLE_HTTP2_STREAM, 92, which pycurl does not name: a stream libcurl reset itself, on a
# connection it found closed under the call, as when the runtime restarted)
_GONE = {pycurl.E_COULDNT_CONNECT, pycurl.E_COULDNT_RESOLVE_HOST, pycurl.E_GOT_NOTHING,
         pycurl.E_SEND_ERROR, pycurl.E_RECV_ERROR, 92}
_POLL_FLAGS = {pycurl.POLL_IN: select.POLLIN, pycurl.POLL_OUT: select.POLLOUT,
               pycurl.POLL_INOUT: select.POLLIN | select.POLLOUT}
_PREFIX = struct.Struct(">BI")  # a message's flag byte and length


class CallFailed(Exception):
    """A call that returned no reply: the gRPC status name (``UNAVAILABLE``,
    ``DEADLINE_EXCEEDED``, ``NOT_FOUND``, ...) and the detail, if any."""

    def __init__(self, status: str, detail: str = "") -> None:
        super().__init__(f"{status}: {detail}" if detail else status)
        self.status = status
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a server listens: a TCP host and port, or a unix socket's path."""

    host: str | None = None
    port: int | None = None
    path: str | None = None

    def url(self, method: str) -> str:
        if self.path is not None:
            return f"http://localhost{method}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}{method}"


@dataclass(frozen=True, slots=True)
class Call:
    """One unary call: ``method`` is the full name, ``/package.Service/Method``. A call
    may be made again and again (the agent's usage call, every poll); its request is not
    changed once it is made: a connection's handle keeps the request it serialized."""

    endpoint: Endpoint
    method: str
    request: Message
    reply_type: type[Message]


class _Exchange:
    """One call in flight: what libcurl hands back (the reply's bytes, its headers and
    trailers), checked as it comes, then made into a reply or a CallFailed."""

    def __init__(self, call: Call, max_reply_bytes: int) -> None:
        self.call = call
        self.max_reply_bytes = max_reply_bytes
        self.body = bytearray()
        self.size = -1  # the announced length, once its prefix is in
        self.refused: CallFailed | None = None
        # libcurl's header callback, which the trailers reach too: every line kept as it
        # comes by a builtin (no Python frame for each of a reply's ~12 lines; reading them
        # is left to the outcome, once)
        self.headers: list[bytes] = []
        self.header = self.headers.append

    def write(self, data: bytes) -> int | None:
        """libcurl's write callback: None takes the data, 0 aborts the transfer."""
        self.body += data
        if self.size < 0 and len(self.body) >= 5:
            flag, self.size = _PREFIX.unpack_from(self.body)
            if flag != 0:
                self.refused = CallFailed("INTERNAL", "compressed reply (not asked for)")
            elif self.size > self.max_reply_bytes:
                self.refused = CallFailed(
                    "RESOURCE_EXHAUSTED", f"a reply of {format_bytes(self.size)} is over "
                    f"the {format_bytes(self.max_reply_bytes)} limit")
        if self.size >= 0 and len(self.body) > 5 + self.size:
            self.refused = CallFailed("INTERNAL", "more than one message in a unary reply")
        return 0 if self.refused is not None else None

    def finish(self, handle: pycurl.Curl, error: int,
               text: str) -> tuple[Message | CallFailed, bool]:
        """The call's outcome once libcurl ended it (``error`` 0: a whole HTTP exchange),
        and whether its connection is to be dropped: a call that failed in transport or
        whose reply was refused leaves whatever is left of it on the wire, not to be read
        as the next reply."""
        outcome = self.outcome(error, text, handle.getinfo(pycurl.RESPONSE_CODE))
        return outcome, bool(error) or self.refused is not None

    def outcome(self, error: int, text: str, http_status: int) -> Message | CallFailed:
        if self.refused is not None:
            return self.refused
        if error:
            return _transport_failure(error, text)
        grpc_status, grpc_message = _grpc_status(self.headers)
        if grpc_status is None:
            return CallFailed(HTTP_STATUS.get(http_status, "UNKNOWN"),
                              f"HTTP status {http_status} and no grpc-status")
        if grpc_status != "OK":
            return CallFailed(grpc_status, grpc_message)
        if self.size < 0:
            return CallFailed("INTERNAL", "the server sent no reply")
        if len(self.body) != 5 + self.size:
            return CallFailed("INTERNAL", "truncated reply")
        try:
            return self.call.reply_type.FromString(bytes(self.body[5:]))
        except DecodeError as exc:
            return CallFailed("INTERNAL", f"reply does not decode: {exc}")


def _grpc_status(lines: list[bytes]) -> tuple[str | None, str]:
    """The call's gRPC status name and message from its header and trailer lines (the last
    of each counts). Nothing here may raise: a peer's header is anything up to libcurl's
    limit on a header's size."""
    status, message = None, ""
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.strip().lower()
        if name == b"grpc-status":
            code = value.strip()
            status = STATUS_NAMES[int(code)] if code.isdigit() and len(code) <= 2 and \
                int(code) < len(STATUS_NAMES) else "UNKNOWN"
        elif name == b"grpc-message":
            message = unquote(value.strip().decode("ascii", "replace"), errors="replace")
    return status, message


def _transport_failure(error: int, text: str) -> CallFailed:
    if error == pycurl.E_OPERATION_TIMEDOUT:
        return CallFailed("DEADLINE_EXCEEDED")
    if error in _GONE:
        return CallFailed("UNAVAILABLE", text)
    return CallFailed("UNKNOWN", text)  # a peer's nonsense libcurl rejected (HTTP/2, ...)


class _Connection:
    """One endpoint's connection, kept in a share handle of its own (libcurl's connection
    pool), which every easy handle of the endpoint uses: a lone call runs in libcurl's own
    loop (``perform``: no Python between its system calls), a round of several in the
    endpoint's multi handle, both on the same connection; closing the share closes exactly
    that connection. Easy handles are kept between calls (a call sets six options)."""

    def __init__(self, endpoint: Endpoint, client: UnaryClient) -> None:
        self.endpoint = endpoint
        self.share = pycurl.CurlShare()
        self.share.setopt(pycurl.SH_SHARE, pycurl.LOCK_DATA_CONNECT)
        self.multi = multi = pycurl.CurlMulti()
        multi.setopt(pycurl.M_PIPELINING, pycurl.PIPE_MULTIPLEX)
        multi.setopt(pycurl.M_SOCKETFUNCTION,
                     lambda what, fd, _multi, _data: client.watch(self, what, fd))
        multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self.timer_due = math.inf  # monotonic time libcurl next wants its timers run
        self.running = 0  # transfers in flight
        self.transfers: dict[pycurl.Curl, _Exchange] = {}  # this round's
        self._idle: list[pycurl.Curl] = []  # for rounds on the multi handle
        # for lone calls, never added to the multi handle: that would close the private
        # multi handle (and its two descriptors) that libcurl keeps for an easy handle's
        # perform, to be made again at the next one
        self._lone: pycurl.Curl | None = None
        # the call each handle's request options are set for, with its headers and timeout
        self._requests: dict[pycurl.Curl, tuple[Call, list[str], int]] = {}

    def start(self, call: Call, exchange: _Exchange, timeout_ms: int,
              headers: list[str]) -> None:
        """Add the call to this round's transfers (run by the client's ``_drive``)."""
        handle = self._idle.pop() if self._idle else self._new_handle()
        self._prepare(handle, call, exchange, timeout_ms, headers)
        self.transfers[handle] = exchange
        self.multi.add_handle(handle)
        self.running += 1

    def perform(self, call: Call, exchange: _Exchange, timeout_ms: int,
                headers: list[str]) -> tuple[Message | CallFailed, bool]:
        """A lone call, start to end in libcurl's loop; its outcome and whether the
        connection is to be dropped (as :meth:`_Exchange.finish`)."""
        handle = self._lone = self._lone or self._new_handle()
        self._prepare(handle, call, exchange, timeout_ms, headers)
        error, text = 0, ""
        try:
            handle.perform()
        except pycurl.error as exc:  # (libcurl's error code, its message)
            failure: tuple[Any, ...] = exc.args
            error, text = int(failure[0]), str(failure[1])
        return exchange.finish(handle, error, text)

    def _prepare(self, handle: pycurl.Curl, call: Call, exchange: _Exchange, timeout_ms: int,
                 headers: list[str]) -> None:
        """Point the handle at the call and at its exchange. A handle keeps its options
        from one transfer to the next, so the request is set only when it is not the
        handle's last (the usage call, every poll, is the same Call each time: four
        options, the URL, the serializing and the framing not redone, ~40 us of a cold
        poll)."""
        last = self._requests.get(handle)
        if last is None or last[0] is not call or last[1] is not headers or \
                last[2] != timeout_ms:
            body = call.request.SerializeToString()
            handle.setopt(pycurl.URL, self.endpoint.url(call.method))
            handle.setopt(pycurl.HTTPHEADER, headers)
            handle.setopt(pycurl.TIMEOUT_MS, timeout_ms)
            handle.setopt(pycurl.POSTFIELDS, _PREFIX.pack(0, len(body)) + body)
            self._requests[handle] = (call, headers, timeout_ms)
        handle.setopt(pycurl.WRITEFUNCTION, exchange.write)
        handle.setopt(pycurl.HEADERFUNCTION, exchange.header)

    def act(self, fd: int, flags: int) -> None:
        self.running = self.multi.socket_action(fd, flags)[1]

    def run_timers(self, now: float) -> None:
        if now >= self.timer_due:
            self.timer_due = math.inf
            self.act(pycurl.SOCKET_TIMEOUT, 0)

    def collect(self) -> tuple[list[Message | CallFailed], bool]:
        """This round's outcomes in the order started, and whether the connection is to be
        dropped (as :meth:`_Exchange.finish`)."""
        ended: dict[pycurl.Curl, tuple[int, str]] = {}
        while True:
            queued, done, failed = self.multi.info_read()
            ended.update((handle, (0, "")) for handle in done)
            ended.update((handle, (code, text)) for handle, code, text in failed)
            if not queued:
                break
        outcomes: list[Message | CallFailed] = []
        broken = False
        for handle, exchange in self.transfers.items():
            outcome, breaks = exchange.finish(
                handle, *ended.get(handle, (pycurl.E_OPERATION_TIMEDOUT, "no end")))
            outcomes.append(outcome)
            broken |= breaks
            self.multi.remove_handle(handle)
            self._idle.append(handle)
        self.transfers = {}
        self.running = 0
        return outcomes, broken

    def close(self) -> None:
        self.multi.close()
        for handle in self._idle + ([self._lone] if self._lone is not None else []):
            handle.close()
        self._idle.clear()
        self._lone = None
        self._requests.clear()
        self.share.close()  # its connection with it

    def _on_timer(self, timeout_ms: int) -> None:
        self.timer_due = math.inf if timeout_ms < 0 else \
            time.monotonic() + timeout_ms / 1000

    def _new_handle(self) -> pycurl.Curl:
        handle = pycurl.Curl()
        handle.setopt(pycurl.NOSIGNAL, 1)  # a threaded agent: no SIGALRM for timeouts
        handle.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE)
        handle.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP)
        handle.setopt(pycurl.NOPROXY, "*")  # an http_proxy in the environment is not ours
        handle.setopt(pycurl.PIPEWAIT, 1)  # a round's calls share one new connection
        handle.setopt(pycurl.POST, 1)
        handle.setopt(pycurl.SHARE, self.share)
        if self.endpoint.path is not None:
            handle.setopt(pycurl.UNIX_SOCKET_PATH, self.endpoint.path)
        return handle


class UnaryClient:
    """Connections to any number of endpoints, kept open between calls; not thread-safe
    (one poll thread owns it). Everything runs on the calling thread, inside ``call`` and
    ``call_all``: nothing runs between calls."""

    def __init__(self, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> None:
        self.max_reply_bytes = max_reply_bytes
        self._connections: dict[Endpoint, _Connection] = {}
        self._by_fd: dict[int, _Connection] = {}
        self._poller = select.poll()
        self._headers: dict[int, list[str]] = {}  # a call's headers by grpc-timeout (ms)
        self._closed = False
        self._unable = None if pycurl.version_info()[4] & pycurl.VERSION_HTTP2 else \
            CallFailed("UNIMPLEMENTED", f"libcurl {pycurl.version_info()[1]} has no HTTP/2 "
                       "(install pycurl's own wheel: pip install --force-reinstall pycurl)")

    def call(self, endpoint: Endpoint, method: str, request: Message,
             reply_type: type[Reply], timeout: float) -> Reply:
        """The reply, or :class:`CallFailed`."""
        outcome = self.call_all([Call(endpoint, method, request, reply_type)], timeout)[0]
        if isinstance(outcome, CallFailed):
            raise outcome
        return outcome  # type: ignore[return-value]

    def call_all(self, calls: Sequence[Call], timeout: float) -> list[Message | CallFailed]:
        """Every call at once, each within ``timeout``: its reply or its failure, in order."""
        if self._closed or self._unable is not None:
            return [self._unable or CallFailed("CANCELLED", "the client is closed")
                    for _ in calls]
        timeout_ms = max(1, math.ceil(timeout * 1000))
        headers = self._call_headers(timeout_ms)
        if len(calls) == 1:  # the agent's usage call, every poll: libcurl's loop alone
            return [self._perform(calls[0], timeout_ms, headers)]
        order: list[tuple[_Connection, int]] = []  # each call's connection and place there
        for call in calls:
            connection = self._connection(call.endpoint)
            order.append((connection, len(connection.transfers)))
            connection.start(call, _Exchange(call, self.max_reply_bytes), timeout_ms, headers)
        round_ = list(dict.fromkeys(connection for connection, _ in order))
        self._drive(round_, time.monotonic() + timeout)
        outcomes = {}
        for connection in round_:
            outcomes[connection], broken = connection.collect()
            if broken:
                self._drop(connection)
        return [outcomes[connection][place] for connection, place in order]

    def close(self) -> None:
        for connection in list(self._connections.values()):
            self._drop(connection)
        self._closed = True

    def forget(self, endpoint: Endpoint) -> None:
        """Close the connection to ``endpoint``, if any: the next call dials afresh."""
        connection = self._connections.get(endpoint)
        if connection is not None:
            self._drop(connection)

    def _perform(self, call: Call, timeout_ms: int, headers: list[str]) -> Message | CallFailed:
        connection = self._connection(call.endpoint)
        outcome, broken = connection.perform(call, _Exchange(call, self.max_reply_bytes),
                                             timeout_ms, headers)
        if broken:
            self._drop(connection)
        return outcome

    def watch(self, connection: _Connection, what: int, fd: int) -> None:
        """libcurl's socket callback: which of a connection's sockets to poll, for what."""
        if what == pycurl.POLL_REMOVE:
            if self._by_fd.pop(fd, None) is not None:
                self._poller.unregister(fd)
        else:
            self._by_fd[fd] = connection
            self._poller.register(fd, _POLL_FLAGS[what])

    def _drive(self, round_: list[_Connection], deadline: float) -> None:
        """Run libcurl until every call of the round ended (its own timeout ends one at the
        deadline at the latest; a second more is the backstop that never hangs a poll)."""
        while any(connection.running for connection in round_):
            now = time.monotonic()
            if now > deadline + 1.0:
                return
            due = min(deadline + 1.0, *(connection.timer_due for connection in round_))
            for fd, event in self._poller.poll(max(0.0, due - now) * 1000):
                connection = self._by_fd.get(fd)
                if connection is not None:
                    connection.act(fd, _curl_flags(event))
            now = time.monotonic()
            for connection in round_:
                connection.run_timers(now)

    def _connection(self, endpoint: Endpoint) -> _Connection:
        connection = self._connections.get(endpoint)
        if connection is None:
            connection = self._connections[endpoint] = _Connection(endpoint, self)
        return connection

    def _drop(self, connection: _Connection) -> None:
        """Close the endpoint's connection; the next call dials afresh."""
        if self._connections.get(connection.endpoint) is connection:
            del self._connections[connection.endpoint]
        connection.close()  # libcurl says POLL_REMOVE for its sockets

    def _call_headers(self, timeout_ms: int) -> list[str]:
        headers = self._headers.get(timeout_ms)
        if headers is None:
            headers = self._headers[timeout_ms] = [
                "content-type: application/grpc", "te: trailers",
                f"grpc-timeout: {timeout_ms}m", "user-agent: tpumon", "accept:"]
        return headers


def _curl_flags(event: int) -> int:
    flags = 0
    if event & select.POLLIN:
        flags |= pycurl.CSELECT_IN
    if event & select.POLLOUT:
        flags |= pycurl.CSELECT_OUT
    if event & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
        flags |= pycurl.CSELECT_ERR
    return flags
