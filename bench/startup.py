"""Start-up time of tpumon commands: the whole process timed, median of several runs.

A command imports what it uses (tpumon/cli/__init__.py loads a command's module only when
that command runs), so ``tpumon --help`` and ``--version`` must come in under 100 ms and
``tpumon status`` (asking a running agent) under 250 ms. Each figure is the median wall
time of ``python -m tpumon ...`` in a fresh interpreter, next to the bare interpreter
(``python -c pass``) timed in the same run, on the same machine.

With ``--baseline-ref REF`` (e.g. HEAD~3) the same commands are also timed against the
tpumon package as it is at that git revision (extracted with ``git archive`` into a
temporary directory), so that before and after come from one run.

    python bench/startup.py [--runs 11] [--baseline-ref REF]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = (("--help",), ("--version",), ("version",), ("status --agent {agent}",))
LIMITS_MS = {"--help": 100, "--version": 100, "version": 100, "status": 250}


def clean_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPUMON_")}
    env["PYTHONPATH"] = str(tree)
    return env


def median_ms(argv: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of the whole process, after
    one untimed run (the page cache). CPU time is what a quiet machine's wall time comes
    to; on a loaded one the wall time also holds the waits for a core. It runs in the tree
    it times: ``python -m`` looks in the working directory first."""
    wall, cpu = [], []
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True, timeout=60, cwd=env["PYTHONPATH"])
        elapsed = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i:
            wall.append(elapsed)
            cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def start_agent(tree: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """``tpumon agent --simulate`` on a free loopback port; (process, its address)."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tpumon", "agent", "--simulate",
                                 "--listen-address", "127.0.0.1:0", "--poll-interval", "1"],
                                stderr=out, env=clean_env(tree), cwd=tree)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"serving metrics on (http://\S+)/metrics", log.read_text())
        if found:
            return proc, found.group(1)
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the agent did not start; its log:\n{log.read_text()}")


def time_tree(tree: Path, agent: str, runs: int) -> dict[str, tuple[float, float]]:
    env = clean_env(tree)
    out = {}
    for command in COMMANDS:
        args = command[0].format(agent=agent).split()
        out[args[0]] = median_ms([sys.executable, "-m", "tpumon", *args], env, runs)
    return out


def extract(ref: str, into: Path) -> Path:
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "tpumon"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--baseline-ref", help="also time tpumon as at this git revision")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        agent, url = start_agent(ROOT, Path(tmp) / "agent.log")
        try:
            bare = median_ms([sys.executable, "-c", "pass"], clean_env(ROOT), args.runs)
            now = time_tree(ROOT, url, args.runs)
            before = None
            if args.baseline_ref:
                before = time_tree(extract(args.baseline_ref, Path(tmp) / "baseline"), url,
                                   args.runs)
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=30)
    print(f"median of {args.runs} runs, whole process, ms: wall (CPU); python -c pass "
          f"{bare[0]:.0f} ({bare[1]:.0f}); load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':<17}{'now':>12}{'limit':>7}"
          + (f"{args.baseline_ref:>14}{'ratio':>7}" if before else ""))
    for name, (wall, cpu) in now.items():
        row = f"{'tpumon ' + name:<17}{wall:>6.0f} ({cpu:>3.0f}){LIMITS_MS[name]:>7}"
        if before:
            old_wall, old_cpu = before[name]
            row += f"{old_wall:>7.0f} ({old_cpu:>3.0f}){old_wall / wall:>6.1f}x"
        print(row + ("" if wall < LIMITS_MS[name] else "  over the limit"))


if __name__ == "__main__":
    main()
