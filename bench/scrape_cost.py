"""The agent's CPU for one Prometheus scrape of /metrics, this tree beside another (issue 25).

bench/overhead.py gives the whole agent's share of a core with a scrape every 15 s, where a
scrape's few milliseconds are lost in the poll's noise. Here two agents (``tpumon agent
--simulate``, 1 s polls), one from this tree and one from ``--baseline`` (a checkout of
another commit: ``git worktree add --detach /tmp/base <commit>``), run at once; windows of
``--window`` seconds alternate between no scrapes and a scrape of each agent every second
(Prometheus 2.42's request headers, gzip), so that every scrape finds the values of a new
poll, as Prometheus's scrapes 15 s apart do. A scrape's CPU is the process's CPU a second
in a scraped window less that in the idle window before it, times the scraped window's
length, over its scrapes; printed per round and as the median of ``--rounds``.

    python bench/scrape_cost.py --baseline /tmp/base [--rounds 3] [--window 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(__file__))
from overhead import scrape, start_agent  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def window(pids: list[int], seconds: float,
           addresses: list[str] | None) -> tuple[list[float], float, int]:
    """Each process's CPU seconds a second over the window, how long it lasted and how many
    scrapes each process had: with ``addresses``, each scraped in turn, half a second
    apart (about one a second each)."""
    before, started = [cpu(pid) for pid in pids], time.monotonic()
    ends, scrapes = started + seconds, 0
    while time.monotonic() < ends:
        for address in addresses or ():
            scrape(address)
            time.sleep(0.5)
        scrapes += bool(addresses)
        if not addresses:
            time.sleep(0.5)
    lasted = time.monotonic() - started
    return [(cpu(pid) - b) / lasted for pid, b in zip(pids, before, strict=True)], lasted, \
        scrapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=30.0)
    args = parser.parse_args()
    trees = {"baseline": args.baseline, "this tree": ROOT}
    with tempfile.TemporaryDirectory(prefix="tpumon-scrape-") as tmp:
        started = {name: start_agent(tree, Path(tmp), name.replace(" ", "-"),
                                     reporter_socket=False)
                   for name, tree in trees.items()}
        pids = [proc.pid for proc, _ in started.values()]
        addresses = [address for _, address in started.values()]
        per_scrape: dict[str, list[float]] = {name: [] for name in trees}
        try:
            time.sleep(args.warmup)  # the runtime's metrics listed and asked once
            for number in range(args.rounds):
                idle, _, _ = window(pids, args.window, None)
                busy, lasted, scrapes = window(pids, args.window, addresses)
                for name, quiet, scraped in zip(trees, idle, busy, strict=True):
                    per_scrape[name].append((scraped - quiet) * lasted / scrapes)
                print(f"# round {number + 1}: " + ", ".join(
                    f"{name} {per_scrape[name][-1] * 1e3:.2f} ms" for name in trees),
                    flush=True)
        finally:
            for proc, _ in started.values():
                proc.terminate()
                proc.wait(timeout=30)
    print("| tree | agent CPU a scrape (median) | rounds |\n|---|---|---|")
    for name, values in per_scrape.items():
        print(f"| {name} ({trees[name]}) | {statistics.median(values) * 1e3:.2f} ms | "
              f"{', '.join(f'{v * 1e3:.2f}' for v in values)} |")


if __name__ == "__main__":
    main()
