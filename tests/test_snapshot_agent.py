"""Tensor snapshots through the whole agent: the simulated job's reporter answers, a leak
called by the detector asks by itself, and the finding reaches Slack, /api/status, the
metrics, `tpumon status` and `tpumon snapshot`."""

import json
import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fake_alert_apis import FakeAlertAPI
from tools import DENSE_POLLS, TPUMON, AgentProcess, wait_for

pytestmark = pytest.mark.e2e  # starts agents or external servers: seconds each


def finished_snapshot(agent: AgentProcess) -> dict | None:
    for p in json.loads(agent.get("/api/status"))["processes"]:
        found = p.get("tensor_snapshot")
        if found and not found["pending"]:
            return {**found, "pid": p["pid"]}
    return None


def agent_view(agent: AgentProcess) -> str:
    """What the agent had, for a failure's message: each chip's verdict, growth and
    process, each process's snapshot request, and the log's tail."""
    status = json.loads(agent.get("/api/status"))
    verdicts = {c["chip"]: (c["verdict"], c["reason"], c["growth_bytes_per_step"],
                            c["owner_pid"], c["reporting_pid"], c["step"])
                for c in status["chips"]}
    asked = [(p["pid"], p.get("step"), p.get("tensor_snapshot")) for p in status["processes"]]
    return f"verdicts {verdicts}; processes {asked}; log:\n{agent.log()[-3000:]}"


@pytest.mark.timeout(600)  # about a minute; the waits below bound it on a loaded machine
def test_a_called_leak_brings_snapshots_that_name_the_leaking_tensor(tmp_path):
    socket_path = tmp_path / "reporter.sock"
    with FakeAlertAPI("slack") as slack:
        agent = AgentProcess(
            tmp_path, None, "--scenario", "linear-leak", "--acceleration", "480",
            "--poll-interval", "0.1", "--reporter-socket", str(socket_path),
            env={"TPUMON_SLACK_WEBHOOK_URL": slack.url, **DENSE_POLLS})
        try:
            try:  # the leak is called some 5 simulated hours in: ~40 s at 480x
                found = wait_for(lambda: finished_snapshot(agent), 240)
            except AssertionError as e:
                raise AssertionError(f"{e}: {agent_view(agent)}") from None
            assert found["reason"].startswith("leak on chip ") and found["error"] is None
            assert found["to_step"] - found["from_step"] >= 100
            groups = {g["group"]: g for g in found["grown"]}
            leaked = [g for name, g in groups.items() if name.startswith("f32[")]
            assert leaked and all(g["count_per_step"] == 1.0 for g in leaked)
            assert all(g["sites"] for g in leaked)
            assert found["summary"].startswith("likely leak: +1 f32[")
            assert 0.5 <= (found["explained_fraction"] or 0) <= 1.0, (  # the chips' HBM slope
                found, agent_view(agent))
            leak_message = wait_for(lambda: next(  # one alert a message: find the leak's
                (r.body["text"] for r in slack.requests
                 if "TPUMonHBMLeakSuspected" in r.body["text"]), None), 120)
            assert "Tensor snapshots: likely leak: +1 f32[" in leak_message
            metrics = agent.get("/metrics")
            grown = [s for f in text_string_to_metric_families(metrics)
                     if f.name == "tpumon_tensor_growth_per_step" for s in f.samples]
            assert 1 <= len(grown) <= 3 and all(s.value == 1.0 for s in grown)
            assert "tpumon_tensor_growth_explained_ratio{" in metrics, agent_view(agent)
            shown = subprocess.run([*TPUMON, "status", "--agent", f"http://{agent.url}"],
                                   capture_output=True, text=True, timeout=60,
                                   env={**os.environ, "COLUMNS": "200"})
            assert f"pid {found['pid']}: tensor snapshots, steps" in shown.stdout
            asked = subprocess.run([*TPUMON, "snapshot", "--agent", f"http://{agent.url}",
                                    "--steps", "500", "--timeout", "120"],
                                   capture_output=True, text=True, timeout=180,
                                   env={**os.environ, "COLUMNS": "200"})
            assert asked.returncode == 0, asked.stderr
            assert "(asked): likely leak: +1 f32[" in asked.stdout
            assert "tensor groups that grew" in asked.stdout
        finally:
            assert agent.stop() == 0
        assert "Traceback" not in agent.log()


def test_tpumon_snapshot_without_an_agent_is_one_error_line(tmp_path):
    done = subprocess.run([*TPUMON, "snapshot", "--agent", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("Error: no agent answering at http://127.0.0.1:9")
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_table_says_how_to_record_creation_sites_when_none_were(capsys):
    """A torch_xla snapshot without TPUMON_TRACK_SITES: "-" in the table, and the hint."""
    from rich.console import Console

    from tpumon.cli.snapshot import SITES_HINT, _render

    result = {"pending": False, "error": None, "reason": "", "steps": 10, "from_step": 1,
              "to_step": 11, "summary": "likely leak: +1 f32[] per step",
              "grown": [{"group": "f32[]", "count_per_step": 1.0, "bytes_per_step": 4.0,
                         "bytes_each": 4.0, "count_delta": 10, "sites": {}}]}
    _render(7, result, Console(width=200))
    out = capsys.readouterr().out
    assert "TPUMON_TRACK_SITES=1" in out and SITES_HINT.split(":")[0] in out
    result["grown"][0]["sites"] = {"train.py:3 (x)": 10}
    _render(7, result, Console(width=200))
    assert "TPUMON_TRACK_SITES" not in capsys.readouterr().out
