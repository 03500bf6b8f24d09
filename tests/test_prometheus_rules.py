"""The shipped Prometheus rules and configuration: promtool accepts them, their unit tests
pass, every alert has a unit test where it fires (labels and annotations checked) and one
where it does not, every runbook link lands on a section of docs/alerts.md, and the unit
tests catch a broken threshold."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tools import require_tool

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy/prometheus"
RULES = PROM / "tpumon.rules.yml"
UNIT_TESTS = sorted((PROM / "tests").glob("*.yml"))
ALERTS_DOC = ROOT / "docs/alerts.md"
RUNBOOK = "https://github.com/tpumon/tpumon/blob/main/docs/alerts.md#"


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([require_tool("promtool"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"]]


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def unit_tests() -> list[dict]:
    return [test for path in UNIT_TESTS for test in yaml.safe_load(path.read_text())["tests"]]


def github_anchors(markdown: str) -> set[str]:
    """Anchors GitHub makes for the headings: lower case, punctuation dropped, spaces to -."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#{1,6} (.+)$", markdown, re.M)}


@pytest.mark.e2e
def test_promtool_checks_the_rules():
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@pytest.mark.e2e
def test_promtool_checks_the_example_configuration_and_finds_the_rules():
    # rule_files is relative to the configuration file, wherever promtool runs from.
    result = promtool("check", "config", "prometheus.yml", cwd=PROM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout
    result = promtool("check", "config", str(PROM / "prometheus.yml"), cwd=ROOT / "tests")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.e2e
def test_the_rule_unit_tests_pass():
    assert len(UNIT_TESTS) >= 3
    result = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS), result.stdout


def test_every_alert_is_unit_tested_firing_with_labels_and_annotations_and_not_firing():
    firing: dict[str, list[dict]] = {}
    silent: set[str] = set()
    for test in unit_tests():
        for case in test.get("alert_rule_test", []):
            if case.get("exp_alerts"):
                firing.setdefault(case["alertname"], []).extend(case["exp_alerts"])
            else:
                silent.add(case["alertname"])
    for name, rule in alerts().items():
        assert name in firing, f"{name}: no unit test where it fires"
        assert name in silent, f"{name}: no unit test where it does not fire"
        for expected in firing[name]:
            assert expected["exp_labels"]["severity"] == rule["labels"]["severity"], name
            assert set(expected["exp_annotations"]) == set(rule["annotations"]), name
    assert not set(firing) - set(alerts()), "unit tests of alerts that do not exist"


def test_every_recording_rule_is_named_by_convention_and_unit_tested():
    tested = {re.match(r"[\w:]+", case["expr"]).group(0)
              for test in unit_tests() for case in test.get("promql_expr_test", [])}
    records = [r["record"] for r in rules() if "record" in r]
    assert records
    for name in records:
        assert re.fullmatch(r"[a-z_]+:tpumon_[a-z_]+:[a-z0-9_]+", name), name  # level:metric:ops
        assert name in tested, f"{name}: no promql_expr_test"


def test_every_alert_has_severity_annotations_and_a_runbook_section():
    anchors = github_anchors(ALERTS_DOC.read_text())
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), f"{name}: no `for`"
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK), url
        anchor = url[len(RUNBOOK):]
        assert anchor == name.lower(), url
        assert anchor in anchors, f"{url}: no such section in docs/alerts.md"
    assert alerts()["TPUMonOOMForecast"]["labels"]["severity"] == "critical"
    assert alerts()["TPUMonHBMLeakSuspected"]["labels"]["severity"] == "warning"


def test_the_runbook_table_lists_every_alert_with_its_severity():
    doc = ALERTS_DOC.read_text()
    for name, rule in alerts().items():
        row = re.search(rf"^\| \[{name}\]\(#{name.lower()}\) \| (\w+) \|", doc, re.M)
        assert row, f"{name} missing from the table in docs/alerts.md"
        assert row.group(1) == rule["labels"]["severity"], name
    for name in (r["record"] for r in rules() if "record" in r):
        assert f"`{name}`" in doc, f"{name} not documented in docs/alerts.md"


