"""`tpumon status --slice` at pod scale (issue 44, item 2): the whole command timed against
a slice of simulated agents, 10 % of them refusing connections and 10 % answering only
after 30 s, median of several runs, and the figures a 1,024-worker pod comes to on paper.

The agents are tpumon.sim.agents: one process (this one) serving every worker's
/api/status on its own loopback address, as the agent writes it. The command runs as a
user runs it, a fresh `python -m tpumon status --slice --peers ...`, its wall time and
CPU time (user + system, from the kernel's accounting of the child) measured. On this VM
the agents share the command's 2 cores; on a pod each is its own VM, so the CPU time is
the command's share, and the wall time an upper bound of what a pod sees.

    python bench/slice_fanout.py [--hosts 256] [--runs 5] [--deadline 1]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tpumon.sim.agents import AgentFleet, FleetSpec  # noqa: E402
from tpumon.client.slice import MAX_IN_FLIGHT  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(argv: list[str], runs: int) -> tuple[float, float, str]:
    """Median wall and CPU seconds of ``runs`` runs (after one untimed: the page cache),
    and the last run's first line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUMON_")}
    env.update(PYTHONPATH=str(ROOT), COLUMNS="120")
    wall, cpu, first = [], [], ""
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                                check=True, cwd=ROOT)
        elapsed = time.perf_counter() - began
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:
            wall.append(elapsed)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        first = (result.stdout.splitlines() or [""])[0]
    return statistics.median(wall), statistics.median(cpu), first


#: One refresh of `watch --slice`, as its loop makes it (the agents asked, the frame drawn
#: on an 80-column screen), timed in one process: median of the rounds after the first.
WATCH_ROUNDS = """
import io, statistics, sys, time
from rich.console import Console
from tpumon.cli.slice_view import slice_reader, watch_frame
from tpumon.client.http import ClientAuth
from tpumon.common.config import load_config
opts = dict(tls=False, peers=sys.argv[1], service=None, agent_port=None,
            deadline=float(sys.argv[2]))
read = slice_reader(load_config(None), opts, ClientAuth())
times = []
for _ in range(int(sys.argv[3]) + 1):
    began = time.perf_counter()
    Console(file=io.StringIO(), width=80).print(watch_frame(read()))
    times.append(time.perf_counter() - began)
print(f"{statistics.median(times[1:]):.3f}")
"""


def watch_refresh(hosts: int, down: int, slow: int, runs: int, deadline: float) -> float:
    spec = FleetSpec.spread(hosts, free_port(), down, slow, seed=44, slow_seconds=30.0)
    fleet = AgentFleet(spec)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUMON_")}
        result = subprocess.run([sys.executable, "-c", WATCH_ROUNDS, ",".join(spec.peers()),
                                 str(deadline), str(runs)], env={**env, "PYTHONPATH": str(ROOT)},
                                capture_output=True, text=True, check=True, timeout=300)
        return float(result.stdout)
    finally:
        fleet.close()


def measure(hosts: int, down: int, slow: int, runs: int, deadline: float,
            fmt: str) -> tuple[float, float, str]:
    spec = FleetSpec.spread(hosts, free_port(), down, slow, seed=44, slow_seconds=30.0)
    fleet = AgentFleet(spec)
    try:
        return timed([sys.executable, "-m", "tpumon", "status", "--slice", "--peers",
                      ",".join(spec.peers()), "--deadline", str(deadline), "--format", fmt],
                     runs)
    finally:
        fleet.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=1.0)
    args = parser.parse_args()
    tenth = round(args.hosts / 10)
    print(f"--deadline {args.deadline:g} s, at most {MAX_IN_FLIGHT} asked at a time; median "
          f"of {args.runs} runs\n")
    print("| workers | down / slow (30 s) | output | wall | CPU | summary line |")
    print("|---|---|---|---|---|---|")
    cpu_of = {}
    quarter = args.hosts // 4
    for hosts, down, slow in ((quarter, 0, 0), (args.hosts, 0, 0), (args.hosts, tenth, tenth)):
        for fmt in ("json", "table"):
            wall, cpu, first = measure(hosts, down, slow, args.runs, args.deadline, fmt)
            cpu_of[hosts, down, fmt] = cpu
            shown = first if fmt == "table" else "(JSON)"
            print(f"| {hosts} | {down} / {slow} | {fmt} | {wall:.2f} s | {cpu:.2f} s | "
                  f"{shown} |")
    refresh = watch_refresh(args.hosts, tenth, tenth, args.runs, args.deadline)
    print(f"\nwatch --slice, {args.hosts} workers, {tenth} down and {tenth} slow: one refresh "
          f"(asked and drawn) {refresh:.2f} s, median of {args.runs}")
    # On paper: each answering worker costs the command the same CPU (its answer read, its
    # rows built and written): the slope between the two all-up sizes; the rest is fixed
    # (start-up, imports). Answers are read on the asking threads while the deadline runs,
    # so the wait is the longer of the deadline and their reading, provided the down and
    # slow peers never fill every request slot (then the others would queue behind them);
    # the rows are written after it.
    big = 1024
    bad = math.ceil(0.2 * big)
    slopes, fixed = {}, {}
    for fmt in ("json", "table"):
        slopes[fmt] = ((cpu_of[args.hosts, 0, fmt] - cpu_of[quarter, 0, fmt])
                       / (args.hosts - quarter))
        fixed[fmt] = cpu_of[args.hosts, 0, fmt] - slopes[fmt] * args.hosts
    reading = (big - bad) * slopes["json"]  # the JSON written is a small part of it
    drawing = (big - bad) * (slopes["table"] - slopes["json"])
    print(f"\nOn paper, {big} workers, 10 % down and 10 % slow: {bad} requests held until "
          f"the deadline, {'fewer' if bad < MAX_IN_FLIGHT else 'NOT fewer'} than the "
          f"{MAX_IN_FLIGHT} slots, so no answer queues behind them; {big - bad} answers read "
          f"at {slopes['json'] * 1e3:.2f} ms of CPU each ({reading:.2f} s, while the "
          f"{args.deadline:g} s deadline runs), their rows drawn at "
          f"{(slopes['table'] - slopes['json']) * 1e3:.2f} ms each ({drawing:.2f} s).")
    wait = max(args.deadline, reading)
    print(f"- json: {fixed['json']:.2f} s fixed + {wait:.2f} s = "
          f"{fixed['json'] + wait:.2f} s")
    print(f"- table: {fixed['table']:.2f} s fixed + {wait:.2f} s + {drawing:.2f} s = "
          f"{fixed['table'] + wait + drawing:.2f} s")


if __name__ == "__main__":
    main()
