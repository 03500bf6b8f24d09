"""A job's end through the real agent: the simulated job's HBM OOM (named, forecast
compared, one Slack message and one PagerDuty page, not again after an agent restart),
and a real reporting process that exits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from fake_alert_apis import FakeAlertAPI
from tools import TPUMON, AgentProcess, clean_env, free_port, wait_for

ROUTING_KEY = "R0UT1NGK3Y5ECRETR0UT1NGK3Y5ECRET"
#: The start of a real training process's script: a reporter on the socket in argv[1]
#: (a loop over `step` follows), for the tests that need a job without a framework.
REPORTING_JOB = ("import os, sys, time\nfrom tpumon.instrument import Reporter\n"
                 "class R(Reporter):\n    framework = 'jax'\n"
                 "    def framework_fields(self):\n        return {'live': 9}\n"
                 "r = R(socket=sys.argv[1], min_interval=0)\n")

pytestmark = pytest.mark.e2e  # real agents, a simulated job to its OOM


def ended(agent: AgentProcess) -> list[dict]:
    return json.loads(agent.get("/api/status"))["job_ends"]


def export_around_end(state, out) -> subprocess.CompletedProcess:
    """`tpumon export --around-end` of the store in ``state`` into ``out``, succeeded."""
    evidence = subprocess.run([*TPUMON, "export", "--state-dir", str(state), "--around-end",
                               "-o", str(out)], capture_output=True, text=True, timeout=60,
                              env=clean_env())
    assert evidence.returncode == 0, evidence.stderr
    return evidence


def test_the_simulated_jobs_hbm_oom_is_named_compared_and_told_once(tmp_path):
    with FakeAlertAPI("slack") as slack, FakeAlertAPI("pagerduty") as pagerduty:
        env = {"TPUMON_SLACK_WEBHOOK_URL": slack.url,
               "TPUMON_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
               "TPUMON_PAGERDUTY_URL": pagerduty.url}
        state = tmp_path / "state"
        agent = AgentProcess(tmp_path, state, "--scenario", "fast-leak", "--acceleration",
                             "960", "--reporter-socket", str(tmp_path / "r.sock"), env=env)
        try:
            [end] = wait_for(lambda: ended(agent), 240)
            assert end["cause"] == "hbm_oom", end
            # the last polls before the OOM caught the chip between 90 % and full, or its
            # floor plus in-step swing came there, which the evidence says (a sample within
            # 0.05 % of its HBM reads 100.0 %: the job dies when the next would not fit)
            assert re.match(r"chip \d( reached|'s floor plus its in-step swing came to) "
                            r"(9\d\.\d|100\.0)% of its HBM", end["evidence"]), end
            assert end["step"] > 0 and len(end["chips"]) == 4
            assert end["forecast"] and end["forecast"].endswith(f"died at step {end['step']:,}")
            assert "ended at step" in agent.log() and ": hbm_oom (" in agent.log()
            page = wait_for(lambda: next((r.body for r in pagerduty.requests
                                          if r.body.get("payload", {}).get("class") ==
                                          "TPUMonJobEnded"), None), 60)
            assert page["event_action"] == "trigger"
            assert page["payload"]["severity"] == "critical"
            assert f"ended at step {end['step']:,}: hbm_oom" in page["payload"]["summary"]
            wait_for(lambda: any("hbm_oom" in r.body.get("text", "") for r in slack.requests), 60)
            assert agent.value("tpumon_job_ends_total", cause="hbm_oom") == 1
            assert agent.value("tpumon_job_ends_total", cause="exited") == 0
            table = subprocess.run([*TPUMON, "status", "--agent", f"http://{agent.url}"],
                                   capture_output=True, text=True, timeout=60,
                                   env={**os.environ, "COLUMNS": "200"})
            assert f"ended at step {end['step']:,}: hbm_oom" in table.stdout
            time.sleep(3)
            assert len(ended(agent)) == 1  # the dead job's silence is not another end
        finally:
            assert agent.stop() == 0
        evidence = export_around_end(state, tmp_path / "end.csv")
        assert f"ended at step {end['step']:,}: hbm_oom" in evidence.stderr
        rows = (tmp_path / "end.csv").read_text().splitlines()[1:]
        assert {r.split(",")[2] for r in rows} == {"0", "1", "2", "3"}  # every chip's hour
        again = AgentProcess(tmp_path, state, "--scenario", "fast-leak", "--acceleration", "480",
                             env=env)
        try:
            time.sleep(5)
            assert ended(again) == []
        finally:
            assert again.stop() == 0
        triggers = [r for r in pagerduty.requests if r.body["event_action"] == "trigger"
                    and r.body["payload"]["class"] == "TPUMonJobEnded"]
        assert len(triggers) == 1, [r.body for r in pagerduty.requests]
        assert sum("hbm_oom" in r.body.get("text", "") and "Resolved" not in
                   r.body.get("text", "") for r in slack.requests) == 1


def test_a_real_reporting_process_that_exits_is_a_job_that_exited(tmp_path):
    """No simulator: the agent on this machine, a real process reporting its steps then
    exiting with memory far from full."""
    socket_path = tmp_path / "r.sock"
    agent = real_agent(tmp_path, socket_path, kernel_log="")
    try:
        code = (REPORTING_JOB +
                "for step in range(1, 31):\n    r.step(step)\n    time.sleep(0.05)\n"
                "time.sleep(1)\n")
        job = subprocess.run([sys.executable, "-c", code, str(socket_path)], timeout=60)
        assert job.returncode == 0
        [end] = wait_for(lambda: ended(agent), 30)
        assert (end["cause"], end["step"], end["framework"]) == ("exited", 30, "jax"), end
        assert end["evidence"].startswith("memory far from full at the last poll: no chips "
                                          "held, host memory"), end
        assert f"training job pid {end['pid']} (jax) ended at step 30: exited" in agent.log()
    finally:
        assert agent.stop() == 0


def test_an_end_held_for_its_last_words_is_told_when_the_agent_stops(tmp_path):
    """A job killed by SIGKILL says nothing; its end is held a poll for words still on
    their way. The agent stopped within that poll (polls 10 s apart here): the end is
    told as it stops (it was lost: no log line, no stored end)."""
    socket_path = tmp_path / "r.sock"
    agent = real_agent(tmp_path, socket_path, "", "--poll-interval", "10")
    try:
        code = REPORTING_JOB + "for step in range(1, 31):\n    r.step(step)\ntime.sleep(600)\n"
        job = subprocess.Popen([sys.executable, "-c", code, str(socket_path)])
        polls = lambda: json.loads(agent.get("/api/status"))["polls_total"]  # noqa: E731
        seen = wait_for(lambda: any(p["pid"] == job.pid for p in json.loads(
            agent.get("/api/status"))["processes"]) and polls(), 30)
        # killed just after a poll, so the next (10 s later) is the first to find it gone
        # and holds it; one under way at the kill could have held it already
        just = wait_for(lambda: polls() > seen and polls(), 30, 0.02)
        job.kill()
        job.wait()
        wait_for(lambda: polls() > just, 30, 0.1)
        assert ended(agent) == [] and "ended at step" not in agent.log()
    finally:
        assert agent.stop() == 0
    said = [line for line in agent.log().splitlines() if f"pid {job.pid} (jax)" in line]
    assert len(said) == 1 and "ended at step 30" in said[0], agent.log()


def real_agent(tmp_path, socket_path, kernel_log: str, *extra: str) -> AgentProcess:
    """`tpumon agent` on this machine (no TPU: its runtime source is down), with a reporter
    socket and no history store."""
    return AgentProcess(tmp_path, None, "--runtime-ports", str(free_port()), *extra,
                        simulate=False,
                        env={"TPUMON_REPORTER_SOCKET": str(socket_path),
                             "TPUMON_STORE_STATE_DIR": "",
                             "TPUMON_AGENT_KERNEL_LOG": kernel_log})


def test_the_simulated_job_that_finishes_is_a_job_that_exited(tmp_path):
    """The job-exit scenario: three simulated hours, then a clean exit with HBM far from
    full; the agent names it exited, with the step: Slack is told, PagerDuty (critical
    only, by default) is not paged."""
    with FakeAlertAPI("slack") as slack, FakeAlertAPI("pagerduty") as pagerduty:
        agent = AgentProcess(tmp_path, None, "--scenario", "job-exit", "--acceleration", "960",
                             "--reporter-socket", str(tmp_path / "r.sock"),
                             env={"TPUMON_SLACK_WEBHOOK_URL": slack.url,
                                  "TPUMON_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
                                  "TPUMON_PAGERDUTY_URL": pagerduty.url})
        try:
            [end] = wait_for(lambda: ended(agent), 120)
            assert end["cause"] == "exited", end
            assert end["evidence"].startswith("memory far from full at the last poll: HBM at "
                                              "most"), end
            assert end["step"] > 0 and end["forecast"] is None
            assert agent.value("tpumon_job_ends_total", cause="exited") == 1
            wait_for(lambda: any(f"ended at step {end['step']:,}: exited" in r.body.get("text", "")
                                 for r in slack.requests), 60)
            assert not any(r.body.get("payload", {}).get("class") == "TPUMonJobEnded"
                           for r in pagerduty.requests)
        finally:
            assert agent.stop() == 0


def _memory_cgroup():
    """A memory cgroup (v1) this test may create, or None (see test_job_ends.py)."""
    from test_job_ends import _own_memcg

    return _own_memcg()


@pytest.mark.skipif(os.geteuid() != 0 or _memory_cgroup() is None or
                    not os.access("/dev/kmsg", os.R_OK),
                    reason="needs root, a writable memory cgroup (v1) and /dev/kmsg")
def test_a_real_job_killed_for_host_memory_is_a_host_oom(tmp_path):
    """The agent on this machine reading the real kernel log; a real Python loop reports
    its steps, then allocates host memory until the kernel's OOM killer ends it under a
    64 MiB cgroup limit."""
    cgroup = _memory_cgroup() / f"tpumon-agent-test-{os.getpid()}"
    cgroup.mkdir()
    socket_path = tmp_path / "r.sock"
    agent = real_agent(tmp_path, socket_path, kernel_log="/dev/kmsg")
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(64 << 20))
        code = (REPORTING_JOB + "open(sys.argv[2], 'w').write(str(os.getpid()))\nkept = []\n"
                "for step in range(1, 1000000):\n    r.step(step)\n"
                "    if step > 20:\n        kept.append(bytearray(4 << 20))\n"
                "    time.sleep(0.05)\n")
        job = subprocess.Popen([sys.executable, "-c", code, str(socket_path),
                                str(cgroup / "cgroup.procs")])
        assert job.wait(120) == -9  # SIGKILL: the kernel's OOM killer
        [end] = wait_for(lambda: ended(agent), 30)
        assert end["cause"] == "host_oom" and end["pid"] == job.pid, end
        assert f"Killed process {job.pid}" in end["evidence"], end
        assert 20 <= end["step"] < 40, end
    finally:
        assert agent.stop() == 0
        cgroup.rmdir()


def test_the_simulated_job_killed_for_host_memory_is_a_host_oom(tmp_path):
    """The host-oom scenario: after two simulated hours the simulated kernel writes its
    OOM-kill line for the job's process, which the agent (under --simulate) reads as its
    kernel log: the end is host_oom on the kernel's word, and pages."""
    with FakeAlertAPI("pagerduty") as pagerduty:
        agent = AgentProcess(tmp_path, None, "--scenario", "host-oom", "--acceleration", "960",
                             "--reporter-socket", str(tmp_path / "r.sock"),
                             env={"TPUMON_PAGERDUTY_ROUTING_KEY": ROUTING_KEY,
                                  "TPUMON_PAGERDUTY_URL": pagerduty.url})
        try:
            [end] = wait_for(lambda: ended(agent), 120)
            assert end["cause"] == "host_oom", end
            assert f"Out of memory: Killed process {end['pid']} (python3)" in end["evidence"]
            page = wait_for(lambda: next((r.body for r in pagerduty.requests if r.body.get(
                "payload", {}).get("class") == "TPUMonJobEnded"), None), 60)
            assert page["payload"]["severity"] == "critical"
        finally:
            assert agent.stop() == 0


