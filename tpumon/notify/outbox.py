"""The persistent outbox: every notification is written down before it is sent.

An alert raised while Slack or PagerDuty is unreachable, or just before the agent
restarts, waits here until it is delivered, once, in order, followed by its resolve. The
file (STATE_DIR/outbox.db, beside the history store) also remembers which alerts are
active, so a restarted agent neither raises them again nor forgets to resolve them.

Per channel, events leave strictly in the order they were recorded: a resolve never
overtakes its trigger. Delivered and given-up events are kept a week for `tpumon status`
and post-mortems, then purged; sooner, oldest first, once the file is past half its
bound (``max_bytes``, its share of ``store.max_size_mb``), which it never passes: past
it, a write fails as on a full disk and the notifier holds the events in memory. The one
window left is a kill -9 between the service's "accepted" and the commit that marks it.
Neither Slack's incoming webhooks nor PagerDuty can be asked what they got (a webhook takes
no idempotency key), so exactly once is impossible in general; the outbox narrows it: each
request's events are marked ``sending`` (with an attempt id) before the post, and events
still ``sending`` when read back were possibly delivered (``Event.in_doubt``). They are
sent again, Slack's marked as a possible repeat, and Slack sends one event per request,
so a kill repeats at most one line (PagerDuty folds a repeat into its incident by
dedup_key).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from tpumon.notify.alerts import Alert, Transition
from tpumon.common.private_paths import create_no_follow
from tpumon.store.database import PAGE_SIZE, is_corruption, move_aside

log = logging.getLogger("tpumon.notify")

OUTBOX_NAME = "outbox.db"
KEEP_DONE_SECONDS = 7 * 86400.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS active (key TEXT PRIMARY KEY, alert TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    channel TEXT NOT NULL,
    action TEXT NOT NULL,
    alert TEXT NOT NULL,
    raised REAL NOT NULL,
    created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'pending',
    done REAL,
    error TEXT,
    attempt TEXT,
    in_doubt INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS events_by_state ON events (channel, state, id);
"""
#: Columns added since the first outbox: added to an older file when it is opened
ADDED_COLUMNS = {"attempt": "TEXT", "in_doubt": "INTEGER NOT NULL DEFAULT 0"}
#: Not yet delivered nor given up: ``sending`` is a post whose outcome was never recorded
WAITING = "state IN ('pending', 'sending')"


@dataclass(frozen=True)
class Event:
    """One notification for one channel: a trigger or a resolve of one alert."""

    id: int
    channel: str
    action: str
    alert: Alert
    raised: float   # when the transition happened (the poll state's time)
    created: float  # when it was written down
    attempts: int
    #: A post of it may have been delivered unbeknown to us (the agent stopped while it
    #: was in flight): sending it again may repeat it
    in_doubt: bool = False


