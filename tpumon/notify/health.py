"""What the notifier tells the rest of the agent (metrics, status): counts and the active
alerts, never a URL or a key. Read from the notifier by its collector and the status
document, never carried by the poll state (the notifier reads that state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

# the reasons a channel's failures and given-up events are counted by (exported even at 0)
GIVE_UP_REASONS = ("rejected", "expired")
FAILURE_REASONS = ("rate_limited", "server_error", "network")


@dataclass(frozen=True)
class ChannelHealth:
    """One channel (slack, pagerduty) as exported and shown."""

    name: str
    up: bool                      # the last attempt succeeded (or none was needed)
    pending: int
    delivered_total: int          # requests accepted
    failures_total: Mapping[str, int]   # failed attempts by reason
    given_up_total: Mapping[str, int]   # events abandoned by reason
    last_error: str | None
    last_delivery: float | None


@dataclass(frozen=True)
class NotifierHealth:
    channels: tuple[ChannelHealth, ...]
    active: tuple[Mapping[str, Any], ...]  # name, severity, subject, summary, raised
