"""Slack incoming webhooks: alerts that fire together go out as one message.

Slack takes about one message a second per channel, and a leak usually starts on every
chip of a host (often of a pod) at once: one message listing them reads better than
eight. Each line names the alert, host, worker, chip, growth, ETA and likely cause.

Slack reads the top-level ``text`` and every mrkdwn block as markup: ``<!channel>`` is a
mention of everyone, ``<http://x|click>`` a link. Every piece of an alert is text that a
training process may have written (a summary names its framework, tensor sites come from
its snapshots), so each goes through :func:`~tpumon.untrusted_text.for_slack`; only the
markup written here (the icon, the bold name, the dashboard and report links, whose URLs
come from the configuration) is Slack's to read.
"""

from __future__ import annotations

from typing import Any, Sequence

from tpumon.units import format_hours
from tpumon.notify.outbox import Event
from tpumon.untrusted_text import for_slack

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
        name, where, subject = for_slack(a.name), for_slack(a.where), for_slack(a.subject)
        if event.action == "resolve":
            return (f"{icon} *Resolved* {name} on {where}, {subject} (active for "
                    f"{format_hours(event.raised - a.raised)})")
        text = f"{icon} *{name}* ({a.severity}) on {where}: {for_slack(a.summary)}."
        if a.details.get("cause_text"):
            text += f" Likely cause: {for_slack(str(a.details['cause_text']))}."
        if a.details.get("tensors"):
            text += f" Tensor snapshots: {for_slack(str(a.details['tensors']))}."
        links = [f"<{url}|{label}>" for label, url in (("Dashboard", a.dashboard),
                                                        ("Report", a.report)) if url]
        return " ".join([text, *links])
