"""The exporter's serving loop against the stock one (issue 23, item 6).

tpumon's ``MetricsServer`` sleeps in select() on its listening socket and a wake-up
socket pair, with no timeout, and ``stop()`` writes one byte; the stock
``socketserver.serve_forever()`` (what prometheus-client's ``start_wsgi_server`` runs)
wakes every 0.5 s to look at its shutdown flag. Both serve the same WSGI server class and
app here, alternating in one process: the median latency of a request (a fresh connection
each, as Prometheus makes), the CPU time the process spends while nobody asks anything,
and the time ``stop`` takes.

    python bench/http_serve.py [--requests 400] [--idle 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import threading
import time
from typing import Callable

from prometheus_client import CollectorRegistry
from wsgiref.simple_server import make_server

from tpumon.web.http import MetricsServer, _Handler, _Server


class StockServer:
    """The same server class and handler under socketserver's serve_forever()."""

    def __init__(self) -> None:
        self._server = make_server("127.0.0.1", 0, _ok, _Server, handler_class=_Handler)

    def start(self) -> tuple[str, int]:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _ok(environ: dict, start_response: Callable) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok\n"]


def measure(server: MetricsServer | StockServer, requests: int, idle: float) -> tuple:
    host, port = server.start()
    if isinstance(server, MetricsServer):
        server.attach(CollectorRegistry(), lambda: None)  # type: ignore[arg-type,return-value]
    path = "/-/healthy" if isinstance(server, MetricsServer) else "/"
    latencies = []
    for _ in range(requests):
        start = time.perf_counter()
        conn = http.client.HTTPConnection(host, port, timeout=5)
        conn.request("GET", path)
        conn.getresponse().read()
        conn.close()
        latencies.append(time.perf_counter() - start)
    cpu = time.process_time()
    time.sleep(idle)
    idle_cpu = time.process_time() - cpu
    start = time.perf_counter()
    server.stop()
    return statistics.median(latencies), idle_cpu / idle, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of no requests")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[tuple]] = {"stock serve_forever()": [], "tpumon": []}
    for _ in range(args.rounds):
        results["stock serve_forever()"].append(measure(StockServer(), args.requests, args.idle))
        results["tpumon"].append(measure(MetricsServer("127.0.0.1:0"), args.requests, args.idle))
    print("| serving loop | request median | idle CPU (share of one core) | stop |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        latency, idle, stop = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"| {name} | {latency * 1e6:.0f} us | {idle * 100:.4f} % | {stop * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
