"""Reports from training processes (tpumon.instrument): each reporter's connection, and the
datagram socket that reporters of earlier versions send to (:mod:`reporter_inlet`).

Every message is untrusted input from another process: the inlet's thread only takes
messages off the sockets, and they are checked (size, JSON, protocol version, field
types) at the next poll, all at once: a message handled on its own, after the thread
slept, cost ~0.2 ms of CPU, most of it a cold interpreter, and a poll's batch costs a
fraction of that per report. Anything wrong is dropped and counted by reason, never
raised. The sender's pid and uid come from the kernel (SO_PASSCRED), not from the
report, so a process cannot speak for another; with ``allowed_uids`` only those users'
processes are heard.

The sockets are writable by every local user (training jobs rarely run as the agent's
user); ``allowed_uids`` is how a site narrows that down.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Collection, Mapping, NamedTuple

from tpumon.instrument.protocol import (FATAL_HEADER, LAST_WORDS_HEADER, MAX_DATAGRAM, PART,
                                        PROTOCOL_VERSION, connection_path, encode_request,
                                        parse_part)
from tpumon.sources.last_words import LastWords, merge, parse_message
from tpumon.sources.reporter_inlet import Arrival, Reply, ReporterInlet, sender
# bench/overhead.py reads the queue length from here
from tpumon.sources.reporter_inlet import kernel_queue_length as kernel_queue_length
from tpumon.sources.snapshots import SnapshotRequests, SnapshotResult

log = logging.getLogger("tpumon.sources")

_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: ``&`` on the IntFlag goes through enum
DROP_REASONS = ("oversized", "malformed", "version", "forbidden", "backlog")
INBOX_BYTES = 8 << 20  # datagrams waiting for the next poll; beyond, dropped ("backlog")
INBOX_USER_BYTES = 1 << 20  # ... of which one sending user's
#: last words have a reserve of their own beside those shares: a process's traceback
#: (one message of at most MAX_LAST_WORDS) is not dropped because its user's other
#: processes filled their share (a job streaming snapshots, a flood of one's own)
INBOX_WORDS_BYTES = 2 << 20
INBOX_USER_WORDS_BYTES = 256 << 10  # ... of which one sending user's (then: the user's share)
STALE_SECONDS = 300.0  # a process not heard from this long is forgotten once it has exited
SILENT_MAX_SECONDS = 86400.0  # ... and even while alive (a pid reused, a job parked for a day)
RATE_WINDOW_SECONDS = 120.0
PENDING_POINTS = 4096  # per process between two polls; beyond, the oldest go
USER_SLOTS = 32  # processes of one user heard at once (a VM has at most 8 chips)
WORDS_KEPT = 512  # processes whose last words are kept (the oldest go first)
NO_DEVICES: Mapping[str, Mapping[str, int | None]] = MappingProxyType({})  # shared: read-only


class ProcessReport(NamedTuple):
    """The latest report of one training process, with the kernel's pid and uid.

    A named tuple, not a frozen dataclass: one is made for every report (ten a second and
    more), and a frozen dataclass's ``__init__`` (``object.__setattr__`` for each of its
    17 fields) and ``dataclasses.replace`` cost ~7 and ~11 us against ~2.5 for each here."""

    pid: int
    uid: int
    framework: str
    step: int
    time: float          # the sender's clock
    received: float      # the agent's clock
    rank: int | None = None
    ordinal: int | None = None
    live: int | None = None
    compiles_cached: int | None = None
    compiles_uncached: int | None = None
    devices: Mapping[str, Mapping[str, int | None]] = NO_DEVICES
    rss: int | None = None
    steps_per_second: float | None = None
    snapshots: bool = False  # the reporter answers snapshot requests
    framework_version: str | None = None  # e.g. "2.9.0": known issues are matched on it
    exited: bool = False  # the pid is gone: kept a while for status and post-mortems


class InvalidReport(ValueError):
    """A datagram that is not a valid report; the message is the drop reason."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    return True


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: a key given twice is ambiguous (which
    one counts depends on the parser), so the datagram is malformed."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise InvalidReport("malformed")
    return doc


