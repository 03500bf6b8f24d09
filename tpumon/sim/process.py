"""Runs ``tpumon sim`` as a child process for ``tpumon agent --simulate``.

A separate process, not a thread: the agent then talks to it over gRPC exactly as to
libtpu, and the child's PID stands in for the training process that owns the chips, so
the host source's per-process RSS path runs too.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass

READY_PREFIX = "TPUMON_SIM_READY ports="
HOST_PREFIX = "TPUMON_SIM_HOST "  # one line per host of a simulated slice (--hosts N)


class SimulatorStartError(Exception):
    """The simulator child did not come up; the message says why in one line."""


@dataclass
class SimulatorProcess:
    """A running simulator child and the ports it serves on 127.0.0.1."""

    process: subprocess.Popen
    ports: list[int]

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def spawn_simulator(scenario: str, chips: int, chip_type: str, acceleration: float,
                    seed: int, timeout: float = 30.0, report_to: str | None = None,
                    max_lag: float = 0.0, start_time: float | None = None,
                    kernel_log: str | None = None) -> SimulatorProcess:
    """Start the child on free loopback ports and wait for its ready line; with
    ``report_to`` it also reports its step there, as an instrumented job would."""
    cmd = [sys.executable, "-m", "tpumon", "sim", "--listen", "127.0.0.1", "--port", "0",
           "--scenario", scenario, "--chips", str(chips), "--chip-type", chip_type,
           "--acceleration", repr(acceleration), "--seed", str(seed), "--max-lag", repr(max_lag),
           "--exit-with-parent"]
    if report_to:
        cmd += ["--report-to", report_to]
    if start_time is not None:
        cmd += ["--start-time", repr(start_time)]
    if kernel_log is not None:
        cmd += ["--kernel-log", kernel_log]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUMON_")}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(READY_PREFIX):
            ports = [int(p) for p in line[len(READY_PREFIX):].split(",")]
            return SimulatorProcess(proc, ports)
    SimulatorProcess(proc, []).stop()
    raise SimulatorStartError(f"the simulator did not start (exit status {proc.poll()})")
