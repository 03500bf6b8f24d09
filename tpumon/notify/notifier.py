"""The notifier thread: alerts from the published poll states, through the outbox, to Slack
and PagerDuty, without ever holding up a poll or a scrape.

It reads the agent's state as the metrics do (data flows sources -> detector -> state
-> notifiers), records each raise and resolve in the outbox before anything is sent, and
then drains the outbox per channel: in order, one request at a time, at most one per
channel's ``min_interval``; after a 429, a 5xx or a network error the channel backs off
(Retry-After when the service gives one, else doubling up to five minutes) and the same
events go again; another 4xx gives the event up with one log line (sending it again would
not help). Events older than ``max_age`` are given up too: a page about a job that died
yesterday helps no one. Each request's events are marked ``sending`` under a new attempt id
before the post, so that a restart knows which may have arrived (outbox.py).
"""

from __future__ import annotations

import logging
import math
import random
import sqlite3
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from tpumon.notify.alerts import AlertTracker, Transition, log_transition
from tpumon.notify.health import ChannelHealth, NotifierHealth
from tpumon.notify.outbox import Event, Outbox
from tpumon.notify.post import DELIVERED, REJECTED, Outcome, post_json
from tpumon.state import PollState

log = logging.getLogger("tpumon.notify")

IDLE_WAIT = 0.5          # seconds between looks at the poll state when nothing is due
PURGE_EVERY = 3600.0


class Channel(Protocol):
    name: str
    url: str
    batch: int
    min_interval: float
    group_wait: float
    severities: tuple[str, ...]

    def requests(self, events: Sequence[Event]) -> list[tuple[list[Event], Any]]: ...


@dataclass
class _Progress:
    next_at: float = 0.0
    failures_in_row: int = 0
    delivered: int = 0
    failures: Counter = field(default_factory=Counter)
    given_up: Counter = field(default_factory=Counter)
    last_error: str | None = None
    last_delivery: float | None = None
    pending: int = 0


