"""The thread that writes polls to the history database, so that no write can stall a poll.

The poll thread hands each poll over with :meth:`StoreWriter.submit`, which only appends
to a bounded queue and never waits. This thread commits each batch in one transaction,
applies retention once a minute of data, and turns every failure into a reported state:

- a read-only or full disk, or a directory it cannot create: polls stay queued (the
  oldest dropped, and counted, once the queue is full) and writes are retried with
  back-off; monitoring and /metrics carry on. One log line when writing stops, one when
  it resumes.
- the cap reached: the oldest data is shed and the write retried at once.
- a damaged file: moved aside (one log line) and a fresh database begins.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from tpumon.store.checkpoint import fingerprint
from tpumon.store.database import (Checkpoint, HistoryDB, Retention, database_path,
                                   is_corruption, move_aside, open_database)
from tpumon.common.samples import Sample, StoredEnd

log = logging.getLogger("tpumon.store")

MAINTENANCE_SECONDS = 60.0  # of sample time between retention passes
RETRY_MIN, RETRY_MAX = 1.0, 60.0


@dataclass(frozen=True)
class PollRecord:
    """One poll for the store: its samples and, now and then, the detectors' state after
    being fed them (chip -> checkpoint bytes)."""

    host: str
    samples: tuple[tuple[str, Sample], ...]
    checkpoints: Mapping[str, bytes] = field(default_factory=dict)
    ends: tuple[StoredEnd, ...] = ()  # jobs that ended, kept with their evidence (job ends)


@dataclass(frozen=True)
class StoreHealth:
    """The store as exported and shown; replaced whole, so readers see one consistent state."""

    path: str
    up: bool = False
    error: str | None = None
    error_kind: str | None = None  # read_only, disk_full, corrupt, io
    polls_written_total: int = 0
    write_errors_total: int = 0
    dropped_polls_total: int = 0
    write_seconds_total: float = 0.0
    write_cpu_seconds_total: float = 0.0  # the writer thread's CPU: its cost, without waits
    moved_aside_total: int = 0
    size_bytes: int = 0
    queued_polls: int = 0


def classify_error(exc: BaseException, state_dir: Path) -> tuple[str, str]:
    """A storage failure as (kind, words a person acts on); kinds: read_only, disk_full,
    corrupt, io. SQLite says only "unable to open database file" when the directory is
    on a read-only file system, so that is checked too."""
    text = str(exc)
    low = text.lower()
    if isinstance(exc, OSError):
        text = f"{exc.strerror or text}: {exc.filename}" if exc.filename else exc.strerror or text
    code = getattr(exc, "errno", None)
    if ("readonly" in low or "read-only" in low or code == errno.EROFS
            or _on_read_only_fs(state_dir)):
        return "read_only", f"read-only ({text})"
    if "full" in low or code == errno.ENOSPC:
        return "disk_full", f"disk full ({text})"
    if isinstance(exc, sqlite3.DatabaseError) and is_corruption(exc):
        return "corrupt", text
    return "io", text


def _on_read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class StoreWriter:
    """Owns the database after start-up; see the module docstring."""

    def __init__(self, state_dir: str | Path, retention: Retention, db: HistoryDB | None = None,
                 open_error: BaseException | None = None, queue_polls: int = 1024,
                 write_delay: float = 0.0) -> None:
        """``write_delay``: how long a poll may wait for others to share its transaction
        (seconds). The agent's polls come every second; writing five at once instead of
        each on its own saves the thread wake-ups and commits, and a crash loses at most
        those seconds (the detectors' checkpoints are a minute apart anyway)."""
        self.state_dir = Path(state_dir)
        self.write_delay = write_delay
        self._oldest_queued = 0.0  # monotonic time the oldest queued poll came
        self._flushing = False
        self.retention = retention
        self._db = db
        self._queue: deque[PollRecord] = deque()
        self._queue_polls = queue_polls
        self._dropped = 0
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._last_ids: dict[tuple[str, str], int] = {}
        self._next_maintenance: float | None = None
        self._retry_at = 0.0
        self._retry_delay = RETRY_MIN
        # its size from the start, so that `status` agrees with the start-up log line before
        # the first write
        self._health = StoreHealth(str(database_path(state_dir)), up=db is not None,
                                   size_bytes=0 if db is None else db.size_bytes())
        if open_error is not None:
            kind, error = classify_error(open_error, self.state_dir)
            self._health = replace(self._health, error=error, error_kind=kind)
            log.error("history store %s: cannot open it: %s; monitoring goes on, history is "
                      "kept in memory until it can be written", self._health.path, error)

    @property
    def health(self) -> StoreHealth:
        return replace(self._health, dropped_polls_total=self._dropped,
                       queued_polls=len(self._queue))

    def submit(self, record: PollRecord) -> None:
        """Queue a poll for writing; never blocks. A full queue drops its oldest poll."""
        with self._cv:
            if len(self._queue) >= self._queue_polls:
                self._queue.popleft()
                self._dropped += 1
            if not self._queue:
                self._oldest_queued = time.monotonic()
                self._cv.notify()  # later polls join it without waking the writer
            self._queue.append(record)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued poll is written (or has failed); for tests and benchmarks."""
        with self._cv:
            self._flushing = True
            self._cv.notify()
        try:
            return self._wait_empty(timeout)
        finally:
            self._flushing = False

    def _wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._queue and time.monotonic() < deadline:
            if not self._health.up and self._retry_at > time.monotonic():
                return False
            time.sleep(0.002)
        return not self._queue

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tpumon-store", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is queued (if the database can be written), then close it."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._db is not None and (self._thread is None or not self._thread.is_alive()):
            self._db.close()
            self._db = None

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if self._stopping and (not self._queue or self._retry_at > time.monotonic()):
                    return
                wait = self._retry_at - time.monotonic()
                if not (self._stopping or self._flushing):
                    wait = max(wait, self._oldest_queued + self.write_delay - time.monotonic())
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                batch = list(self._queue)
            try:
                self._write(batch)
            except Exception as exc:  # noqa: BLE001 - a failing disk is a state, not a crash
                self._failed(exc)
                continue
            with self._cv:
                for record in batch:  # the poll thread may have dropped some meanwhile
                    if self._queue and self._queue[0] is record:
                        self._queue.popleft()
            self._recovered()

    def _write(self, batch: list[PollRecord]) -> None:
        if self._db is None:
            self._db = open_database(self.state_dir, self.retention)
            self._last_ids.clear()
        db = self._db
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            self._commit(db, batch)
        except sqlite3.OperationalError as exc:
            if "full" not in str(exc).lower() or not db.enforce_cap():
                raise
            self._commit(db, batch)  # the cap, not the disk: room was made, so once more
        newest = max((s.time for r in batch for _, s in r.samples), default=None)
        if newest is not None:
            self._maintain(db, newest)
        self._update(polls_written_total=self._health.polls_written_total + len(batch),
                     write_seconds_total=self._health.write_seconds_total
                     + time.perf_counter() - started,
                     write_cpu_seconds_total=self._health.write_cpu_seconds_total
                     + time.thread_time() - cpu,
                     size_bytes=db.size_bytes())

    def _commit(self, db: HistoryDB, batch: list[PollRecord]) -> None:
        with db.transaction():
            for record in batch:
                ids = db.add_samples(record.host, record.samples)
                for chip, sample_id in ids.items():
                    self._last_ids[(record.host, chip)] = sample_id
                for chip, state in record.checkpoints.items():
                    last = self._last_ids.get((record.host, chip))
                    if last is not None:
                        db.save_checkpoint(record.host, chip, Checkpoint(
                            fingerprint(), last, time.time(), state))
                for end in record.ends:
                    db.keep_job_end(record.host, end)

    def _maintain(self, db: HistoryDB, newest: float) -> None:
        """Retention once per minute of recorded time (so at the same pace under a 1000x
        simulation as on a TPU VM)."""
        if self._next_maintenance is None:
            self._next_maintenance = newest  # right after start-up: a lowered cap, old data
        if newest >= self._next_maintenance:
            db.apply_retention(newest)
            self._next_maintenance = newest + MAINTENANCE_SECONDS

    def _failed(self, exc: Exception) -> None:
        corrupt = isinstance(exc, sqlite3.DatabaseError) and is_corruption(exc)
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None
        moved = 0
        if corrupt:
            path = database_path(self.state_dir)
            try:
                aside = move_aside(path)
                moved = 1
                log.error("history store %s became unreadable (%s); moved it to %s and started "
                          "a fresh one", path, exc, aside)
            except OSError as move_exc:
                log.error("history store %s is damaged (%s) and cannot be moved aside: %s",
                          path, exc, classify_error(move_exc, self.state_dir)[1])
        kind, error = classify_error(exc, self.state_dir)
        if self._health.up or self._health.error is None:
            log.error("history store %s: cannot write: %s; monitoring and /metrics go on, polls "
                      "are kept in memory (up to %d) and written once it can", self._health.path,
                      error, self._queue_polls)
        self._retry_at = time.monotonic() + (0.0 if moved else self._retry_delay)
        self._retry_delay = min(self._retry_delay * 2, RETRY_MAX)
        self._update(up=False, error=error, error_kind=kind,
                     write_errors_total=self._health.write_errors_total + 1,
                     moved_aside_total=self._health.moved_aside_total + moved)

    def _recovered(self) -> None:
        self._retry_delay = RETRY_MIN
        if not self._health.up:
            if self._health.error is not None:
                log.info("history store %s: writing again (%d poll(s) dropped so far)",
                         self._health.path, self._dropped)
            self._update(up=True, error=None, error_kind=None)

    def _update(self, **changes: Any) -> None:
        """Only the writer thread changes the health (the poll thread counts drops apart)."""
        self._health = replace(self._health, **changes)
