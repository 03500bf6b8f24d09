"""The history store inside the agent: restart on the simulator, kill -9, full and
read-only disks. Real agent processes, a real simulator over gRPC, real file systems."""

import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from fake_runtime import chips_metrics
from test_sim_server import ManualClock
from tools import TPUMON, AgentProcess, clean_env, wait_for
from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
from tpumon.detect import ChipDetector, Verdict
from tpumon.metrics.collectors import build_registry
from tpumon.common.identity import Identity
from tpumon.sim.server import Simulator
from tpumon.sim.workload import Workload
from tpumon.sources.chips import inventory_for
from tpumon.sources.tpu_runtime import TpuRuntimeSource
from tpumon.state import AgentState
from tpumon.store.database import Retention, database_path, open_database
from tpumon.common.samples import Sample
from tpumon.store.resume import restore_detectors
from tpumon.store.writer import StoreWriter

HOST = "t1v-n-resume-w-0"


@pytest.mark.slow
def test_restart_mid_run_resumes_verdict_slope_and_forecast(tmp_path):
    """Two lives of the agent on one simulated job: after the second, every chip's
    assessment is exactly what one uninterrupted detector says about the same samples."""
    start = 1750000000.0
    workload = Workload("linear-leak", chips=2, seed=5, start_time=start,
                        leak_bytes_per_step=400_000, leak_chip_spread=0.0)
    clock = ManualClock(start)
    sim = Simulator(workload, clock, "127.0.0.1", [0], 2)
    sim.start()
    inventory = inventory_for("v4", 2)
    seen: dict[str, list[tuple[float, int, int]]] = {"0": [], "1": []}

    def life(polls: int, checkpoint_interval: float) -> Agent:
        db = open_database(tmp_path, Retention())
        detectors = restore_detectors(db, HOST)
        writer = StoreWriter(tmp_path, Retention(), db)
        writer.start()
        state = AgentState(Identity(host=HOST), inventory)
        source = TpuRuntimeSource("127.0.0.1", sim.ports, 1.0, inventory, clock=clock.now)
        agent = Agent(AgentInputs(state, source, OwnerScanner(dict, 60), 30.0,
                                  build_registry(lambda: state.current), detectors=detectors,
                                  store=writer, checkpoint_interval=checkpoint_interval))
        for _ in range(polls):
            snap = agent.poll_once()
            for chip, sample in snap.runtime.chips.items():
                seen[chip].append((snap.runtime.time, sample.hbm_used_bytes,
                                   sample.hbm_total_bytes))
            clock.t += 60.0
        source.close()
        writer.stop()  # what was polled is written; no last checkpoint: as after a crash
        return agent

    try:
        first = life(125, checkpoint_interval=0.0)  # a checkpoint at every poll
        # the first life ended with a fitted trend: the checkpoint has something to carry
        assert first.state.current.assessments["0"].window_seconds > 1800
        second = life(125, checkpoint_interval=3600.0)  # none in this life
    finally:
        sim.stop()
    for chip, samples in seen.items():
        t, used, total = (np.array(c, dtype=float) for c in zip(*samples, strict=True))
        reference = ChipDetector()
        reference.update(t, np.full(len(t), np.nan), used, total)
        resumed = second.state.current.assessments[chip]
        assert resumed == reference.assessment, chip
        assert second._detectors[chip].alert == reference.alert
    assert resumed.verdict is Verdict.LEAK and resumed.predicted_oom_time is not None


@pytest.mark.e2e
@pytest.mark.parametrize("write_delay", [0.0, 0.5])
def test_kill_9_loses_at_most_the_write_delay_and_the_restart_resumes(tmp_path, write_delay):
    """Polls wait up to store.write_delay to share a transaction: a kill -9 loses those
    (0.05 s polls: 10 in 0.5 s) and at most the one being written, nothing else."""
    state = tmp_path / "state"
    agent = AgentProcess(tmp_path, state, env={"TPUMON_STORE_CHECKPOINT_INTERVAL": "0.2",
                                               "TPUMON_STORE_WRITE_DELAY": str(write_delay)})
    try:
        wait_for(lambda: (agent.value("tpumon_store_polls_written_total") or 0) >= 60, 60)
        m = agent.metrics()
        runtime = (("source", "tpu_runtime"),)
        polled = (m[("tpumon_source_polls_total", runtime)]
                  - m[("tpumon_source_errors_total", runtime)])
        agent.proc.kill()
        agent.proc.wait(10)
    finally:
        agent.stop()
    conn = sqlite3.connect(database_path(state))
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = conn.execute("SELECT count(*) FROM samples").fetchone()[0] / 4  # polls of 4 chips
    assert stored >= polled - 1 - write_delay / 0.05, (stored, polled)
    assert conn.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 4
    conn.close()
    again = AgentProcess(tmp_path, state)
    try:
        wait_for(lambda: "resumed the trend of 4 chip(s)" in again.log(), 30)
        assert "4 from checkpoints" in again.log()
        wait_for(lambda: again.value("tpumon_store_up") == 1.0, 30)
    finally:
        assert again.stop() == 0
    assert "Traceback" not in again.log() + agent.log()


