"""tpumon benchmarks (`make bench`): medians over repeated runs, ratios to a baseline run
in the same process. Figures are recorded in docs/benchmarks.md.

1. Runtime poll: tpumon's TpuRuntimeSource.poll() against tpu-info's own
   get_chip_usage() (the baseline), both reading the same simulated runtime on loopback,
   on one port (4 chips) and on four ports (one chip each, PyTorch/XLA multiprocess).
2. A hung runtime: how long one poll takes when the server never answers.
3. Simulator cost: Workload.sample() per call.
4. Leak detection in the agent: 4 chips polled every second, each sample fed to its
   ChipDetector one poll at a time (the agent's code path), CPU share of one core.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tpu_info import metrics as tpu_info_metrics  # noqa: E402
from tpu_info.device import TpuChip  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from fake_runtime import FakeRuntime, RuntimeServer, chips_metrics  # noqa: E402

from tpumon.sim.workload import Workload  # noqa: E402
from tpumon.sources.chips import inventory_for  # noqa: E402
from tpumon.sources.tpu_runtime import TpuRuntimeSource  # noqa: E402

import timing  # noqa: E402 - bench/ is on sys.path

REPEATS = 300


def median_ms(fn, repeats: int = REPEATS) -> float:
    return timing.median_ms(fn, repeats, warmup=10)


def free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def bench_poll(ports_count: int) -> tuple[float, float, float]:
    """tpu-info's three metrics, tpumon's poll asking every metric the runtime lists (15;
    the agent's slow round, every ``runtime.slow_metrics_interval``) and asking usage alone
    (every other poll), in ms. The simulator runs in a process of its own, as libtpu does:
    a server in the benchmark's process would share its GIL with the clients."""
    ports = free_ports(ports_count)
    sim = subprocess.Popen(
        [sys.executable, "-m", "tpumon", "sim", "--scenario", "healthy", "--chips", "4",
         "--acceleration", "1", "--port", ",".join(map(str, ports)), "--exit-with-parent"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert sim.stdout is not None and sim.stdout.readline().startswith("TPUMON_SIM_READY")
        every = TpuRuntimeSource("localhost", ports, 1.0, inventory_for("v4", 4))
        usage = TpuRuntimeSource("localhost", ports, 1.0, inventory_for("v4", 4),
                                 slow_interval=3600.0)
        usage.poll()  # its one slow round

        def baseline():  # tpu-info asks one address per call; a multi-port VM needs one each
            for port in ports:
                tpu_info_metrics.get_chip_usage(TpuChip.V4, f"localhost:{port}")

        base = median_ms(baseline)
        slow, fast = median_ms(every.poll), median_ms(usage.poll)
        every.close()
        usage.close()
        return base, slow, fast
    finally:
        sim.terminate()
        sim.wait(10)


def bench_hung() -> tuple[float, str]:
    server = RuntimeServer(FakeRuntime(chips_metrics({0: 1})))
    server.runtime.delay = 3600
    try:
        source = TpuRuntimeSource("localhost", [server.port], 1.0, inventory_for("v4", 1))
        t0 = time.perf_counter()
        try:
            source.poll()
        except Exception:  # noqa: BLE001 - SourceUnavailable expected
            pass
        ours = time.perf_counter() - t0
        done = threading.Event()

        def baseline():
            try:
                tpu_info_metrics.get_chip_usage(TpuChip.V4, f"localhost:{server.port}")
                done.set()
            except Exception:  # noqa: BLE001 - the server is torn down under it at the end
                pass

        threading.Thread(target=baseline, daemon=True).start()
        base = "returned" if done.wait(10) else "still blocked after 10 s"
        return ours, base
    finally:
        server.stop()


def bench_sample() -> float:
    workload = Workload("linear-leak", seed=2, start_time=0.0)
    t = [3600.0]

    def one():
        t[0] += 1.0
        workload.sample(t[0])

    return median_ms(one, 20000) * 1e3  # microseconds


def bench_agent_detection(hours: float = 6.0, pooled: bool = True) -> tuple[float, float]:
    """CPU seconds of detection per simulated second, for 4 chips at 1 s polls; with
    ``pooled``, the chips' evidence pooled after each poll as the agent does (one process
    holds the 4 chips, so once they leak every poll pools them)."""
    from itertools import groupby

    from tpumon.detect import ChipDetector
    from tpumon.detect.pooling import pool_jobs
    from tpumon.sim.tracegen import generate_trace

    rows = list(generate_trace("linear-leak", duration_s=hours * 3600, poll_interval_s=1.0,
                               chips=4, seed=3, poll_jitter_s=0.01))
    detectors = {c: ChipDetector() for c in "0123"}
    job_of = {c: "process 1" for c in detectors}
    start = time.process_time()
    for _, poll in groupby(rows, key=lambda r: r.time):
        for r in poll:
            detectors[r.chip].update((r.time,), (float(r.step),), (r.hbm_used_bytes,),
                                     (r.hbm_total_bytes,))
        assessments = {c: d.assessment for c, d in detectors.items()}
        if pooled:
            pool_jobs(assessments, job_of)
    cpu = time.process_time() - start
    return cpu / (hours * 3600), cpu / len(rows) * 1e6


def main() -> None:
    print(f"# tpumon benchmarks ({REPEATS} repeats, medians; python {sys.version.split()[0]})\n")
    print("| benchmark | tpu-info get_chip_usage, 3 metrics (baseline) | tpumon | ratio |")
    print("|---|---|---|---|")
    for ports in (1, 4):
        base, slow, fast = bench_poll(ports)
        print(f"| runtime poll, 4 chips on {ports} port(s), usage alone | {base:.2f} ms | "
              f"{fast:.2f} ms | {fast / base:.2f}x |")
        print(f"| runtime poll, 4 chips on {ports} port(s), all 15 metrics | {base:.2f} ms | "
              f"{slow:.2f} ms | {slow / base:.2f}x |")
    ours, base = bench_hung()
    print(f"| hung runtime (never answers), deadline 1 s | {base} | {ours:.2f} s | - |")
    print(f"\nWorkload.sample (4 chips): {bench_sample():.1f} us per call (median)")
    for pooled in (False, True):
        share, per_sample = bench_agent_detection(pooled=pooled)
        print(f"Leak detection in the agent, 4 chips at 1 s polls (6 simulated hours, one poll "
              f"at a time{', chips of the job pooled' if pooled else ''}): {100 * share:.3f} % "
              f"of one core ({per_sample:.0f} us CPU per sample)")


if __name__ == "__main__":
    main()
