"""`make demo` as the README tells it: the agent on its simulator, run twice into the same
state directory, then `tpumon export` and `tpumon analyze`; and what the first run shows:
one clock for every OOM forecast, and a log line when a leak is called."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from tools import AgentProcess, clean_env, wait_for

import pytest

pytestmark = pytest.mark.e2e  # real agents (and a browser): seconds each

TPUMON = [sys.executable, "-m", "tpumon"]
# make demo's scenario at 4x its pace (and polls 4x as often: the same 15 simulated s
# apart), so that each run calls its leak within about 20 s
DEMO = ("--scenario", "fast-leak", "--acceleration", "240", "--poll-interval", "0.0625",
        "--reporter-socket")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TPUMON, *args], capture_output=True, text=True, timeout=120,
                          env=clean_env(), stdin=subprocess.DEVNULL)


def demo_run(tmp_path, state, number: int) -> AgentProcess:
    return AgentProcess(tmp_path, state, *DEMO, str(tmp_path / f"r{number}.sock"))


def leaking(agent: AgentProcess) -> dict | None:
    doc = json.loads(agent.get("/api/status"))
    chips = doc["chips"]
    return doc if chips and all(c["verdict"] == "leak" for c in chips) else None


def test_two_demo_runs_then_export_and_analyze(tmp_path):
    """A second demo run once mixed its samples with the first's (its simulated clock
    started at now, behind where the first run's ended): export + analyze then said every
    chip was 'ok' with 958 restarts. A simulated run now continues the last one's clock:
    one restart, and the leak of the job that runs now."""
    state = tmp_path / "state"
    first = demo_run(tmp_path, state, 1)
    try:
        doc = wait_for(lambda: leaking(first), timeout=120, interval=0.5)
        check_one_clock(first, doc)
        check_the_log_says_so(first)
        check_the_pages_agree(first)
    finally:
        assert first.stop() == 0
    agent = demo_run(tmp_path, state, 2)
    try:  # it resumes the first run's detectors: wait for its own job's leak, after a restart
        wait_for(lambda: (agent.value("tpumon_job_restarts_total", chip="0") or 0) >= 1
                 and leaking(agent), timeout=120, interval=0.5)
        time.sleep(2)
    finally:
        assert agent.stop() == 0
    assert "refusing samples" not in agent.log()
    check_a_resumed_start_raises_nothing_it_drops(agent.log())
    exported = run("export", "--state-dir", str(state), "-o", str(tmp_path / "demo.csv"))
    assert exported.returncode == 0, exported.stderr
    analyzed = run("analyze", str(tmp_path / "demo.csv"), "--format", "json")
    assert analyzed.returncode == 0, analyzed.stderr
    series = json.loads(analyzed.stdout)
    series = series.get("series", series) if isinstance(series, dict) else series
    assert len(series) == 4
    for chip in series:
        assert chip["verdict"] == "leak", chip
        assert chip["restarts"] == 1, chip
    # the table says it too, as the README promises (only --format json did)
    table = run("analyze", str(tmp_path / "demo.csv"))
    assert table.returncode == 0, table.stderr
    assert table.stdout.count("\n  1 restart (") == 4, table.stdout


def check_a_resumed_start_raises_nothing_it_drops(log: str) -> None:
    """The second run once logged `verdict leak` and 8 "alert trigger" lines from the
    first run's saved state, then a second later "verdict warming_up (was leak)", with no
    resolve: the verdict from before the gap, raised and dropped. Alerts from a resumed
    state follow the live rules: raised on this run's own leak call, none dropped."""
    lines = log.splitlines()
    assert not [line for line in lines if "(was leak)" in line], log
    called = next(i for i, line in enumerate(lines) if re.search(r"verdict leak \(was ", line))
    triggers = [i for i, line in enumerate(lines) if "alert trigger" in line]
    assert triggers and min(triggers) > called, log  # none before this run's own call
    assert "alert resolve" not in log, log


