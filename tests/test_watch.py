"""`tpumon watch` in a real terminal: tmux at 80 columns, keys sent, the screen captured."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import TPUMON, AgentProcess, clean_env, free_port, require_tool, wait_for

pytestmark = pytest.mark.e2e  # starts agents or external servers: seconds each

COLUMNS, ROWS = 80, 30


class Tmux:
    """A private tmux server with one 80x30 session running ``command``."""

    def __init__(self, tmp: Path, command: str, rows: int = ROWS) -> None:
        self.tmux = require_tool("tmux")
        self.name = f"tpumon-test-{os.getpid()}-{len(list(tmp.iterdir()))}"
        self.exit_file = tmp / "exit-status"
        self.raw = tmp / "raw-output"
        env = clean_env()
        env.update(TERM="xterm-256color")
        self.run("new-session", "-d", "-s", "w", "-x", str(COLUMNS), "-y", str(rows),
                 f"{command}; echo $? > {self.exit_file}; sleep 60", env=env)

    def run(self, *args: str, env: dict | None = None) -> str:
        return subprocess.run([self.tmux, "-L", self.name, *args], capture_output=True,
                              text=True, env=env, timeout=30, check=True).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "w")

    def record(self) -> None:
        """Everything the program writes from now on, escape codes and all."""
        self.run("pipe-pane", "-t", "w", "-o", f"cat >> {self.raw}")

    def quit(self) -> None:
        """Ctrl-C, as a person quits: the command must exit with status 0."""
        self.run("send-keys", "-t", "w", "C-c")
        wait_for(self.exit_file.exists, 20)
        assert self.exit_file.read_text().strip() == "0"

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.name, "kill-server"], capture_output=True)


@pytest.fixture
def agent(tmp_path):
    a = AgentProcess(tmp_path, None, "--reporter-socket", str(tmp_path / "r.sock"))
    yield a
    a.stop()


def test_watch_shows_every_chip_in_80_columns_without_flicker_and_quits_on_ctrl_c(
        tmp_path, agent):
    term = Tmux(tmp_path, f"{sys.executable} -m tpumon watch --agent http://{agent.url} "
                          "--interval 0.2")
    try:
        reporting = re.compile(r"^\s*\d+\s+sim\s+[\d,]+\s+[\d.]+", re.M)  # pid, step, rate
        screen = wait_for(lambda: (s := term.screen()) and reporting.search(s) and s, 60)
        term.record()
        lines = screen.splitlines()
        assert all(len(line) <= COLUMNS for line in lines)
        assert "…" not in screen, screen  # nothing cut short at 80 columns
        header = next(line for line in lines if line.startswith("Chip"))
        for column in ("HBM used", "Floor", "Growth", "OOM in", "Verdict", "Duty"):
            assert column in header
        # sizes as every other view writes them (it once wrote "31.7Gi" for "31.75 GiB")
        rows = [line for line in lines
                if re.match(r"\s+[0-3]\s+\S+ \d+\.\d\d GiB/\d+\.\d\d GiB", line)]
        assert len(rows) == 4, screen
        time.sleep(2)  # ~10 refreshes, recorded
        assert term.screen() != screen  # it is live: the clock and the step moved on
        raw = term.raw.read_bytes()
        assert raw.count(b"\x1b[H") >= 3  # each refresh redraws in place from the top ...
        assert b"\x1b[2J" not in raw and b"\x1b[J" not in raw  # ... never clears the screen
        term.quit()
        assert "Traceback" not in term.screen()
    finally:
        term.close()


def test_watch_without_an_agent_polls_the_runtime(tmp_path):
    port = free_port()
    sim = subprocess.Popen([*TPUMON, "sim", "--port", str(port), "--chips", "2"],
                           stderr=subprocess.DEVNULL)
    term = Tmux(tmp_path, f"{sys.executable} -m tpumon watch --direct --runtime-ports {port} "
                          "--interval 0.2")
    try:
        screen = wait_for(lambda: (s := term.screen()) and re.search(r"^\s+1\s+\S+ \d", s, re.M)
                          and s, 60)
        assert "runtime (no agent)" in screen
        term.quit()
    finally:
        term.close()
        sim.terminate()
        sim.wait(10)


def test_watch_keeps_going_when_the_agent_is_away(tmp_path):
    term = Tmux(tmp_path, f"{sys.executable} -m tpumon watch --agent "
                          f"http://127.0.0.1:{free_port()} --interval 0.2")
    try:
        wait_for(lambda: "no agent answering" in term.screen(), 60)
        term.quit()
    finally:
        term.close()


FAST = ("--scenario", "fast-leak", "--acceleration", "240", "--poll-interval", "0.0625")


def test_watch_fits_80x24_with_a_leak_and_its_forecast(tmp_path):
    """Once growth and an OOM forecast are shown, every cell still fits 80 columns
    (the header read 'OOM …', cells '22.5…' and '+118.7K/…')."""
    agent = AgentProcess(tmp_path, None, *FAST, "--reporter-socket", str(tmp_path / "r.sock"))
    term = Tmux(tmp_path, f"{sys.executable} -m tpumon watch --agent http://{agent.url} "
                          "--interval 0.3", rows=24)
    try:
        screen = wait_for(lambda: (s := term.screen()) and re.search(
            r"^\s+0 .* \d+\.\d h\s+leak\s+\d[\d.]* KiB/step", s, re.M) and s, 120)
        lines = screen.splitlines()
        assert all(len(line) <= COLUMNS for line in lines)
        assert "…" not in screen, screen
        header = next(line for line in lines if line.lstrip().startswith("Chip"))
        for column in ("HBM used", "OOM in", "Verdict", "Growth"):
            assert column in header, header
        term.quit()
    finally:
        term.close()
        agent.stop()


def test_watch_and_status_without_a_terminal(tmp_path):
    """Piped, watch printed nothing and never exited; status cut verdicts short."""
    agent = AgentProcess(tmp_path, None)
    try:
        proc = subprocess.Popen([*TPUMON, "watch", "--agent", f"http://{agent.url}",
                                 "--interval", "0.2"], stdout=subprocess.PIPE, text=True,
                                env=clean_env())
        try:
            first = [proc.stdout.readline() for _ in range(4)]
            assert first[0].startswith("tpumon watch ") and "Chip" in first[2], first
            assert not any("\x1b" in line for line in first)
        finally:
            proc.terminate()
            proc.wait(10)
        status = subprocess.run([*TPUMON, "status", "--agent", f"http://{agent.url}"],
                                capture_output=True, text=True, env=clean_env(), timeout=60)
        assert status.returncode == 0 and "…" not in status.stdout, status.stdout
        assert re.search(r"collecting|warming up|ok|leak", status.stdout)  # as watch writes them
    finally:
        agent.stop()


@pytest.mark.parametrize("verdict", ["step_change", "insufficient_data", "warming_up", "leak"])
def test_every_verdict_keeps_the_floor_in_80_columns(verdict):
    """A chip that stepped up lost its Floor column (the one that matters for a step change)
    once views wrote the verdict as "step change", three characters wider than watch's
    own "step chg" had been."""
    from tpumon.cli.watch import chip_table

    GiB = 2**30
    chip = {"chip": "0", "up": True, "hbm_used_bytes": 31 * GiB, "hbm_total_bytes": 32 * GiB,
            "duty_cycle": 0.97, "verdict": verdict, "floor_bytes": 27.5 * GiB,
            "growth_bytes_per_step": 466.4 * 1024, "growth_bytes_per_hour": 2.2 * GiB,
            "time_to_oom_seconds": 5400.0, "predicted_oom_time": None}
    table = chip_table({"time": 0.0, "chips": [chip]}, width=80)
    assert "Floor" in [c.header for c in table.columns]