def test_a_job_that_pauses_for_a_checkpoint_has_not_ended(tmp_path):
    """A real reporting process that stops stepping for a while (a checkpoint, an eval)
    is alive: no end while it pauses, one when it exits, at its last step."""
    socket_path = tmp_path / "r.sock"
    agent = real_agent(tmp_path, socket_path, kernel_log="")
    try:
        code = (REPORTING_JOB +
                "for step in range(1, 41):\n    r.step(step)\n    time.sleep(0.05)\n"
                "    if step == 20:\n        print('paused', flush=True)\n"
                "        sys.stdin.readline()\n")
        job = subprocess.Popen([sys.executable, "-c", code, str(socket_path)], text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert job.stdout.readline() == "paused\n"
        wait_for(lambda: any(p["pid"] == job.pid and p["step"] == 20 for p in
                             json.loads(agent.get("/api/status"))["processes"]), 30)
        time.sleep(5)  # 25 polls of a paused job
        assert ended(agent) == []
        job.stdin.write("go on\n")
        job.stdin.close()
        assert job.wait(60) == 0
        [end] = wait_for(lambda: ended(agent), 30)
        assert (end["pid"], end["step"], end["cause"]) == (job.pid, 40, "exited"), end
    finally:
        assert agent.stop() == 0


def test_a_jobs_last_words_reach_the_store_export_and_report(tmp_path):
    """A real reporting process dies of an XLA out-of-memory error (its real TPU wording,
    https://github.com/erfanzar/EasyDeL/issues/166) beside the simulated healthy job: the
    end is hbm_oom with the program's need and its largest allocation, and the same words
    are what `tpumon export --around-end` names and `tpumon report` shows. (The simulator
    runs at real time: the end of a process that holds no chip is dated on the wall clock,
    and the samples kept for it are the simulated chips' of the hour before.)"""
    from pathlib import Path

    socket_path, state = tmp_path / "r.sock", tmp_path / "state"
    wording = (Path(__file__).parent / "fixtures" / "last_words" /
               "easydel_166_compile.txt").read_text()
    agent = AgentProcess(tmp_path, state, "--scenario", "healthy", "--acceleration", "1",
                         "--reporter-socket", str(socket_path))
    try:
        code = (REPORTING_JOB + "for step in range(1, 31):\n    r.step(step)\n"
                "    time.sleep(0.05)\n"
                "class XlaRuntimeError(Exception):\n    pass\n"
                f"raise XlaRuntimeError({wording!r})\n")
        job = subprocess.run([sys.executable, "-c", code, str(socket_path)], timeout=60,
                             capture_output=True, text=True)
        assert job.returncode == 1 and "XlaRuntimeError" in job.stderr
        [end] = wait_for(lambda: ended(agent), 30)
        assert end["cause"] == "hbm_oom", end
        detail = ("the program needed 63.80 GiB of 30.75 GiB of hbm; largest: f32[32,4096,4096] "
                  "2.00 GiB at attention_module.py:1059 (dot_general) (XlaRuntimeError at "
                  "<string>:")
        assert detail in end["summary"] and detail in agent.log()
        assert end["last_words"]["oom"]["program_bytes"] == round(63.80 * 2**30)
        time.sleep(2)  # the store's writer takes the end
    finally:
        assert agent.stop() == 0
    evidence = export_around_end(state, tmp_path / "end.csv")
    assert detail in evidence.stderr
    page = subprocess.run([*TPUMON, "report", "--state-dir", str(state), "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                          env=clean_env())
    assert page.returncode == 0, page.stderr
    html = "".join(p.read_text() for p in (tmp_path / "out").glob("*.html"))
    assert detail.replace("<string>", "&lt;string&gt;") in html
