"""PagerDuty Events API v2: one event per alert transition, deduplicated per host, alert
and chip, so a trigger sent twice is one incident and the resolve closes it; slice-wide
conditions (a leak, an OOM forecast) are deduplicated per slice and alert instead, so the
N workers of a slice that see one leak open one incident, not N (docs/notifications.md).

The summary names what training processes wrote (their framework, their tensors' sites):
:func:`~tpumon.common.untrusted_text.for_pagerduty` takes its control characters out and holds
it to the API's 1024 characters."""

from __future__ import annotations

import datetime
from typing import Any, Sequence

from tpumon.notify.alerts import INCIDENT_OPEN
from tpumon.notify.outbox import Event
from tpumon.common.untrusted_text import for_pagerduty

MAX_DEDUP_KEY = 255


class PagerDutyChannel:
    """Formats outbox events as Events API v2 bodies."""

    name = "pagerduty"
    batch = 1            # the API takes one event per request
    min_interval = 0.5   # well under the API's 120 events a minute per routing key
    group_wait = 0.0     # PagerDuty groups incidents itself

    def __init__(self, url: str, routing_key: str, severities: tuple[str, ...]) -> None:
        self.url = url
        self.routing_key = routing_key
        self.severities = severities

    def requests(self, events: Sequence[Event]) -> list[tuple[list[Event], Any]]:
        """One event per request; None (nothing to send) for the resolve of one chip of a
        slice-wide incident that other chips of this host still hold open."""
        return [([e], self.body(e)) for e in events]

    def body(self, event: Event) -> dict[str, Any] | None:
        a = event.alert
        if event.action == "resolve" and a.details.get(INCIDENT_OPEN):
            return None
        body: dict[str, Any] = {"routing_key": self.routing_key,
                                "event_action": event.action,
                                "dedup_key": a.incident_key[:MAX_DEDUP_KEY]}
        if event.action == "resolve":
            return body
        summary = f"{a.name} on {a.where}: {a.summary}"
        if a.details.get("tensors"):  # before the cause: it names the tensors, and the
            summary += f". {a.details['tensors']}"  # summary is cut at 1024 characters
        if a.details.get("cause_text"):
            summary += f". Likely cause: {a.details['cause_text']}"
        body["payload"] = {
            "summary": for_pagerduty(summary),  # names a process's framework, its tensors
            "source": a.host,
            "severity": a.severity,
            "timestamp": datetime.datetime.fromtimestamp(
                event.raised, datetime.timezone.utc).isoformat(),
            "component": a.subject,
            "group": a.slice or a.host,
            "class": a.name,
            "custom_details": {"worker": a.worker, "slice": a.slice,
                               "accelerator_type": a.accelerator_type, **a.details},
        }
        links = [{"href": url, "text": text} for text, url in (
            ("tpumon dashboard", a.dashboard), ("tpumon report", a.report)) if url]
        if links:
            body["links"] = links
        return body
