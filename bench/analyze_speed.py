"""``tpumon analyze`` end to end, in samples per second: this tree against a baseline tree.

Three workloads (issue 20, item 5): one large trace (8M rows by default: copies of 8 hosts
of 4 chips, one scenario of the simulator each, leaks included, polled every 5 s; each host
its own job), a directory of many small traces (the same rows cut into files of
one host and a few hours each), and one slice (the first 2M rows, every host a worker of
one slice: one job of all its chips, pooled, as a pod's trace is). Each
is analyzed by this tree's ``analyze_path`` and by the baseline's (``git archive`` of
``--baseline-ref``, default ``main``: what `tpumon analyze` is today), each in a fresh
subprocess, alternating, median CPU seconds of ``--runs`` runs. CPU time, not wall time:
the machine is shared, and CPU time is what one core's throughput means (pyarrow's reader
threads and the forked workers that replay jobs in parallel are counted too; wall time is
shown beside it), and peak RSS (median of the runs; the larger of the process's and of
its largest forked worker's: VmHWM, ``ru_maxrss``). The table says whether both gave the same
verdicts, alerts, forecasts and reasons (they differ where the detector itself changed,
not where the reader did). Issue 44's figure: ``--rows 50000000`` (about 3.5 GiB of CSV
under TMPDIR, and as much again while this tree's spill file exists).

The corpus is built once from the simulator (about 1M rows) and multiplied: each copy is
another host of the slice, its times shifted by a few seconds, so every series is replayed
on its own; then written by pyarrow as CSV, host after host (a host's series end long
before the file: ``analyze`` replays them while it reads the rest,
tpumon/detect/early_replay.py), or with ``--by-time`` every poll's rows together, as an
agent records a trace live (no series ends before the file does).

    python bench/analyze_speed.py [--rows 8000000] [--runs 3] [--baseline-ref main]
                                  [--slice-rows 2000000] [--only-slice]

``--slice-rows`` sizes the slice (about 17,600 rows a chip: 5.5M rows are 312 chips,
18M about 1,024; ``--rows`` must be as many); ``--only-slice`` measures the slice alone.
``--jsonl-rows`` (2M by default, 0 for none): the first rows of the large trace as JSON
Lines, as ``tpumon export`` writes them (a baseline that reads JSON Lines row by row in
Python takes ~5 us a row, hence fewer rows than the CSV).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from tpumon.sim.tracegen import generate_trace  # noqa: E402
from tpumon.trace.arrow import arrow_schema  # noqa: E402

CHIPS = 4
POLL_S = 5.0
SCENARIOS = ("healthy", "linear-leak", "staircase-leak", "step-change", "saturating-cache",
             "chip0-leak", "job-restart", "healthy")
SMALL_HOURS = 6.0  # one small trace: one host, this many hours
SLICE_ROWS = 2_000_000  # the trace of one slice whose chips are all one job

#: Run in a subprocess with PYTHONPATH set to the tree under test: prints CPU seconds,
#: samples and a digest of the results.
_MEASURE = """
import inspect, json, resource, sys, time
from tpumon.detect import replay
paths = sys.argv[1:]
analyze = getattr(replay, "analyze_path", None) or replay.analyze_file
# as `tpumon analyze` runs it: on every usable core where the tree replays jobs in parallel
cores = getattr(replay, "usable_cores", lambda: 1)()
kwargs = {"workers": cores} if "workers" in inspect.signature(analyze).parameters else {}

def children():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # forked workers, once reaped
    return usage.ru_utime + usage.ru_stime

start = time.process_time() + children()
wall = time.perf_counter()
results = [r for p in paths for r in analyze(p, **kwargs)]
cpu = time.process_time() + children() - start
wall = time.perf_counter() - wall
import tpumon
# this process's own peak: VmHWM, not ru_maxrss, which execve carries over from the
# forking process (the benchmark, holding the corpus: 2.5 GiB at 50M rows)
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
           if line.startswith("VmHWM:"))
workers_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # the largest
print(json.dumps({"tree": tpumon.__file__, "cpu": cpu, "wall": wall, "rss": rss,
                  "workers_rss": workers_rss,
                  "samples": sum(r.samples for r in results),
                  "digest": [[r.host, r.chip, r.verdict,
                              r.alert and [r.alert["time"], r.alert["step"],
                                           r.alert["reason"]], r.assessment.reason,
                              r.predicted_oom and [r.predicted_oom["time"],
                                                   r.predicted_oom["step"]]]
                             for r in results]}))
