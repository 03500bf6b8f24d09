"""Soak test (issue 9): the real agent process through a simulated week, accelerated.

``tpumon agent --simulate`` runs as a child process with everything a long deployment
has switched on: the history store, the reporter socket, Slack notifications (to a
loopback fake Slack), a scraper reading /metrics and /api/status every second, and a
FakeReporter sending about 10 reports a second. Time runs ``--acceleration`` times faster
in the simulator (1000x: a week in about 10 minutes); polls every ``--poll-interval``
seconds come acceleration x interval simulated seconds apart (60 s by default: the
detector looks for a restart after a gap of 120 s). Every few seconds the agent's RSS,
open fds and threads (and its simulator child's RSS) are sampled.

Targets after warm-up (the first simulated day, or half of a shorter run): RSS grows
by at most 5 MiB, fd and thread counts stay flat. Exits 1, saying why, when one is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from fake_alert_apis import FakeAlertAPI  # noqa: E402
from tools import AgentProcess, FakeReporter  # noqa: E402

from tpumon.store.database import HistoryDB, Retention, database_path  # noqa: E402
from tpumon.store.trace_rows import export_rows  # noqa: E402

DAY = 86400
MIB = 2**20
RSS_GROWTH_TARGET = 5 * MIB
IN_FLIGHT_SLACK = 2  # a scrape in flight holds one handler thread and one socket


@dataclass
class Probe:
    """One sample of the agent process (and its simulator child)."""

    sim_days: float
    rss: int
    file_rss: int  # file-backed and shared pages: shared libraries, mapped files
    sim_rss: int
    fds: int
    threads: int


def report_loop(path: str, stop: threading.Event, rate: float = 10.0,
                counts: dict[str, int] | None = None) -> None:
    """~``rate`` reports a second, as an instrumented training loop with a short step would
    send them: the agent's receive path runs all along. ``counts`` gets the reports sent
    and those dropped at the sender (the agent's queue full), at the end."""
    reporter = FakeReporter(socket=path, min_interval=0)
    step = 0
    while not stop.wait(1 / rate):
        step += 1
        reporter.step(step)
    if counts is not None:
        counts.update(sent=reporter.sent, dropped=reporter.dropped)


def scrape_loop(url: str, stop: threading.Event, latencies: dict[str, list[float]],
                errors: list[str], every: float = 1.0) -> None:
    """/metrics and /api/status every ``every`` seconds, as Prometheus and `tpumon status`
    would; latencies and failures recorded."""
    while not stop.wait(every):
        for path in latencies:
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(f"http://{url}{path}", timeout=10) as r:
                    r.read()
                latencies[path].append(time.perf_counter() - t0)
            except OSError as exc:
                errors.append(f"{path}: {exc}")


def probe(agent: psutil.Process, sim_days: float) -> Probe:
    memory = agent.memory_info()
    return Probe(sim_days, memory.rss, memory.shared,
                 sum(c.memory_info().rss for c in agent.children()), agent.num_fds(),
                 agent.num_threads())


def write_probes(path: Path, probes: list[Probe]) -> None:
    """Every probe as CSV, to plot or to look at a growth more closely."""
    fields = list(Probe.__dataclass_fields__)
    rows = [",".join(fields)] + [",".join(str(getattr(p, f)) for f in fields) for p in probes]
    path.write_text("\n".join(rows) + "\n")


def late_polls(state: Path, gap: float = 120.0) -> tuple[int, int, float]:
    """Stored rows at least ``gap`` simulated seconds after their chip's previous one
    (rolled-up minutes keep their polls' times, so gaps survive), how many rows, and the
    longest gap. At 60 simulated seconds a poll, a poll held up 60 ms makes such a gap,
    after which the detector checks for a restart; real polls are 1-5 s apart."""
    db = HistoryDB(database_path(state), Retention(), read_only=True)
    late = total = 0
    longest = 0.0
    previous: dict[str, float] = {}
    for row in export_rows(db):
        total += 1
        dt = row.time - previous.get(row.chip, row.time)
        previous[row.chip] = row.time
        late += dt >= gap
        longest = max(longest, dt)
    db.close()
    return late, total, longest


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def window(probes: list[Probe], start: float, end: float, field: str) -> list[float]:
    return [getattr(p, field) for p in probes if start <= p.sim_days <= end]


def windows(probes: list[Probe], warmup: float) -> tuple[tuple[float, float], ...]:
    """The first simulated day after warm-up and the last day (or, in a shorter run, the
    first and last halves of what follows warm-up): whole windows, not single readings,
    because the agent's RSS wanders over 15 MiB or so, sometimes in one jump, while a
    leak raises the whole window, its median and its peak alike."""
    end = probes[-1].sim_days
    span = min(1.0, (end - warmup) / 2)
    return (warmup, warmup + span), (end - span, end)


def check_rss(probes: list[Probe], warmup: float) -> tuple[list[tuple[str, str]], list[str]]:
    """RSS in the first window against the last; the target missed, if it is."""
    first, last = windows(probes, warmup)
    label = f"day {first[0]:.2f}-{first[1]:.2f} / day {last[0]:.2f}-{last[1]:.2f}"

    def medians(field: str) -> str:
        return " / ".join(f"{statistics.median(window(probes, *w, field)) / MIB:.1f} MiB"
                          for w in (first, last))

    rss = [window(probes, *w, "rss") for w in (first, last)]
    growth = statistics.median(rss[1]) - statistics.median(rss[0])
    rows = [(f"agent RSS, median ({label})", medians("rss")),
            (f"agent RSS, max ({label})", " / ".join(f"{max(v) / MIB:.1f} MiB" for v in rss)),
            ("RSS growth after warm-up, medians (target <= 5 MiB)", f"{growth / MIB:+.2f} MiB"),
            ("of which file-backed and shared (median, same windows)", medians("file_rss")),
            ("simulator child RSS (median, same windows)", medians("sim_rss"))]
    missed = [] if growth <= RSS_GROWTH_TARGET else [
        f"RSS grew {growth / MIB:.1f} MiB after warm-up (target at most "
        f"{RSS_GROWTH_TARGET / MIB:.0f} MiB)"]
    return rows, missed


def check_flat(probes: list[Probe], warmup: float) -> tuple[list[tuple[str, str]], list[str]]:
    """Open fds and threads after warm-up: flat, but for a scrape in flight."""
    first, last = windows(probes, warmup)
    rows, missed = [], []
    for field, name in (("fds", "open fds"), ("threads", "threads")):
        after = window(probes, warmup, probes[-1].sim_days, field)
        medians = [statistics.median(window(probes, *w, field)) for w in (first, last)]
        rows.append((f"{name} after warm-up, min-max (target: flat)",
                     f"{min(after)}-{max(after)}"))
        if medians[1] > medians[0] or max(after) - min(after) > IN_FLIGHT_SLACK:
            missed.append(f"{name} not flat after warm-up: {min(after)}-{max(after)}, "
                          f"medians {medians[0]:g} then {medians[1]:g}")
    return rows, missed


def ms(values: list[float], q: float = 0.5) -> str:
    values = sorted(values)
    return f"{values[min(len(values) - 1, int(q * len(values)))] * 1e3:.1f} ms"


def metric(metrics: dict, name: str, **labels: str) -> float:
    """A series' value, summed over the label sets that carry the given labels."""
    return sum(v for (n, ls), v in metrics.items()
               if n == name and set(labels.items()) <= set(ls))


@dataclass
class Outcome:
    """What a soak run leaves to judge."""

    probes: list[Probe]
    metrics: dict
    latencies: dict[str, list[float]]
    scrape_errors: list[str]
    slack_requests: int
    exit_code: int
    log: str
    sender: dict[str, int]  # the FakeReporter's reports sent / dropped at the sender


def soak(args: argparse.Namespace, tmp: Path) -> Outcome:
    """Run the agent with its load for the simulated days, probing it all along."""
    state, sock = tmp / "state", str(tmp / "r.sock")
    wall = args.days * DAY / args.acceleration
    with FakeAlertAPI("slack") as slack:
        agent = AgentProcess(tmp, state, "--scenario", args.scenario, "--acceleration",
                             str(args.acceleration), "--poll-interval", str(args.poll_interval),
                             "--reporter-socket", sock,
                             env={"TPUMON_SLACK_WEBHOOK_URL": slack.url})
        started = time.monotonic()
        stop = threading.Event()
        latencies: dict[str, list[float]] = {"/metrics": [], "/api/status": []}
        errors: list[str] = []
        sender: dict[str, int] = {}
        threads = [threading.Thread(target=report_loop, args=(sock, stop, 10.0, sender),
                                    daemon=True),
                   threading.Thread(target=scrape_loop, args=(agent.url, stop, latencies, errors),
                                    daemon=True)]
        for t in threads:
            t.start()
        proc, probes = psutil.Process(agent.proc.pid), []
        try:
            while (elapsed := time.monotonic() - started) < wall and agent.proc.poll() is None:
                probes.append(probe(proc, elapsed * args.acceleration / DAY))
                if len(probes) % 30 == 0:
                    p = probes[-1]
                    print(f"  day {p.sim_days:5.2f}: RSS {p.rss / MIB:.1f} MiB, fds {p.fds}, "
                          f"threads {p.threads}", flush=True)
                time.sleep(args.sample_every)
            metrics = agent.metrics() if agent.proc.poll() is None else {}
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=15)
            code = agent.stop()
        return Outcome(probes, metrics, latencies, errors, len(slack.requests), code, agent.log(),
                       sender)