class Outbox:
    """SQLite outbox; ``path`` None keeps it in memory (no state directory: an agent
    restart then loses what was not yet delivered, which the log says at start-up).
    ``max_bytes``: the file and its WAL together stay under it (None: unbounded)."""

    def __init__(self, path: Path | None, max_bytes: int | None = None) -> None:
        self.path = path
        #: The database's pages at most (half the bound; the WAL is checkpointed at a
        #: quarter and truncated to it), or None
        self.max_pages = None if max_bytes is None else max(max_bytes // 2 // PAGE_SIZE, 16)
        self.conn = self._open(path)

    def _connect(self, path: Path | None) -> sqlite3.Connection:
        if path is not None:
            create_no_follow(path)  # a link put in its place is refused (ELOOP)
        conn = sqlite3.connect(":memory:" if path is None else str(path), timeout=5.0,
                               isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # few writes, each one a promise to a person
        conn.executescript(SCHEMA)
        _add_columns(conn)
        if self.max_pages is not None:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {max(self.max_pages, pages)}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {max(self.max_pages // 2, 8)}")
            conn.execute(f"PRAGMA journal_size_limit = {self.max_pages // 2 * PAGE_SIZE}")
        return conn

    def _open(self, path: Path | None) -> sqlite3.Connection:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        try:
            return self._connect(path)
        except sqlite3.DatabaseError as exc:
            if path is None or not is_corruption(exc):
                raise
            aside = move_aside(path)
            log.error("notification outbox %s is unreadable (%s); moved it to %s and started "
                      "a fresh one", path, exc, aside)
            return self._connect(path)

    def close(self) -> None:
        self.conn.close()

    def active(self) -> dict[str, Alert]:
        """The alerts raised and not yet resolved, as the last run left them."""
        return {key: Alert.from_json(json.loads(raw))
                for key, raw in self.conn.execute("SELECT key, alert FROM active")}

    def record(self, transitions: Iterable[Transition],
               channels: Mapping[str, tuple[str, ...]], now: float,
               held: Iterable[Event] = ()) -> int:
        """Write transitions down (the active set and one event per channel that takes the
        alert's severity) in one transaction, after ``held``: events another outbox (one in
        memory, while this one's disk was full) has not delivered yet, taken over in their
        order. The number of events written."""
        if self._crowded():
            self._forget_oldest_done()
        written = 0
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            for e in held:
                self.conn.execute(
                    "INSERT INTO events (channel, action, alert, raised, created, attempts, "
                    "in_doubt) VALUES (?, ?, ?, ?, ?, ?, ?)", (e.channel, e.action, json.dumps(
                        e.alert.to_json(), sort_keys=True), e.raised, e.created, e.attempts,
                        e.in_doubt))
                written += 1
            for t in transitions:
                raw = json.dumps(t.alert.to_json(), sort_keys=True)
                if t.action == "trigger":
                    self.conn.execute("INSERT OR REPLACE INTO active VALUES (?, ?)",
                                      (t.alert.key, raw))
                else:
                    self.conn.execute("DELETE FROM active WHERE key = ?", (t.alert.key,))
                for channel, severities in channels.items():
                    if t.alert.severity in severities:
                        self.conn.execute(
                            "INSERT INTO events (channel, action, alert, raised, created) "
                            "VALUES (?, ?, ?, ?, ?)", (channel, t.action, raw, t.time, now))
                        written += 1
        return written

    def pending(self, channel: str, limit: int) -> list[Event]:
        """The oldest undelivered events of a channel, in the order they were recorded.
        One still ``sending`` is in doubt: the notifier marks every outcome before it reads
        again, so its post was cut short by a stop (or the mark failed)."""
        rows = self.conn.execute(
            "SELECT id, channel, action, alert, raised, created, attempts, "
            f"in_doubt OR state = 'sending' FROM events WHERE channel = ? AND {WAITING} "
            "ORDER BY id LIMIT ?", (channel, limit))
        return [Event(i, c, a, Alert.from_json(json.loads(raw)), r, cr, n, bool(doubt))
                for i, c, a, raw, r, cr, n, doubt in rows]

    def pending_count(self, channel: str) -> int:
        return self.conn.execute(f"SELECT count(*) FROM events WHERE channel = ? AND "
                                 f"{WAITING}", (channel,)).fetchone()[0]

    def in_doubt(self) -> list[tuple[str, str]]:
        """(channel, attempt id) of the posts that were in flight when the last run
        stopped, for the start-up log."""
        return self.conn.execute("SELECT channel, attempt FROM events WHERE state = "
                                 "'sending' GROUP BY channel, attempt ORDER BY min(id)"
                                 ).fetchall()

    def sending(self, ids: Iterable[int], attempt: str) -> None:
        """Mark events as posted by ``attempt``, committed before the post: read back
        ``sending`` after a restart, they are known to be possibly delivered (a doubt
        that stays with them until they are delivered)."""
        self._update(ids, "in_doubt = in_doubt OR state = 'sending', state = 'sending', "
                     "attempt = ?", (attempt,))

    def attempted(self, ids: Iterable[int], error: str) -> None:
        self._update(ids, "attempts = attempts + 1, state = 'pending', error = ?", (error,))

    def delivered(self, ids: Iterable[int]) -> None:
        self._update(ids, "attempts = attempts + 1, state = 'delivered', done = ?, error = NULL",
                     (time.time(),))

    def given_up(self, ids: Iterable[int], why: str) -> None:
        self._update(ids, "state = 'given_up', done = ?, error = ?", (time.time(), why))

    def _update(self, ids: Iterable[int], assignments: str, args: tuple) -> None:
        ids = list(ids)
        marks = ",".join("?" * len(ids))
        with self.conn:
            self.conn.execute(f"UPDATE events SET {assignments} WHERE id IN ({marks})",
                              args + tuple(ids))

    def purge(self, now: float) -> None:
        """Forget delivered and given-up events after a week (bounded file size)."""
        with self.conn:
            self.conn.execute(f"DELETE FROM events WHERE NOT {WAITING} AND done < ?",
                              (now - KEEP_DONE_SECONDS,))

    def _crowded(self) -> bool:
        """Whether the file's pages in use are past half its bound."""
        if self.max_pages is None:
            return False
        pages, free = (self.conn.execute(f"PRAGMA {p}").fetchone()[0]
                       for p in ("page_count", "freelist_count"))
        return pages - free > self.max_pages // 2

    def _forget_oldest_done(self) -> None:
        """Forget the older half of the delivered and given-up events (the pending ones
        are promises still to keep), whose pages the next writes reuse."""
        with self.conn:
            self.conn.execute(
                f"DELETE FROM events WHERE id IN (SELECT id FROM events WHERE NOT {WAITING} "
                f"ORDER BY id LIMIT (SELECT count(*) / 2 + 1 FROM events WHERE NOT {WAITING}))")


def _add_columns(conn: sqlite3.Connection) -> None:
    """Bring an outbox written by an earlier version up to this schema (its events keep
    their state; none was in doubt)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(events)")}
    for name, kind in ADDED_COLUMNS.items():
        if name not in have:
            conn.execute(f"ALTER TABLE events ADD COLUMN {name} {kind}")


def open_outbox(state_dir: str, max_bytes: int | None = None) -> Outbox:
    """The outbox under the state directory (its files under ``max_bytes``), or in memory
    without one or when the directory cannot hold it (logged: undelivered alerts then do
    not survive a restart)."""
    if not state_dir:
        log.info("notification outbox in memory (no state directory): alerts not yet "
                 "delivered are lost if the agent restarts")
        return Outbox(None)
    path = Path(state_dir) / OUTBOX_NAME
    try:
        return Outbox(path, max_bytes)
    except (OSError, sqlite3.Error) as exc:
        log.error("notification outbox %s cannot be opened (%s); keeping it in memory: alerts "
                  "not yet delivered are lost if the agent restarts", path, exc)
        return Outbox(None)
