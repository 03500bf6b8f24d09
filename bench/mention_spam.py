"""Mention spam through the agent's notifications (issue 42, docs/security.md): how many
Slack mentions a local user gets to the on-call channel in SECONDS.

The real agent (``tpumon agent --simulate``) posts to a recording Slack webhook on
loopback. A local user forks RATE short-lived processes a second; each sends one report
whose framework is ``<!channel><!channel><!channel>`` (30 of the 32 characters a report
may hold) on the datagram socket, lives a few polls and exits, which the agent reports as
a job that ended. Counted: the Slack posts, the ``<!channel>`` that Slack would read as a
mention (raw, in ``text`` or a block), and the ones that arrived escaped
(``&lt;!channel&gt;``, shown as text), until SETTLE seconds after the last fork.

    python bench/mention_spam.py [--seconds 30] [--rate 20]

Run it from a tree before a change (PYTHONPATH=that tree) to measure what the change
gained.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from fake_alert_apis import FakeAlertAPI  # noqa: E402
from tools import AgentProcess, wait_for  # noqa: E402

from tpumon.instrument.protocol import PROTOCOL_VERSION  # noqa: E402

FRAMEWORK = "<!channel>" * 3
LIFE = 0.5  # seconds each spamming process lives: several polls (0.05 s apart)
SETTLE = 30.0  # seconds after the last fork: the group wait, then 20 events a post, 1 a second


def spam_once(sock: Path) -> None:
    """Fork one process that reports once, lives LIFE seconds and exits; reap the done."""
    if os.fork() == 0:
        try:
            doc = {"v": PROTOCOL_VERSION, "framework": FRAMEWORK, "step": 1,
                   "time": time.time()}
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(json.dumps(doc).encode(), str(sock))
            time.sleep(LIFE)
        finally:
            os._exit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def count(slack: FakeAlertAPI) -> tuple[int, int, int]:
    """Posts, raw mentions and escaped ones, over ``text`` and every block."""
    raw = escaped = 0
    for r in slack.requests:
        texts = [r.body.get("text", ""), *(b["text"]["text"] for b in r.body.get("blocks", []))]
        raw += sum(t.count("<!channel>") for t in texts)
        escaped += sum(t.count("&lt;!channel&gt;") for t in texts)
    return len(slack.requests), raw, escaped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=20.0, help="processes forked a second")
    args = parser.parse_args()
    import tpumon
    print(f"tpumon from {Path(tpumon.__file__).parent}")
    with tempfile.TemporaryDirectory() as tmp, FakeAlertAPI("slack") as slack:
        sock = Path(tmp) / "reporter.sock"
        agent = AgentProcess(Path(tmp), None, "--reporter-socket", str(sock),
                             env={"TPUMON_SLACK_WEBHOOK_URL": slack.url})
        try:
            wait_for(sock.exists, 30)
            started, forked = time.monotonic(), 0
            while time.monotonic() - started < args.seconds:
                spam_once(sock)
                forked += 1
                time.sleep(max(0.0, started + forked / args.rate - time.monotonic()))
            time.sleep(SETTLE)
            posts, raw, escaped = count(slack)
            ended = agent.value("tpumon_job_ends_total", cause="exited")
        finally:
            agent.stop()
    print(f"{forked} spamming processes in {args.seconds:.0f} s, {ended:.0f} job ends seen; "
          f"within {SETTLE:.0f} s more: {posts} Slack posts, {raw} <!channel> mentions "
          f"Slack would read, {escaped} escaped (shown as text)")


if __name__ == "__main__":
    main()