"""


def base_table() -> pa.Table:
    """About 1M rows: one host per scenario, 4 chips, 5 s polls, 1.25 days each."""
    columns: dict[str, list] = {name: [] for name in arrow_schema().names}
    for i, scenario in enumerate(SCENARIOS):
        for r in generate_trace(scenario, duration_s=30 * 3600, poll_interval_s=POLL_S,
                                chips=CHIPS, seed=100 + i, host=f"s{i}", drop_probability=0.01):
            columns["time"].append(round(r.time, 3))
            columns["host"].append(r.host)
            columns["chip"].append(r.chip)
            columns["step"].append(r.step)
            columns["hbm_used_bytes"].append(r.hbm_used_bytes)
            columns["hbm_total_bytes"].append(r.hbm_total_bytes)
    return pa.table(columns, schema=arrow_schema())


def slice_table(base: pa.Table, rows: int) -> pa.Table:
    """Copies of ``base`` as hosts ``t1v-n-5f0c1a2b-w-K`` of one slice, ``rows`` rows."""
    copies = []
    for k in range(-(-rows // len(base))):
        hosts = np.char.add(f"t1v-n-5f0c1a2b-w-{k}-", base.column("host").to_numpy(
            zero_copy_only=False).astype(str))
        times = np.round(base.column("time").to_numpy() + 0.5 * k, 3)
        copies.append(base.set_column(0, "time", pa.array(times))
                      .set_column(1, "host", pa.array(hosts)))
    return pa.concat_tables(copies).slice(0, rows)


def write_small(table: pa.Table, directory: str) -> list[str]:
    """Cut a table into files of one host and SMALL_HOURS each."""
    os.makedirs(directory, exist_ok=True)
    times = table.column("time").to_numpy()
    hosts = table.column("host").to_numpy(zero_copy_only=False)
    piece = np.floor((times - times.min()) / (SMALL_HOURS * 3600)).astype(int)
    paths = []
    for host in dict.fromkeys(hosts.tolist()):
        mine = hosts == host
        for p in np.unique(piece[mine]).tolist():
            rows = np.flatnonzero(mine & (piece == p))
            path = os.path.join(directory, f"{host}-{p:03d}.csv")
            pcsv.write_csv(table.take(rows), path)
            paths.append(path)
    return paths


def write_jsonl(table: pa.Table, path: str) -> None:
    """The table as JSON Lines, each row as ``tpumon export`` writes it."""
    columns = [table.column(name).to_pylist() for name in arrow_schema().names]
    with open(path, "w") as f:
        for t, host, chip, step, used, total in zip(*columns, strict=True):
            f.write(f'{{"time": {t:.3f}, "host": {json.dumps(host)}, "chip": '
                    f'{json.dumps(chip)}, "step": {"null" if step is None else step}, '
                    f'"hbm_used_bytes": {used}, "hbm_total_bytes": {total}}}\n')


def one_slice(table: pa.Table) -> pa.Table:
    """The table's hosts as workers of one slice (``…-w-0-s3`` -> ``…-w-03``): one job of
    all its chips, pooled together, as a pod's trace is."""
    import pyarrow.compute as pc

    return table.set_column(1, "host", pc.replace_substring(table.column("host"), "-s", ""))


