"""The agent's direct notifiers, end to end: `tpumon agent --simulate` with Slack and
PagerDuty configured through the environment, a real reporter going silent (a stalled
training step), and loopback services answering as Slack and PagerDuty do. Secrets must
not appear in logs, metrics, status or `tpumon config show`."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from fake_alert_apis import FakeAlertAPI
from test_hostile import sim_runtime, stop_all
from tools import TPUMON, AgentProcess, FakeReporter, clean_env, wait_for

pytestmark = pytest.mark.e2e  # starts agents or external servers: seconds each

WEBHOOK_SECRET = "/services/T0SECRET/B0SECRET/s3cr3tW3bh00kT0k3n"
ROUTING_KEY = "R0UT1NGK3Y5ECRETR0UT1NGK3Y5ECRET"
REPORT_TIMEOUT = 130  # the page's own bound on its `tpumon report` child is 120 s


def keep_stepping(reporter: FakeReporter, done: threading.Event) -> None:
    step = 1201
    while not done.wait(0.2):
        reporter.step(step)
        step += 1


def received(*apis: FakeAlertAPI) -> str:
    """What each fake service got, and when, for a failure's message."""
    return "; ".join(f"{api.kind} got " + ", ".join(
        f"{time.strftime('%H:%M:%S', time.localtime(r.time))} "
        f"{r.body.get('event_action') or r.body.get('text', '')[:60]!r}" for r in api.requests)
        for api in apis)


def test_a_stalled_step_is_paged_and_resolved_without_leaking_secrets(tmp_path):
    """This process reports, stalls, then steps again, the one trusted process reporting
    to a real agent on a simulated runtime: the chips are the ones it drives (a process
    is stalled on its own chips only: docs/security.md)."""
    socket_path = tmp_path / "reporter.sock"
    sim, port = sim_runtime(tmp_path)
    with FakeAlertAPI("slack", path=WEBHOOK_SECRET) as slack, \
            FakeAlertAPI("pagerduty") as pagerduty:
        env = {"TPUMON_SLACK_WEBHOOK_URL": slack.url,
               "TPUMON_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
               "TPUMON_PAGERDUTY_URL": pagerduty.url,
               "TPUMON_PAGERDUTY_MIN_SEVERITY": "warning",
               # 12 s: far past the stepper's 0.2 s, so that on a starved host a stepper
               # held up for seconds after the resolve does not page again
               "TPUMON_ALERTS_TRAINING_STALL_MINUTES": "0.2",
               "TPUMON_ALERTS_RESOLVE_AFTER_MINUTES": "0.05",
               "TPUMON_ALERTS_DASHBOARD_URL": "https://grafana.example/d/x?var-host={host}"}
        agent = AgentProcess(tmp_path, tmp_path / "state", "--runtime-ports", str(port),
                             "--reporter-socket", str(socket_path), simulate=False,
                             env={**env, "TPUMON_IDENTITY_METADATA": "off"})
        reporter = FakeReporter(socket=str(socket_path), min_interval=0)
        done = threading.Event()
        stepping = threading.Thread(target=keep_stepping, args=(reporter, done))
        try:
            reporter.step(1200)  # then nothing: this process is alive, its step stuck
            trigger = pagerduty.wait_for_requests(1, 60)[0].body
            assert trigger["event_action"] == "trigger"
            assert trigger["payload"]["class"] == "TPUMonTrainingStalled"
            assert trigger["dedup_key"].endswith(f"TPUMonTrainingStalled/pid{os.getpid()}")
            message = slack.wait_for_requests(1, 30)[0].body["text"]
            assert f"training process {os.getpid()} (fake) stuck at step 1200" in message
            assert "grafana.example" in message
            table = subprocess.run([*TPUMON, "status", "--agent", f"http://{agent.url}"],
                                   capture_output=True, text=True, timeout=60,
                                   env={**os.environ, "COLUMNS": "120"})
            assert "warning TPUMonTrainingStalled: training process" in table.stdout
            assert "pagerduty: ok, 0 waiting, 1 sent" in table.stdout
            stepping.start()  # the job moves again: resolved, once, after the trigger
            resolve = pagerduty.wait_for_requests(2, 60)[1].body
            assert resolve == {"routing_key": ROUTING_KEY, "event_action": "resolve",
                               "dedup_key": trigger["dedup_key"]}
            assert "Resolved" in slack.wait_for_requests(2, 30)[1].body["text"]
            for name in ("pagerduty", "slack"):  # the snapshot after the deliveries
                try:
                    wait_for(lambda name=name: agent.value("tpumon_notifier_deliveries_total",
                                                           notifier=name) == 2, 30)
                    wait_for(lambda name=name: agent.value(
                        "tpumon_notifier_pending_notifications", notifier=name) == 0, 30)
                except AssertionError as failure:
                    raise AssertionError(f"{name}: {failure}; {received(slack, pagerduty)}; "
                                         f"the agent's log ends:\n{agent.log()[-3000:]}") from None
            assert agent.value("tpumon_notifier_up", notifier="slack") == 1
            status = json.loads(agent.get("/api/status"))
            assert {c["name"] for c in status["notifications"]["channels"]} == {
                "slack", "pagerduty"}
            shown = subprocess.run([*TPUMON, "config", "show"], capture_output=True, text=True,
                                   env={**os.environ, **env}, timeout=60)
            assert shown.returncode == 0 and "webhook_url is set (environment" in shown.stdout
            exposed = {"log": agent.log(), "metrics": agent.get("/metrics"),
                       "status": json.dumps(status), "config show": shown.stdout,
                       "status table": table.stdout}
        finally:
            done.set()
            if stepping.is_alive():
                stepping.join()
            stop_all(agent, sim)
        exposed["log"] = agent.log()
        for where, text in exposed.items():
            assert "s3cr3tW3bh00kT0k3n" not in text and ROUTING_KEY not in text, where
        assert len(slack.requests) == 2 and len(pagerduty.requests) == 2, \
            received(slack, pagerduty)  # nothing twice
        assert "Traceback" not in exposed["log"]


