"""Overhead (issue 9): what the agent costs a TPU VM, beside node_exporter.

node_exporter (the Debian package, default collectors) is the reference for a lightweight
exporter that nobody thinks twice about running. Both run for ``--minutes``, scraped
every ``--scrape-every`` seconds alike; the agent polls 4 simulated chips every second
(``--poll-interval``) with its history store on and takes ``--reports`` reports a second
in all: its simulated job reports its step 4 times a second, a FakeReporter thread sends
the rest. Scrapes come at deploy/prometheus's 15 s with Prometheus 2.42's request headers
(OpenMetrics preferred, gzip); the simulator runs at real pace (``--acceleration 1``), as a
job's chips fill.

Per process: CPU as a share of one core (user + system CPU time over wall time, after a
warm-up), in each minute and over the whole window (the target is judged on the median
minute, as this VM's neighbours slow everything on it for minutes at a time); RSS (median
and max of samples every few seconds); and the agent's poll latency (its own
tpumon_poll_duration_seconds histogram over the window). The agent's
simulator child stands in for libtpu, so it is shown apart; the agent alone is the
headline. Targets, for 1 s polls with every runtime metric the simulator serves (issue 25):
the agent alone at most 0.3 % of one core (median minute) and 60 MiB RSS (issue 9's were
0.5 % and 80 MiB). The reporter's cost in the training loop is bench/reporters.py's.

``--baseline TREE`` runs a second agent, from another checkout, beside this tree's: its own
simulator, the same reports and scrapes, measured in the same minutes. This VM charges a
process that wakes once a second for memory gone cold, and that charge moves 2-4x from
hour to hour (docs/benchmarks.md, issue 25, session 16), so an absolute figure from one
hour and a target set in another do not compare; the ratio of two agents in the same run
does. The targets are still judged on this tree's absolute figures.
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import psutil
from prometheus_client.parser import text_string_to_metric_families

from soak import MIB, report_loop  # bench/ is on sys.path when this runs as a script
from tpumon.sources.reports import kernel_queue_length
# tests/tools.py, on the path through soak
from tools import PROMETHEUS_HEADERS, Processes, free_port, ready, wait_for

ROOT = Path(__file__).resolve().parent.parent
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
SIM_REPORTS = 4.0  # a second, from the simulated job (tpumon sim --report-to)
CPU_TARGET = 0.003
RSS_TARGET = 60 * MIB
BASELINE = "baseline agent"  # --baseline's, in the table


def start_node_exporter(procs: Processes) -> tuple[psutil.Process, str]:
    """node_exporter on a free loopback port, default collectors."""
    address = f"127.0.0.1:{free_port()}"
    proc = procs.start("node_exporter", [NODE_EXPORTER, f"--web.listen-address={address}"])
    wait_for(lambda: ready(f"http://{address}/metrics"), timeout=30)
    return psutil.Process(proc.pid), address


def start_agent(tree: Path, tmp: Path, name: str, reporter_socket: bool = True,
                poll_interval: float = 1.0, acceleration: float = 1.0
                ) -> tuple[subprocess.Popen, str]:
    """``tpumon agent --simulate`` importing tpumon from ``tree`` (PYTHONPATH, and a cwd
    outside any tree), with its history store, on a free loopback port; its files (state,
    reporter socket ``r.sock``, log) under ``tmp / name``.
    Every bench that sets two trees side by side starts both with this, so that they differ
    in nothing but the tree."""
    home = tmp / name
    home.mkdir()
    address = f"127.0.0.1:{free_port()}"
    # as installed (pip writes bytecode): an environment's PYTHONDONTWRITEBYTECODE would have
    # each agent compile its modules from source at every start (~0.2 MiB more RSS, measured)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TPUMON_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(tree.resolve()), TPUMON_SIMULATOR_ACCELERATION=str(acceleration))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpumon", "agent", "--simulate", "--listen-address", address,
         "--state-dir", str(home / "state"), "--poll-interval", str(poll_interval),
         *(("--reporter-socket", str(home / "r.sock")) if reporter_socket else ())],
        cwd=tmp, env=env, stderr=open(home / "agent.log", "w"))
    wait_for(lambda: ready(f"http://{address}/metrics"), timeout=60)
    return proc, address


def scrape_loop(addresses: list[str], stop: threading.Event, every: float,
                latencies: dict[str, list[float]]) -> None:
    """Every exporter scraped at the same cadence and with the same request headers as one
    Prometheus would (Debian's 2.42, deploy/prometheus: OpenMetrics first, and gzip)."""
    while not stop.wait(every):
        for address in addresses:
            t0 = time.perf_counter()
            scrape(address)
            latencies[address].append(time.perf_counter() - t0)


def scrape(address: str) -> None:
    """One /metrics, asked as Prometheus asks it."""
    request = urllib.request.Request(f"http://{address}/metrics", headers=PROMETHEUS_HEADERS)
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def cpu_seconds(procs: list[psutil.Process]) -> float:
    return sum(t.user + t.system for t in (p.cpu_times() for p in procs))


def histogram(metrics: dict, name: str) -> dict[float, float]:
    """Cumulative bucket counts of one histogram, by upper bound."""
    return {float(dict(labels)["le"]): v for (n, labels), v in metrics.items()
            if n == f"{name}_bucket"}


def quantile(buckets: dict[float, float], q: float) -> float:
    """PromQL's histogram_quantile: linear interpolation inside the bucket holding rank q."""
    bounds = sorted(buckets)
    rank, lower, below = q * buckets[math.inf], 0.0, 0.0
    for upper in bounds:
        if buckets[upper] >= rank:
            if upper == math.inf:
                return lower
            return lower + (upper - lower) * (rank - below) / max(buckets[upper] - below, 1e-12)
        lower, below = upper, buckets[upper]
    return lower


class Cpu(NamedTuple):
    """A process's CPU as a share of one core: over the whole window, and per minute."""

    mean: float
    minutes: list[float]

    @property
    def median(self) -> float:
        """The median minute: what the process costs while the host is itself. This VM's
        neighbours slow every process on it for minutes at a time (node_exporter alone
        has measured 0.08-0.17 % in the same benchmark); the mean takes those minutes in
        at full weight, the median does not. Both are printed."""
        return statistics.median(self.minutes) if self.minutes else self.mean


def minute_shares(samples: list[tuple[float, float]], window: float = 60.0) -> list[float]:
    """CPU shares over the whole minutes that fit in (wall, CPU seconds) samples: the span
    cut into as many equal parts as it holds minutes, at the samples nearest the cuts (so
    every sample counts, and 5 minutes sampled every 5 s make 5 parts)."""
    times = [t for t, _ in samples]
    span = times[-1] - times[0]
    parts = int(span // window)
    edges = [0] + [_nearest(times, times[0] + span * k / parts) for k in range(1, parts + 1)]
    return [(samples[j][1] - samples[i][1]) / (times[j] - times[i])
            for i, j in zip(edges, edges[1:], strict=False) if j > i]


def _nearest(times: list[float], t: float) -> int:
    i = bisect.bisect_left(times, t)
    if i == len(times) or (i > 0 and t - times[i - 1] <= times[i] - t):
        return i - 1
    return i


def measure(targets: dict[str, list[psutil.Process]], seconds: float, sample_every: float
            ) -> tuple[dict[str, Cpu], dict[str, list[int]], dict[str, list[int]]]:
    """CPU share of one core per target over ``seconds`` (and per minute), and RSS samples
    per target: all of it, and its file-backed part (shared libraries' pages, which RSS
    counts although they are clean and shared with any process that maps the same files)."""
    cpu: dict[str, list[tuple[float, float]]] = {k: [] for k in targets}
    rss: dict[str, list[int]] = {k: [] for k in targets}
    shared: dict[str, list[int]] = {k: [] for k in targets}
    t0 = time.monotonic()
    while True:
        now = time.monotonic()
        for k, procs in targets.items():
            cpu[k].append((now, cpu_seconds(procs)))
        if now - t0 >= seconds:
            break
        for k, procs in targets.items():
            memory = [p.memory_info() for p in procs]
            rss[k].append(sum(m.rss for m in memory))
            shared[k].append(sum(m.shared for m in memory))
        time.sleep(min(sample_every, max(t0 + seconds - time.monotonic(), 0.0)))
    shares = {k: Cpu((v[-1][1] - v[0][1]) / (v[-1][0] - v[0][0]), minute_shares(v))
              for k, v in cpu.items()}
    return shares, rss, shared


def metrics(address: str) -> dict[tuple[str, tuple], float]:
    """An exporter's samples now, by name and labels."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tpumon-overhead-"))
    procs = Processes(tmp)
    stop = threading.Event()
    trees = {"agent": ROOT} | ({BASELINE: args.baseline} if args.baseline else {})
    agents: dict[str, tuple[subprocess.Popen, str]] = {}
    threads: list[threading.Thread] = []
    sent: dict[str, dict[str, int]] = {name: {} for name in trees}
    try:
        exporter, exporter_address = start_node_exporter(procs)
        for name, tree in trees.items():
            agents[name] = start_agent(tree, tmp, name.replace(" ", "-"),
                                       poll_interval=args.poll_interval,
                                       acceleration=args.acceleration)
        latencies: dict[str, list[float]] = {address: [] for _, address in agents.values()}
        latencies[exporter_address] = []
        loops: list[tuple] = [(scrape_loop, (list(latencies), stop, args.scrape_every,
                                             latencies))]
        if args.reports > SIM_REPORTS:
            loops += [(report_loop, (str(tmp / name.replace(" ", "-") / "r.sock"), stop,
                                     args.reports - SIM_REPORTS, sent[name]))
                      for name in trees]
        threads = [threading.Thread(target=target, args=targs, daemon=True)
                   for target, targs in loops]
        for thread in threads:
            thread.start()
        print(f"# overhead: agent polling every {args.poll_interval:g} s (simulator at "
              f"{args.acceleration:g}x), {args.reports:g} reports/s; {args.minutes:g} min "
              f"after {args.warmup:g} s warm-up, scrapes every {args.scrape_every:g} s; "
              f"datagram queue {kernel_queue_length()}; {tmp}"
              + (f"; beside {BASELINE} from {args.baseline}" if args.baseline else ""),
              flush=True)
        print(f"# load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
              flush=True)
        time.sleep(args.warmup)
        address = agents["agent"][1]
        before = histogram(metrics(address), "tpumon_poll_duration_seconds")
        targets = {}
        for name, (proc, _) in agents.items():
            agent = psutil.Process(proc.pid)
            [sim] = agent.children()
            targets |= {name: [agent], f"{name} + simulator": [agent, sim],
                        name.replace("agent", "simulator"): [sim]}
        targets["node_exporter"] = [exporter]
        cpu, rss, shared = measure(targets, args.minutes * 60, args.sample_every)
        after = histogram(metrics(address), "tpumon_poll_duration_seconds")
        print(f"# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"({os.cpu_count()} CPUs)", flush=True)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=15)
        for proc, _ in agents.values():
            proc.terminate()
            proc.wait(timeout=30)
        procs.stop_all()
    polls = {le: after[le] - before.get(le, 0.0) for le in after}
    scrapes = {name: latencies[address] for name, (_, address) in agents.items()}
    scrapes["node_exporter"] = latencies[exporter_address]
    for name, counts in sent.items():
        if counts:
            print(f"FakeReporter ({name}): {counts['sent']} reports sent, {counts['dropped']} "
                  "dropped at the sender (the agent's socket queue full)")
    return report(cpu, rss, shared, polls, scrapes)


def report(cpu: dict[str, Cpu], rss: dict[str, list[int]], shared: dict[str, list[int]],
           polls: dict[float, float], scrapes: dict[str, list[float]]) -> int:
    """The table, the ratios to node_exporter, and the targets missed."""
    print("\n| process | CPU, median minute (% of one core) | CPU, mean | minutes (min-max) | "
          "RSS median | RSS max | of which file-backed (median) | /metrics scrape (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for k, c in cpu.items():
        scrape = f"{statistics.median(scrapes[k]) * 1e3:.1f} ms" if k in scrapes else "-"
        spread = (f"{100 * min(c.minutes):.3f}-{100 * max(c.minutes):.3f} % ({len(c.minutes)})"
                  if c.minutes else "-")
        print(f"| {k} | {100 * c.median:.3f} % | {100 * c.mean:.3f} % | {spread} | "
              f"{statistics.median(rss[k]) / MIB:.1f} MiB | {max(rss[k]) / MIB:.1f} MiB | "
              f"{statistics.median(shared[k]) / MIB:.1f} MiB | {scrape} |")
    print()
    for other in ("node_exporter", BASELINE):
        if other in cpu:
            print(f"agent / {other}: CPU {cpu['agent'].median / cpu[other].median:.2f}x "
                  f"(median minutes), {cpu['agent'].mean / cpu[other].mean:.2f}x (means), "
                  f"RSS {statistics.median(rss['agent']) / statistics.median(rss[other]):.2f}x")
    agent = cpu["agent"]
    print(f"agent poll duration over the window ({polls[math.inf]:.0f} polls, from its "
          f"histogram): median {quantile(polls, 0.5) * 1e3:.1f} ms, "
          f"p99 {quantile(polls, 0.99) * 1e3:.1f} ms")
    print("reporter cost in the training loop: bench/reporters.py")
    missed = []
    if agent.median > CPU_TARGET:
        missed.append(f"agent CPU {100 * agent.median:.3f} % of one core in the median minute "
                      f"(target at most {100 * CPU_TARGET:.1f} %)")
    if max(rss["agent"]) > RSS_TARGET:
        missed.append(f"agent RSS max {max(rss['agent']) / MIB:.1f} MiB (target at most "
                      f"{RSS_TARGET / MIB:.0f} MiB)")
    for why in missed:
        print(f"MISSED: {why}")
    print("all targets met" if not missed else f"{len(missed)} target(s) missed")
    return 1 if missed else 0


def in_network_namespace(queue_length: int) -> None:
    """Re-run this bench in a network namespace of its own whose ``net.unix.max_dgram_qlen``
    is ``queue_length`` (root only; the sysctl is per namespace and read when a socket is
    made). The kernel's default is 10; systemd raises it to 512 at boot, so a TPU VM's
    Ubuntu runs with 512, while a container without systemd keeps 10."""
    if os.environ.get("BENCH_NETNS_QLEN") == str(queue_length):
        return
    missing = [tool for tool in ("unshare", "ip", "sysctl") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        sys.exit("--unix-dgram-qlen needs root and unshare, ip and sysctl"
                 + (f" ({', '.join(missing)} not found)" if missing else ""))
    script = (f"ip link set lo up && sysctl -q -w net.unix.max_dgram_qlen={queue_length} && "
              f'exec "$0" "$@"')
    os.environ["BENCH_NETNS_QLEN"] = str(queue_length)
    os.execvp("unshare", ["unshare", "--net", "sh", "-c", script, sys.executable,
                          *sys.argv])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    parser.add_argument("--reports", type=float, default=10.0,
                        help="reports a second in all (the simulated job sends 4)")
    parser.add_argument("--scrape-every", type=float, default=15.0,
                        help="seconds between scrapes (deploy/prometheus/prometheus.yml's "
                             "scrape_interval)")
    parser.add_argument("--acceleration", type=float, default=1.0,
                        help="simulated seconds per real second: 1 is a real job's pace, where "
                             "a detector's minute bucket takes 60 one-second polls (at 60x "
                             "every poll would close one)")
    parser.add_argument("--warmup", type=float, default=120.0,
                        help="seconds before measuring (with reports coming in, the agent's "
                             "RSS levels off after about 100 s)")
    parser.add_argument("--sample-every", type=float, default=5.0,
                        help="seconds between RSS samples")
    parser.add_argument("--baseline", type=Path, default=None, metavar="TREE",
                        help="also run the agent of another checkout (git worktree add "
                             "--detach /tmp/base REF) beside this tree's, under the same load "
                             "in the same run: a ratio between the two that this VM's "
                             "hour-to-hour swings move less than either figure")
    parser.add_argument("--unix-dgram-qlen", type=int, default=None, metavar="N",
                        help="run in a network namespace of its own with this datagram queue "
                             "length (root): 512 is what systemd sets on a TPU VM")
    args = parser.parse_args()
    if args.unix_dgram_qlen is not None:
        in_network_namespace(args.unix_dgram_qlen)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