# Each mutation breaks one alert the way a careless edit would; its unit tests must notice.
MUTATIONS = {
    "TPUMonHBMJump threshold 3 % -> 10 %": (
        ") > 0.03 * tpumon_hbm_total_bytes", ") > 0.10 * tpumon_hbm_total_bytes", "hbm.yml"),
    "TPUMonOOMForecast without the leak verdict": (
        'and ignoring (verdict)\n            (tpumon_leak_verdict{verdict="leak"} == 1)\n'
        '        for: 2m',
        "\n        for: 2m", "leak.yml"),
    "TPUMonHBMJump without the guard for a chip that held nothing": (
        "          and\n          min_over_time(tpumon_hbm_used_bytes[5m] offset 10m)"
        " > 0.05 * tpumon_hbm_total_bytes\n", "",
        "hbm.yml"),
    "TPUMonHBMHigh on raw samples (in-step peaks) instead of the floor": (
        "          min_over_time(tpumon_hbm_used_bytes[5m]) / tpumon_hbm_total_bytes\n"
        "            >",
        "          max_over_time(tpumon_hbm_used_bytes[5m]) / tpumon_hbm_total_bytes\n"
        "            >",
        "hbm.yml"),
    "TPUMonTrainingStalled also where the chips hold nothing": (
        "group_left tpumon_hbm_used_bytes\n                ) > 0",
        "group_left tpumon_hbm_used_bytes\n                ) >= 0", "health.yml"),
    "TPUMonTrainingStalled on the host's chips, not the process's own": (
        "and on (instance, job, pid)\n              (\n"
        "                max by (instance, job, pid) (\n"
        "                  tpumon_chip_owner_info * on (instance, job, chip) group_left ",
        "and on (instance, job)\n              (\n                max by (instance, job) (\n"
        "                  ", "health.yml"),
    "TPUMonTrainingStalled ignoring the exported stall time": (
        "> ignoring (pid, framework, rank) group_left\n"
        "              tpumon_alert_training_stall_seconds",
        "> 60", "health.yml"),
    "TPUMonJobDiedOOM also for a job that exited": (
        'tpumon_job_ends_total{cause=~"hbm_oom|host_oom"}', 'tpumon_job_ends_total',
        "ends.yml"),
    "TPUMonHostDCNLatencyOutlier threshold 2x -> 5x the slice's median": (
        "host:tpumon_dcn_transfer_latency_seconds:ratio_to_slice_median > 2\n",
        "host:tpumon_dcn_transfer_latency_seconds:ratio_to_slice_median > 5\n", "outliers.yml"),
    "TPUMonHostStepTimeOutlier without the three-host guard": (
        "            and on (slice, accelerator_type)\n"
        "              (count by (slice, accelerator_type) "
        "(host:tpumon_hlo_execution_seconds:mean5m) >= 3)\n", "", "outliers.yml"),
    "TPUMonHostMemoryLeak also for a process that exited": (
        "            and on (instance, job, pid)\n              (tpumon_process_exited == 0)\n", "",
        "host.yml"),
}


@pytest.mark.e2e
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_unit_tests_fail_on_a_broken_rule(tmp_path, mutation):
    before, after, test_file = MUTATIONS[mutation]
    text = RULES.read_text()
    assert text.count(before) == 1, before
    (tmp_path / "tests").mkdir()
    (tmp_path / RULES.name).write_text(text.replace(before, after))
    shutil.copy(PROM / "tests" / test_file, tmp_path / "tests" / test_file)
    assert promtool("check", "rules", str(tmp_path / RULES.name)).returncode == 0
    result = promtool("test", "rules", str(tmp_path / "tests" / test_file))
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr, result.stdout
