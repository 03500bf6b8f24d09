"""Prometheus at pod scale (issue 44 item 3): a real Prometheus with the shipped rules
scrapes a simulated slice of WORKERS agents for an hour; then its memory, the time of
each shipped rule and of each query of the pod dashboard are measured.

The agents are a real agent's exposition, replayed: one `tpumon agent --simulate` runs
for 20 s and its /metrics is taken as every worker's, with that worker's host, worker and
slice labels and its chips' HBM moving (a sawtooth on a floor, one worker leaking), so
Prometheus stores, compresses and evaluates the series a slice's agents would give it. One
HTTP server answers all workers (`/metrics?worker=N`; Prometheus' relabelling makes each
its own target with its own `instance`), which is what lets 256 workers fit on a 2-core VM.

    .venv/bin/python bench/prometheus_pod.py                 # 256 workers, 60 min
    .venv/bin/python bench/prometheus_pod.py --workers 16 --minutes 3   # a smoke run

Figures to docs/benchmarks.md ("Prometheus at pod scale") and docs/pods.md.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_grafana import queries  # noqa: E402  (the dashboard's queries as Grafana sends them)
from tools import free_port  # noqa: E402

SLICE = "bench-pod"
HBM_TOTAL = 34_359_738_368  # v4: 32 GiB a chip
MOVING = re.compile(r'^(tpumon_hbm_(?:used|floor)_bytes)\{(.*chip="(\d+)".*)\} \S+$')


def capture_exposition(python: str) -> str:
    """A real simulated agent's /metrics after 20 s of polls."""
    port = free_port()
    agent = subprocess.Popen([python, "-m", "tpumon", "agent", "--simulate",
                              "--listen-address", f"127.0.0.1:{port}", "--poll-interval", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        time.sleep(20)
        return get(f"http://127.0.0.1:{port}/metrics")
    finally:
        agent.terminate()
        agent.wait(15)


def get(url: str, timeout: float = 60.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def worker_lines(exposition: str, worker: int) -> list[str | tuple[str, str, int]]:
    """The exposition as worker ``worker``'s: its identity labels; the HBM lines left as
    (metric, labels, chip) for the values of each scrape."""
    out: list[str | tuple[str, str, int]] = []
    for line in exposition.splitlines():
        line = (line.replace('host="vm"', f'host="{SLICE}-w-{worker}"')
                .replace('worker="0"', f'worker="{worker}"')
                .replace('slice="tpumon-sim"', f'slice="{SLICE}"')
                .replace('accelerator_type="v4-8"', 'accelerator_type="v4-2048"'))
        m = MOVING.match(line)
        out.append((m.group(1), m.group(2), int(m.group(3))) if m else line)
    return out


def hbm(metric: str, worker: int, chip: int, now: float, began: float) -> float:
    """A sawtooth on a floor that stays flat, except worker 0's, which grows 64 MiB/min."""
    floor = 12 * 2**30 + chip * 2**28 + (64 * 2**20 * (now - began) / 60 if worker == 0 else 0)
    return floor if metric.endswith("floor_bytes") else floor + 2**30 * ((now / 7.0) % 1.0)


def serve(templates: list[list], began: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            worker = int(query.get("worker", ["0"])[0])
            now = time.time()
            body = "\n".join(
                line if isinstance(line, str) else
                f"{line[0]}{{{line[1]}}} {hbm(line[0], worker, line[2], now, began):.0f}"
                for line in templates[worker]).encode() + b"\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def prometheus_config(tmp: Path, workers: int, port: int) -> Path:
    """The shipped configuration and rules (15 s scrapes and evaluations), no Alertmanager,
    the tpumon job's targets the replayed workers, each with its own instance label."""
    root = ROOT / "deploy/prometheus"
    shutil.copy(root / "tpumon.rules.yml", tmp / "tpumon.rules.yml")
    config = yaml.safe_load((root / "prometheus.yml").read_text())
    del config["alerting"]
    [job] = config["scrape_configs"]
    job["static_configs"] = [{"targets": [f"{SLICE}-w-{w}:9847" for w in range(workers)]}]
    job["relabel_configs"] = [
        {"source_labels": ["__address__"], "target_label": "instance"},
        {"source_labels": ["__address__"], "regex": rf"{SLICE}-w-(\d+):9847",
         "target_label": "__param_worker", "replacement": "$1"},
        {"target_label": "__address__", "replacement": f"127.0.0.1:{port}"}]
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def api(prom: str, path: str, **params: object) -> dict:
    return json.loads(get(f"{prom}/api/v1/{path}?" + urllib.parse.urlencode(params)))["data"]


def timed(prom: str, path: str, repeats: int = 5, **params: object) -> float:
    """Median seconds of ``repeats`` answers to one API call."""
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        api(prom, path, **params)
        took.append(time.perf_counter() - start)
    return statistics.median(took)


def rule_times(prom: str, samples: int, every: float) -> dict[str, list[float]]:
    """Each rule's evaluation time, as Prometheus reports it, over ``samples`` reads."""
    out: dict[str, list[float]] = {}
    for k in range(samples):
        for group in api(prom, "rules")["groups"]:
            for rule in group["rules"]:
                name = rule.get("name") or rule.get("record")
                out.setdefault(f"{group['name']}: {name}", []).append(rule["evaluationTime"])
        if k + 1 < samples:
            time.sleep(every)
    return out


def dashboard_times(prom: str, minutes: float) -> list[tuple[str, float]]:
    """Median seconds of every query of the pod dashboard, hosts "All", over the run."""
    now = time.time()
    span = min(minutes, 60) * 60
    out = []
    for q in queries("tpumon-pod", {"datasource": "prometheus", "slice": SLICE, "host": ".*"}):
        if q.kind == "variable":
            took = timed(prom, "series", **{"match[]": q.expr, "start": now - span, "end": now})
        elif q.kind == "instant":
            took = timed(prom, "query", query=q.expr, time=now)
        else:  # a panel 1,000 px wide over the last hour: Grafana's step is about 4 s
            took = timed(prom, "query_range", query=q.expr, start=now - span, end=now,
                         step=max(15, math.ceil(span / 1000)))
        out.append((q.where, took))
    return out


def wait(minutes: float, prom: str) -> None:
    """Sleep through the run, saying how far it is on a terminal."""
    end = time.time() + minutes * 60
    if sys.stderr.isatty():
        from rich.progress import Progress
        with Progress(transient=True) as progress:
            task = progress.add_task("Prometheus scraping the slice", total=minutes * 60)
            while time.time() < end:
                time.sleep(min(5, max(0, end - time.time())))
                progress.update(task, completed=minutes * 60 - (end - time.time()))
    else:
        time.sleep(minutes * 60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--minutes", type=float, default=60.0)
    args = parser.parse_args()
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("bench/prometheus_pod.py: prometheus is not installed (make test installs it)")
    exposition = capture_exposition(sys.executable)
    per_host = sum(1 for line in exposition.splitlines() if line and not line.startswith("#"))
    began = time.time()
    server = serve([worker_lines(exposition, w) for w in range(args.workers)], began)
    with tempfile.TemporaryDirectory(prefix="tpumon-prom-pod-") as tmp:
        config = prometheus_config(Path(tmp), args.workers, server.server_address[1])
        port = free_port()
        prom = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([binary, f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp}/data",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"])
        try:
            while True:
                try:
                    get(f"{prom}/-/ready")
                    break
                except OSError:
                    time.sleep(0.5)
            idle_rss = psutil.Process(proc.pid).memory_info().rss
            wait(args.minutes, prom)
            report(prom, proc, args, per_host, idle_rss)
        finally:
            proc.terminate()
            proc.wait(60)
            server.shutdown()


def report(prom: str, proc: subprocess.Popen, args: argparse.Namespace, per_host: int,
           idle_rss: int) -> None:
    rss = psutil.Process(proc.pid).memory_info().rss
    head = api(prom, "status/tsdb")["headStats"]["numSeries"]
    up = api(prom, "query", query='count(up{job="tpumon"} == 1)')["result"]
    print(f"{args.workers} workers x {per_host} series each, {args.minutes:.0f} min of 15 s "
          f"scrapes: {int(up[0]['value'][1]) if up else 0} targets up, head series "
          f"{head:,.0f}; Prometheus RSS {rss / 2**20:,.0f} MiB (idle before the first "
          f"scrape: {idle_rss / 2**20:,.0f} MiB), {(rss - idle_rss) / max(head, 1):,.0f} B a "
          f"series")
    print("\n| rule (group: name) | evaluation, median of 20 (ms) | max (ms) |\n|---|---|---|")
    for name, times in sorted(rule_times(prom, 20, 15).items(),
                              key=lambda kv: -statistics.median(kv[1])):
        print(f"| {name} | {1000 * statistics.median(times):.1f} | {1000 * max(times):.1f} |")
    print("\n| pod dashboard query | median of 5 (ms) |\n|---|---|")
    for where, took in sorted(dashboard_times(prom, args.minutes), key=lambda kv: -kv[1]):
        print(f"| {where} | {1000 * took:.1f} |")


if __name__ == "__main__":
    main()
