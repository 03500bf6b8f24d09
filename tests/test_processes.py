"""Reporting processes: verdicts from live counts and RSS, host-side leaks, exited
processes, known framework issues. Real reports over the real socket where it matters."""

import json
import os
import subprocess
import sys
import time

import pytest

from tools import wait_for
from tpumon.instrument.protocol import PROTOCOL_VERSION
from tpumon.diagnose.known_issues import KNOWN_ISSUES, known_issue, parse_version
from tpumon.diagnose.processes import ProcessTracker, chip_processes, with_hbm_growth
from tpumon.sources.reports import ReporterSocket, parse_report


def report(step: int, live: int | None, rss: int, framework: str = "torch_xla",
           version: str | None = None) -> bytes:
    doc = {"v": PROTOCOL_VERSION, "framework": framework, "step": step, "time": 1.0,
           "live": live, "rss": rss, "compiles": {"cached": 1, "uncached": 1}}
    if version:
        doc["fv"] = version
    return json.dumps(doc).encode()


def states(tmp_path, points, pid=None, **kwargs):
    """A ReporterSocket fed (step, live, rss) reports of one pid, and the tracker's view."""
    pid = pid or os.getpid()
    r = ReporterSocket(tmp_path / "r.sock")
    for step, live, rss in points:
        r._record(parse_report(report(step, live, rss, **kwargs), pid, 0, time.time()))
    return ProcessTracker().update(r.poll(), host_available=8 << 30)[pid]


def test_a_live_count_that_rises_alone_is_growing_not_a_leak(tmp_path):
    """The SPMD false alarm: the count rose one a step while no memory grew."""
    state = states(tmp_path, [(s, 100 + s, 1 << 30) for s in range(1, 400)])
    assert state.live.growing and state.live.per_step == pytest.approx(1.0)
    assert state.verdict == "growing" and state.host_verdict == "ok"
    told = with_hbm_growth({1: state}, {"0": 1}, ["0"])[1]
    assert told.verdict == "leak"  # HBM grows on its chip: now it is one
    assert "kept alive across steps" in told.diagnosis().text


def test_a_process_without_a_live_count_says_why_its_verdict_is_unknown(tmp_path):
    """The simulated process's verdict read `unknown` in `status`, with no reason."""
    from rich.console import Console

    from tpumon.cli.status import render_processes
    from tpumon.web.status import _process

    state = states(tmp_path, [(s, None, 1 << 30) for s in range(1, 50)])
    assert state.verdict == "unknown" and "no live-tensor count" in state.verdict_reason
    console = Console(width=200, record=True, color_system=None)
    render_processes([{**_process(4242, state), "tensor_snapshot": None}], console)
    assert "pid 4242: unknown: it reports no live-tensor count" in console.export_text()


def test_a_live_count_and_rss_rising_together_is_a_leak(tmp_path):
    """On a CPU backend device buffers are host memory: both grow."""
    state = states(tmp_path, [(s, 100 + s, (1 << 30) + s * (1 << 20)) for s in range(1, 400)])
    assert state.verdict == "leak" and state.host_verdict == "leak"
    assert state.diagnosis().code == "retained_tensors"


def test_host_memory_growing_with_flat_tensors_is_a_host_leak_with_a_forecast(tmp_path):
    state = states(tmp_path, [(s, 50, (1 << 30) + s * (256 << 10)) for s in range(1, 1000)])
    assert state.verdict == "ok" and state.host_verdict == "leak"
    assert state.rss.per_step == pytest.approx(256 << 10, rel=0.01)
    assert state.host_oom_steps == pytest.approx((8 << 30) / (256 << 10), rel=0.01)
    cause = state.diagnosis()
    assert cause.code == "host_memory"
    assert cause.text.startswith("host memory (RSS) grows 256.0 KiB per step while live "
                                 "tensors stay flat")


@pytest.mark.parametrize("shape", ["noise", "warm-up", "one-off jump", "sawtooth"])
def test_healthy_rss_shapes_are_not_host_leaks(tmp_path, shape):
    import random

    rng = random.Random(7)
    base = 2 << 30

    def rss(step: int) -> int:
        if shape == "noise":
            return base + rng.randint(-(8 << 20), 8 << 20)
        if shape == "warm-up":  # caches fill in the first 100 steps, then flat
            return base + min(step, 100) * (4 << 20)
        if shape == "one-off jump":  # an eval's buffers, kept
            return base + (200 << 20) * (step > 500)
        return base + (step % 50) * (2 << 20)  # gc sawtooth
    state = states(tmp_path, [(s, 50, rss(s)) for s in range(1, 1500)])
    assert state.host_verdict == "ok", state.rss


def test_a_known_framework_issue_is_named_with_its_fix(tmp_path):
    old = states(tmp_path, [(s, 100 + s, (1 << 30) + s * (1 << 20)) for s in range(1, 400)],
                 version="2.6.0+libtpu")
    assert "pytorch/xla/issues/8809" in old.diagnosis().text
    assert "clone" in old.diagnosis().text
    new = states(tmp_path, [(s, 100 + s, (1 << 30) + s * (1 << 20)) for s in range(1, 400)],
                 version="2.9.0")
    assert "8809" not in new.diagnosis().text


