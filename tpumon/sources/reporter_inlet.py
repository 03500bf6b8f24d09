"""Where reports arrive: the reporters' connections and the datagram socket, one thread.

Every local user can reach both sockets, so no sender may be able to silence another.
A reporter connects to a Unix ``SOCK_SEQPACKET`` socket (message boundaries kept, like
datagrams) and so has a kernel queue of its own: a neighbour flooding his connection
fills only his queue. The thread reads the ready connections in turn, at most
READS_PER_TURN messages from each before the next, so one that always has more waiting
cannot starve the others; a user whose messages overflow his share of the agent's inbox
(the caller's ``keep`` says who) is not read again until the next poll, so his senders'
queues fill, nobody else's, and the agent spends no CPU on him meanwhile. A message too
long, or that cannot be a report (not ``{`` nor a snapshot header), closes its
connection. Each user may hold CONNECTIONS_PER_USER connections (beyond, the new one is
closed: a user crowds out only himself), CONNECTIONS_MAX in all.

Each message's pid and uid are the kernel's (``SO_PASSCRED``, which an accepted socket
takes from the listener): the process that sent that message, even on a connection that
another process opened (a forked child, a descriptor passed on, a pid since reused).
The connecting user (``SO_PEERCRED``) is what the quota counts.

The datagram socket at the documented address stays for reporters of earlier versions
(and for any reporter whose connection failed): its kernel queue holds just
``net.unix.max_dgram_qlen`` datagrams for every sender together, which is why reporters
connect where they can. It is read at most its queue length per turn.

The thread does not wake for every message either: it takes whatever is waiting, then
sleeps while more gather (:class:`Pacer`). The poll takes what waits too, just before it
reads the inbox (:meth:`ReporterInlet.take_waiting`), so a report sent before a poll is
in it however long the thread sleeps: the thread's sleeps only keep the kernel's queues
from filling between polls.
"""

from __future__ import annotations

import array
import logging
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Collection, NamedTuple, Protocol

from tpumon.instrument.protocol import (FATAL_HEADER, LAST_WORDS_HEADER, MAX_LAST_WORDS,
                                        MAX_SNAPSHOT_DATAGRAM, PART)
from tpumon.common.signals import Stop
from tpumon.common.private_paths import bind_with_mode

log = logging.getLogger("tpumon.sources")

CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: ``&`` on the IntFlag goes through enum
_SEND = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
READS_PER_TURN = 16  # messages from one connection before the next ready one's turn
ACCEPTS_PER_TURN = 64
CONNECTIONS_PER_USER = 64  # a user's processes heard at once are 32 (reporter.USER_SLOTS)
CONNECTIONS_MAX = 512
QUEUE_LENGTH_FILE = Path("/proc/sys/net/unix/max_dgram_qlen")
#: What may start a message on a connection: a report, a snapshot, last words. (A fatal
#: signal's words come only from the pipe a reporter passed: never as a message.)
STARTS = (b"{", PART, LAST_WORDS_HEADER)
_FD = array.array("i").itemsize


class Reply(Protocol):
    """Where a request to a message's sender goes (snapshot requests)."""

    def send(self, payload: bytes) -> None:
        """Send without waiting; OSError when it cannot be sent now."""


class DatagramReply(NamedTuple):
    """A datagram sender's address, answered from the agent's datagram socket."""

    sock: socket.socket
    address: str | bytes

    def send(self, payload: bytes) -> None:
        self.sock.sendto(payload, socket.MSG_DONTWAIT, self.address)


