"""The history database: one SQLite file (WAL) of chip samples, in two tiers, under a cap.

Tiers. ``samples`` holds every poll (time, step, used, total per chip) for
``raw_retention`` seconds. Older samples are rolled up into ``minutes``: per chip and
minute the floor (lowest sample) and the peak (highest), with the first and last time and
step, kept for ``minute_retention``. The detector's buckets are whole minutes, so a minute
tier keeps exactly what it reads of a bucket (its floor, its peak, its first and last
step). Ages count from the newest stored sample, not the wall clock: a clock that jumps,
or a simulation running 1000x, ages data by what was recorded.

Cap. ``max_bytes`` bounds the database and its WAL together. SQLite enforces it itself
(``max_page_count``: a write that would pass it fails instead of growing the file), and
retention sheds the oldest data well before that: first old minutes, then raw samples are
rolled up early. Freed pages go back to the file system (incremental auto-vacuum).

Crash safety is SQLite's: a poll is one transaction, WAL with synchronous=NORMAL survives
kill -9 of the agent with every committed poll. A file SQLite calls corrupt is moved
aside by :func:`open_database` and a fresh one begins.

One thread uses a ``HistoryDB`` at a time (the writer thread, after start-up restore).
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Iterable, Iterator

from tpumon.common.private_paths import create_no_follow
from tpumon.common.samples import Sample, StoredEnd

log = logging.getLogger("tpumon.store")

DB_NAME = "history.db"
SCHEMA_VERSION = 1
PAGE_SIZE = 4096
# SQLite's page cache per connection (its default is 2,000 KiB). The agent appends at the
# right edge of a few B-trees and rewrites a checkpoint (~75 KiB a chip) each minute: 128
# pages hold a transaction's dirty pages and the paths to them. The default fills as the
# file grows over days: ~1.5 MiB of the agent's RSS growth in a week.
CACHE_KIB = 512
MINUTE = 60.0

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE series (
    id INTEGER PRIMARY KEY,
    host TEXT NOT NULL,
    chip TEXT NOT NULL,
    UNIQUE (host, chip)
);
CREATE TABLE samples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: checkpoints name the last one fed
    series INTEGER NOT NULL,
    time REAL NOT NULL,
    step INTEGER,
    used INTEGER NOT NULL,
    total INTEGER NOT NULL
);
CREATE INDEX samples_by_series_time ON samples (series, time);
CREATE TABLE minutes (
    series INTEGER NOT NULL,
    minute INTEGER NOT NULL,
    first_time REAL NOT NULL,
    first_step INTEGER,
    last_time REAL NOT NULL,
    last_step INTEGER,
    floor INTEGER NOT NULL,
    peak INTEGER NOT NULL,
    total INTEGER NOT NULL,
    polls INTEGER NOT NULL,
    PRIMARY KEY (series, minute)
) WITHOUT ROWID;
CREATE TABLE checkpoints (
    series INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    last_sample INTEGER NOT NULL,  -- samples.id of the last sample the detector was fed
    saved_at REAL NOT NULL,
    state BLOB NOT NULL
);
"""

