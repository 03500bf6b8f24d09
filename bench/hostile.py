"""Hostile neighbours under load (docs/security.md): the real agent over its real HTTP port
and reporter socket on loopback, each attack against a baseline measured in the same run.

1. Slowloris: CONNECTIONS connections trickling a header every GAP seconds for SECONDS,
   then closing at once. Connections the agent holds (its threads), its RSS, scrape
   latency (median, max) before, during and after, and its poll duration.
2. Wrong passwords: GUESSERS clients sending random wrong passwords (bcrypt cost 10) for
   SECONDS; the right password's latency after every 300 wrong answers, against its
   latency with no attack.
3. Garbage flood (as root: a second local user): 8,000-byte garbage as fast as two
   processes can send, one on the datagram socket, one on as many connections as the
   agent lets that user hold (reconnecting when it closes one), while a job reports 10
   times a second, polls 5 s apart: the job's reports accepted, over its connection (this
   version's reporter) and as datagrams (an earlier version's), against the same job with
   no flood; the agent's CPU meanwhile.

    python bench/hostile.py [--connections 2000] [--seconds 20] [--only flood]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_hostile import (FLOOD_BOTH_SOCKETS, NEIGHBOUR, agent_threads,  # noqa: E402
                          as_user, authed_get, real_agent, slowloris, timed_scrape)
from tools import AgentProcess, FakeReporter, wait_for  # noqa: E402

from tpumon.instrument.protocol import connection_path  # noqa: E402


def rss_mib(a: AgentProcess) -> float:
    text = Path(f"/proc/{a.proc.pid}/status").read_text()
    return int(text.split("VmRSS:")[1].split()[0]) / 1024


def cpu_seconds(a: AgentProcess) -> float:
    fields = Path(f"/proc/{a.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def poll_seconds(a: AgentProcess) -> tuple[float, float]:
    m = a.metrics()
    return (m.get(("tpumon_poll_duration_seconds_sum", ()), 0.0),
            m.get(("tpumon_poll_duration_seconds_count", ()), 0.0))


def summary(name: str, values: list[float]) -> str:
    finite = [v for v in values if v != float("inf")]
    failed = len(values) - len(finite)
    return (f"{name}: median {statistics.median(finite) * 1e3:.1f} ms, max "
            f"{max(finite) * 1e3:.1f} ms over {len(values)}" + (f", {failed} failed" if failed
                                                                 else ""))


def bench_slowloris(tmp: Path, connections: int, seconds: float, gap: float) -> None:
    a = AgentProcess(tmp, None, "--poll-interval", "1")
    try:
        time.sleep(2)
        baseline = [timed_scrape(a) for _ in range(20)]
        polls0 = poll_seconds(a)
        result: dict = {}
        attack = threading.Thread(target=lambda: result.update(
            slowloris(a.url, connections, seconds, gap)))
        attack.start()
        during, threads, rss = [], [], []
        while attack.is_alive():
            during.append(timed_scrape(a))
            threads.append(agent_threads(a))
            rss.append(rss_mib(a))
            time.sleep(0.5)
        attack.join()
        polls1 = poll_seconds(a)
        after = []
        end = time.monotonic() + 10
        while time.monotonic() < end:
            after.append(timed_scrape(a))
            threads.append(agent_threads(a))
            time.sleep(0.25)
        polls2 = poll_seconds(a)
        print(f"slowloris: {result['opened']} connections opened, {connections} tried, a "
              f"header every {gap:g} s for {seconds:g} s")
        print(f"  agent threads: max {max(threads)}; RSS {min(rss):.1f}-{max(rss):.1f} MiB")
        print("  " + summary("scrape before", baseline))
        print("  " + summary("scrape during", during))
        print("  " + summary("scrape after the close", after))
        for label, (s0, c0), (s1, c1) in (("during", polls0, polls1), ("after", polls1, polls2)):
            if c1 > c0:
                print(f"  poll duration {label}: mean {(s1 - s0) / (c1 - c0) * 1e3:.2f} ms "
                      f"over {c1 - c0:.0f} polls")
    finally:
        a.stop()


def bench_passwords(tmp: Path, guessers: int, seconds: float) -> None:
    import bcrypt

    password = "right-horse-battery"
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10)).decode()
    (tmp / "web.yml").write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
    a = AgentProcess(tmp, None, "--web-config-file", str(tmp / "web.yml"))
    url = f"http://{a.url}/metrics"
    try:
        assert authed_get(url, "prometheus", password) == 200
        baseline = []
        for _ in range(20):
            started = time.monotonic()
            authed_get(url, "prometheus", password)
            baseline.append(time.monotonic() - started)
        stop = threading.Event()
        answers: list[int] = []

        def guess() -> None:
            while not stop.is_set():
                answers.append(authed_get(url, "prometheus", os.urandom(8).hex(), timeout=60))

        flood = [threading.Thread(target=guess) for _ in range(guessers)]
        for t in flood:
            t.start()
        during = []
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                seen = len(answers)
                wait_for(lambda s=seen: len(answers) >= s + 300 or time.monotonic() > end,
                         seconds + 30, 0.05)
                started = time.monotonic()
                ok = authed_get(url, "prometheus", password, timeout=30) == 200
                during.append(time.monotonic() - started if ok else float("inf"))
        finally:
            stop.set()
            for t in flood:
                t.join()
        codes = {c: answers.count(c) for c in sorted(set(answers))}
        print(f"wrong passwords: {guessers} clients for {seconds:g} s, {len(answers)} "
              f"answered {codes}")
        print("  " + summary("right password, no attack", baseline))
        print("  " + summary("right password, after every 300 wrong", during))
    finally:
        a.stop()


def bench_flood(tmp: Path, seconds: float) -> None:
    if os.geteuid() != 0:
        print("garbage flood: skipped (needs root to act as a second local user)")
        return
    import pwd
    import subprocess

    try:
        neighbour = pwd.getpwnam(NEIGHBOUR)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/false",
                        NEIGHBOUR], check=True)
        neighbour = pwd.getpwnam(NEIGHBOUR)
    room = Path(tempfile.mkdtemp(prefix="tpumon-bench-"))
    room.chmod(0o755)
    sock = room / "reporter.sock"
    a, sim = real_agent(tmp, sock, "--poll-interval", "5")
    try:
        for label, flood in (("no flood", False), ("flood", True)):
            flooder = as_user(neighbour, FLOOD_BOTH_SOCKETS, str(sock), connection_path(sock),
                              str(seconds + 1)) if flood else None
            if flooder is not None:
                assert flooder.stdout.readline().strip() == "flooding"
            time.sleep(0.5)
            cpu0, before = cpu_seconds(a), a.value("tpumon_reporter_reports_total") or 0
            jobs = {"connection": FakeReporter(socket=str(sock), min_interval=0),
                    "datagrams": FakeReporter(socket=str(sock), min_interval=0)}
            jobs["datagrams"]._sender._disconnect()
            jobs["datagrams"]._sender._retry_at = float("inf")  # an earlier version's
            sends = int(seconds * 10)
            started = time.monotonic()
            for step in range(sends):
                for job in jobs.values():
                    job.step(step)
                time.sleep(max(0.0, started + (step + 1) / 10 - time.monotonic()))
            cpu = (cpu_seconds(a) - cpu0) / (time.monotonic() - started)
            sent = flooder.communicate(timeout=60)[0].split()[-1] if flooder else "0"
            time.sleep(6)  # the next poll
            accepted = (a.value("tpumon_reporter_reports_total") or 0) - before
            print(f"garbage flood, {label}: agent CPU {cpu * 100:.0f} % of a core; "
                  f"{sent} messages on the flooder's connections")
            for kind, job in jobs.items():
                print(f"  job over {kind}: {sends - job.dropped} of {sends} taken by the "
                      f"kernel ({job.dropped} refused)")
            print(f"  reports accepted by the agent, both jobs: {accepted:.0f} of {2 * sends}")
        dropped = {r: a.value("tpumon_reporter_dropped_reports_total", reason=r)
                   for r in ("malformed", "oversized", "forbidden", "backlog")}
        print(f"  dropped by the agent: {dropped}")
    finally:
        a.stop()
        sim.terminate()
        sim.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--gap", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--guessers", type=int, default=200)
    parser.add_argument("--only", choices=("slowloris", "passwords", "flood"),
                        help="run this attack alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"tpumon hostile-neighbour bench ({os.cpu_count()} CPUs)")
        if args.only in (None, "slowloris"):
            bench_slowloris(Path(tmp), args.connections, args.seconds, args.gap)
        if args.only in (None, "passwords"):
            bench_passwords(Path(tmp), args.guessers, args.seconds)
        if args.only in (None, "flood"):
            bench_flood(Path(tmp), min(args.seconds, 10.0))


if __name__ == "__main__":
    main()