class Connection:
    """One reporter's connection, and the user who opened it (SO_PEERCRED)."""

    def __init__(self, sock: socket.socket, uid: int) -> None:
        self.sock = sock
        self.uid = uid
        #: the read end of the reporter's faulthandler pipe, and the credentials of the
        #: message that passed it (tpumon.instrument.last_words): read as the connection ends
        self.fatal_pipe: int | None = None
        self.fatal_ancillary: list = []

    def take_pipe(self, fd: int, ancillary: list) -> None:
        """Keep a faulthandler pipe (one per connection: a new one replaces the last)."""
        self.close_pipe()
        self.fatal_pipe, self.fatal_ancillary = fd, ancillary

    def close_pipe(self) -> None:
        if self.fatal_pipe is not None:
            os.close(self.fatal_pipe)
            self.fatal_pipe = None

    def fatal_words(self) -> Arrival | None:
        """What faulthandler wrote into the pipe before the process died, as a message
        (at most MAX_LAST_WORDS bytes); None when it wrote nothing."""
        if self.fatal_pipe is None:
            return None
        try:
            data = os.read(self.fatal_pipe, MAX_LAST_WORDS - len(FATAL_HEADER))
        except OSError:  # nothing written (EAGAIN)
            data = b""
        self.close_pipe()
        return Arrival(FATAL_HEADER + data, self.fatal_ancillary, 0, None) if data else None

    def send(self, payload: bytes) -> None:
        self.sock.send(payload, _SEND)  # a closed socket raises OSError too


class Arrival(NamedTuple):
    """One message as read: the caller parses it at its next poll."""

    data: bytes
    ancillary: list
    flags: int
    reply: Reply | None


def passed_fds(ancillary: list) -> list[int]:
    """The descriptors a message carried (SCM_RIGHTS), now open in the agent."""
    fds: list[int] = []
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(array.array("i", value[:len(value) - len(value) % _FD]))
    return fds


def is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def sender(ancillary: list) -> tuple[int, int]:
    """(pid, uid) of a message's sender, as the kernel gave them; (-1, -1) without."""
    for level, kind, value in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, uid, _ = CREDS.unpack(value[:CREDS.size])
            return pid, uid
    return -1, -1


def kernel_queue_length(path: Path = QUEUE_LENGTH_FILE) -> int:
    """How many datagrams the kernel queues for an unconnected Unix socket before senders
    get EAGAIN (this network namespace's ``net.unix.max_dgram_qlen``; the kernel's default
    of 10 when it cannot be read). systemd raises it to 512; containers often keep 10."""
    try:
        return max(int(path.read_text()), 1)
    except (OSError, ValueError):
        return 10


class Pacer:
    """When the receiving thread sleeps, and for how long, between looks at the sockets.

    Each wake-up costs the agent ~0.1-0.3 ms of CPU on a VM (cold caches, the GIL), so at
    10 reports a second waking for each would be half the agent's budget. While messages come
    faster than the thread's sleep, it sleeps between looks and takes what gathered, as
    long as that stays under half of the fullest queue it reads: the datagram socket's
    kernel queue (shared by every datagram sender), and for a connection two looks'
    reads (2 * READS_PER_TURN; its kernel queue, the sender's socket buffer, holds far
    more), a look that took a full turn from one counting as full since it may have left
    more. A connection's messages do not fill the datagram queue, so they are not counted
    against it. A look that found more than half shortens the next sleep in proportion,
    one that found under a quarter lengthens it by half (between MIN_HOLD and MAX_HOLD,
    or MAX_CONNECTION_HOLD while only connections send). A look that finds nothing, or a
    slow sender, puts the thread back to blocking until the next message (no wake-ups
    while idle, one per message when they come further apart than the sleep). No rate is
    assumed, so a sender that speeds up is followed within a look or two.
    """

    MIN_HOLD = 0.002
    # The poll takes what waits itself (take_waiting), so a longer sleep delays no report
    # past its poll. The datagram queue is shared and short: a look at least every second.
    MAX_HOLD = 1.0
    # A connection's queue is its sender's socket buffer (a hundred reports and more), and
    # each poll takes a turn (READS_PER_TURN) from it: at a reporter's fastest (20 reports
    # a second, its min_interval) and 1 s polls, a 4 s sleep leaves one turn waiting. The
    # thread's looks cost ~0.3 ms of CPU each, cold: at 10 reports a second over
    # connections, ~1 wake-up a second with MAX_HOLD, ~0.25 with this.
    MAX_CONNECTION_HOLD = 4.0

    def __init__(self, queue_length: int) -> None:
        self.queue_length = queue_length
        self.hold = self.MIN_HOLD

    def after_look(self, datagrams: int, most_from_one_connection: int = 0) -> bool:
        """After a look that found ``datagrams`` waiting on the datagram socket and at most
        ``most_from_one_connection`` on any one connection: whether to sleep and look again
        (else block), with ``hold`` adjusted."""
        connection = 1.0 if most_from_one_connection >= READS_PER_TURN else \
            most_from_one_connection / (2 * READS_PER_TURN)  # a full turn may have left more
        fill = max(datagrams / self.queue_length, connection)
        longest = self._longest(datagrams)
        if fill > 0.5:
            self.hold = max(self.hold * 0.25 / fill, self.MIN_HOLD)
        elif fill < 0.25:
            self.hold = self.hold * 1.5
        self.hold = min(self.hold, longest)
        return datagrams + most_from_one_connection > 0

    def after_block(self, waited: float, datagrams: int) -> bool:
        """After blocking ``waited`` seconds for a message (``datagrams`` of what it took
        came from the datagram socket): whether to sleep and look (the next one is likely
        to come within the sleep), else block again."""
        longest = self._longest(datagrams)
        if waited < self.hold:
            self.hold = min(self.hold, longest)
            return True
        self.hold = min(self.hold * 1.5, longest)
        return False

    def _longest(self, datagrams: int) -> float:
        return self.MAX_HOLD if datagrams else self.MAX_CONNECTION_HOLD