#: The evidence of a job's end: the hour of raw samples before it, copied when the end is
#: seen, so that retention (raw samples roll up into minutes after a day) never thins what
#: a post-mortem needs. Added beside schema 1 (IF NOT EXISTS: older files gain them, older
#: agents leave them be); the latest KEPT_ENDS ends are kept.
_EVIDENCE_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_ends (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    host TEXT NOT NULL,
    time REAL NOT NULL,  -- on the samples' clock
    cause TEXT NOT NULL,
    pid INTEGER,
    step INTEGER,
    summary TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS end_samples (
    end_id INTEGER NOT NULL,
    chip TEXT NOT NULL,
    time REAL NOT NULL,
    step INTEGER,
    used INTEGER NOT NULL,
    total INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS end_samples_by_end ON end_samples (end_id, chip, time);
"""
EVIDENCE_SECONDS = 3600.0
KEPT_ENDS = 16


#: Merge a rolled-up minute with one already there (a late sample after a clock jump).
_UPSERT_MINUTE = """
INSERT INTO minutes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (series, minute) DO UPDATE SET
    first_step = CASE WHEN excluded.first_time < first_time THEN excluded.first_step
                      ELSE first_step END,
    first_time = min(first_time, excluded.first_time),
    last_step = CASE WHEN excluded.last_time >= last_time THEN excluded.last_step
                     ELSE last_step END,
    last_time = max(last_time, excluded.last_time),
    floor = min(floor, excluded.floor),
    peak = max(peak, excluded.peak),
    total = excluded.total,
    polls = polls + excluded.polls
"""


@dataclass(frozen=True)
class Retention:
    """How long each tier is kept and how large the files may grow."""

    raw_seconds: float = 24 * 3600.0
    minute_seconds: float = 30 * 86400.0
    max_bytes: int = 256 * 2**20

    @property
    def wal_bytes(self) -> int:
        """The WAL's share of the cap: checkpointed back into the database at this size."""
        return max(min(4 * 2**20, self.max_bytes // 8), 16 * PAGE_SIZE)

    @property
    def outbox_bytes(self) -> int:
        """The notification outbox's share of the cap (outbox.db and its WAL, beside the
        history in the state directory): a sixteenth, between 256 KiB and 16 MiB. Inside
        the cap, as every local user can add to the outbox."""
        return min(max(self.max_bytes // 16, 64 * PAGE_SIZE), 16 * 2**20)

    @property
    def max_pages(self) -> int:
        return max((self.max_bytes - self.outbox_bytes - 2 * self.wal_bytes) // PAGE_SIZE, 32)


@dataclass(frozen=True)
class Checkpoint:
    fingerprint: str
    last_sample: int
    saved_at: float
    state: bytes


def is_corruption(exc: sqlite3.Error) -> bool:
    """A damaged file (move it aside), as opposed to a disk that is full or read-only."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.DatabaseError) \
        and not isinstance(exc, sqlite3.OperationalError) \
        and any(m in text for m in ("malformed", "not a database", "encrypted", "corrupt"))


class HistoryDB:
    """The open history database; see the module docstring for what it keeps."""

    def __init__(self, path: Path, retention: Retention, *, read_only: bool = False) -> None:
        self.path = path
        self.retention = retention
        self.read_only = read_only
        if read_only:
            self.conn = _connect_read_only(path)
        else:
            create_no_follow(path)  # a link put in its place is refused (ELOOP)
            self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                        timeout=5.0)
        self._series: dict[tuple[str, str], int] = {}
        self._latest: dict[int, float] = {}  # series -> newest stored sample time
        self._refusing: set[int] = set()  # series whose backward samples were logged
        self.refused_total = 0  # samples refused for running backwards
        try:
            self._prepare()
        except BaseException:
            self.conn.close()
            raise

    # ------------------------------------------------------------------ setup

    def _prepare(self) -> None:
        c = self.conn
        c.execute("PRAGMA busy_timeout = 5000")
        if self.read_only:
            self._check_version()
            return
        if c.execute("PRAGMA page_count").fetchone()[0] == 0:  # new file: settings that must
            c.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # precede the first table
            c.execute("PRAGMA auto_vacuum = INCREMENTAL")
        c.execute("PRAGMA journal_mode = WAL")
        c.execute("PRAGMA synchronous = NORMAL")
        c.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        r = self.retention
        c.execute(f"PRAGMA journal_size_limit = {r.wal_bytes}")
        c.execute(f"PRAGMA wal_autocheckpoint = {max(r.wal_bytes // PAGE_SIZE // 2, 8)}")
        c.execute(f"PRAGMA max_page_count = {max(r.max_pages, self._page_count())}")
        if not c.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            foreign = [name for (name,) in c.execute(
                "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")]
            if foreign:  # someone else's database: set aside, never written into
                raise sqlite3.DatabaseError(f"not a tpumon history database (a foreign schema "
                                            f"with {', '.join(sorted(foreign)[:5])})")
            with self.transaction():
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    c.execute(statement)
                c.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        self._check_version()
        with self.transaction():
            for statement in filter(str.strip, _EVIDENCE_SCHEMA.split(";")):
                c.execute(statement)

    def _check_version(self) -> None:
        try:
            row = self.conn.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.OperationalError as exc:  # a meta table of another kind
            raise sqlite3.DatabaseError(f"not a tpumon history database (a foreign schema: "
                                        f"{exc})") from None
        if row is None or str(row[0]) != str(SCHEMA_VERSION):
            raise sqlite3.DatabaseError(
                f"not a tpumon history database of schema {SCHEMA_VERSION} (found {row})")

    def transaction(self) -> "_Transaction":
        return _Transaction(self.conn)

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ writing

    def series_id(self, host: str, chip: str) -> int:
        key = (host, chip)
        sid = self._series.get(key)
        if sid is None:
            self.conn.execute("INSERT OR IGNORE INTO series (host, chip) VALUES (?, ?)", key)
            sid = self.conn.execute("SELECT id FROM series WHERE host = ? AND chip = ?",
                                    key).fetchone()[0]
            self._series[key] = sid
        return sid

    def add_samples(self, host: str, rows: Iterable[tuple[str, Sample]]) -> dict[str, int]:
        """Insert one poll's samples; returns each chip's new samples.id. Call inside a
        transaction (the poll and its checkpoints commit together).

        A sample older than the newest stored for its chip is refused, not stored: the
        history stays monotonic, so a clock set back, or a run whose simulated clock
        starts behind the last one's, cannot interleave two runs (which replayed as
        hundreds of restarts). One warning line says so per chip until samples move on."""
        ids = {}
        for chip, s in rows:
            series = self.series_id(host, chip)
            if not self._in_order(series, host, chip, s.time):
                continue
            cur = self.conn.execute(
                "INSERT INTO samples (series, time, step, used, total) VALUES (?, ?, ?, ?, ?)",
                (series, s.time, s.step, s.used, s.total))
            assert cur.lastrowid is not None  # every INSERT that succeeds sets it
            ids[chip] = cur.lastrowid
        return ids

    def _in_order(self, series: int, host: str, chip: str, t: float) -> bool:
        latest = self._latest.get(series)
        if latest is None:
            latest = self.latest_time(series)
        if t >= latest:
            self._latest[series] = t
            if series in self._refusing:
                self._refusing.discard(series)
                log.info("history store: chip %s of %s: samples in order again", chip, host)
            return True
        self.refused_total += 1
        if series not in self._refusing:
            self._refusing.add(series)
            log.warning("history store: chip %s of %s: refusing samples dated before the "
                        "newest stored (%.3f < %.3f): the clock went back, or another run's "
                        "clock is ahead of this one's; stored history stays in order",
                        chip, host, t, latest)
        return False

    def latest_time(self, series: int) -> float:
        """The newest stored sample time of a series, raw or rolled up (-inf if none)."""
        row = self.conn.execute(
            "SELECT max(coalesce((SELECT max(time) FROM samples WHERE series = ?), -1e300), "
            "coalesce((SELECT max(last_time) FROM minutes WHERE series = ?), -1e300))",
            (series, series)).fetchone()
        return -math.inf if row[0] is None or row[0] <= -1e300 else float(row[0])

    def meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def meta_prefixed(self, prefix: str) -> dict[str, str]:
        """The meta entries whose key starts with ``prefix``, by the rest of the key."""
        rows = self.conn.execute("SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?",
                                 (len(prefix), prefix)).fetchall()
        return {key[len(prefix):]: value for key, value in rows}

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def has_samples(self) -> bool:
        return self.conn.execute("SELECT 1 FROM samples UNION ALL SELECT 1 FROM minutes "
                                 "LIMIT 1").fetchone() is not None

    def save_checkpoint(self, host: str, chip: str, checkpoint: Checkpoint) -> None:
        self.conn.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?)",
                          (self.series_id(host, chip), checkpoint.fingerprint,
                           checkpoint.last_sample, checkpoint.saved_at, checkpoint.state))

    # ------------------------------------------------------------------ reading

    def series(self) -> list[tuple[int, str, str]]:
        """(id, host, chip) of every stored series."""
        return self.conn.execute("SELECT id, host, chip FROM series ORDER BY host, id").fetchall()

    def checkpoint(self, series: int) -> Checkpoint | None:
        row = self.conn.execute("SELECT fingerprint, last_sample, saved_at, state FROM checkpoints"
                                " WHERE series = ?", (series,)).fetchone()
        return None if row is None else Checkpoint(*row)

    def samples_after(self, series: int, sample_id: int) -> list[Sample]:
        """Raw samples stored after ``sample_id`` (what a checkpoint has not seen yet)."""
        return [Sample(*r) for r in self.conn.execute(
            "SELECT time, step, used, total FROM samples WHERE series = ? AND id > ? ORDER BY id",
            (series, sample_id))]

    def read_series(self, series: int, since: float = -math.inf,
                    until: float = math.inf) -> Iterator[Sample]:
        """A series in time order: the minute tier (a floor and a peak sample per minute)
        where raw samples are no longer kept, then raw samples."""
        raw_start = self.conn.execute("SELECT min(time) FROM samples WHERE series = ?",
                                      (series,)).fetchone()[0]
        raw_start = math.inf if raw_start is None else raw_start
        for m in self.conn.execute(
                "SELECT first_time, first_step, floor, last_time, last_step, peak, total, polls "
                "FROM minutes WHERE series = ? AND first_time >= ? AND first_time <= ? "
                "AND first_time < ? ORDER BY minute", (series, since, until, raw_start)):
            yield Sample(m[0], m[1], m[2], m[6])
            if m[7] > 1 and m[3] <= until and m[3] < raw_start:
                yield Sample(m[3], m[4], m[5], m[6])
        yield from (Sample(*r) for r in self.conn.execute(
            "SELECT time, step, used, total FROM samples WHERE series = ? AND time >= ? "
            "AND time <= ? ORDER BY time, id", (series, since, until)))

    def keep_job_end(self, host: str, end: StoredEnd) -> int:
        """Record a job's end and copy the host's raw samples of the EVIDENCE_SECONDS
        before it beside it; only the latest KEPT_ENDS ends are kept. The end's id."""
        c = self.conn
        cur = c.execute("INSERT INTO job_ends (host, time, cause, pid, step, summary) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (host, end.time, end.cause, end.pid, end.step, end.summary))
        end_id = cur.lastrowid
        assert end_id is not None
        c.execute("INSERT INTO end_samples SELECT ?, s.chip, m.time, m.step, m.used, m.total "
                  "FROM samples m JOIN series s ON s.id = m.series "
                  "WHERE s.host = ? AND m.time >= ? AND m.time <= ?",
                  (end_id, host, end.time - EVIDENCE_SECONDS, end.time))
        old = [r[0] for r in c.execute("SELECT id FROM job_ends ORDER BY id DESC LIMIT -1 "
                                        "OFFSET ?", (KEPT_ENDS,))]
        c.executemany("DELETE FROM end_samples WHERE end_id = ?", [(i,) for i in old])
        c.executemany("DELETE FROM job_ends WHERE id = ?", [(i,) for i in old])
        return end_id

    def job_ends(self) -> list[StoredEnd]:
        """The kept ends, newest first."""
        if not self._has_table("job_ends"):  # a read-only look at a file from before them
            return []
        return [StoredEnd(*r) for r in self.conn.execute(
            "SELECT id, host, time, cause, pid, step, summary FROM job_ends ORDER BY id DESC")]

    def end_samples(self, end_id: int) -> Iterator[tuple[str, Sample]]:
        """An end's evidence: (chip, sample) by chip, then time."""
        for chip, *sample in self.conn.execute(
                "SELECT chip, time, step, used, total FROM end_samples WHERE end_id = ? "
                "ORDER BY chip, time", (end_id,)):
            yield chip, Sample(*sample)

    def _has_table(self, name: str) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                                 "name = ?", (name,)).fetchone() is not None

    def size_bytes(self) -> int:
        """Bytes on disk: the database, its WAL and shared-memory index."""
        total = 0
        for suffix in ("", "-wal", "-shm"):
            try:
                total += os.stat(f"{self.path}{suffix}").st_size
            except FileNotFoundError:
                pass
        return total

    # ------------------------------------------------------------------ retention

    def apply_retention(self, now: float) -> None:
        """Roll raw samples older than ``raw_seconds`` into minutes, drop minutes older than
        ``minute_seconds``, then shed the oldest data while over the cap. ``now`` is the
        newest sample's time."""
        r = self.retention
        oldest_minute = math.floor((now - r.minute_seconds) / MINUTE)
        with self.transaction():
            self._roll_up(math.floor((now - r.raw_seconds) / MINUTE) * MINUTE)
            self.conn.executemany("DELETE FROM minutes WHERE series = ? AND minute < ?",
                                  ((sid, oldest_minute) for sid, in
                                   self.conn.execute("SELECT id FROM series").fetchall()))
        self.enforce_cap()

    def _roll_up(self, cutoff: float) -> int:
        """Replace the raw samples before ``cutoff`` (a whole minute) by minute rows."""
        rolled = 0
        for sid, in self.conn.execute("SELECT id FROM series").fetchall():
            rows = self.conn.execute("SELECT time, step, used, total FROM samples WHERE series = ?"
                                     " AND time < ? ORDER BY time, id", (sid, cutoff)).fetchall()
            if not rows:
                continue
            by_minute = groupby(rows, key=lambda s: math.floor(s[0] / MINUTE))
            self.conn.executemany(_UPSERT_MINUTE, (_minute_row(sid, minute, list(group))
                                                   for minute, group in by_minute))
            self.conn.execute("DELETE FROM samples WHERE series = ? AND time < ?", (sid, cutoff))
            rolled += len(rows)
        return rolled

    def fit_cap(self) -> None:
        """Bring a database under a cap lowered since it was written, then make SQLite
        enforce the cap (it cannot be set below the file's current size)."""
        self.enforce_cap()
        pages = max(self.retention.max_pages, self._page_count())
        self.conn.execute(f"PRAGMA max_page_count = {pages}")

    def used_pages(self) -> int:
        return self._page_count() - self.conn.execute("PRAGMA freelist_count").fetchone()[0]

    def _page_count(self) -> int:
        return self.conn.execute("PRAGMA page_count").fetchone()[0]

    def enforce_cap(self, high: float = 0.85, low: float = 0.7) -> bool:
        """Above ``high`` of the page budget, shed oldest data down to ``low``; give the
        freed pages back. Returns whether anything was shed."""
        limit = self.retention.max_pages
        if self.used_pages() <= high * limit:
            return False
        while self.used_pages() > low * limit:
            with self.transaction():
                if not self._shed_oldest():
                    break
        self.conn.execute("PRAGMA incremental_vacuum")
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return True

    def _shed_oldest(self) -> bool:
        """One step of shedding: the oldest quarter of the minute tier, or, with no minutes
        left before the raw samples, the older half of the raw samples rolled up early."""
        c = self.conn
        m0, m1 = c.execute("SELECT min(first_time), max(last_time) FROM minutes").fetchone()
        r0, r1 = c.execute("SELECT min(time), max(time) FROM samples").fetchone()
        if m0 is not None and (m1 - m0 >= MINUTE or r0 is None):
            cut = m0 + max((m1 - m0) / 4, MINUTE)
            c.execute("DELETE FROM minutes WHERE first_time < ?", (cut,))
            return True
        if r0 is not None and r1 - r0 >= 2 * MINUTE:
            cut = math.floor((r0 + (r1 - r0) / 2) / MINUTE) * MINUTE
            if self._roll_up(max(cut, math.floor(r0 / MINUTE) * MINUTE + MINUTE)):
                return True
        if m0 is not None:
            c.execute("DELETE FROM minutes")
            return True
        return False


def _minute_row(series: int, minute: int, rows: list[tuple]) -> tuple:
    used = [r[2] for r in rows]
    first, last = rows[0], rows[-1]
    return (series, minute, first[0], first[1], last[0], last[1], min(used), max(used), last[3],
            len(rows))


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A reader beside the agent. A WAL database wants its shared-memory index, which a
    reader without write access to the directory cannot create when no agent holds it
    open; then no one is writing and the file can be read as immutable."""
    uri = path.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False)
        conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError:
        if not path.exists():
            raise
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None,
                               check_same_thread=False)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:
            self.conn.execute("ROLLBACK")


def database_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / DB_NAME


def open_database(state_dir: str | os.PathLike[str], retention: Retention) -> HistoryDB:
    """Open (creating the directory and file if needed) the agent's database for writing.

    A file SQLite reports as damaged, or that is not a tpumon database, is renamed to
    ``history.db.corrupt-<unix time>`` (with its WAL), logged once, and replaced by a fresh
    one. Other errors (permissions, a full disk) propagate: the caller reports them.
    """
    path = database_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    try:
        db = HistoryDB(path, retention)
        verdict = db.conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        if verdict != "ok":
            db.close()
            raise sqlite3.DatabaseError(f"database disk image is malformed ({verdict})")
        db.fit_cap()
        return db
    except sqlite3.DatabaseError as exc:
        if not (is_corruption(exc) or "schema" in str(exc)):
            raise
        aside = move_aside(path)
        log.error("history store %s is unreadable (%s); moved it to %s and started a fresh one",
                  path, exc, aside)
        return HistoryDB(path, retention)


def move_aside(path: Path, label: str = "corrupt") -> Path:
    """Rename a damaged database (and its WAL and index) out of the way; only the latest
    damaged copy is kept, so a disk that keeps corrupting files cannot fill up with them.
    ``label`` names why (another run's history is kept the same way, one copy)."""
    for old in path.parent.glob(f"{path.name}.{label}-*"):
        old.unlink(missing_ok=True)
    aside = path.with_name(f"{path.name}.{label}-{int(time.time())}")
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.rename(f"{aside}{suffix}")
    return aside
