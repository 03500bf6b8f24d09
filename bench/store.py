"""History store benchmarks (`make bench`); figures go to docs/benchmarks.md.

1. Seven simulated days at 1 s polls on 4 chips, accelerated: the agent's per-poll work
   for the store (each chip's detector fed, the poll queued for the writer thread, the
   detectors checkpointed every 60 simulated seconds) as fast as the writer keeps up.
   Reports, per simulated day, the database's size on disk and the process's RSS, and
   the writer's cost per poll. Raw samples are kept 24 h (the default) and minute floors
   2 days (instead of 30), so that both tiers reach their steady state inside 7 days.
2. Poll-loop latency with the store on and off: Agent.poll_once() against the simulator
   over gRPC (4 chips), blocks of polls alternating between an agent with a store and one
   without, medians and 99th percentiles, and the ratio. Polls are spaced 50 ms apart
   (the agent's are 1-5 s), so the writer works between polls as it does in the agent;
   the store's own share of a poll (queueing it, and pickling the detectors at each
   checkpoint, here every second) is timed apart.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import numpy as np  # noqa: E402
import psutil  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_sim_server import ManualClock  # noqa: E402

from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner  # noqa: E402
from tpumon.detect import ChipDetector  # noqa: E402
from tpumon.metrics.collectors import build_registry  # noqa: E402
from tpumon.common.identity import Identity  # noqa: E402
from tpumon.sim.server import Simulator  # noqa: E402
from tpumon.sim.workload import Workload  # noqa: E402
from tpumon.sources.chips import inventory_for  # noqa: E402
from tpumon.sources.tpu_runtime import TpuRuntimeSource  # noqa: E402
from tpumon.state import AgentState  # noqa: E402
from tpumon.store.checkpoint import dump_detector  # noqa: E402
from tpumon.store.database import Retention, open_database  # noqa: E402
from tpumon.common.samples import Sample
from tpumon.store.writer import PollRecord, StoreWriter  # noqa: E402

DAY = 86400
CHIPS = 4


def seven_days(days: int) -> None:
    state_dir = tempfile.mkdtemp(prefix="tpumon-bench-store-")
    retention = Retention(raw_seconds=DAY, minute_seconds=2 * DAY)
    writer = StoreWriter(state_dir, retention, open_database(state_dir, retention))
    writer.start()
    start = 1750000000.0
    workload = Workload("healthy", chips=CHIPS, seed=7, start_time=start)
    job_end = workload.jobs[-1].end_time if workload.jobs else math.inf
    detectors = {str(c): ChipDetector() for c in range(CHIPS)}
    proc = psutil.Process()
    print(f"\n## {days} simulated days, 1 s polls, {CHIPS} chips (raw 24 h, minutes 2 d)")
    print("| day | database on disk | process RSS | writer CPU per poll (median of hours) |")
    print("|---|---|---|---|")
    per_hour: list[float] = []
    last = (0, 0.0)
    wall = time.perf_counter()
    pending: list[tuple[float, float, tuple[int, ...], int]] = []
    for k in range(days * DAY):
        t = start + k
        s = workload.sample(t) if t < job_end else None
        checkpoints = {}
        if s is not None and s.runtime_up:
            pending.append((t, s.step, s.hbm_used_bytes, s.hbm_total_bytes))
        # detectors fed a minute at a time (same result as per poll, at a fraction of the cost)
        if k % 60 == 59 and pending:
            times, steps, used, totals = zip(*pending, strict=True)
            for c, detector in detectors.items():
                detector.update(times, steps, [u[int(c)] for u in used], totals)
            pending = []
            checkpoints = {c: dump_detector(d) for c, d in detectors.items()}
        if s is not None and s.runtime_up:
            writer.submit(PollRecord("bench-w-0", tuple(
                (str(c), Sample(t, s.step, used, s.hbm_total_bytes))
                for c, used in enumerate(s.hbm_used_bytes)), checkpoints))
        if writer.health.queued_polls > 256:
            writer.flush()
        if k % 3600 == 3599:
            writer.flush()
            h = writer.health
            polls, seconds = h.polls_written_total - last[0], h.write_cpu_seconds_total - last[1]
            last = (h.polls_written_total, h.write_cpu_seconds_total)
            if polls:
                per_hour.append(seconds / polls)
        if k % DAY == DAY - 1:
            h = writer.health
            print(f"| {k // DAY + 1} | {h.size_bytes / 2**20:.1f} MiB | "
                  f"{proc.memory_info().rss / 2**20:.0f} MiB | "
                  f"{statistics.median(per_hour[-24:]) * 1e6:.0f} us |", flush=True)
    writer.stop()
    h = writer.health
    print(f"\n{h.polls_written_total:,} polls written in {time.perf_counter() - wall:.0f} s "
          f"wall; dropped {h.dropped_polls_total}, write errors {h.write_errors_total}; "
          f"writer CPU per poll over the run "
          f"{h.write_cpu_seconds_total / h.polls_written_total * 1e6:.0f} us, "
          f"wall {h.write_seconds_total / h.polls_written_total * 1e6:.0f} us "
          f"(median of hours {statistics.median(per_hour) * 1e6:.0f} us)")


def _agent(sim: Simulator, clock: ManualClock, store: StoreWriter | None) -> Agent:
    inventory = inventory_for("v4", CHIPS)
    state = AgentState(Identity(host="bench-w-0"), inventory, history_points=64)
    source = TpuRuntimeSource("127.0.0.1", sim.ports, 1.0, inventory, clock=clock.now)
    return Agent(AgentInputs(state, source, OwnerScanner(dict, 60), 1.0,
                             build_registry(lambda: state.current), store=store,
                             checkpoint_interval=1.0))


def poll_latency(blocks: int, per_block: int, gap: float = 0.05) -> None:
    start = 1750000000.0
    clock = ManualClock(start + 3600)
    sim = Simulator(Workload("linear-leak", chips=CHIPS, seed=3, start_time=start), clock,
                    "127.0.0.1", [0], CHIPS)
    sim.start()
    state_dir = tempfile.mkdtemp(prefix="tpumon-bench-latency-")
    writer = StoreWriter(state_dir, Retention(), open_database(state_dir, Retention()))
    writer.start()
    agents = {"off": _agent(sim, clock, None), "on": _agent(sim, clock, writer)}
    times: dict[str, list[float]] = {"off": [], "on": []}
    record_times: dict[bool, list[float]] = {False: [], True: []}  # by: with a checkpoint
    on = agents["on"]
    record = on._record

    def timed_record(*args, **kwargs):
        due = on._next_checkpoint
        t0 = time.perf_counter()
        record(*args, **kwargs)
        record_times[on._next_checkpoint != due].append(time.perf_counter() - t0)

    agents["on"]._record = timed_record
    for block in range(blocks):
        for name in (("off", "on") if block % 2 == 0 else ("on", "off")):
            agent = agents[name]
            for _ in range(per_block):
                clock.t += 1.0
                t0 = time.perf_counter()
                agent.poll_once()
                times[name].append(time.perf_counter() - t0)
                time.sleep(gap)
    writer.stop()
    sim.stop()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    p99 = {k: float(np.percentile(v, 99)) * 1e3 for k, v in times.items()}
    print(f"\n## Poll-loop latency, store off vs on ({blocks} alternating blocks of "
          f"{per_block} polls each; checkpoints every 1 s with the store on)")
    print("| store | median poll | p99 poll | max poll |")
    print("|---|---|---|---|")
    for k in ("off", "on"):
        print(f"| {k} | {med[k]:.2f} ms | {p99[k]:.2f} ms | {max(times[k]) * 1e3:.2f} ms |")
    print(f"\nratio on/off: median {med['on'] / med['off']:.2f}x, "
          f"p99 {p99['on'] / p99['off']:.2f}x; "
          f"{writer.health.polls_written_total:,} polls written, "
          f"dropped {writer.health.dropped_polls_total}")
    for checkpoint, label in ((False, "queueing a poll"), (True, "with a checkpoint of 4 chips")):
        v = record_times[checkpoint]
        print(f"the store's share of a poll, {label}: median {statistics.median(v) * 1e6:.0f} us,"
              f" p99 {float(np.percentile(v, 99)) * 1e6:.0f} us, max {max(v) * 1e6:.0f} us "
              f"({len(v)} polls)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=7, help="0: skip this part")
    parser.add_argument("--blocks", type=int, default=10, help="0: skip the latency part")
    parser.add_argument("--per-block", type=int, default=200)
    args = parser.parse_args()
    if args.blocks:
        poll_latency(args.blocks, args.per_block)
    if args.days:
        seven_days(args.days)


if __name__ == "__main__":
    main()
