"""Hundreds of workers' agents from one process: a pod-sized slice for ``status --slice``
and ``watch --slice``, some of its agents down and some slow.

A real agent per host is a process polling its own runtime; 256 of them do not fit on a
2-core VM, and what ``--slice`` reads of each is one HTTP answer, ``/api/status``. So each
simulated worker here is an HTTP server on its own loopback address (127.0.0.1 + k, all on
the same port, as the workers of a pod are), answering with the document the agent itself
writes (:func:`tpumon.web.status.status_document`) from a poll of its chips: healthy, or
leaking on the workers given. A down worker has nothing listening on its address (a
refused connection); a slow one answers after a delay.

    python -m tpumon.sim.agents --hosts 256 --down 26 --slow 26 [--port 9847]

prints the peers and serves until Ctrl-C (docs/pods.md, bench/slice_fanout.py).
"""

from __future__ import annotations

import argparse
import json
import random
import selectors
import signal
import socketserver
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tpumon.detect.verdict import Assessment, Verdict
from tpumon.common.identity import Identity
from tpumon.common.samples import ChipSample, RuntimeReading
from tpumon.sim.naming import accelerator_type, worker_hostname
from tpumon.sim.pod import host_address
from tpumon.sources.chips import ChipInventory
from tpumon.sources.health import SourceHealth
from tpumon.state import PollState
from tpumon.web.status import status_document

GiB = 2**30
V4_HBM_BYTES = 32 * GiB


@dataclass(frozen=True)
class FleetSpec:
    """Which workers there are and how each behaves: ``down`` and ``slow`` are worker
    numbers; a slow one answers after ``slow_seconds``."""

    hosts: int
    port: int
    down: frozenset[int] = frozenset()
    slow: frozenset[int] = frozenset()
    slow_seconds: float = 30.0
    leaking: frozenset[int] = frozenset()
    chips: int = 4
    slice_name: str = "pod-sim"
    base_address: str = "127.0.0.1"
    addresses: list[str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "addresses", [host_address(self.base_address, k)
                                               for k in range(self.hosts)])

    @classmethod
    def spread(cls, hosts: int, port: int, down: int, slow: int, seed: int = 0, *,
               slow_seconds: float = 30.0, leaking: frozenset[int] = frozenset()) -> FleetSpec:
        """``down`` and ``slow`` workers drawn at random (reproducibly from ``seed``), as
        a pod's failures fall, not the last ones in a row."""
        if min(hosts, down, slow) < 0 or down + slow > hosts:
            raise ValueError(f"{down} down and {slow} slow of {hosts} workers")
        chosen = random.Random(seed).sample(range(hosts), down + slow)
        return cls(hosts, port, frozenset(chosen[:down]), frozenset(chosen[down:]),
                   slow_seconds, leaking)

    def peers(self) -> list[str]:
        return [f"{address}:{self.port}" for address in self.addresses]


def agent_document(spec: FleetSpec, worker: int, now: float) -> bytes:
    """Worker ``worker``'s /api/status: its chips at 20-27 GiB of 32, a leak forecast
    on the leaking workers, written by the agent's own status_document."""
    chips = {str(c): ChipSample(str(c), 20 * GiB + (worker * 7 + c) % 8 * GiB,
                                V4_HBM_BYTES, 0.9, c, 8431) for c in range(spec.chips)}
    assessments = {c: _assessment(worker in spec.leaking, s.hbm_used_bytes, now, worker)
                   for c, s in chips.items()}
    snap = PollState(
        time=now,
        identity=Identity(worker_hostname(spec.slice_name, worker), str(worker),
                          accelerator_type("v4", spec.chips, spec.hosts), spec.slice_name),
        inventory=ChipInventory("v4", spec.chips, 1, V4_HBM_BYTES),
        runtime=RuntimeReading(now, chips),
        owners={c: 4000 + worker for c in chips},
        health=(SourceHealth("tpu_runtime", True, None, now, 100, 0, 0.004),),
        assessments=assessments, polls_total=100)
    return json.dumps(status_document(snap)).encode()


def _assessment(leak: bool, floor: int, now: float, worker: int) -> Assessment:
    if not leak:
        return Assessment(Verdict.OK, "flat floor", floor_bytes=floor)
    return Assessment(Verdict.LEAK, "the floor grows 1.2 GiB/h", floor_bytes=floor,
                      slope_bytes_per_step=150e3, slope_bytes_per_second=1.2 * GiB / 3600,
                      predicted_oom_time=now + 3600 * (2 + worker % 5))


class _Server(ThreadingHTTPServer):
    """http.server's server without its reverse lookup of the address it binds
    (socket.getfqdn: ~90 ms per 127.0.0.k here, 20 s for a 256-worker fleet)."""

    daemon_threads = True
    request_queue_size = 64  # the CLI asks them all at once
    timeout = 0  # handle_request() never waits: the fleet's selector said it is ready

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class AgentFleet:
    """Every worker of ``spec`` that is not down, served until :meth:`close`: one thread
    waits on every listening socket and hands each connection to its server (a thread per
    request, as ThreadingHTTPServer does), not a serve_forever thread per server: with
    those, a 1,024-worker fleet does not answer in time on 2 cores (docs/benchmarks.md)."""

    def __init__(self, spec: FleetSpec) -> None:
        self.spec = spec
        self._servers: list[_Server] = []
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        try:
            for worker, address in enumerate(spec.addresses):
                if worker not in spec.down:
                    self._serve(worker, address)
        except BaseException:
            self.close()
            raise
        self._thread = threading.Thread(target=self._accept, name="sim-agents", daemon=True)
        self._thread.start()

    def _serve(self, worker: int, address: str) -> None:
        spec = self.spec
        delay = spec.slow_seconds if worker in spec.slow else 0.0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                time.sleep(delay)
                body = agent_document(spec, worker, time.time())
                try:
                    self.send_response(200 if self.path == "/api/status" else 404)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client stopped waiting for a slow worker: what it is for

            def log_message(self, format: str, *args: object) -> None:
                pass

        try:
            httpd = _Server((address, spec.port), Handler)
        except OSError as exc:
            raise OSError(f"cannot serve worker {worker} on {address}:{spec.port}: "
                          f"{exc.strerror or exc}") from None
        self._servers.append(httpd)
        self._selector.register(httpd.socket, selectors.EVENT_READ, httpd)

    def _accept(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.2):
                key.data.handle_request()  # ready: accepts without blocking

    def close(self) -> None:
        self._stop.set()
        if hasattr(self, "_thread"):
            self._thread.join()
        self._selector.close()
        for s in self._servers:
            s.server_close()
        self._servers.clear()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tpumon.sim.agents",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--port", type=int, default=9847)
    parser.add_argument("--down", type=int, default=0, help="workers with no agent")
    parser.add_argument("--slow", type=int, default=0, help="workers whose agent is slow")
    parser.add_argument("--slow-seconds", type=float, default=30.0)
    parser.add_argument("--leaking", type=int, default=0, help="workers 0..N-1 leak")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        spec = FleetSpec.spread(args.hosts, args.port, args.down, args.slow, args.seed,
                                slow_seconds=args.slow_seconds,
                                leaking=frozenset(range(args.leaking)))
        fleet = AgentFleet(spec)
    except (ValueError, OSError) as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    print(",".join(spec.peers()), flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    fleet.close()


if __name__ == "__main__":
    main()