def baseline_tree(ref: str, directory: str) -> str:
    """The tpumon package at git ``ref``, extracted under ``directory``."""
    archive = subprocess.run(["git", "-C", ROOT, "archive", ref, "tpumon"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    return directory


def measure(tree: str, paths: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    # cwd too: ``python -c`` puts the working directory first on sys.path
    out = subprocess.run([sys.executable, "-c", _MEASURE, *paths], env=env, cwd=tree,
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def compare(label: str, paths: list[str], trees: dict[str, str], runs: int) -> list[str]:
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    wall: dict[str, list[float]] = {name: [] for name in trees}
    rss: dict[str, list[int]] = {name: [] for name in trees}
    digests: dict[str, list] = {}
    samples = 0
    for _ in range(runs):
        for name, tree in trees.items():
            got = measure(tree, paths)
            assert got["tree"].startswith(os.path.realpath(tree)), got["tree"]
            cpu[name].append(got["cpu"])
            wall[name].append(got["wall"])
            rss[name].append(max(got["rss"], got["workers_rss"]))
            digests[name], samples = got["digest"], got["samples"]
    load = os.getloadavg()[0]  # the machine is shared: say how busy it was
    same = len({json.dumps(d) for d in digests.values()}) == 1
    rates = {name: samples / statistics.median(c) for name, c in cpu.items()}
    walls = {name: samples / statistics.median(c) for name, c in wall.items()}
    base, new = rates["baseline"], rates["this tree"]
    peak = {name: statistics.median(r) / 2**30 for name, r in rss.items()}
    return [f"| {label} | {samples:,} | {base:,.0f} ({walls['baseline']:,.0f}) | "
            f"{new:,.0f} ({walls['this tree']:,.0f}) | {new / base:.2f}x "
            f"({walls['this tree'] / walls['baseline']:.2f}x) | "
            f"{peak['baseline']:.2f} | {peak['this tree']:.2f} | "
            f"{'same' if same else 'different'} | {load:.1f} |"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline-ref", default="main")
    parser.add_argument("--slice-rows", type=int, default=SLICE_ROWS)
    parser.add_argument("--only-slice", action="store_true")
    parser.add_argument("--only-large", action="store_true",
                        help="the one large CSV alone (issue 44's 50M rows: --rows 50000000)")
    parser.add_argument("--jsonl-rows", type=int, default=2_000_000)
    parser.add_argument("--by-time", action="store_true",
                        help="the large trace's rows in time order, every series' rows "
                             "interleaved (else host after host, as copies of the corpus)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        big = slice_table(base_table(), args.rows)
        if args.by_time:  # every poll's rows together, as an agent records them live
            big = big.sort_by([("time", "ascending")])
        big_path = os.path.join(tmp, "slice.csv")
        pcsv.write_csv(big, big_path)
        slice_path = os.path.join(tmp, "one-slice.csv")
        one = one_slice(big.slice(0, 0 if args.only_large else min(args.rows, args.slice_rows)))
        pcsv.write_csv(one, slice_path)
        chips = len(set(zip(one.column("host").to_pylist(), one.column("chip").to_pylist(),
                            strict=True)))
        jsonl_path = os.path.join(tmp, "trace.jsonl")
        jsonl_rows = 0 if args.only_slice or args.only_large else min(args.jsonl_rows,
                                                                      args.rows)
        if jsonl_rows:
            write_jsonl(big.slice(0, jsonl_rows), jsonl_path)
        small = [] if args.only_slice or args.only_large else write_small(
            big.slice(0, min(args.rows, 4_000_000)), os.path.join(tmp, "small"))
        rows = len(big)
        del big, one  # the corpus is on disk: the measured processes need the memory
        print(f"corpus written in {time.perf_counter() - start:.0f} s: {rows:,} rows in "
              f"one file; {len(small)} files of one host and {SMALL_HOURS:.0f} h; a slice of "
              f"{chips} chips", file=sys.stderr)
        trees = {"baseline": baseline_tree(args.baseline_ref, tempfile.mkdtemp(dir=tmp)),
                 "this tree": ROOT}
        lines = ["| trace | samples | baseline samples/s, CPU (wall) | this tree samples/s, "
                 "CPU (wall) | ratio, CPU (wall) | baseline peak RSS, GiB | this tree peak "
                 "RSS, GiB | results | load after |",
                 "|---|---|---|---|---|---|---|---|---|"]
        if not args.only_slice:
            lines += compare("one large CSV", [big_path], trees, args.runs)
            if small:
                lines += compare(f"{len(small)} small CSVs", sorted(small), trees, args.runs)
        if jsonl_rows:
            lines += compare("one JSON Lines trace", [jsonl_path], trees, args.runs)
        if not args.only_large:
            lines += compare(f"one slice of {chips} chips, one job (CSV)", [slice_path],
                             trees, args.runs)
    print(f"`analyze` end to end, CPU time, median of {args.runs} runs each, baseline = "
          f"`{args.baseline_ref}`:\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