Keep = Callable[[list[Arrival]], Collection[int]]


class ReporterInlet:
    """Binds both sockets and takes messages off them on a thread, handing each batch to
    ``keep``, which answers the users now past their share (not read until :meth:`resume`)."""

    def __init__(self, path: Path, connection_path: Path,
                 allowed_uids: Callable[[], Collection[int]], keep: Keep) -> None:
        self.path, self.connection_path = path, connection_path
        self._allowed_uids = allowed_uids  # the owner's, as reloaded: asked at each accept
        self._keep = keep
        self._selector = selectors.DefaultSelector()
        self._datagrams: socket.socket | None = None
        self._listener: socket.socket | None = None
        self._wake_in, self._wake_out = socket.socketpair()
        self._connections: dict[int, set[Connection]] = {}  # uid -> its open connections
        self._paused: set[Connection] = set()
        self._listener_paused = False  # out of descriptors: accept again after the next poll
        self._queue_length = kernel_queue_length()
        self._dropped: Counter[str] = Counter()  # by reason, under _lock
        self._lock = threading.Lock()
        # the thread's looks and the poll's (take_waiting) one at a time: the selector's
        # registrations, the paused set and the connections are theirs under it
        self._io = threading.Lock()
        self._stopping = Stop()  # its wait is cheaper than an Event's (tpumon.common.signals)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind both sockets (replacing stale socket files) and start the thread."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._datagrams = self._bind(socket.SOCK_DGRAM, self.path)
        self._datagrams.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._selector.register(self._datagrams, selectors.EVENT_READ, "datagrams")
        try:
            self._listener = self._bind(socket.SOCK_SEQPACKET, self.connection_path)
            self._listener.listen(socket.SOMAXCONN)
            self._listener.setblocking(False)
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        except OSError as exc:  # e.g. a path too long: reporters fall back to datagrams
            log.warning("reporter connections off: cannot listen on %s: %s",
                        self.connection_path, exc)
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._selector.register(self._wake_in, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="tpumon-reporter", daemon=True)
        self._thread.start()

    @staticmethod
    def _bind(kind: int, path: Path) -> socket.socket:
        if path.is_socket():
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, kind | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            bind_with_mode(sock, str(path), 0o666)  # every user's processes report
        except OSError:
            sock.close()
            raise
        return sock

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(2.0)
        with self._io:
            self._close_all()
        if self._thread is None or not self._thread.is_alive():
            self._selector.close()
            self._wake_in.close()
            self._wake_out.close()

    def _close_all(self) -> None:
        for sock, path in ((self._datagrams, self.path), (self._listener, self.connection_path)):
            if sock is not None:
                sock.close()
                try:
                    path.unlink()
                except OSError:
                    pass
        self._datagrams = self._listener = None
        for connection in [c for mine in self._connections.values() for c in mine]:
            connection.sock.close()
            connection.close_pipe()
        self._connections.clear()

    def take_waiting(self) -> None:
        """Take every message waiting now for ``keep``, on the caller's thread (the poll,
        just before it reads the inbox): one turn, as a look of the thread takes."""
        with self._io:
            if self._stopping.is_set() or self._thread is None:
                return
            self._take(self._selector.select(0), READS_PER_TURN)

    def resume(self) -> None:
        """The inbox was emptied (any thread): read the users paused for their share again."""
        if self._paused or self._listener_paused:
            self._wake()

    def dropped(self) -> dict[str, int]:
        """Messages dropped here, by reason (a refused connection counts one)."""
        with self._lock:
            return dict(self._dropped)

    def datagram_reply(self, address: str | bytes) -> Reply | None:
        """Where a request to a datagram's sender goes (None for an unbound sender)."""
        return DatagramReply(self._datagrams, address) \
            if address and self._datagrams is not None else None

    def connection_count(self) -> int:
        return sum(len(mine) for mine in self._connections.values())

    def _wake(self) -> None:
        try:
            self._wake_out.send(b"w")
        except OSError:  # already awake (full) or stopped
            pass

    def _run(self) -> None:
        """Take messages for ``keep``, paced by :class:`Pacer`: blocking until one is
        ready, or sleeping and then taking all that wait."""
        pacer = Pacer(self._queue_length)
        looking = False
        while not self._stopping.is_set():
            started = time.monotonic()
            ready = self._selector.select(0 if looking else None)
            if self._stopping.is_set():
                return
            # Woken from a block: one message per ready socket (most wake-ups bring one,
            # and a read that finds none waiting costs as much again, cold); a socket
            # that has more stays ready, and the look that follows takes full turns.
            with self._io:
                if self._stopping.is_set():  # stop() closed the sockets meanwhile
                    return
                datagrams, most = self._take(ready, READS_PER_TURN if looking else 1)
            looking = pacer.after_look(datagrams, most) if looking else \
                pacer.after_block(time.monotonic() - started, datagrams)
            if looking:
                self._stopping.wait(pacer.hold)

    def _take(self, ready: list, reads: int) -> tuple[int, int]:
        """One turn read and handed to ``keep`` (under ``_io``): how many came from the
        datagram socket and the most from one connection."""
        batch, datagrams, most = self._read(ready, reads)
        if batch:
            self._pause(self._keep(batch))
        return datagrams, most

    def _read(self, ready: list, reads: int) -> tuple[list[Arrival], int, int]:
        """One turn: every ready socket, each at most ``reads`` messages (the datagram
        socket, shared by every sender of earlier versions, its queue length). The
        messages, how many came from the datagram socket and the most from one connection
        (what the :class:`Pacer` weighs). ``ready`` may be stale (the other thread's look
        came between): a socket found empty, paused or closed meanwhile is passed over."""
        batch: list[Arrival] = []
        datagrams = most = 0
        for key, _ in ready:
            if key.data == "datagrams":
                datagrams = self._read_datagrams(
                    batch, max(self._queue_length, reads) if reads > 1 else 1)
            elif key.data == "listener":
                self._accept()
            elif key.data == "wake":
                self._on_wake()
            else:
                most = max(most, self._read_connection(key.data, batch, reads))
        return batch, datagrams, most

    def _read_datagrams(self, batch: list[Arrival], reads: int) -> int:
        """Up to ``reads`` datagrams; how many."""
        if self._datagrams is None:  # stopped
            return 0
        space = socket.CMSG_SPACE(CREDS.size)
        for taken in range(reads):
            try:
                data, ancillary, flags, address = self._datagrams.recvmsg(
                    MAX_SNAPSHOT_DATAGRAM, space, socket.MSG_DONTWAIT)
            except OSError:  # none waiting (EAGAIN), or a transient error
                return taken
            if data.startswith(FATAL_HEADER):  # only read from a pipe, never sent
                with self._lock:
                    self._dropped["malformed"] += 1
                continue
            batch.append(Arrival(data, ancillary, flags, self.datagram_reply(address)))
        return reads

    def _read_connection(self, connection: Connection, batch: list[Arrival],
                         reads: int) -> int:
        """Up to ``reads`` messages, how many; a bad one, or the end, closes the
        connection."""
        if connection in self._paused or connection.sock.fileno() < 0:
            return 0  # paused or closed since the select that found it ready
        # room for the credentials and one descriptor (a faulthandler pipe); more are
        # closed by the kernel (MSG_CTRUNC)
        space = socket.CMSG_SPACE(CREDS.size) + socket.CMSG_SPACE(_FD)
        for taken in range(reads):
            try:
                data, ancillary, flags, _ = connection.sock.recvmsg(
                    MAX_SNAPSHOT_DATAGRAM, space, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return taken
            except OSError:
                data, flags, ancillary = b"", 0, []
            fds = passed_fds(ancillary)
            if fds and data == FATAL_HEADER and len(fds) == 1 and is_pipe(fds[0]):
                connection.take_pipe(fds[0], ancillary)
                continue
            for fd in fds:  # a descriptor with anything else: not kept
                os.close(fd)
            if not data:  # the reporter closed it (or the kernel did): it may have died
                words = connection.fatal_words()
                if words is not None:
                    batch.append(words)
                self._close(connection, None)
                return taken
            bad = "oversized" if flags & _MSG_TRUNC else None if data.startswith(STARTS) \
                else "malformed"
            if bad:
                self._close(connection, bad)
                return taken
            batch.append(Arrival(data, ancillary, flags, connection))
        return reads

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:  # none waiting
                return
            except OSError as exc:  # out of descriptors: not again until the next poll
                log.warning("reporter connections: cannot accept: %s", exc)
                self._selector.unregister(self._listener)
                self._listener_paused = True
                return
            uid = CREDS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                               CREDS.size))[1]
            mine = self._connections.setdefault(uid, set())
            allowed = self._allowed_uids()
            if (allowed and uid not in allowed) or \
                    len(mine) >= CONNECTIONS_PER_USER or \
                    self.connection_count() >= CONNECTIONS_MAX:
                sock.close()
                with self._lock:
                    self._dropped["forbidden"] += 1
                continue
            sock.setblocking(False)
            connection = Connection(sock, uid)
            mine.add(connection)
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _close(self, connection: Connection, reason: str | None) -> None:
        if reason is not None:
            with self._lock:
                self._dropped[reason] += 1
        if connection in self._paused:
            self._paused.discard(connection)
        else:
            self._selector.unregister(connection.sock)
        self._connections.get(connection.uid, set()).discard(connection)
        connection.sock.close()
        connection.close_pipe()

    def _pause(self, users: Collection[int]) -> None:
        """Stop reading these users' connections until :meth:`resume`."""
        for uid in users:
            for connection in self._connections.get(uid, ()):
                if connection not in self._paused:
                    self._selector.unregister(connection.sock)
                    self._paused.add(connection)

    def _on_wake(self) -> None:
        try:
            while self._wake_in.recv(64):
                pass
        except OSError:  # drained
            pass
        for connection in self._paused:
            self._selector.register(connection.sock, selectors.EVENT_READ, connection)
        self._paused = set()
        if self._listener_paused and self._listener is not None:
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")
            self._listener_paused = False