# one scanner for every report: json.loads builds a new decoder for each call given a hook,
# and JSONDecoder.decode's two Python frames and two regex matches around the scanner are a
# fifth of a report's parsing; the decoder's __init__ sets scan_once, which typeshed does
# not declare
_SCAN = json.JSONDecoder(object_pairs_hook=_unique_keys).scan_once  # type: ignore[attr-defined]
_JSON_SPACE = " \t\n\r"  # RFC 8259's whitespace, all JSONDecoder.decode skips


def parse_report(payload: bytes, pid: int, uid: int, received: float) -> ProcessReport:
    """Validate one datagram; InvalidReport('malformed' | 'version') when it is not one.

    Any local user can send one, so nothing in it may raise anything else: nesting deep
    enough to exhaust the parser's recursion (8 KiB of ``[``), numbers too long for int(),
    duplicate keys, non-ASCII digits and bytes that are not UTF-8 are all just "malformed".
    UTF-8 only, as RFC 8259 has JSON between systems and every reporter sends it."""
    try:
        text = payload.decode() if isinstance(payload, bytes) else payload
        if text[:1] != "{":
            text = text.lstrip(_JSON_SPACE)
        doc, end = _SCAN(text, 0)  # StopIteration: no JSON value at all
    except (ValueError, UnicodeDecodeError, RecursionError, StopIteration):
        raise InvalidReport("malformed") from None
    if type(doc) is not dict or (end != len(text) and text[end:].strip(_JSON_SPACE)):
        raise InvalidReport("malformed")
    get = doc.get
    if get("v") != PROTOCOL_VERSION:
        raise InvalidReport("version")
    compiles = get("compiles") or {}
    if type(compiles) is not dict:
        raise InvalidReport("malformed")
    step, rank, ordinal, live, rss, cached, uncached = counts = (
        get("step"), get("rank"), get("ordinal"), get("live"), get("rss"),
        compiles.get("cached"), compiles.get("uncached"))
    if step is None or not _counts(counts):
        raise InvalidReport("malformed")
    version = get("fv")
    # positional: the named tuple's __new__ takes them ~2x faster than keywords
    return ProcessReport(
        pid, uid, _text(get("framework")), step, _number(get("time")), received, rank,
        ordinal, live, cached, uncached, _devices(get("devices")), rss, None,
        get("snapshots") is True, None if version is None else _text(version))


def _counts(values: tuple[Any, ...]) -> bool:
    """Whether each value is absent (None) or a count: an integer in [0, 2**63). One loop
    for a report's seven, not a call each (the poll parses every report). JSON's true and
    false decode to bools, an int subclass: refused, as are floats."""
    for value in values:
        if value is not None and (type(value) is not int or not 0 <= value < 2**63):
            return False
    return True


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidReport("malformed")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 32 or not value.isprintable():
        raise InvalidReport("malformed")
    return value


def _devices(value: Any) -> Mapping[str, Mapping[str, int | None]]:
    if value is None:
        return NO_DEVICES
    if not isinstance(value, dict) or len(value) > 64:
        raise InvalidReport("malformed")
    out = {}
    for device, stats in value.items():
        if not isinstance(stats, dict) or not (device.isascii() and device.isdigit()):
            raise InvalidReport("malformed")
        used, limit, peak = stats.get("used"), stats.get("limit"), stats.get("peak")
        if not _counts((used, limit, peak)):
            raise InvalidReport("malformed")
        out[str(device)] = {"used": used, "limit": limit, "peak": peak}
    return out


class CountPoint(NamedTuple):
    """One report's counts, kept for the trend of live tensors and compiles."""

    step: int
    live: int | None
    compiles_uncached: int | None
    rss: int | None = None


