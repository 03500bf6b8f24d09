"""End to end: a leak on the simulated TPU VM reaches Slack and PagerDuty through a real
Prometheus running the shipped rules and a real Alertmanager running the shipped
configuration.

    tpumon agent --simulate (linear leak, time accelerated)
        -> prometheus (deploy/prometheus/prometheus.yml, tpumon.rules.yml; 1 s scrapes)
        -> prometheus-alertmanager (deploy/alertmanager/alertmanager.yml)
        -> FakeAlertAPI("slack") / FakeAlertAPI("pagerduty") on loopback

What is changed in the copies, and why (nothing else is):

- prometheus.yml: the targets (the agent, the Alertmanager on loopback ports), 1 s scrape
  and evaluation intervals, the path of the rules copy.
- tpumon.rules.yml: only `for:` durations. TPUMonHBMLeakSuspected waits 1 s and
  TPUMonOOMForecast 15 s instead of 1 and 2 minutes, so the test takes a minute, and the
  page comes after the warning: once the critical alert fires, Alertmanager's inhibition
  mutes that chip's warning (which the test checks too), so the Slack message must go first.
- alertmanager.yml: the secret files (written here, holding the fake services' URL and a
  routing key), PagerDuty's URL, the templates' absolute path, and 1 s group waits.
- The agent runs with a configuration file giving it a pod identity and an OOM horizon of
  48 h: its clock is the simulator's, which runs ahead of the wall clock, so the forecast OOM
  time (simulated) is about a simulated day from Prometheus' real `time()`.

The simulator runs 480x (a poll every 0.1 s is 48 simulated seconds, under the detector's
2-minute gap that would split a job): the detector calls the leak after about 4 simulated
hours, 30-50 s of wall time here; the simulated job would OOM after about 22 simulated
hours (2.7 minutes), long after the test is done.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from fake_alert_apis import FakeAlertAPI
from tools import (DENSE_POLLS, Processes, clean_env, free_port, get, prometheus_config,
                   ready, require_tool, wait_for)

pytestmark = pytest.mark.e2e  # starts agents or external servers: seconds each

ROOT = Path(__file__).resolve().parent.parent
HOST = "t1v-n-e2e0pod-w-0"
SLICE = "e2e-pod"
ROUTING_KEY = "e2e0routing0key0000000000000000"
FOR = {"TPUMonHBMLeakSuspected": "1s", "TPUMonOOMForecast": "15s"}


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


def alertmanager_config(tmp: Path, slack: FakeAlertAPI, pagerduty: FakeAlertAPI) -> Path:
    """The shipped alertmanager.yml with the secrets in files here, PagerDuty's URL on
    loopback and 1 s group waits; routes, grouping, inhibition and templates as shipped."""
    (tmp / "slack-webhook-url").write_text(slack.url + "\n")
    (tmp / "pagerduty-routing-key").write_text(ROUTING_KEY + "\n")
    config = yaml.safe_load((ROOT / "deploy/alertmanager/alertmanager.yml").read_text())
    config["templates"] = [str(ROOT / "deploy/alertmanager" / t) for t in config["templates"]]
    config["route"].update(group_wait="1s", group_interval="2s")
    receivers = {r["name"]: r for r in config["receivers"]}
    [slack_config] = receivers["slack-tpumon"]["slack_configs"]
    slack_config["api_url_file"] = str(tmp / "slack-webhook-url")
    [pd_config] = receivers["pagerduty-tpumon"]["pagerduty_configs"]
    pd_config["routing_key_file"] = str(tmp / "pagerduty-routing-key")
    pd_config["url"] = pagerduty.url
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def agent_config(tmp: Path) -> Path:
    path = tmp / "tpumon.toml"
    path.write_text(f"""
[identity]
hostname = "{HOST}"
worker = "0"
accelerator_type = "v4-8"
slice = "{SLICE}"
metadata = "off"

