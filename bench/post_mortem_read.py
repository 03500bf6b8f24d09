"""The slice post-mortem's read (`tpumon analyze --prometheus`): every sample (the
default) against `--resolution`, on a real Prometheus backfilled with promtool: a v4-32
(4 hosts x 4 chips) leaking, "demo" scraped every second (a simulated minute at 60x: 1 h
of Prometheus time), "day" every 15 s for 24 h. Prints each run's best of 3 wall time, the
verdicts and the samples replayed. Run from the repository root:
`PYTHONPATH=$PWD python bench/post_mortem_read.py` (needs prometheus and promtool)."""
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, "tests")
from test_prometheus_history import _openmetrics
from tools import TPUMON, Processes, clean_env, free_port, ready, wait_for
from tpumon.sim.tracegen import generate_trace

tmp = Path(tempfile.mkdtemp(prefix="tpumon-post-mortem-"))
now = time.time()
cases = {"demo": (1.0, 3600, 15.0), "day": (15.0, 5760, 15.0)}  # scrape s, scrapes, poll s
slices = {}
for name, (every, count, poll) in cases.items():
    hosts = [list(generate_trace("linear-leak", duration_s=count * poll, poll_interval_s=poll,
                                 chips=4, seed=w, host=f"{name}-w-{w}")) for w in range(4)]
    polls = [[rows[i:i + 4] for i in range(0, len(rows), 4)] for rows in hosts]
    first = now - 600 - count * every
    slices[name] = [(first + k * every + 0.001 * w, polls[w][k]) for k in range(count)
                    for w in range(4) if k < len(polls[w])]
(tmp / "s.om").write_text(_openmetrics(slices, now))
t = time.time()
subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(tmp / "s.om"),
                str(tmp / "data")], check=True, capture_output=True)
print(f"backfill {time.time() - t:.1f} s")
(tmp / "p.yml").write_text("global:\n  scrape_interval: 15s\n")
port = free_port()
procs = Processes(tmp)
procs.start("prometheus", ["prometheus", f"--config.file={tmp / 'p.yml'}",
                           f"--storage.tsdb.path={tmp / 'data'}",
                           f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"])
url = f"http://127.0.0.1:{port}"
try:
    wait_for(lambda: ready(f"{url}/-/ready"), timeout=60, interval=0.2)
    for name, (every, count, _) in cases.items():
        since = repr(now - 700 - count * every)
        for extra in ([], ["--resolution", "15"], ["--resolution", repr(every)]):
            best = []
            for _ in range(3):
                t = time.time()
                r = subprocess.run([*TPUMON, "analyze", "--prometheus", url, "--slice", name,
                                    "--since", since, *extra, "--format", "json"],
                                   capture_output=True, text=True, env=clean_env())
                best.append(time.time() - t)
            assert r.returncode == 0, r.stderr
            series = json.loads(r.stdout)["series"]
            verdicts = collections.Counter(s["verdict"] for s in series)
            print(name, extra or ["raw"], f"{min(best):.2f} s", dict(verdicts),
                  sum(s["samples"] for s in series))
finally:
    procs.stop_all()
    shutil.rmtree(tmp, ignore_errors=True)
