"""Direct notifications: the agent pages Slack and PagerDuty itself, for teams without
Prometheus and Alertmanager (those route the same alerts from deploy/prometheus/).

alerts (conditions, hold-downs) -> outbox (persistent, ordered) -> notifier (delivery,
retry, rate limits) -> slack / pagerduty (message formats); secrets reads the webhook URL
and routing key; health is what metrics and status see. agent.bootstrap.open_notifier wires
it. docs/alerts.md describes the alerts; docs/configuration.md the [alerts], [slack] and
[pagerduty] sections.

A reader of the poll state: may import ``state``, everything below it and ``store``.
Imports nothing itself.
"""