def test_the_known_issue_table_is_well_formed():
    for issue in KNOWN_ISSUES:
        assert issue.link.startswith("https://") and issue.fix and issue.symptom
        assert issue.fixed is None or parse_version(issue.fixed) is not None
    assert parse_version("2.9.0+git1a2b") == (2, 9, 0) and parse_version("dev") is None
    assert known_issue("torch_xla", "2.6.1", "retained_tensors") is not None
    assert known_issue("torch_xla", "2.7.0", "retained_tensors") is None
    assert known_issue("torch_xla", "2.6.1", "recompilation") is None
    assert known_issue("jax", "0.4.1", "retained_tensors") is None
    assert known_issue("torch_xla", None, "retained_tensors") is None


def test_jax_reports_between_two_counts_keep_the_last_count(tmp_path):
    r = ReporterSocket(tmp_path / "r.sock")
    for step, live in ((1, 40), (2, None), (3, None)):
        r._record(parse_report(report(step, live, 1 << 30, "jax"), os.getpid(), 0, time.time()))
    reading = r.poll()
    assert reading.processes[os.getpid()].live == 40
    assert [p.live for p in reading.points[os.getpid()]] == [40, None, None]


def test_an_exited_process_is_marked_at_the_next_poll_and_drives_no_chip(tmp_path):
    """Its pid is gone: exited within one poll (it used to look live for 5 minutes), no
    chip's step comes from it, and a snapshot request to it ends at once."""
    r = ReporterSocket(tmp_path / "run" / "r.sock")
    r.start()
    try:
        child = _reporting_child(r.path)
        reading = wait_for(lambda: (lambda now: now if child.pid in now.processes else None)(
            r.poll()), 10)
        tracker = ProcessTracker()
        assert not reading.processes[child.pid].exited
        states_now = tracker.update(reading)
        assert chip_processes(["0"], {}, states_now) == {"0": child.pid}
        child.stdin.close()
        child.wait(10)
        reading = r.poll()
        assert reading.processes[child.pid].exited
        assert chip_processes(["0"], {}, tracker.update(reading)) == {}
        asked = r.request_snapshot(child.pid, 10, "test")
        assert asked.error == f"process {child.pid} has exited" and not asked.pending
    finally:
        r.stop()


def _reporting_child(path, snapshots: bool = False) -> subprocess.Popen:
    """A process that reports step 1 (saying it takes snapshots, or not), then waits for
    its stdin to close and exits without stepping again."""
    live_module = "    live_module = 'tpumon.instrument.live_jax'\n" if snapshots else ""
    code = ("import sys\nfrom tpumon.instrument import Reporter\n"
            "class R(Reporter):\n"
            "    framework = 'jax'\n" + live_module +
            "    def framework_fields(self):\n"
            "        return {'live': 5, 'ordinal': 0}\n"
            "r = R(socket=sys.argv[1], min_interval=0)\n"
            "r.step(1)\nsys.stdin.readline()\n")
    return subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE)


def test_a_request_open_when_the_process_exits_ends_at_the_next_poll(tmp_path):
    r = ReporterSocket(tmp_path / "run" / "r.sock")
    r.start()
    try:
        child = _reporting_child(r.path, snapshots=True)
        wait_for(lambda: r.poll() and child.pid in r._latest, 10)
        asked = r.request_snapshot(child.pid, 1000, "test")
        assert asked.pending, asked
        child.stdin.close()
        child.wait(10)
        result = r.poll().snapshots[child.pid]
        assert not result.pending and result.error == \
            f"process {child.pid} exited before answering"
    finally:
        r.stop()


@pytest.mark.e2e
def test_tpumon_snapshot_fails_at_once_when_its_target_exits(tmp_path):
    """It used to wait ~300 s in silence; now: one line, non-zero, within a few polls."""
    from tools import TPUMON, AgentProcess

    sock = tmp_path / "reporter.sock"
    agent = AgentProcess(tmp_path, None, "--reporter-socket", str(sock),
                         "--scenario", "healthy")
    try:
        child = _reporting_child(sock, snapshots=True)
        wait_for(lambda: f'"pid": {child.pid}' in agent.get("/api/status")
                 .replace('"pid":', '"pid": ').replace(":  ", ": "), 30)
        asking = subprocess.Popen([*TPUMON, "snapshot", "--agent", f"http://{agent.url}",
                                   "--pid", str(child.pid), "--steps", "100"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        assert asking.poll() is None  # waiting for an answer that will not come
        started = time.monotonic()
        child.stdin.close()
        child.wait(10)
        out, err = asking.communicate(timeout=60)
        assert asking.returncode == 1 and time.monotonic() - started < 15, (out, err)
        assert f"process {child.pid} exited before answering" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        again = subprocess.run([*TPUMON, "snapshot", "--agent", f"http://{agent.url}",
                                "--pid", str(child.pid)], capture_output=True, text=True,
                               timeout=60)
        assert again.returncode == 1 and "has exited" in again.stderr, again.stderr
    finally:
        agent.stop()
