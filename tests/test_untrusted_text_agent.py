"""Text that a training process wrote, through the real agent and commands (issue 42,
"Escaping at every sink"): a report's framework holding Slack mentions and a disguised
link reaches a recording Slack webhook escaped and PagerDuty within its limits; a status
document whose process name holds terminal escape sequences and whose framework holds
Rich markup is printed by `tpumon status` and `tpumon watch` with none of it obeyed."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
from fake_alert_apis import FakeAlertAPI
from test_hostile import sim_runtime, stop_all
from test_untrusted_text import HOSTILE, MENTIONS
from tools import TPUMON, AgentProcess, FakeReporter, clean_env

pytestmark = pytest.mark.e2e  # real agents and commands: seconds each


class MentioningReporter(FakeReporter):
    """A job whose reporter calls its framework ``<!channel> <http://evil|click>``: the
    agent accepts it (32 printable characters at most) and quotes it in its alerts."""

    framework = MENTIONS


def slack_texts(body: dict) -> list[str]:
    """Everything in a Slack message that Slack reads as text or mrkdwn."""
    return [body.get("text", ""), *(b["text"]["text"] for b in body.get("blocks", []))]


def test_mentions_in_a_framework_reach_slack_escaped_and_pagerduty_capped(tmp_path):
    """The one trusted process reporting to a real agent on a simulated runtime (so the
    chips are the ones it drives, and its stall is paged) names its framework with Slack
    mentions and a disguised link."""
    sock = tmp_path / "reporter.sock"
    sim, port = sim_runtime(tmp_path)
    with FakeAlertAPI("slack") as slack, FakeAlertAPI("pagerduty") as pagerduty:
        agent = AgentProcess(tmp_path, None, "--runtime-ports", str(port), "--reporter-socket",
                             str(sock), simulate=False, env={
            "TPUMON_SLACK_WEBHOOK_URL": slack.url, "TPUMON_PAGERDUTY_URL": pagerduty.url,
            "TPUMON_PAGERDUTY_ROUTING_KEY": "R0UT1NGK3Y", "TPUMON_PAGERDUTY_MIN_SEVERITY":
            "warning", "TPUMON_ALERTS_TRAINING_STALL_MINUTES": "0.1",
            "TPUMON_IDENTITY_METADATA": "off"})
        try:
            MentioningReporter(socket=str(sock), min_interval=0).step(1200)  # then stuck
            body = slack.wait_for_requests(1, 60)[0].body
            page = pagerduty.wait_for_requests(1, 60)[0].body
        finally:
            stop_all(agent, sim)
    texts = slack_texts(body)
    assert all("<!" not in t and "<http://evil" not in t for t in texts), texts
    escaped = "(&lt;!channel&gt; &lt;http://evil|click&gt;) stuck at step 1200"
    assert all(escaped in t for t in texts), texts
    summary = page["payload"]["summary"]  # PagerDuty shows text as text: only bounded
    assert f"({MENTIONS}) stuck at step 1200" in summary and len(summary) <= 1024
    assert page["payload"]["class"] == "TPUMonTrainingStalled"


class FakeAgent:
    """A loopback HTTP server answering /api/status with one document, as an agent (or
    anything on its port) would."""

    def __init__(self, doc: dict) -> None:
        body = json.dumps(doc).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self.send_response(200 if self.path == "/api/status" else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hostile_agent() -> Iterator[FakeAgent]:
    agent = FakeAgent(HOSTILE)
    yield agent
    agent.close()


def assert_nothing_obeyed(out: str) -> None:
    """Printed to a pipe, Rich writes no escape sequence of its own: any is the attack's."""
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out, repr(out)
    assert "pwn" not in out
    assert "[link=http://e]x[/link]" in out and "([bold]jax[/bold])" in out


def test_status_prints_no_escape_sequence_from_a_process_name(hostile_agent):
    done = subprocess.run([*TPUMON, "status", "--agent", hostile_agent.url],
                          capture_output=True, text=True, timeout=60,
                          env={**clean_env(), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert_nothing_obeyed(done.stdout)
    assert "4242 pyth2Jon" in done.stdout


def test_watch_prints_no_escape_sequence_from_a_process_name(hostile_agent):
    proc = subprocess.Popen([*TPUMON, "watch", "--agent", hostile_agent.url, "--interval",
                             "0.2"], stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        lines = [proc.stdout.readline() for _ in range(16)]
    finally:
        proc.terminate()
        proc.wait(10)
    out = "".join(lines)
    assert out.startswith("tpumon watch ") and os.linesep in out, out
    assert_nothing_obeyed(out)
