"""Slack incoming webhooks: one message per alert raise or resolve.

Each message is one line naming the alert, host, worker, chip, growth, ETA and likely
cause, not one message for the alerts that fire together: a webhook takes no idempotency
key, so a message whose post was cut short by a kill -9 is sent again after the restart,
and a batch would repeat all its lines. One line per message repeats one at most, marked as
a possible repeat; Slack's rate (about one message a second per channel) then spreads a
leak on eight chips over eight seconds.

Slack reads the top-level ``text`` and every mrkdwn block as markup: ``<!channel>`` is a
mention of everyone, ``<http://x|click>`` a link. Every piece of an alert is text that a
training process may have written (a summary names its framework, tensor sites come from
its snapshots), so each goes through :func:`~tpumon.common.untrusted_text.for_slack`; only the
markup written here (the icon, the bold name, the dashboard and report links, whose URLs
come from the configuration) is Slack's to read.
"""

from __future__ import annotations

from typing import Any, Sequence

from tpumon.common.units import format_hours
from tpumon.notify.outbox import Event
from tpumon.common.untrusted_text import for_slack

ICONS = {("trigger", "critical"): ":red_circle:", ("trigger", "warning"): ":warning:",
         ("resolve", "critical"): ":white_check_mark:",
         ("resolve", "warning"): ":white_check_mark:"}


class SlackChannel:
    """Formats outbox events as one webhook message."""

    name = "slack"
    batch = 1            # events per message: a kill repeats at most this many lines
    min_interval = 1.0   # seconds between messages: Slack's per-channel rate
    group_wait = 0.0     # seconds to wait for alerts raised together (none: one a message)

    def __init__(self, url: str, severities: tuple[str, ...]) -> None:
        self.url = url
        self.severities = severities

    def requests(self, events: Sequence[Event]) -> list[tuple[list[Event], Any]]:
        """One message for all of them (``batch`` of them at most)."""
        lines = [self._line(e) for e in events]
        return [(list(events), {
            "text": "\n".join(lines),
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": line[:3000]}}
                       for line in lines[:50]],
        })]

    @classmethod
    def _line(cls, event: Event) -> str:
        line = cls._alert_line(event)
        if event.in_doubt:  # a repeat must not read as a second raise
            line += (" _(Possibly a repeat: the agent stopped while sending this, and "
                     "cannot know whether it arrived.)_")
        return line

    @staticmethod
    def _alert_line(event: Event) -> str:
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
