"""Turns a source's failures into a reported state: up/down, counters and one log line per change.

Every poll of every source goes through :class:`SourceTracker`, so "a failing source is a
reported state, never a crash" is enforced in one place instead of in each source.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("tpumon.sources")


class SourceUnavailable(Exception):
    """An expected down state (e.g. no TPU runtime listening between jobs), not a bug."""


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """A source's state as exported and shown: the last poll's outcome and running counts."""

    name: str
    up: bool
    error: str | None
    last_success: float | None
    polls_total: int
    errors_total: int
    last_duration_seconds: float


class SourceTracker(Generic[T]):
    """Polls a source, times the call, and records the outcome instead of raising.

    With ``min_interval`` a source that changes rarely (the kubelet's pod list) is asked at
    most that often: a call in between returns the last successful result and leaves the
    health (and its counts) as the last real poll left them."""

    def __init__(self, name: str, poll: Callable[[], T],
                 clock: Callable[[], float] = time.time, min_interval: float = 0.0) -> None:
        self.name = name
        self._poll = poll
        self._clock = clock
        self._health = SourceHealth(name, False, "not polled yet", None, 0, 0, 0.0)
        self._min_interval = min_interval
        self._next_due = -math.inf
        self._last: T | None = None

    @property
    def health(self) -> SourceHealth:
        return self._health

    def poll(self) -> T | None:
        """The source's result, or None when it failed (the reason is in ``health``)."""
        started = time.monotonic()
        if started < self._next_due:
            return self._last if self._health.up else None
        self._next_due = started + self._min_interval
        try:
            result = self._poll()
        except SourceUnavailable as exc:
            self._record_failure(str(exc), started, expected=True)
            return None
        except Exception as exc:  # noqa: BLE001 - a buggy or garbled source must not kill the agent
            log.debug("source %s raised", self.name, exc_info=True)
            self._record_failure(f"{type(exc).__name__}: {exc}", started, expected=False)
            return None
        self._record_success(started)
        self._last = result
        return result

    def _record_success(self, started: float) -> None:
        h = self._health
        if not h.up and h.polls_total:
            log.info("%s: up again", self.name)
        self._health = SourceHealth(self.name, True, None, self._clock(), h.polls_total + 1,
                                    h.errors_total, time.monotonic() - started)

    def _record_failure(self, error: str, started: float, expected: bool) -> None:
        h = self._health
        if h.up or h.polls_total == 0 or error != h.error:
            level = logging.INFO if expected else logging.WARNING
            log.log(level, "%s: down: %s", self.name, error)
        self._health = SourceHealth(self.name, False, error, h.last_success, h.polls_total + 1,
                                    h.errors_total + 1, time.monotonic() - started)
