"""The shipped Alertmanager configuration: amtool accepts it, routes warnings to Slack and
criticals to PagerDuty (amtool's own routing decisions), keeps secrets out of the file, and
its templates render the alerts' host, chip, growth and ETA. Inhibition needs a running
Alertmanager: tests/test_alerting_e2e.py checks it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tools import require_tool

ROOT = Path(__file__).resolve().parent.parent
AM = ROOT / "deploy/alertmanager"
CONFIG = AM / "alertmanager.yml"
RULES = ROOT / "deploy/prometheus/tpumon.rules.yml"
RECEIVER = {"warning": "slack-tpumon", "critical": "pagerduty-tpumon"}


def amtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("amtool"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def route(*labels: str) -> str:
    result = amtool("config", "routes", "test", f"--config.file={CONFIG}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


@pytest.mark.e2e
def test_amtool_accepts_the_configuration_and_its_templates():
    # The template glob is relative to the configuration file, wherever amtool runs from.
    for cwd in (ROOT, ROOT / "tests"):
        result = amtool("check-config", str(CONFIG), cwd=cwd)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS" in result.stdout
        assert " - 1 inhibit rules" in result.stdout and " - 2 receivers" in result.stdout
        assert " - 1 templates" in result.stdout


def test_warnings_go_to_slack_and_criticals_to_pagerduty():
    assert route("severity=warning") == "slack-tpumon"
    assert route("severity=critical") == "pagerduty-tpumon"
    assert route("alertname=Unrelated") == "slack-tpumon"  # the default receiver


def test_every_alert_of_the_rules_routes_by_its_severity():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 7
    for rule in alerts:
        severity = rule["labels"]["severity"]
        labels = [f"alertname={rule['alert']}", f"severity={severity}", "slice=llama-pod-a",
                  "host=t1v-n-pod-a-w-3", "worker=3", "chip=2", "accelerator_type=v4-32"]
        assert route(*labels) == RECEIVER[severity], rule["alert"]


def test_grouping_by_pod_and_inhibition_of_warnings_by_criticals_of_the_same_chip():
    cfg = config()
    assert cfg["route"]["group_by"] == ["slice", "alertname"]
    [rule] = cfg["inhibit_rules"]
    assert rule["source_matchers"] == ['severity="critical"']
    assert rule["target_matchers"] == ['severity="warning"']
    assert rule["equal"] == ["slice", "host", "chip"]


def test_secrets_come_from_files_and_resolved_alerts_are_sent():
    receivers = {r["name"]: r for r in config()["receivers"]}
    [slack] = receivers["slack-tpumon"]["slack_configs"]
    [pagerduty] = receivers["pagerduty-tpumon"]["pagerduty_configs"]
    assert slack["api_url_file"] == "/etc/alertmanager/slack-webhook-url"
    assert pagerduty["routing_key_file"] == "/etc/alertmanager/pagerduty-routing-key"
    assert "api_url" not in slack and "routing_key" not in pagerduty
    assert "global" not in config() or not {"slack_api_url", "pagerduty_url"} & set(
        config()["global"])
    assert slack["send_resolved"] is True and pagerduty["send_resolved"] is True


def alert(name: str, severity: str, chip: str, host: str, description: str) -> dict:
    return {"status": "firing",
            "labels": {"alertname": name, "severity": severity, "host": host, "worker": host[-1],
                       "chip": chip, "slice": "llama-pod-a", "accelerator_type": "v4-32",
                       "instance": f"{host}:9847", "job": "tpumon"},
            "annotations": {"summary": f"HBM leak on chip {chip} of {host}",
                            "description": description,
                            "runbook_url": "https://github.com/tpumon/tpumon/blob/main/docs/"
                                           f"alerts.md#{name.lower()}"},
            "startsAt": "2025-06-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph", "fingerprint": f"f{chip}"}


@pytest.fixture
def leak_notification(tmp_path) -> Path:
    """Alertmanager's template data for a group of two leak warnings of one pod."""
    name = "TPUMonHBMLeakSuspected"
    data = {"receiver": "slack-tpumon", "status": "firing",
            "alerts": [alert(name, "warning", "2", "t1v-n-pod-a-w-3",
                             "Chip 2 of t1v-n-pod-a-w-3 (worker 3, slice llama-pod-a, v4-32): "
                             "the HBM floor grows 40.26KiB/step, 417.1MiB/h; OOM in 5h 18m 0s "
                             "(step 62000). Likely cause: retained_tensors."),
                       alert(name, "warning", "0", "t1v-n-pod-a-w-1",
                             "Chip 0 of t1v-n-pod-a-w-1 ...")],
            "groupLabels": {"slice": "llama-pod-a", "alertname": name},
            "commonLabels": {"alertname": name, "severity": "warning", "slice": "llama-pod-a",
                             "accelerator_type": "v4-32", "job": "tpumon"},
            "commonAnnotations": {}, "externalURL": "http://alertmanager:9093"}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data))
    return path


def render(template: str, data: Path) -> str:
    result = amtool("template", "render", f"--template.glob={AM / 'templates'}/*.tmpl",
                    f"--template.data={data}", f"--template.text={template}")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.e2e
def test_slack_message_names_host_worker_chip_growth_and_eta(leak_notification):
    title = render('{{ template "tpumon.slack.title" . }}', leak_notification)
    assert title == "[FIRING:2] TPUMonHBMLeakSuspected on llama-pod-a (v4-32)"
    assert render('{{ template "tpumon.slack.color" . }}', leak_notification) == "warning"
    text = render('{{ template "tpumon.slack.text" . }}', leak_notification)
    lines = text.splitlines()
    assert lines[0] == ":warning: *HBM leak on chip 2 of t1v-n-pod-a-w-3*"
    assert lines[1] == "host `t1v-n-pod-a-w-3` · worker `3` · chip `2`"
    assert "40.26KiB/step, 417.1MiB/h; OOM in 5h 18m 0s (step 62000)" in lines[2]
    assert "Likely cause: retained_tensors." in lines[2]
    assert lines[2].endswith("<https://github.com/tpumon/tpumon/blob/main/docs/alerts.md"
                             "#tpumonhbmleaksuspected|Runbook>")
    assert "host `t1v-n-pod-a-w-1` · worker `1` · chip `0`" in text


@pytest.mark.e2e
def test_pagerduty_summary_and_details(leak_notification):
    summary = render('{{ template "tpumon.pagerduty.description" . }}', leak_notification)
    assert summary == "[llama-pod-a] HBM leak on chip 2 of t1v-n-pod-a-w-3 (first of 2 alerts)"
    hosts = render('{{ template "tpumon.alerts.hosts" .Alerts.Firing }}', leak_notification)
    assert hosts == "t1v-n-pod-a-w-3/chip 2, t1v-n-pod-a-w-1/chip 0"
    details = render('{{ template "tpumon.alerts.text" .Alerts.Firing }}', leak_notification)
    assert details.startswith("Chip 2 of t1v-n-pod-a-w-3 (worker 3, slice llama-pod-a, v4-32)")
