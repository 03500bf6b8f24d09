"""The agent's CPU by thread and its RSS, this tree beside another (issue 25).

bench/overhead.py gives the headline (the agent beside node_exporter); this one says which
threads a change moved, which a loaded host blurs less than a whole-process share: two
agents (``tpumon agent --simulate``, 1 s polls, history store and reporter socket on, the
simulator's 4 reports a second) start together, one from this tree and one from
``--baseline`` (a checkout of another commit, e.g. ``git worktree add --detach
/tmp/base main``), and after ``--warmup`` each thread's CPU time is read from
``/proc/PID/task/*/schedstat`` over ``--seconds``: the poll loop (the main thread), gRPC's
``event_engine``, timer and lifeguard threads, and tpumon's other Python threads
(reporter, store writer, HTTP server). RSS and its anonymous part at the end. With
``--load``, each agent also gets bench/overhead.py's load: reports up to 10 a second in all
(a FakeReporter beside the simulated job) and a gzip scrape every 15 s. Each thread
group's voluntary wake-ups a second are printed too (``/proc/PID/task/*/status``).
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import threading
import time
from pathlib import Path

# bench/ is on sys.path when this runs as a script
from overhead import SIM_REPORTS, scrape_loop, start_agent
from soak import report_loop

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


def tasks(pid: int) -> dict[str, tuple[str, int, int]]:
    """Each thread's name, nanoseconds of CPU and voluntary context switches (wake-ups),
    by thread id; a thread that ended meanwhile is left out."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        out[tid] = (name, ns, int(status.split("voluntary_ctxt_switches:")[1].split()[0]))
    return out


def thread_cpu(pid: int) -> tuple[collections.Counter, collections.Counter]:
    """Nanoseconds of CPU, and voluntary context switches (wake-ups), by thread name; the
    main thread is "poll"."""
    out: collections.Counter = collections.Counter()
    wakes: collections.Counter = collections.Counter()
    for tid, (name, ns, woken) in tasks(pid).items():
        key = "poll" if tid == str(pid) else "python" if name.startswith("python") else name
        out[key] += ns
        wakes[key] += woken
    return out, wakes


def rollup(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True,
                        help="a checkout of the tree to compare with")
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--load", action="store_true",
                        help="bench/overhead.py's reports (10 a second in all) and scrapes")
    args = parser.parse_args()
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="tpumon-threads-") as tmp:
        started = {"baseline": start_agent(args.baseline, Path(tmp), "baseline"),
                   "this tree": start_agent(ROOT, Path(tmp), "this")}
        agents = {name: proc for name, (proc, _) in started.items()}
        addresses = {name: address for name, (_, address) in started.items()}
        try:
            if args.load:
                latencies: dict[str, list[float]] = {a: [] for a in addresses.values()}
                loops = [threading.Thread(target=scrape_loop, daemon=True, args=(
                    list(addresses.values()), stop, 15.0, latencies))]
                loops += [threading.Thread(target=report_loop, daemon=True, args=(
                    str(Path(tmp) / d / "r.sock"), stop, 10.0 - SIM_REPORTS))
                    for d in ("baseline", "this")]
                for loop in loops:
                    loop.start()
            time.sleep(args.warmup)
            print(f"# load average at start: {os.getloadavg()[0]:.2f}", flush=True)
            before = {k: thread_cpu(p.pid) for k, p in agents.items()}
            t0 = time.monotonic()
            time.sleep(args.seconds)
            after = {k: thread_cpu(p.pid) for k, p in agents.items()}
            wall = time.monotonic() - t0
            print(f"# load average at end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
            print("| tree | agent CPU | by thread (% of one core) | wake-ups a second | RSS | "
                  "anonymous |")
            print("|---|---|---|---|---|---|")
            for name, proc in agents.items():
                used = after[name][0] - before[name][0]
                woke = after[name][1] - before[name][1]
                share = {k: v / wall / 1e7 for k, v in sorted(used.items())}
                print(f"| {name} | {sum(share.values()):.3f} % | "
                      + ", ".join(f"{k} {v:.3f}" for k, v in share.items())
                      + " | " + ", ".join(f"{k} {v / wall:.1f}" for k, v in sorted(woke.items()))
                      + f" | {rollup(proc.pid, 'Rss') / MIB:.1f} MiB"
                      f" | {rollup(proc.pid, 'Anonymous') / MIB:.1f} MiB |")
        finally:
            stop.set()
            for proc in agents.values():
                proc.terminate()
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()
