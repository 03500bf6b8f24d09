"""kill -9 during Slack deliveries, against the real agent and a recording webhook: how
many lines arrive twice (issue 42; docs/security.md, "Figures").

Slack's incoming webhooks take no idempotency key, so a message whose post was under way
when the agent was killed cannot be recognised after the restart: sending it again may
repeat it, not sending it may lose it. The agent sends it again, marked as a possible
repeat, one alert line per message, so that a kill repeats one line at most.

The webhook holds each answer 2 s, so every kill falls inside a post that the service
then acts on: each kill is the worst case, not a lucky miss. The notifications are written
into the outbox between runs, as an earlier run would have left them (the agent reads them
back at start), so that every run has more than two messages to send.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from fake_alert_apis import FakeAlertAPI
from tools import AgentProcess, free_port, wait_for

from tpumon.notify.alerts import Alert
from tpumon.notify.outbox import Event, Outbox

pytestmark = pytest.mark.e2e  # starts agents: about two minutes

KILLS = 10
WAITING = 40  # notifications waiting at each start: two requests' worth at 20 a request
LINE = re.compile(r"stuck at step (\d+)")
REPEAT = "Possibly a repeat"


def top_up(state: Path, made: int) -> int:
    """Fill the agent's outbox (the agent not running) up to ``WAITING`` Slack
    notifications, each a line of its own (step ``made + k``); how many were made in all.
    Created a minute ago, so that no channel waits to group them with later ones."""
    outbox = Outbox(state / "outbox.db")
    try:
        now, events = time.time(), []
        for step in range(made + 1, made + 1 + WAITING - outbox.pending_count("slack")):
            alert = Alert("TPUMonTrainingStalled", "warning", f"tpumon/vm/stall/pid{step}",
                          "vm", "", "", "", f"pid {step}",
                          f"training process {step} (fake) stuck at step {step}", raised=now)
            events.append(Event(0, "slack", "trigger", alert, now, now - 60, 0))
        outbox.record([], {}, now, events)
        return made + len(events)
    finally:
        outbox.close()


def start_agent(tmp_path: Path, slack: FakeAlertAPI) -> AgentProcess:
    """A real agent with a runtime port nobody serves (no alerts of its own) and Slack."""
    return AgentProcess(tmp_path, tmp_path / "state", "--runtime-ports", str(free_port()),
                        simulate=False, env={"TPUMON_SLACK_WEBHOOK_URL": slack.url,
                                             "TPUMON_IDENTITY_METADATA": "off"})


def kill_in_second_post(agent: AgentProcess, slack: FakeAlertAPI) -> None:
    """kill -9 while the run's second message is held by the webhook (the first one
    delivered and marked), then let the webhook take it, as Slack would."""
    before = slack.arrived
    try:
        slack.wait_for_arrivals(before + 2, 90)
    except AssertionError as failure:
        raise AssertionError(f"{failure}; the agent's log ends:\n{agent.log()[-3000:]}") from None
    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait(10)
    slack.wait_for_requests(before + 2, 30)


def lines(slack: FakeAlertAPI) -> list[tuple[int, str]]:
    """(step, line) of every line that arrived, in order."""
    return [(int(m.group(1)), line) for r in slack.accepted
            for line in r.body["text"].split("\n") if (m := LINE.search(line))]


def test_ten_kills_during_delivery_repeat_at_most_one_line_each_and_lose_none(tmp_path):
    made = 0
    with FakeAlertAPI("slack", delay=2.0) as slack:
        for _ in range(KILLS):
            made = top_up(tmp_path / "state", made)
            kill_in_second_post(start_agent(tmp_path, slack), slack)
        slack.delay = 0.0
        agent = start_agent(tmp_path, slack)
        try:
            wait_for(lambda: agent.value("tpumon_notifier_pending_notifications",
                                         notifier="slack") == 0, 180)
        finally:
            assert agent.stop() == 0
    got = lines(slack)
    counts = Counter(step for step, _ in got)
    repeated = sum(n - 1 for n in counts.values())
    print(f"{KILLS} kills: {len(slack.accepted)} Slack messages, {len(got)} lines for "
          f"{made} notifications, {repeated} repeated lines, "
          f"{sum(REPEAT in line for _, line in got)} marked as a possible repeat")
    assert set(counts) == set(range(1, made + 1))  # none lost
    assert repeated <= KILLS  # at most one line per kill
    seen: set[int] = set()
    for step, line in got:  # a second copy says that it may be one
        assert step not in seen or REPEAT in line, line
        seen.add(step)
    assert "Traceback" not in agent.log()