class Notifier:
    """Runs the alert tracker on each new snapshot and delivers the outbox."""

    def __init__(self, get_snapshot: Callable[[], PollState], tracker: AlertTracker,
                 outbox: Outbox, channels: Sequence[Channel], *, timeout: float = 10.0,
                 backoff_base: float = 1.0, backoff_max: float = 300.0,
                 max_age: float = 86400.0, clock: Callable[[], float] = time.time) -> None:
        self._get_snapshot = get_snapshot
        self.tracker = tracker
        self.outbox = outbox
        self.channels = list(channels)
        self._timeout = timeout
        self._backoff = (backoff_base, backoff_max)
        self._max_age = max_age
        self._clock = clock
        self._progress = {c.name: _Progress(pending=outbox.pending_count(c.name))
                          for c in self.channels}
        self._severities = {c.name: c.severities for c in self.channels}
        self._unsaved: list[Transition] = []  # not yet in the outbox file
        self._unqueued: list[Transition] = []  # not yet in any outbox (file or held)
        self._held: Outbox | None = None  # in memory while the file cannot be written
        self._seen_poll = 0
        self._active: tuple[dict, ...] = ()
        self._next_purge = 0.0
        self._outbox_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tpumon-notify", daemon=True)

    def start(self) -> None:
        for name, p in self._progress.items():
            if p.pending:
                log.info("%s: %d notification(s) from before the restart still to deliver",
                         name, p.pending)
        for name, attempt in self.outbox.in_doubt():
            log.warning("%s: the agent stopped while posting attempt %s, which may have "
                        "arrived; its notifications go again, marked as a possible repeat",
                        name, attempt)
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Finish the request in flight (so it is marked), then stop; the outbox keeps the
        rest for the next start."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.outbox.close()

    def replace_channels(self, channels: Sequence[Channel]) -> None:
        """New channel settings (a reload): what is waiting for a channel of the same name
        is delivered through the new one; a channel no longer configured keeps its events
        in the outbox until it comes back."""
        for c in channels:
            self._progress.setdefault(c.name, _Progress(pending=self.outbox.pending_count(c.name)))
        self._severities = {c.name: c.severities for c in channels}
        self.channels = list(channels)

    def health(self) -> NotifierHealth:
        """For its collector and the status document: each channel's counts, and the alerts
        active now (read from here, never carried by the poll state)."""
        channels = tuple(ChannelHealth(name, p.failures_in_row == 0, p.pending, p.delivered,
                                       dict(p.failures), dict(p.given_up), p.last_error,
                                       p.last_delivery)
                         for name, p in self._progress.items())
        return NotifierHealth(channels, self._active)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.step()
            except Exception:  # noqa: BLE001 - the notifier must outlive any one bug
                log.exception("notifier iteration failed; continuing")
                wait = 5.0
            self._stop.wait(wait)

    def step(self) -> float:
        """Track the newest snapshot, write transitions down, deliver what is due; the
        seconds until something may be due again."""
        snap = self._get_snapshot()
        if snap.polls_total != self._seen_poll:
            self._seen_poll = snap.polls_total
            changes = self.tracker.update(snap)
            self._unsaved.extend(changes)
            self._unqueued.extend(changes)
            self._active = tuple({"name": a.name, "severity": a.severity, "subject": a.subject,
                                  "summary": a.summary, "raised": a.raised}
                                 for a in self.tracker.active.values())
        if self._unsaved and not self._save():
            now = self._clock()  # a full disk: deliver what is held in memory meanwhile
            return min([IDLE_WAIT] + [self._deliver(c, now, self._held)
                                      for c in self.channels])
        now = self._clock()
        if now >= self._next_purge:
            self.outbox.purge(now)
            self._next_purge = now + PURGE_EVERY
        return min([IDLE_WAIT] + [self._deliver(c, now) for c in self.channels])

    def _save(self) -> bool:
        """Record transitions in the outbox file. On a full or read-only disk, hold them in
        an outbox in memory, delivered from there meanwhile (a full disk is a common
        companion of a dying job: its page must not wait for space), and retry; once the
        file can be written, the active alerts go into it and so do the held events not
        yet delivered, so that none is sent twice."""
        try:
            self._persist()
        except sqlite3.Error as exc:
            if self._held is None:
                self._held = Outbox(None)
            self._held.record(self._unqueued, self._severities, self._clock())
            self._unqueued = []
            if str(exc) != self._outbox_error:
                log.error("notification outbox: cannot write (%s); %d alert change(s) held "
                          "in memory and delivered from there, retrying", exc,
                          len(self._unsaved))
                self._outbox_error = str(exc)
            return False
        if self._outbox_error:
            log.info("notification outbox: writing again")
            self._outbox_error = None
        for t in self._unsaved:
            log_transition(t)
        self._unsaved = []
        for name, p in self._progress.items():
            p.pending = self.outbox.pending_count(name)
        return True

    def _persist(self) -> None:
        """The unsaved transitions into the outbox file (sqlite3.Error if it cannot be
        written): as events, or, for those held in memory, the active set and the held
        events still to deliver."""
        if self._held is None:
            self.outbox.record(self._unsaved, self._severities, self._clock())
            self._unqueued = []
            return
        self._held.record(self._unqueued, self._severities, self._clock())
        self._unqueued = []
        waiting = [e for name in self._severities
                   for e in self._held.pending(name, 2**31 - 1)]
        self.outbox.record(self._unsaved, {}, self._clock(), waiting)
        self._held.close()
        self._held = None

    def _deliver(self, channel: Channel, now: float, outbox: Outbox | None = None) -> float:
        """At most one request for this channel from ``outbox`` (the file's by default);
        seconds until it may send again."""
        outbox = outbox or self.outbox
        p = self._progress[channel.name]
        if now < p.next_at:
            return p.next_at - now
        events = self._fresh(channel, now, outbox)
        if not events:
            return math.inf
        if now - events[0].created < channel.group_wait:
            return channel.group_wait - (now - events[0].created)
        batch, body = channel.requests(events)[0]
        ids = [e.id for e in batch]
        if body is None:  # nothing to send for these (the channel says why)
            self.outbox.delivered(ids)
            p.pending = self.outbox.pending_count(channel.name)
            return 0.0
        outbox.sending(ids, uuid.uuid4().hex[:12])  # committed before the post
        outcome = post_json(channel.url, body, self._timeout)
        if outcome.kind == DELIVERED:
            self._delivered(channel, p, batch, ids, outbox)
        elif outcome.kind == REJECTED:
            outbox.given_up(ids, outcome.detail)
            p.given_up["rejected"] += len(ids)
            p.last_error = outcome.detail
            log.error("%s rejected %s (%s); not retried: %s", channel.name,
                      _names(batch), outcome.detail, _hint(channel.name))
        else:
            self._failed(channel, p, ids, outcome, outbox)
        p.pending = outbox.pending_count(channel.name)
        p.next_at = max(p.next_at, self._clock() + channel.min_interval)
        return p.next_at - self._clock()

    def _fresh(self, channel: Channel, now: float, outbox: Outbox) -> list[Event]:
        """The channel's next events, after giving up those older than ``max_age``."""
        events = outbox.pending(channel.name, channel.batch)
        stale = [e.id for e in events if now - e.created > self._max_age]
        if stale:
            outbox.given_up(stale, "expired")
            self._progress[channel.name].given_up["expired"] += len(stale)
            log.warning("%s: gave up %d notification(s) older than %.0f h", channel.name,
                        len(stale), self._max_age / 3600)
            events = outbox.pending(channel.name, channel.batch)
            self._progress[channel.name].pending = outbox.pending_count(channel.name)
        return events

    def _delivered(self, channel: Channel, p: _Progress, batch: list[Event],
                   ids: list[int], outbox: Outbox) -> None:
        outbox.delivered(ids)
        if p.failures_in_row:
            log.info("%s: delivering again after %d failed attempt(s)", channel.name,
                     p.failures_in_row)
        log.info("%s: sent %s", channel.name, _names(batch))
        p.delivered += 1
        p.failures_in_row = 0
        p.last_error = None
        p.last_delivery = self._clock()

    def _failed(self, channel: Channel, p: _Progress, ids: list[int], outcome: Outcome,
                outbox: Outbox) -> None:
        outbox.attempted(ids, outcome.detail)
        p.failures[outcome.reason] += 1
        p.failures_in_row += 1
        p.last_error = outcome.detail
        base, cap = self._backoff
        wait = outcome.retry_after if outcome.retry_after is not None else \
            min(cap, base * 2 ** (p.failures_in_row - 1)) * random.uniform(0.75, 1.0)
        p.next_at = self._clock() + wait
        if p.failures_in_row == 1 or outcome.reason == "rate_limited":
            log.warning("%s: %s; retrying in %.1f s (%d notification(s) waiting)",
                        channel.name, outcome.detail, wait, p.pending)


def _names(events: Sequence[Event]) -> str:
    return ", ".join(f"{e.action} {e.alert.name} {e.alert.subject}" for e in events)


def _hint(channel: str) -> str:
    return {"slack": "check slack.webhook_url (revoked webhook, archived channel?)",
            "pagerduty": "check pagerduty.routing_key (an Events API v2 integration key)"
            }.get(channel, "check its configuration")
