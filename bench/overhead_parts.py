"""Where the agent's CPU goes, part by part, under bench/overhead.py's load (issue 25).

bench/overhead.py gives the headline and bench/overhead_threads.py the threads; this one
names the code. It starts ``tpumon agent --simulate`` (1 s polls, history store and
reporter socket on) through itself, with each of PARTS wrapped in a timer of the calling
thread's CPU (``time.thread_time``), gives it the same load (reports up to 10 a second in
all, a gzip scrape every 15 s), and after ``--warmup`` prints, over ``--seconds``: each
part's CPU a second and per call (nested parts are inside their callers: the poll's
total is ``Agent.poll_once``), and each thread's CPU and wake-ups a second from
``/proc/PID/task``. The timers add ~1-2 us a call; read shares and before/after pairs in
the same VM state, not absolute values. ``--tree`` runs another checkout's agent.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent

# (module, qualified name) of each part timed; a part missing from a tree is left out
PARTS = [
    ("tpumon.agent.loop", "Agent.poll_once"),
    ("tpumon.sources.tpu_runtime", "TpuRuntimeSource.poll"),
    ("tpumon.sources.tpu_runtime", "TpuRuntimeSource._ask_all_ports"),
    ("tpumon.sources.tpu_runtime", "TpuRuntimeSource._ask_extras"),
    ("tpumon.sources.grpc_unary", "_Connection.perform"),
    ("tpumon.sources.grpc_unary", "_Connection._prepare"),
    ("tpumon.sources.grpc_unary", "_Exchange.finish"),
    ("tpumon.sources.reports", "ReporterSocket.poll"),
    ("tpumon.sources.reporter_inlet", "ReporterInlet.take_waiting"),
    ("tpumon.sources.reports", "ReporterSocket._handle"),
    ("tpumon.sources.reports", "parse_report"),
    ("tpumon.sources.reports", "ReporterSocket._record"),
    ("tpumon.diagnose.processes", "ProcessTracker.update"),
    ("tpumon.diagnose.counts", "CountTracker._fit"),
    ("tpumon.sources.host", "HostSource.poll"),
    ("tpumon.agent.loop", "Agent._detect"),
    ("tpumon.agent.loop", "Agent._notice_ends"),
    ("tpumon.diagnose.job_ends", "JobEndTracker.update"),
    ("tpumon.notify.alerts", "AlertLog.__call__"),
    ("tpumon.agent.loop", "Agent._record"),
    ("tpumon.store.writer", "StoreWriter._write"),
    ("tpumon.web.http", "_Handler.handle"),
    ("prometheus_client.exposition", "generate_latest"),
    ("gzip", "compress"),
]


def resolve(module: str, qualname: str) -> tuple[Any, str]:
    """The object holding the part and the part's attribute name on it."""
    owner: Any = importlib.import_module(module)
    *path, name = qualname.split(".")
    for attribute in path:
        owner = getattr(owner, attribute)
    getattr(owner, name)  # AttributeError when the tree has no such part
    return owner, name


def timed(fn: Callable, key: str, totals: dict[str, float], counts: Counter) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.thread_time() - started
            counts[key] += 1
    return wrapper


def collection_timer(totals: dict[str, float], counts: Counter) -> Callable:
    """A gc callback that times each collection of the cyclic garbage collector, by
    generation, in the thread that ran it (a collection runs in whichever thread's
    allocation crossed the threshold)."""
    begun: dict[int, float] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        key = f"gc collection, generation {info['generation']}"
        if phase == "start":
            begun[threading.get_ident()] = time.thread_time()
            return
        started = begun.pop(threading.get_ident(), None)
        if started is not None:
            totals[key] += time.thread_time() - started
            counts[key] += 1
    return callback


def run_agent(out: str, argv: list[str]) -> None:
    """The child: the agent with its parts timed; SIGUSR1 starts the window, SIGUSR2 writes
    the parts and the threads' names to ``out``."""
    totals: dict[str, float] = defaultdict(float)
    counts: Counter = Counter()
    for module, qualname in PARTS:
        try:
            owner, name = resolve(module, qualname)
        except (ImportError, AttributeError):
            continue
        setattr(owner, name, timed(getattr(owner, name), qualname, totals, counts))
    gc.callbacks.append(collection_timer(totals, counts))
    started = [time.monotonic()]

    def begin(*_: Any) -> None:
        totals.clear()
        counts.clear()
        started[0] = time.monotonic()

    def dump(*_: Any) -> None:
        Path(out).write_text(json.dumps({
            "wall": time.monotonic() - started[0], "totals": totals, "counts": counts,
            "threads": {str(t.native_id): t.name for t in threading.enumerate()}}))

    signal.signal(signal.SIGUSR1, begin)
    signal.signal(signal.SIGUSR2, dump)
    from tpumon.cli import main
    sys.argv = ["tpumon", *argv]
    main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to run")
    parser.add_argument("--warmup", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        run_agent(args.child[0], args.child[1:])
        return
    from overhead import SIM_REPORTS, scrape_loop  # bench/ is on sys.path as a script
    from overhead_threads import tasks
    from soak import report_loop
    from tools import free_port

    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="tpumon-parts-") as tmp:
        address, out = f"127.0.0.1:{free_port()}", Path(tmp) / "parts.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUMON_")}
        env.update(PYTHONPATH=str(args.tree.resolve()), TPUMON_SIMULATOR_ACCELERATION="1")
        agent = subprocess.Popen(
            [sys.executable, __file__, "--child", str(out), "agent", "--simulate",
             "--listen-address", address, "--state-dir", f"{tmp}/state", "--poll-interval",
             "1", "--reporter-socket", f"{tmp}/r.sock"],
            cwd=tmp, env=env, stderr=open(Path(tmp) / "agent.log", "w"))
        try:
            time.sleep(5)  # the sockets bound
            loops = [threading.Thread(target=scrape_loop, daemon=True,
                                      args=([address], stop, 15.0, {address: []})),
                     threading.Thread(target=report_loop, daemon=True,
                                      args=(f"{tmp}/r.sock", stop, 10.0 - SIM_REPORTS))]
            for loop in loops:
                loop.start()
            time.sleep(args.warmup)
            agent.send_signal(signal.SIGUSR1)
            before, t0 = tasks(agent.pid), time.monotonic()
            time.sleep(args.seconds)
            after, wall = tasks(agent.pid), time.monotonic() - t0
            agent.send_signal(signal.SIGUSR2)
            time.sleep(1.0)
            parts = json.loads(out.read_text())
        finally:
            stop.set()
            agent.terminate()
            agent.wait(timeout=30)
    print(f"# {args.tree}: {args.seconds:g} s after {args.warmup:g} s, "
          f"load average {os.getloadavg()[0]:.2f}")
    print("| thread | CPU, ms a second | wake-ups a second |\n|---|---|---|")
    for tid in sorted(set(before) & set(after), key=lambda t: -(after[t][1] - before[t][1])):
        cpu, wakes = (after[tid][k] - before[tid][k] for k in (1, 2))
        print(f"| {parts['threads'].get(tid, tid)} | {cpu / wall / 1e6:.3f} | "
              f"{wakes / wall:.2f} |")
    print("\n| part | CPU, ms a second | ms a call | calls |\n|---|---|---|---|")
    for key, total in sorted(parts["totals"].items(), key=lambda kv: -kv[1]):
        calls = parts["counts"][key]
        print(f"| {key} | {total / parts['wall'] * 1e3:.3f} | {total / calls * 1e3:.3f} | "
              f"{calls} |")


if __name__ == "__main__":
    main()
