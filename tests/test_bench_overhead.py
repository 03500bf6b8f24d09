"""The overhead benchmark's arithmetic (bench/overhead.py): CPU shares per minute.

The target is judged on the median minute, so the minutes must be cut from the samples
as they were taken (uneven spacing, a last partial minute) and a burst must move the
mean and not the median."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def overhead():
    sys.path.insert(0, str(ROOT / "bench"))  # the script imports soak.py beside it
    try:
        spec = importlib.util.spec_from_file_location("bench_overhead",
                                                      ROOT / "bench" / "overhead.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def samples(rates: list[float], every: float = 5.0, start: float = 100.0
            ) -> list[tuple[float, float]]:
    """(wall, CPU seconds) every ``every`` s, spending ``rates[i]`` of a core in sample i."""
    out, cpu = [(start, 10.0)], 10.0
    for i, rate in enumerate(rates):
        cpu += rate * every
        out.append((start + every * (i + 1), cpu))
    return out


def test_five_minutes_make_five_minutes(overhead):
    # 5 minutes sampled every 5 s, the third at 1.2 % of a core and the others at 0.4 %.
    rates = [0.004] * 24 + [0.012] * 12 + [0.004] * 24
    assert overhead.minute_shares(samples(rates)) == \
        pytest.approx([0.004, 0.004, 0.012, 0.004, 0.004])


def test_every_sample_counts_when_the_span_is_not_whole_minutes(overhead):
    # 5.5 minutes sampled every 6 s: five parts of 66 s, together the whole window's share.
    rates = [0.004] * 22 + [0.010] * 33
    shares = overhead.minute_shares(samples(rates, every=6.0))
    assert shares == pytest.approx([0.004, 0.004, 0.010, 0.010, 0.010])
    assert sum(shares) / 5 == pytest.approx(sum(rates) / len(rates))


def test_uneven_samples(overhead):
    # 130 s: two parts of 65 s, each ending at the first sample after it (61 s, 130 s).
    points = [(0.0, 0.0), (25.0, 0.1), (59.0, 0.236), (61.0, 0.244), (130.0, 0.52)]
    assert overhead.minute_shares(points) == pytest.approx([0.244 / 61, (0.52 - 0.244) / 69])


def test_a_burst_moves_the_mean_and_not_the_median(overhead):
    quiet, loud = [0.004] * 12, [0.012] * 12
    points = samples(quiet * 2 + loud + quiet * 2)
    cpu = overhead.Cpu((points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]),
                       overhead.minute_shares(points))
    assert cpu.mean == pytest.approx(0.0056)
    assert cpu.median == pytest.approx(0.004)


def test_a_window_under_a_minute_falls_back_to_the_mean(overhead):
    cpu = overhead.Cpu(0.003, overhead.minute_shares(samples([0.003] * 6)))
    assert cpu.minutes == [] and cpu.median == 0.003


def test_the_thread_breakdown_names_the_main_thread_poll_and_counts_a_busy_thread():
    """bench/overhead_threads.py: the agent's main thread (its poll loop) is "poll", and a
    thread that burns CPU shows under its own name."""
    import os
    import threading
    import time

    spec = importlib.util.spec_from_file_location("bench_overhead_threads",
                                                  ROOT / "bench" / "overhead_threads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before, woken_before = module.thread_cpu(os.getpid())
    stop = threading.Event()

    def spin() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        stop.wait()

    worker = threading.Thread(target=spin)
    worker.start()
    time.sleep(0.3)
    during, woken = module.thread_cpu(os.getpid())
    stop.set()
    worker.join()
    assert "poll" in before and during["poll"] >= before["poll"]
    assert during["python"] - before.get("python", 0) >= 40_000_000  # >= 40 ms of the 50
    # the worker blocked twice at least (its start, then stop.wait()): voluntary switches
    assert woken["python"] - woken_before.get("python", 0) >= 1 and woken["poll"] >= 1


def test_every_part_the_parts_bench_times_is_in_the_agent():
    """bench/overhead_parts.py leaves out a part it cannot find (so it can time an older
    tree): in this tree, each must be there, or a rename would drop it silently."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import overhead_parts
        for module, qualname in overhead_parts.PARTS:
            owner, name = overhead_parts.resolve(module, qualname)
            assert callable(getattr(owner, name)), qualname
    finally:
        sys.path.remove(str(ROOT / "bench"))