def check_one_clock(agent: AgentProcess, doc: dict) -> None:
    """The table, the reason under it and Prometheus give one time to OOM (they once said
    22.4 h, 17.8 h: one on the wall clock, one on the simulated)."""
    chip = doc["chips"][0]
    left = chip["predicted_oom_time"] - doc["time"]
    said = float(re.search(r"OOM in ([\d.]+) h", chip["reason"]).group(1)) * 3600
    assert abs(said - left) < 0.15 * 3600 + 240, (chip["reason"], left)
    metric = agent.value("tpumon_oom_predicted_timestamp_seconds", chip="0")
    assert metric is not None
    # at 240x the forecast comes nearer 240 s per second: allow for the time between reads
    assert abs((metric - time.time()) - left) < 0.15 * 3600 + 240 * 10, (metric, left)
    check_one_number(agent)


def check_one_number(agent: AgentProcess) -> None:
    """`status`'s table, the reason under it and the index page write one poll's growth and
    time to OOM byte for byte alike (one status printed "495.4 KiB/step | 3.9 h" in its
    table and "grow 499.9 KiB/step; OOM in 4.1 h" in the reason). The three are read
    between two reads of /api/status that give the same reason: one assessment."""
    seen = []
    for _ in range(20):
        before = json.loads(agent.get("/api/status"))["chips"][0]
        table = run("status", "--agent", f"http://{agent.url}")
        page = agent.get("/")
        after = json.loads(agent.get("/api/status"))["chips"][0]
        assert table.returncode == 0, table.stderr
        seen.append((before["reason"], after["reason"]))
        if before["reason"] != after["reason"] or before["verdict"] != "leak":
            continue
        growth = re.search(r"[\d.]+ KiB/step", before["reason"]).group()
        left = re.search(r"OOM in ([\d.]+ h)", before["reason"]).group(1)
        row = next(line for line in table.stdout.splitlines() if re.match(r"\W*0\W", line))
        assert f" {growth} " in row and f" {left} " in row, (row, before["reason"])
        assert f"chip 0: leak: {before['reason']}" in table.stdout
        cells = re.search(r"<tr><td data-label='chip'>0</td>.*?</tr>", page, re.S).group()
        assert (f"<td data-label='growth' class='nowrap'>{growth}</td><td data-label='OOM in' "
                f"class='nowrap'>{left}</td>") in cells, cells
        return
    raise AssertionError(f"the assessment never held still across the reads: {seen}")


def check_the_pages_agree(agent: AgentProcess) -> None:
    """The index page and /report give the same verdicts (at 1200x, with polls 90
    simulated s apart, one said 'no significant growth' and the other 'saturating').
    /report replays the stored history, which trails the live detector by the writer's
    delay, so the two are compared at a moment the live verdicts hold still across the
    report's making (a few tries: the live verdict can still change meanwhile)."""
    seen = []
    for _ in range(4):
        time.sleep(5)
        before = index_verdicts(agent.get("/"))
        report = re.findall(r'class="verdict"[^>]*>(\w+)</span>', agent.get("/report",
                                                                          timeout=120))
        after = index_verdicts(agent.get("/"))
        seen.append((before, report, after))
        if before == after and len(report) == 4:
            assert report == before, seen
            return
    raise AssertionError(f"the live verdicts never held still: {seen}")


def index_verdicts(page: str) -> list[str]:
    return re.findall(r"<td data-label='leak detector'>(\w+): ", page)


def check_the_log_says_so(agent: AgentProcess) -> None:
    """Without Slack or PagerDuty the journal once said nothing when a leak was called."""
    said = (r"WARNING .*chip 0: verdict leak \(was [\w ]+\): (floor grows|all 4 chips of "
            r"process \d+ grow; this one) [\d.]+ KiB/step; OOM in [\d.]+ h; OOM at step "
            r"~[\d,]+ \(.* UTC\)")
    line = wait_for(lambda: re.search(said, agent.log()), timeout=10)
    assert line
    assert len(re.findall(r"chip 0: verdict leak", agent.log())) == 1
    # the leak warning waits for the process's tensor snapshots, and the journal says so:
    # in make demo's first 70 simulated minutes of `leak` it had the OOM page and no word
    # of the warning; then the warning comes, carrying them
    waits = "alert TPUMonHBMLeakSuspected on chip 0 waits up to 10 min for its process's " \
        "tensor snapshots"
    wait_for(lambda: waits in agent.log(), timeout=10)
    raised = wait_for(lambda: re.search(r"alert trigger: TPUMonHBMLeakSuspected on chip 0 .*",
                                        agent.log()), timeout=120).group()
    assert agent.log().index(waits) < agent.log().index(raised)
