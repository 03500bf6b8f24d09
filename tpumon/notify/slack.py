"""Slack incoming webhooks: alerts that fire together go out as one message.

Slack takes about one message a second per channel, and a leak usually starts on every
chip of a host (often of a pod) at once: one message listing them reads better than
eight. Each line names the alert, host, worker, chip, growth, ETA and likely cause.
"""

from __future__ import annotations

from typing import Any, Sequence

from tpumon.notify.alerts import describe_duration
from tpumon.notify.outbox import Event

ICONS = {("trigger", "critical"): ":red_circle:", ("trigger", "warning"): ":warning:",
         ("resolve", "critical"): ":white_check_mark:",
         ("resolve", "warning"): ":white_check_mark:"}


class SlackChannel:
    """Formats outbox events as one webhook message."""

    name = "slack"
    batch = 20           # events per message at most
    min_interval = 1.0   # seconds between messages: Slack's per-channel rate
    group_wait = 10.0    # seconds to wait for alerts raised together

    def __init__(self, url: str, severities: tuple[str, ...]) -> None:
        self.url = url
        self.severities = severities

    def requests(self, events: Sequence[Event]) -> list[tuple[list[Event], Any]]:
        """One message for all of them."""
        lines = [self._line(e) for e in events]
        return [(list(events), {
            "text": "\n".join(lines),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": line[:3000]}}
                       for line in lines[:50]],
        })]

    @staticmethod
    def _line(event: Event) -> str:
        a = event.alert
        icon = ICONS[(event.action, a.severity)]
        if event.action == "resolve":
            return (f"{icon} *Resolved* {a.name} on {a.where}, {a.subject} (active for "
                    f"{describe_duration(event.raised - a.raised)})")
        text = f"{icon} *{a.name}* ({a.severity}) on {a.where}: {a.summary}."
        if a.details.get("cause_text"):
            text += f" Likely cause: {a.details['cause_text']}."
        if a.details.get("tensors"):
            text += f" Tensor snapshots: {a.details['tensors']}."
        links = [f"<{url}|{name}>" for name, url in (("Dashboard", a.dashboard),
                                                      ("Report", a.report)) if url]
        return " ".join([text, *links])