def summarize(args: argparse.Namespace, tmp: Path, out: Outcome) -> int:
    """Print the table of figures and the targets missed; 1 if any was."""
    if not out.metrics:
        print(f"MISSED: the agent exited {out.exit_code} during the run:\n{out.log[-3000:]}")
        return 1
    warmup = args.warmup_days if args.warmup_days is not None else min(1.0, args.days / 2)
    rows, missed = check_rss(out.probes, warmup)
    flat_rows, flat_missed = check_flat(out.probes, warmup)
    rows, missed = rows + flat_rows, missed + flat_missed
    if out.exit_code != 0:
        missed.append(f"the agent exited {out.exit_code} on SIGTERM")
    if out.scrape_errors:
        missed.append(f"{len(out.scrape_errors)} failed scrape(s), first: {out.scrape_errors[0]}")
    rows += activity_rows(tmp, out)
    print("\n| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    for why in missed:
        print(f"MISSED: {why}")
    print("all targets met" if not missed else f"{len(missed)} target(s) missed")
    return 1 if missed else 0


def activity_rows(tmp: Path, out: Outcome) -> list[tuple[str, str]]:
    """What the agent did meanwhile: the store, scrapes, polls, reports, notifications."""
    m, lat = out.metrics, out.latencies
    late, stored, longest = late_polls(tmp / "state")
    return [
        ("history store on disk after the agent stopped (live, with WAL)",
         f"{dir_size(tmp / 'state') / MIB:.2f} MiB "
         f"({metric(m, 'tpumon_store_size_bytes') / MIB:.2f} MiB)"),
        ("scrape latency /metrics, median / p99",
         f"{ms(lat['/metrics'])} / {ms(lat['/metrics'], 0.99)}"),
        ("scrape latency /api/status, median / p99",
         f"{ms(lat['/api/status'])} / {ms(lat['/api/status'], 0.99)}"),
        ("scrapes of each endpoint / failed", f"{len(lat['/metrics'])} / {len(out.scrape_errors)}"),
        ("polls / runtime polls failed (runtime down)",
         f"{metric(m, 'tpumon_poll_duration_seconds_count'):.0f} / "
         f"{metric(m, 'tpumon_source_errors_total', source='tpu_runtime'):.0f}"),
        ("stored rows / gaps >= 120 simulated s between polls (longest)",
         f"{stored} / {late} ({longest:.0f} s)"),
        ("job restarts seen by the detectors (all chips)",
         f"{metric(m, 'tpumon_job_restarts_total'):.0f}"),
        ("reports received / dropped", f"{metric(m, 'tpumon_reporter_reports_total'):.0f} / "
         f"{metric(m, 'tpumon_reporter_dropped_reports_total'):.0f}"),
        ("FakeReporter's reports sent / dropped at the sender (agent's queue full)",
         f"{out.sender.get('sent', 0)} / {out.sender.get('dropped', 0)}"),
        ("Slack requests / deliveries / failed attempts",
         f"{out.slack_requests} / {metric(m, 'tpumon_notifier_deliveries_total'):.0f} / "
         f"{metric(m, 'tpumon_notifier_failures_total'):.0f}"),
        ("agent log lines at WARNING or above / tracebacks",
         f"{sum(' WARNING ' in line or ' ERROR ' in line for line in out.log.splitlines())} / "
         f"{out.log.count('Traceback')}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=float, default=7.0, help="simulated days")
    parser.add_argument("--quick", action="store_true",
                        help="two simulated days, about 3 minutes (a smoke run)")
    parser.add_argument("--scenario", default="healthy",
                        help="'healthy' keeps the runtime up all week; in 'linear-leak' the "
                             "job OOMs after ~22 simulated hours and the runtime stays down")
    parser.add_argument("--acceleration", type=float, default=1000.0)
    parser.add_argument("--poll-interval", type=float, default=0.06,
                        help="above the simulator's 0.05 s sample hold, so polls see new samples")
    parser.add_argument("--sample-every", type=float, default=2.0, help="seconds between probes")
    parser.add_argument("--warmup-days", type=float, default=None,
                        help="default: 1 day, or half of a shorter run")
    args = parser.parse_args()
    if args.quick:  # a day of warm-up: the agent's RSS takes about 100 s to level off
        args.days = 2.0
    if args.acceleration * args.poll_interval > 60:
        parser.error("acceleration x poll interval is over 60 simulated seconds per poll")
    tmp = Path(tempfile.mkdtemp(prefix="tpumon-soak-"))
    print(f"# soak: scenario {args.scenario}, {args.days:g} simulated days at "
          f"{args.acceleration:g}x, polls every {args.poll_interval:g} s "
          f"({args.acceleration * args.poll_interval:g} simulated s), "
          f"{args.days * DAY / args.acceleration:.0f} s wall; files in {tmp}", flush=True)
    out = soak(args, tmp)
    write_probes(tmp / "probes.csv", out.probes)
    sys.exit(summarize(args, tmp, out))


if __name__ == "__main__":
    main()