def test_an_unreadable_secret_file_is_one_line_and_exit_1(tmp_path):
    env = clean_env()
    env["TPUMON_PAGERDUTY_ROUTING_KEY_FILE"] = str(tmp_path / "missing")
    done = subprocess.run([*TPUMON, "agent", "--simulate", "--listen-address", "127.0.0.1:0"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith(
        f"pagerduty.routing_key_file {tmp_path / 'missing'}: cannot read it: "
        "No such file or directory")
    assert "Traceback" not in done.stderr


def test_systemd_credentials_are_found_without_configuration(tmp_path):
    """LoadCredential=slack-webhook-url:... in the unit: no key needed in the config."""
    from tpumon.agent.bootstrap import notification_channels
    from tpumon.common.config import load_config

    (tmp_path / "slack-webhook-url").write_text("https://hooks.slack.com/services/A/B/C\n")
    channels = notification_channels(load_config(env={}),
                                     env={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert [(c.name, c.url) for c in channels] == [
        ("slack", "https://hooks.slack.com/services/A/B/C")]


def test_the_agent_serves_its_report_for_notification_links(tmp_path):
    agent = AgentProcess(tmp_path, tmp_path / "state")
    try:
        wait_for(lambda: (agent.value("tpumon_store_polls_written_total") or 0) >= 100, 60)
        page = agent.get("/report", timeout=REPORT_TIMEOUT)  # a child draws it: seconds
        assert page.startswith("<!DOCTYPE html>") and "data:image/png;base64," in page
        assert "<title>tpumon report: vm</title>" in page  # the simulated host ...
        assert "<th>Chips</th><td>0, 1, 2, 3</td>" in page  # ... and its chips
        assert agent.get("/report", timeout=REPORT_TIMEOUT) == page  # drawn once, kept a minute
    finally:
        assert agent.stop() == 0


def test_a_link_template_with_an_unknown_placeholder_is_refused(tmp_path):
    env = clean_env()
    env["TPUMON_ALERTS_REPORT_URL"] = "http://{hostname}:9847/report"
    done = subprocess.run([*TPUMON, "config", "show"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 1 and "alerts.report_url may use only {host}" in done.stderr
