"""``tpumon report TRACE`` end to end: peak RSS and time, this tree against a baseline tree
(issue 44, item 1: a trace of any length in bounded memory).

The trace is bench/analyze_speed.py's one large CSV (copies of 8 hosts of 4 chips, one
simulator scenario each, 5 s polls, each copy another host: ``--rows`` rows, about 31,000 a
chip, so 50M rows are 1,600 chips on 400 hosts, 400 pictures and pages). Each tree runs
the command in a fresh subprocess (``PYTHONPATH`` = the tree), the trees alternating,
``--runs`` times; the table gives the median wall and CPU seconds and the median peak RSS
(VmHWM of the process: ``report`` replays and draws in itself, with pyarrow's reader
threads). ``results`` says whether both trees wrote the same files: every PNG byte for
byte, every page but for the moment it was generated.

    python bench/report_speed.py [--rows 8000000] [--runs 3] [--baseline-ref main]
                                 [--baseline-tree DIR] [--csv PATH] [--only this|baseline]

``--baseline-tree``: a checkout to take the baseline from (else ``git archive`` of
``--baseline-ref``). ``--csv PATH``: the trace is kept there, and reused if it exists
(building 50M rows takes minutes; about 3.5 GiB). ``--only``: measure one tree alone (a
baseline that needs more memory or time than there is).
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

import pyarrow.csv as pcsv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from analyze_speed import ROOT, base_table, baseline_tree, slice_table  # noqa: E402

#: Run in a subprocess with PYTHONPATH set to the tree under test: `tpumon report` of the
#: trace into a directory; prints wall and CPU seconds, peak RSS and a digest of the files.
_MEASURE = """
import hashlib, json, os, re, resource, sys, time
from tpumon.cli import main
trace, outdir = sys.argv[1:]
start, cpu = time.perf_counter(), time.process_time()
try:
    main(["report", trace, "-o", outdir], standalone_mode=False)
except SystemExit as exc:
    assert not exc.code, exc.code
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status")
           if line.startswith("VmHWM:"))
digest = {}
for name in sorted(os.listdir(outdir)):
    data = open(os.path.join(outdir, name), "rb").read()
    if name.endswith(".html"):  # but for the moment it was generated
        data = re.sub(rb"\\(tpumon report\\) at [^<]*? UTC\\.", b"", data)
    digest[name] = hashlib.sha256(data).hexdigest()
import tpumon
print(json.dumps({"tree": tpumon.__file__, "wall": wall, "cpu": cpu, "rss": rss,
                  "files": len(digest), "digest": digest}))
"""


def measure(tree: str, trace: str, outdir: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    # cwd too: ``python -c`` puts the working directory first on sys.path
    out = subprocess.run([sys.executable, "-c", _MEASURE, trace, outdir], env=env, cwd=tree,
                         check=True, capture_output=True, text=True).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["tree"].startswith(os.path.realpath(tree)), got["tree"]
    return got


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline-ref", default="main")
    parser.add_argument("--baseline-tree", default=None)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--only", choices=["this", "baseline"], default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.csv or os.path.join(tmp, "trace.csv")
        if not os.path.exists(trace):
            start = time.perf_counter()
            big = slice_table(base_table(), args.rows)
            pcsv.write_csv(big, trace)
            del big  # the corpus is on disk: the measured processes need the memory
            print(f"{args.rows:,} rows written in {time.perf_counter() - start:.0f} s",
                  file=sys.stderr)
        trees = {"baseline": args.baseline_tree
                 or baseline_tree(args.baseline_ref, tempfile.mkdtemp(dir=tmp)),
                 "this tree": ROOT}
        if args.only:
            trees = {name: tree for name, tree in trees.items()
                     if name == {"this": "this tree"}.get(args.only, args.only)}
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for i in range(args.runs):
            for name, tree in trees.items():
                outdir = tempfile.mkdtemp(dir=tmp)
                runs[name].append(measure(tree, trace, outdir))
                got = runs[name][-1]
                print(f"{name} run {i + 1}: {got['wall']:.0f} s wall, {got['cpu']:.0f} s CPU, "
                      f"{got['rss'] / 2**30:.2f} GiB peak RSS, {got['files']} files",
                      file=sys.stderr)
                subprocess.run(["rm", "-rf", outdir], check=True)
    load = os.getloadavg()[0]
    same = len({json.dumps(r["digest"]) for rs in runs.values() for r in rs}) == 1
    print(f"`tpumon report` of {os.path.getsize(trace) / 2**30:.1f} GiB CSV "
          f"({args.rows:,} rows), median of {args.runs} run(s), baseline = "
          f"`{args.baseline_tree or args.baseline_ref}`:\n")
    print("| tree | wall s | CPU s | peak RSS, GiB | files |\n|---|---|---|---|---|")
    for name, rs in runs.items():
        print(f"| {name} | {statistics.median(r['wall'] for r in rs):.0f} | "
              f"{statistics.median(r['cpu'] for r in rs):.0f} | "
              f"{statistics.median(r['rss'] for r in rs) / 2**30:.2f} | {rs[0]['files']} |")
    print(f"\nresults: {'the same files' if same else 'DIFFERENT files'}; load after "
          f"{load:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