def _private_tmpfs_prefix(mountpoint: Path, size: str) -> tuple[str, ...]:
    """Run a command in its own mount namespace with a small tmpfs on ``mountpoint``,
    mounted read-only: a real file system that can be made writable and filled up from
    outside (nsenter, /proc/PID/root) without touching the host's."""
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")):
        pytest.skip("needs root, unshare(1) and nsenter(1) for a private tmpfs")
    # mode 0750: a tmpfs root is 1777 by default, and the agent refuses a state directory
    # others may write (docs/security.md)
    mount = f"mount -t tmpfs -o ro,size={size},mode=0750 tmpfs {mountpoint}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private tmpfs here: {probe.stderr.strip()}")
    return ("unshare", "-m", "sh", "-c", f'{mount} && exec "$@"', "sh")


@pytest.mark.e2e
def test_read_only_and_full_disks_are_reported_and_monitoring_goes_on(tmp_path):
    """The state directory starts on a read-only file system, which then becomes
    writable, then fills up, then has room again: each state is reported, logged once,
    and polling and /metrics never stop."""
    mount = Path(tempfile.mkdtemp(dir=tmp_path))
    agent = AgentProcess(tmp_path, mount, prefix=_private_tmpfs_prefix(mount, "2m"))
    inside = Path(f"/proc/{agent.proc.pid}/root{mount}")  # the agent's view of its tmpfs

    def polls() -> float:
        return agent.value("tpumon_source_polls_total", source="tpu_runtime") or 0

    def outage(kind: str) -> None:
        wait_for(lambda: agent.value("tpumon_store_error_info", kind=kind) == 1.0, 30)
        assert agent.value("tpumon_store_up") == 0.0
        before = polls()
        wait_for(lambda: polls() > before + 20, 30)  # polling goes on
        assert agent.value("tpumon_hbm_used_bytes", chip="0") > 0  # and so does exporting
        doc = json.loads(agent.get("/api/status"))
        assert doc["store"]["up"] is False and doc["store"]["error"]

    def recovered() -> None:
        wait_for(lambda: agent.value("tpumon_store_up") == 1.0, 90)
        written = agent.value("tpumon_store_polls_written_total")
        wait_for(lambda: agent.value("tpumon_store_polls_written_total") > written + 20, 30)

    try:
        outage("read_only")
        subprocess.run(["nsenter", "-t", str(agent.proc.pid), "-m", "mount", "-o",
                        "remount,rw", str(mount)], check=True)
        recovered()
        # Fill the disk, unbuffered: a buffered file keeps what the full disk refused and
        # tries it again at close, raising ENOSPC out of the `with`.
        with open(inside / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        outage("disk_full")
        (inside / "filler").unlink()
        recovered()
    finally:
        assert agent.stop() == 0
    log = agent.log()
    assert "Traceback" not in log
    assert len(re.findall(r"cannot open it: read-only", log)) == 1, log
    assert len(re.findall(r"cannot write: disk full", log)) == 1, log
    assert len(re.findall(r"writing again", log)) == 2, log


@pytest.mark.e2e
def test_one_off_status_leaves_the_history_store_alone(tmp_path):
    """`tpumon status --direct` builds an agent for one poll; it must not open (or create)
    the store the real agent owns."""
    env = clean_env()
    env["TPUMON_STORE_STATE_DIR"] = str(tmp_path / "state")
    result = subprocess.run([*TPUMON, "status", "--direct", "--runtime-ports", "1"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.e2e
def test_another_user_can_export_a_stopped_agents_store(tmp_path):
    """A person without write access to the state directory (the agent runs as root or
    its own user) can still export after the agent stopped and removed the WAL index."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv(1) to run as another user")
    state = Path(tempfile.mkdtemp())
    try:
        db = open_database(state, Retention())
        with db.transaction():
            db.add_samples(HOST, [("0", Sample(1750000000.0, 7, 5, 9))])
        db.close()
        state.chmod(0o755)
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                 *TPUMON, "export", "--state-dir", str(state)],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[1] == f"1750000000.000,{HOST},0,7,5,9"
        assert not any(p.name.endswith("-shm") for p in state.iterdir())
    finally:
        shutil.rmtree(state)


def test_a_stalled_disk_never_stalls_polling(tmp_path, runtime_servers):
    """Another process holds the database locked (as a hung disk would hold a write) for
    longer than the whole test: polls still complete, one after another, each in far less
    time than the lock lasts, with the store's queue growing; the queued polls are written
    once the lock goes. (How fast a poll is does not matter here, only that none waits
    for the writer: bench/store.py measures latency.)"""
    server = runtime_servers(chips_metrics({0: 2**30, 1: 2**31}))
    inventory = inventory_for("v4", 2)
    state = AgentState(Identity(host=HOST), inventory)
    writer = StoreWriter(tmp_path, Retention(), open_database(tmp_path, Retention()))
    writer.start()
    source = TpuRuntimeSource("127.0.0.1", [server.port], 1.0, inventory)
    agent = Agent(AgentInputs(state, source, OwnerScanner(dict, 60), 0.05,
                              build_registry(lambda: state.current), store=writer))
    try:
        agent.poll_once()
        assert writer.flush()
        written = writer.health.polls_written_total
        blocker = sqlite3.connect(database_path(tmp_path), isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")  # the writer now waits (busy timeout 5 s, retries)
        started = time.monotonic()
        for _ in range(10):
            agent.poll_once()
        assert time.monotonic() - started < 20.0  # writer-bound, they would take >= 50 s
        assert writer.health.polls_written_total == written  # the writer is stuck
        assert writer.health.queued_polls >= 9
        blocker.execute("ROLLBACK")
        blocker.close()
        wait_for(lambda: writer.health.polls_written_total == written + 10, 90)
    finally:
        source.close()
        writer.stop()
    assert writer.health.dropped_polls_total == 0
