"""Trace reading speed: median microseconds per row over a ~1M-row trace.

`tpumon analyze` must get through >= 200,000 samples/s on one core, parse and
leak detection together, so parsing has to stay well under 5 us per row.
This generates a trace of the 'healthy' scenario (4 chips) into a temporary
directory, writes it with write_trace, and times:

- read_trace (rows as TraceRow objects, consumed one by one), and
- read_trace_columns (per-series numpy arrays, what `analyze` uses), when
  the installed tpumon has it, and its memory (one more run, under tracemalloc).

With ``--baseline-ref REF`` (e.g. HEAD) it also times read_trace of
tpumon's trace reader as it is at that git revision (bench/revision.py), so
that before and after come from the same process on the same machine.

    python bench/trace_read.py [--rows 1000000] [--runs 5] [--format csv|jsonl|both]
                               [--baseline-ref HEAD]
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tpumon import trace  # noqa: E402
from tpumon.sim.tracegen import generate_trace  # noqa: E402

CHIPS = 4
POLL_INTERVAL_S = 5.0


def make_trace(directory: str, rows: int, fmt: str) -> tuple[str, int]:
    path = os.path.join(directory, f"trace.{fmt}")
    duration_s = rows / CHIPS * POLL_INTERVAL_S
    gen = generate_trace("healthy", duration_s=duration_s, poll_interval_s=POLL_INTERVAL_S,
                         chips=CHIPS, seed=1)
    count = trace.write_trace(gen, path, format=fmt)
    return path, count


def load_baseline(ref: str) -> types.ModuleType:
    """tpumon's trace reader at git revision ``ref`` (bench/revision.py: any layout, the
    one trace.py module of old or today's trace package), as a module of its own."""
    from revision import import_revision

    return importlib.import_module(import_revision(ref) + ".trace")


def time_runs(fn, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def report(label: str, times: list[float], rows: int) -> None:
    per_row = [t / rows * 1e6 for t in times]
    med = statistics.median(per_row)
    print(f"  {label:<26} median {med:6.3f} us/row ({1 / med:4.2f} M rows/s), "
          f"min {min(per_row):6.3f}; runs {' '.join(f'{x:.3f}' for x in per_row)}", flush=True)


def bench_format(fmt: str, rows: int, runs: int, baseline: types.ModuleType | None,
                 ref: str | None) -> None:
    with tempfile.TemporaryDirectory(prefix="tpumon-bench-") as d:
        t0 = time.perf_counter()
        path, count = make_trace(d, rows, fmt)
        size = os.path.getsize(path)
        print(f"{fmt}: {count} rows, {size / 1e6:.1f} MB, generated in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)

        def consume(read):
            return lambda: collections.deque(read(path), maxlen=0)

        if baseline is not None:
            report(f"read_trace @ {ref}", time_runs(consume(baseline.read_trace), runs), count)
        report("read_trace", time_runs(consume(trace.read_trace), runs), count)
        columns = getattr(trace, "read_trace_columns", None)
        if columns is None:
            print("  read_trace_columns         (not in this tpumon)")
            return
        report("read_trace_columns", time_runs(lambda: columns(path), runs), count)
        tracemalloc.start()
        result = columns(path)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del result
        print(f"  read_trace_columns memory: {held / count:.0f} bytes/row held, "
              f"{peak / count:.0f} at the peak (tracemalloc)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--format", choices=("csv", "jsonl", "both"), default="csv")
    p.add_argument("--baseline-ref", default=None,
                   help="also time read_trace of tpumon/trace.py at this git revision")
    args = p.parse_args()
    baseline = load_baseline(args.baseline_ref) if args.baseline_ref else None
    print(f"python {sys.version.split()[0]}, {args.runs} runs each")
    for fmt in ("csv", "jsonl") if args.format == "both" else (args.format,):
        bench_format(fmt, args.rows, args.runs, baseline, args.baseline_ref)


if __name__ == "__main__":
    main()
