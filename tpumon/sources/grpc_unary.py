"""Unary gRPC calls from synchronous code: grpclib (HTTP/2 in pure Python) driven on one
private asyncio loop per client, only while a call is made.

Why not grpcio, which the simulator serves with and tpu-info's own client uses: the agent
makes one small call a second, and for that grpcio's C core is the heavier half of the
agent. Importing it costs ~16 MiB of RSS, its channels keep 6-7 threads that wake 12-18
times a second with nothing to do, and a call is handed from the calling thread to those
threads and back. grpclib has no threads and nothing runs between calls: ~11 MiB less RSS
and about a fifth less CPU at one call a second (docs/benchmarks.md, issue 25).

What the agent needs from a client, and this one gives:

* every call has a deadline, sent to the server (``grpc-timeout``) and enforced here;
* every failure is a :class:`CallFailed` with a gRPC status name, never another exception:
  nothing listening is UNAVAILABLE, a reply that does not decode INTERNAL, anything the
  transport raises on a peer's nonsense UNKNOWN (a source turns it into a reported state);
* a reply is at most ``max_reply_bytes`` (RESOURCE_EXHAUSTED beyond, as grpcio's default
  4 MiB limit): a port any local user can bind between jobs must not make the agent buffer
  gigabytes. grpclib has no such limit of its own, so the length prefix is read here;
* a connection that failed or was refused is dialled again at the next call, so a runtime
  that comes back (the next job) heals unaided;
* a connection is replaced after ``streams_per_connection`` calls: h2 remembers every
  stream it closed, up to 65,536 a connection (~115 bytes each), which at the agent's one
  to two calls a second was ~7 MiB of RSS grown over its first ten hours.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any, Coroutine, Sequence, TypeVar

from google.protobuf.message import DecodeError, Message
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

from tpumon.units import format_bytes

Reply = TypeVar("Reply", bound=Message)

DEFAULT_MAX_REPLY_BYTES = 4 << 20  # grpcio's default receive limit
STREAMS_PER_CONNECTION = 4096  # ~0.5 MiB of h2's closed streams; a new connection ~35 min


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


@dataclass(frozen=True, slots=True)
class Call:
    """One unary call: ``method`` is the full name, ``/package.Service/Method``."""

    endpoint: Endpoint
    method: str
    request: Message
    reply_type: type[Message]


class UnaryClient:
    """Channels to any number of endpoints, kept open between calls; not thread-safe (one
    poll thread owns it)."""

    def __init__(self, max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
                 streams_per_connection: int = STREAMS_PER_CONNECTION) -> None:
        self.max_reply_bytes = max_reply_bytes
        self.streams_per_connection = streams_per_connection
        self._loop = asyncio.new_event_loop()
        self._channels: dict[Endpoint, Channel] = {}
        self._streams: dict[Endpoint, int] = {}  # calls made on each channel's connection

    def call(self, endpoint: Endpoint, method: str, request: Message,
             reply_type: type[Reply], timeout: float) -> Reply:
        """The reply, or :class:`CallFailed`."""
        return self._run(self._call(Call(endpoint, method, request, reply_type), timeout))

    def call_all(self, calls: Sequence[Call], timeout: float) -> list[Message | CallFailed]:
        """Every call at once, each within ``timeout``: its reply or its failure, in order."""
        async def every() -> list[Message | CallFailed]:
            return list(await asyncio.gather(*(self._outcome(c, timeout) for c in calls)))
        return self._run(every())

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        if not self._loop.is_closed():
            # Let the transports' close callbacks run before the loop goes.
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    def _run(self, work: Coroutine[Any, Any, Any]) -> Any:
        if self._loop.is_closed():
            work.close()
            raise CallFailed("CANCELLED", "the client is closed")
        self._retire_worn()
        return self._loop.run_until_complete(work)

    def _retire_worn(self) -> None:
        """Close each connection that carried its ``streams_per_connection`` calls, between
        rounds (never under a call in flight); the next call dials afresh."""
        for endpoint, used in list(self._streams.items()):
            if used >= self.streams_per_connection:
                self._drop(endpoint)

    async def _outcome(self, call: Call, timeout: float) -> Message | CallFailed:
        try:
            return await self._call(call, timeout)
        except CallFailed as failure:
            return failure

    async def _call(self, call: Call, timeout: float) -> Any:
        try:
            return await asyncio.wait_for(self._exchange(call, timeout), timeout)
        except CallFailed:
            raise
        except asyncio.TimeoutError:
            # The peer is hung, or broke HTTP/2 in a way grpclib closes the connection on
            # without waking the call: either way a fresh connection next time.
            self._drop(call.endpoint)
            raise CallFailed("DEADLINE_EXCEEDED") from None
        except GRPCError as exc:
            raise CallFailed(exc.status.name, exc.message or "") from None
        except (OSError, StreamTerminatedError) as exc:
            self._drop(call.endpoint)
            raise CallFailed("UNAVAILABLE", str(exc)) from None
        except DecodeError as exc:
            raise CallFailed("INTERNAL", f"reply does not decode: {exc}") from None
        except Exception as exc:  # a peer's nonsense the transport rejected (h2, grpclib)
            self._drop(call.endpoint)
            raise CallFailed("UNKNOWN", f"{type(exc).__name__}: {exc}") from None

    async def _exchange(self, call: Call, timeout: float) -> Message:
        channel = self._channel(call.endpoint)
        self._streams[call.endpoint] += 1
        stream: Stream[Message, Message] = channel.request(
            call.method, Cardinality.UNARY_UNARY, type(call.request), call.reply_type,
            timeout=timeout)
        async with stream:
            await stream.send_message(call.request, end=True)
            await stream.recv_initial_metadata()
            try:
                body = await self._reply_body(stream)
            except CallFailed:
                self._drop(call.endpoint)  # the rest of its reply is never read
                raise
            if body is None:
                raise CallFailed("INTERNAL", "the server sent no reply")
            return call.reply_type.FromString(body)

    async def _reply_body(self, stream: Stream[Message, Message]) -> bytes | None:
        """The reply's bytes after its length prefix is checked. grpclib's own
        ``recv_message`` reads whatever length the peer announces; this is the same read
        (grpclib 0.4's ``stream.recv_message``) with a limit, through its stream's buffer."""
        raw = stream._stream  # grpclib.protocol.Stream: the HTTP/2 stream's data
        head = await raw.recv_data(5)
        if not head:
            return None
        if len(head) != 5 or head[0] != 0:
            raise CallFailed("INTERNAL", "compressed or truncated reply")
        size = struct.unpack(">I", head[1:])[0]
        if size > self.max_reply_bytes:
            raise CallFailed("RESOURCE_EXHAUSTED", f"a reply of {format_bytes(size)} is over "
                             f"the {format_bytes(self.max_reply_bytes)} limit")
        return await raw.recv_data(size) if size else b""

    def _channel(self, endpoint: Endpoint) -> Channel:
        channel = self._channels.get(endpoint)
        if channel is None:  # made on the running loop: grpclib binds it to that loop
            channel = Channel(endpoint.host, endpoint.port, path=endpoint.path)
            self._channels[endpoint] = channel
            self._streams[endpoint] = 0
        return channel

    def _drop(self, endpoint: Endpoint) -> None:
        """Close the endpoint's connection; the next call dials afresh."""
        channel = self._channels.pop(endpoint, None)
        self._streams.pop(endpoint, None)
        if channel is not None:
            channel.close()