[alerts]
oom_horizon_hours = 48.0
""")
    return path


@pytest.mark.timeout(300)  # about a minute; the waits below bound it on a loaded machine
def test_leak_reaches_slack_and_pagerduty_through_prometheus_and_alertmanager(tmp_path, processes):
    prometheus = require_tool("prometheus")
    alertmanager = require_tool("prometheus-alertmanager")
    agent_port, prom_port, am_port = free_port(), free_port(), free_port()
    env = clean_env() | DENSE_POLLS

    with FakeAlertAPI("slack") as slack, FakeAlertAPI("pagerduty") as pagerduty:
        processes.start("agent", [
            sys.executable, "-m", "tpumon", "agent", "--simulate", "--scenario", "linear-leak",
            "--acceleration", "480", "--poll-interval", "0.1",
            "--listen-address", f"127.0.0.1:{agent_port}",
            "--config", str(agent_config(tmp_path)),
            "--reporter-socket", str(tmp_path / "reporter.sock")], env=env)
        processes.start("alertmanager", [
            alertmanager, f"--config.file={alertmanager_config(tmp_path, slack, pagerduty)}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
            "--log.level=warn"])
        config = prometheus_config(tmp_path, [f"127.0.0.1:{agent_port}"], FOR,
                                   f"127.0.0.1:{am_port}")
        processes.start("prometheus", [
            prometheus, f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])

        def diagnostics() -> str:
            try:
                alerts = get(f"http://127.0.0.1:{prom_port}/api/v1/alerts").decode()
            except OSError as e:
                alerts = repr(e)
            try:
                verdicts = [line for line in get(f"http://127.0.0.1:{agent_port}/metrics")
                            .decode().splitlines() if "tpumon_leak_verdict{" in line
                            and line.endswith(" 1.0")]
            except OSError as e:
                verdicts = [repr(e)]
            return (f"\nverdicts: {verdicts}\nprometheus alerts: {alerts[:3000]}\n"
                    + "".join(f"--- {n}.log\n{processes.log(n)[-2000:]}\n"
                              for n in processes.procs))

        def up() -> bool:
            processes.check_alive()
            return (ready(f"http://127.0.0.1:{agent_port}/metrics")
                    and ready(f"http://127.0.0.1:{prom_port}/-/ready")
                    and ready(f"http://127.0.0.1:{am_port}/-/ready"))

        wait_for(up, timeout=60, interval=0.5)

        # The warning: TPUMonHBMLeakSuspected, as Alertmanager's Slack notifier posts it.
        try:
            slack.wait_for_requests(1, timeout=150)
        except AssertionError as e:
            raise AssertionError(f"{e}{diagnostics()}") from None
        message = slack.requests[0]
        assert message.status == 200, (message.status, message.raw)
        [attachment] = message.body["attachments"]
        assert attachment["title"].startswith("[FIRING:")
        assert f"TPUMonHBMLeakSuspected on {SLICE} (v4-8)" in attachment["title"]
        text = attachment["text"]
        chips = re.findall(rf"host `{HOST}` · worker `0` · chip `(\d)`", text)
        assert chips, text
        assert f"HBM leak on chip {chips[0]} of {HOST}" in text
        assert re.search(r"the HBM floor grows [\d.]+[KMG]iB/step, [\d.]+[KMG]iB/h; "
                         r"OOM in \d+h \d+m \d+s \(step \d+\)\.", text), text
        assert "docs/alerts.md#tpumonhbmleaksuspected" in text
        assert attachment["color"] == "warning"

        # The page: TPUMonOOMForecast, as an Events API v2 trigger.
        try:
            [event, *_] = pagerduty.wait_for_requests(1, timeout=60)
        except AssertionError as e:
            raise AssertionError(f"{e}{diagnostics()}") from None
        assert event.status == 202, (event.status, event.raw)
        body = event.body
        assert body["routing_key"] == ROUTING_KEY
        assert body["event_action"] == "trigger"
        assert 0 < len(body["dedup_key"]) <= 255
        payload = body["payload"]
        assert payload["severity"] == "critical"
        assert payload["group"] == SLICE and payload["class"] == "TPUMonOOMForecast"
        assert re.match(rf"\[{SLICE}\] OOM forecast in \d+h \d+m \d+s on chip (\d) of {HOST}",
                        payload["summary"]), payload["summary"]
        details = payload["custom_details"]
        assert re.search(rf"{HOST}/chip \d", details["hosts"]), details
        assert "runs out of HBM in" in details["alerts"] and "B/step" in details["alerts"]
        assert details["runbook_url"].endswith("docs/alerts.md#tpumonoomforecast")
        assert not [r for r in slack.requests if "TPUMonOOMForecast" in r.raw.decode()], \
            "a critical alert went to Slack"

        # Inhibition: the page mutes the same chip's leak warning in Alertmanager.
        def inhibited() -> list:
            alerts = json.loads(get(f"http://127.0.0.1:{am_port}/api/v2/alerts"))
            paged = {a["labels"]["chip"] for a in alerts
                     if a["labels"]["alertname"] == "TPUMonOOMForecast"}
            return [a for a in alerts if a["labels"]["alertname"] == "TPUMonHBMLeakSuspected"
                    and a["labels"]["chip"] in paged and a["status"]["inhibitedBy"]]

        muted = wait_for(inhibited, timeout=20, interval=0.5)
        assert muted[0]["status"]["state"] == "suppressed"
        processes.check_alive()
