"""The framework-neutral half of a reporter: sampling, the common fields, sending.

A reporter's ``step()`` runs inside the training loop, so it must cost microseconds and
must never raise: anything that goes wrong while building a report drops that report
(counted in ``dropped``) and training goes on. For the same reason the report is
formatted directly (its scalars are numbers and fixed names; ``json.dumps`` of the whole
dict costs several times more) and the RSS is read at most once a second.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from typing import Any

from tpumon.instrument.protocol import PROTOCOL_VERSION, parse_request, socket_path
from tpumon.instrument.last_words import LastWords
from tpumon.instrument.snapshot import Snapshot, track_sites_setting
from tpumon.instrument.snapshot_job import SnapshotJob
from tpumon.instrument.transport import ReportSender

_PAGE = os.sysconf("SC_PAGE_SIZE")


class Reporter:
    """Call :meth:`step` once per training step; every ``every``-th call sends a report,
    and never more often than every ``min_interval`` seconds.

    The interval keeps a fast loop (a small model can take a few ms per step) from
    flooding the agent: a reporter's connection queues ~150 reports, and an agent of an
    earlier version, reached by datagrams, only a handful for every sender together
    (net.unix.max_dgram_qlen, 10 by default). Trends need steady sampling, not every step.

    ``last_words`` (on by default) also sends how the process ends: an uncaught exception,
    a fatal signal, the exit (tpumon.instrument.last_words), so that the agent can say
    what a job died of; ``close()`` takes those hooks off again.
    """

    framework = "python"

    #: The module that lists this framework's live tensors (``snapshot``, ``SiteTracker``):
    #: tpumon.instrument.live_torch_xla or live_jax; None where there is none.
    live_module: str | None = None

    def __init__(self, every: int = 1, socket: str | None = None,
                 min_interval: float = 0.05, track_sites: bool | None = None,
                 last_words: bool = True) -> None:
        self.every = max(int(every), 1)
        self.min_interval = min_interval
        self.last_sent_step: int | None = None
        self._next_send = 0.0
        self._sender = ReportSender(socket_path(socket))
        self._calls = 0
        self._pid = os.getpid()
        self._statm = _open_statm()
        self._rss_value: int | None = None
        self._rss_due = 0.0
        self._head = f'{{"v":{PROTOCOL_VERSION},"pid":{self._pid},"framework":"{self.framework}"'
        version = _version_field(self.framework_version())
        if version:
            self._head += f',"fv":{version}'
        self._job: SnapshotJob | None = None
        self._answers = "false" if self.live_module is None and \
            type(self).take_snapshot is Reporter.take_snapshot else "true"
        self.track_sites = track_sites_setting(track_sites)
        self._tracker: Any = None  # the live module's SiteTracker, made on first use
        #: the process's end (exceptions, exit, fatal signals), sent as it happens
        self._last_words: LastWords | None = None
        if last_words:
            self._last_words = LastWords(self._sender)
            self._sender.on_connect = self._last_words.on_connect
            try:
                self._last_words.install()
            except Exception:  # noqa: BLE001 - never break the job: no last words then
                self._last_words.uninstall()
                self._last_words = None
                self._sender.on_connect = None

    @property
    def sent(self) -> int:
        return self._sender.sent

    @property
    def dropped(self) -> int:
        return self._sender.dropped

    def step(self, step: int | None = None) -> None:
        """Report after a training step (``step`` defaults to the number of calls)."""
        self._calls += 1
        if self._job is not None:
            self._advance_job(self._job, self._calls if step is None else int(step))
        if (self._calls - 1) % self.every:
            return
        now = time.monotonic()
        if now < self._next_send:
            return
        self._next_send = now + self.min_interval
        step = self._calls if step is None else int(step)
        try:
            payload = self.encode(step)
        except Exception:  # noqa: BLE001 - never break the training loop
            self._sender.dropped += 1
            return
        if self._sender.send(payload):
            self.last_sent_step = step
        if self._job is None:
            self._take_request()

    def _take_request(self) -> None:
        """A snapshot request from the agent, looked for each time a report goes out."""
        request = self._sender.receive()
        parsed = None if request is None else parse_request(request)
        if parsed is not None:
            self._job = SnapshotJob(*parsed)

    def _advance_job(self, job: SnapshotJob, step: int) -> None:
        try:
            job.at_step(step, self.take_snapshot, self.start_tracking, self.stop_tracking,
                        self._sender.send)
        except Exception:  # noqa: BLE001 - never break the training loop
            job.stop(self.stop_tracking)
            job.done = True
        if job.done:
            self._job = None

    def take_snapshot(self, step: int) -> Snapshot | None:
        """This process's live device tensors grouped by shape, dtype and device, with
        creation sites where known; None where the framework gives none, or if it failed."""
        if self.live_module is None:
            return None
        try:
            return self._live().snapshot(step, self._snapshot_tracker())
        except Exception:  # noqa: BLE001 - never break the training loop
            return None

    def start_tracking(self) -> bool:
        """Record creation sites from now on, on this thread (``track_sites`` opts in);
        False when off, unsupported, or the tracker could not start."""
        if not self.track_sites or self.live_module is None:
            return False
        try:
            if self._tracker is None:
                self._tracker = self._live().SiteTracker()
            return self._tracker.start()
        except Exception:  # noqa: BLE001
            return False

    def stop_tracking(self) -> None:
        """Stop recording creation sites."""
        try:
            if self._tracker is not None:
                self._tracker.stop()
        except Exception:  # noqa: BLE001
            pass

    def _snapshot_tracker(self) -> Any:
        """The tracker whose sites a snapshot reads: the one started, if any."""
        return self._tracker

    def _live(self) -> Any:
        if self.live_module is None:  # callers look first: a reporter without one
            raise LookupError(f"{type(self).__name__} has no live-tensor module")
        return importlib.import_module(self.live_module)

    def encode(self, step: int) -> bytes:
        """This step's report as a datagram (the fields of tpumon.instrument.protocol)."""
        now = time.time()
        if now >= self._rss_due:
            self._rss_value, self._rss_due = self._rss(), now + 1.0
        f = self.framework_fields()
        c = f.get("compiles") or {}
        devices = f.get("devices")
        tail = ',"devices":' + json.dumps(devices, separators=(",", ":")) if devices else ""
        return (f'{self._head},"step":{int(step)},"time":{now!r},"rss":{_int(self._rss_value)},'
                f'"rank":{_int(f.get("rank"))},"ordinal":{_int(f.get("ordinal"))},'
                f'"live":{_int(f.get("live"))},"compiles":{{"cached":{_int(c.get("cached"))},'
                f'"uncached":{_int(c.get("uncached"))}}},"snapshots":{self._answers}'
                f'{tail}}}').encode()

    def framework_version(self) -> str | None:
        """The framework's version, sent with every report: the agent matches known
        framework leaks on it (tpumon.diagnose.known_issues)."""
        return None

    def framework_fields(self) -> dict[str, Any]:
        """rank, ordinal, live, compiles ({"cached", "uncached"}), devices: whatever the
        framework knows. Values are ints, None, or (compiles, devices) small dicts."""
        return {}

    def _rss(self) -> int | None:
        if self._statm is None:
            return None
        try:
            return int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None

    def close(self) -> None:
        if self._last_words is not None:
            self._last_words.uninstall()
            self._last_words = None
        self._sender.close()
        if self._statm is not None:
            os.close(self._statm)
            self._statm = None


def _open_statm() -> int | None:
    """/proc/self/statm kept open: one pread per report instead of open/read/close."""
    try:
        return os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None


def _version_field(version: str | None) -> str | None:
    """A version as a JSON string, or None when it would not pass the agent's checks."""
    if not version or len(version) > 32 or not version.isprintable():
        return None
    return json.dumps(version)


def _int(value: Any) -> str:
    return "null" if value is None else str(int(value))