@dataclass(frozen=True)
class ReporterReading:
    """What the reporter socket knows now: each live process's latest report, every
    report's counts since the last poll, and totals."""

    processes: Mapping[int, ProcessReport]
    points: Mapping[int, list[CountPoint]]
    reports_total: int
    dropped_total: Mapping[str, int]
    snapshots: Mapping[int, SnapshotResult] = field(default_factory=dict)  # latest, per pid
    #: what each process said as it ended (tpumon.sources.last_words), kept until it is forgotten
    last_words: Mapping[int, LastWords] = field(default_factory=dict)


class _Shares:
    """Bytes taken from a budget, in all and per user, until cleared (under the caller's
    lock)."""

    def __init__(self, total: int, per_user: int) -> None:
        self.total, self.per_user = total, per_user
        self._taken = 0
        self._by_user: dict[int, int] = {}

    def take(self, uid: int, size: int) -> bool:
        """Take ``size`` bytes for ``uid`` if both bounds allow it."""
        mine = self._by_user.get(uid, 0) + size
        if self._taken + size > self.total or mine > self.per_user:
            return False
        self._taken += size
        self._by_user[uid] = mine
        return True

    def clear(self) -> None:
        self._taken = 0
        self._by_user = {}


class ReporterSocket:
    """Binds the socket, receives on a thread, keeps each process's latest report."""

    def __init__(self, path: str | os.PathLike[str], allowed_uids: Collection[int] = (),
                 max_processes: int = 256, clock=time.time) -> None:
        self.path = Path(path)
        self.allowed_uids = frozenset(allowed_uids)
        self._max_processes = max_processes
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: dict[int, ProcessReport] = {}
        self._exited: set[int] = set()  # pids of _latest found gone at the last poll
        self._steps: dict[int, deque[tuple[float, int]]] = {}
        self._points: dict[int, deque[CountPoint]] = {}
        self._reports = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)  # the poll thread's counts
        self._dropped_backlog = 0  # the receiving thread's, under the lock
        # with the sender's (pid, uid) and when it was taken
        self._inbox: list[tuple[Arrival, tuple[int, int], float]] = []
        self._reports_share = _Shares(INBOX_BYTES, INBOX_USER_BYTES)
        self._words_share = _Shares(INBOX_WORDS_BYTES, INBOX_USER_WORDS_BYTES)
        self._replies: dict[int, Reply] = {}  # pid -> where a request to it goes
        self._requests = SnapshotRequests()  # under the lock: the HTTP thread asks too
        self._words: dict[int, LastWords] = {}  # pid -> its last words (the poll thread's)
        self._inlet: ReporterInlet | None = None

    def start(self) -> None:
        """Bind both sockets (replacing stale socket files from a previous agent) and start
        receiving: reporters connect at :func:`connection_path` of ``path``; reporters of
        earlier versions send datagrams to ``path`` itself."""
        inlet = ReporterInlet(self.path, Path(connection_path(self.path)),
                              lambda: self.allowed_uids, self._keep)
        inlet.start()
        self._inlet = inlet

    def stop(self) -> None:
        if self._inlet is not None:
            self._inlet.stop()
            self._inlet = None

    def poll(self) -> ReporterReading:
        """Each process heard from in the last STALE_SECONDS, or still alive (a training
        step stuck in a collective is the stall the alerts look for), with its step rate."""
        if self._inlet is not None:
            self._inlet.take_waiting()  # what was sent before this poll is in this poll
        with self._lock:
            inbox, self._inbox = self._inbox, []
            self._reports_share.clear()
            self._words_share.clear()
        if self._inlet is not None:
            self._inlet.resume()
        for arrival, creds, received in inbox:
            self._handle_one(arrival, creds, received)
        # what a process forgotten below said stays in this poll's reading: a job silent
        # for minutes (hung in a collective) and then aborted is forgotten in the very
        # poll its last words arrive in, and its end is told from this reading
        words = dict(self._words)
        now = self._clock()
        for pid in [p for p, r in self._latest.items() if self._forgotten(p, now - r.received)]:
            self._forget(pid)
        points = {pid: list(q) for pid, q in self._points.items() if q}
        self._points = {pid: deque(maxlen=PENDING_POINTS) for pid in self._latest}
        exited = {pid for pid in self._latest if not pid_alive(pid)}
        early = self._inlet.dropped() if self._inlet is not None else {}
        with self._lock:
            dropped = {k: v + self._dropped_backlog * (k == "backlog")
                       + early.get(k, 0)
                       for k, v in self._dropped.items()}
            self._exited = exited
            self._requests.expire(now, self._latest, exited)
            snapshots = dict(self._requests.results)
        # a process that exited steps no more: its last two minutes' rate stayed in status
        processes = {pid: r._replace(steps_per_second=None if pid in exited else self._rate(pid),
                                     exited=pid in exited)
                     for pid, r in self._latest.items()}
        return ReporterReading(processes, points, self._reports, dropped, snapshots, words)

    def request_snapshot(self, pid: int, steps: int, reason: str,
                         sites: bool = True) -> SnapshotResult:
        """Ask a reporting process for two snapshots ``steps`` apart (any thread). The
        request as it stands: open, or ended at once with why (no such process, one
        already open, the process's socket gone)."""
        now = self._clock()
        with self._lock:
            reply, report = self._replies.get(pid), self._latest.get(pid)
            if report is None:
                return SnapshotResult(pid, "", reason, now, steps, now,
                                      error=f"no reporting process {pid}")
            if pid in self._exited:
                return SnapshotResult(pid, "", reason, now, steps, now,
                                      error=f"process {pid} has exited")
            if not report.snapshots or reply is None:
                return SnapshotResult(pid, "", reason, now, steps, now, error=(
                    f"process {pid}'s reporter ({report.framework}) takes no snapshots"))
            request_id = self._requests.open(pid, steps, reason, now)
            if request_id is None:
                return self._requests.results[pid]  # the open one
            try:
                reply.send(encode_request(request_id, steps, sites))
            except OSError as exc:  # queue full, process gone, stopped
                self._requests.cancel(request_id, f"could not ask: {exc}", now)
            return self._requests.results[pid]

    @staticmethod
    def _forgotten(pid: int, silent: float) -> bool:
        if silent <= STALE_SECONDS:
            return False
        return silent > SILENT_MAX_SECONDS or not pid_alive(pid)

    def _keep(self, batch: list[Arrival]) -> set[int]:
        """Into the inbox for the next poll (the inlet's thread), within INBOX_BYTES, and
        within INBOX_USER_BYTES for each sending user, so that one user's flood cannot crowd
        out another's reports (beyond: "backlog"). Last words take from a reserve of their
        own first (INBOX_WORDS_BYTES, INBOX_USER_WORDS_BYTES), then from that share. The
        users past their share: the inlet reads their connections no more until the next
        poll."""
        received = self._clock()
        full = set()
        with self._lock:
            for arrival in batch:
                creds = sender(arrival.ancillary)
                uid = creds[1]
                size = len(arrival.data) + 1  # an empty datagram takes a slot too
                words = arrival.data.startswith((LAST_WORDS_HEADER, FATAL_HEADER))
                if not (words and self._words_share.take(uid, size)) and \
                        not self._reports_share.take(uid, size):
                    self._dropped_backlog += 1
                    full.add(uid)
                    continue
                self._inbox.append((arrival, creds, received))
        return full

    def _handle_one(self, arrival: Arrival, creds: tuple[int, int], received: float) -> None:
        """One message of the poll's batch, on its own: whatever it does wrong, only it is
        dropped (counted "malformed"), never the rest of the batch."""
        try:
            self._handle(arrival, creds, received)
        except Exception:  # noqa: BLE001 - untrusted input: a parser bug drops one message
            log.debug("reporter message dropped", exc_info=True)
            self._dropped["malformed"] += 1

    def _handle(self, arrival: Arrival, creds: tuple[int, int], received: float) -> None:
        """Validate one message and record it, or count why it was dropped."""
        data = arrival.data
        pid, uid = creds
        try:
            if arrival.flags & _MSG_TRUNC:
                raise InvalidReport("oversized")
            if pid <= 0 or (self.allowed_uids and uid not in self.allowed_uids):
                raise InvalidReport("forbidden")
            if data.startswith(PART):
                self._answer(pid, data, received)
                return
            if data.startswith((LAST_WORDS_HEADER, FATAL_HEADER)):
                self._keep_words(pid, data)
                return
            if len(data) > MAX_DATAGRAM:
                raise InvalidReport("oversized")
            report = parse_report(data, pid, uid, received)
        except InvalidReport as exc:
            self._dropped[str(exc)] += 1
            return
        if self._record(report) and arrival.reply is not None:
            self._replies[pid] = arrival.reply

    def _keep_words(self, pid: int, data: bytes) -> None:
        """A process's last words, merged with what it said before (an exception, then
        its exit); at most WORDS_KEPT processes' (the oldest go)."""
        words = parse_message(data)
        if words is None:
            raise InvalidReport("malformed")
        self._words[pid] = merge(self._words.pop(pid, None), words)
        while len(self._words) > WORDS_KEPT:
            del self._words[next(iter(self._words))]

    def _answer(self, pid: int, data: bytes, received: float) -> None:
        """One of a process's two snapshots for an open request."""
        try:
            request_id, part, body = parse_part(data)
        except ValueError:
            raise InvalidReport("malformed") from None
        with self._lock:
            refused = self._requests.answer(pid, request_id, part, body, received)
        if refused:
            raise InvalidReport(refused)

    def _admit(self, pid: int, uid: int) -> bool:
        """Room for a process not heard from before, within USER_SLOTS for its user and
        max_processes in all. Past its user's share, that user's dead processes go first,
        then the one it has been silent longest; past the total, dead processes of anyone.
        One user's processes never push out another's, so a user filling the socket with
        processes locks out only itself."""
        if pid in self._latest:
            return True
        mine = [p for p, r in self._latest.items() if r.uid == uid]
        if len(mine) >= USER_SLOTS:
            own_dead = [p for p in mine if not pid_alive(p)]
            self._forget(own_dead[0] if own_dead else
                         min(mine, key=lambda p: self._latest[p].received))
        elif len(self._latest) >= self._max_processes:
            dead = next((p for p in self._latest if not pid_alive(p)), None)
            if dead is None:
                return False
            self._forget(dead)
        return True

    def _forget(self, pid: int) -> None:
        del self._latest[pid]
        self._steps.pop(pid, None)
        self._replies.pop(pid, None)
        self._points.pop(pid, None)
        self._words.pop(pid, None)

    def _record(self, report: ProcessReport) -> bool:
        """Keep a valid report: the process's latest, its step for the rate, its counts."""
        if not self._admit(report.pid, report.uid):
            self._dropped["forbidden"] += 1
            return False
        steps = self._steps.get(report.pid)
        if steps is None:
            steps = self._steps[report.pid] = deque(maxlen=512)
        if steps and report.step < steps[-1][1]:
            steps.clear()  # the process restarted its count (a new run in the same pid)
        steps.append((report.time, report.step))
        while steps[0][0] < report.time - RATE_WINDOW_SECONDS and len(steps) > 2:
            steps.popleft()
        previous = self._latest.get(report.pid)
        self._latest[report.pid] = report if report.live is not None or previous is None \
            else report._replace(live=previous.live)  # a report between two counts (JAX)
        points = self._points.get(report.pid)
        if points is None:
            points = self._points[report.pid] = deque(maxlen=PENDING_POINTS)
        points.append(CountPoint(report.step, report.live, report.compiles_uncached, report.rss))
        self._reports += 1
        return True

    def _rate(self, pid: int) -> float | None:
        """Steps a second over the last RATE_WINDOW_SECONDS of the process's reports."""
        steps = self._steps.get(pid)
        if not steps:
            return None
        (t0, s0), (t1, s1) = steps[0], steps[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None
