"""A real gRPC RuntimeMetricService on loopback, built from tpu-info's own stubs.

Stands in for libtpu in tests: it answers with whatever the test puts in ``metrics``
(device id -> value, in any order, possibly partial or malformed), can hang, and records
the peers it saw so tests can tell whether the client reused its connection.
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Callable

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

from tpumon.sim.server import gauge_metric as gauge_entry
from tpumon.sources.tpu_runtime import DUTY_CYCLE, TOTAL, USAGE

V4_TOTAL = 34088157184


def chips_metrics(used: dict[int, int], total: int = V4_TOTAL,
                  duty: float = 90.0) -> dict[str, list[pb.Metric]]:
    """Usual answers for the given device ids: usage, total and duty cycle per device."""
    return {
        USAGE: [gauge_entry(d, u) for d, u in used.items()],
        TOTAL: [gauge_entry(d, total) for d in used],
        DUTY_CYCLE: [gauge_entry(d, duty) for d in used],
    }


class FakeRuntime(pb_grpc.RuntimeMetricServiceServicer):
    def __init__(self, metrics: dict[str, list[pb.Metric]] | None = None) -> None:
        self.metrics = metrics or {}
        self.delay = 0.0
        self.peers: list[str] = []
        self.calls = 0
        self.requested: list[str] = []  # metric names, in the order asked
        self.hook: Callable[[pb.MetricRequest], None] | None = None
        self.supported: list[str] | None = None  # None: ListSupportedMetrics unimplemented
        self.list_calls = 0
        self._release = threading.Event()

    def release(self) -> None:
        """Let hung calls return (so the server can stop promptly)."""
        self._release.set()

    def GetRuntimeMetric(self, request, context):
        self.calls += 1
        self.requested.append(request.metric_name)
        if self.hook is not None:
            self.hook(request)
        self.peers.append(context.peer())
        if self.delay:
            self._release.wait(self.delay)
        if request.metric_name not in self.metrics:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no metric {request.metric_name}")
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name,
                                                     metrics=self.metrics[request.metric_name]))


    def ListSupportedMetrics(self, request, context):
        self.list_calls += 1
        if self.supported is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "ListSupportedMetrics")
        return pb.ListSupportedMetricsResponse(
            supported_metric=[pb.SupportedMetric(metric_name=n) for n in self.supported])


class RuntimeServer:
    """Owns a grpc.Server for a FakeRuntime; ``port=0`` picks a free port. ``local``: with
    gRPC's local credentials, as tpu-info's client dials libtpu."""

    def __init__(self, runtime: FakeRuntime, port: int = 0, local: bool = False) -> None:
        self.runtime = runtime
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(runtime, self.server)
        address = f"127.0.0.1:{port}"
        self.port = self.server.add_secure_port(
            address, grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP)) \
            if local else self.server.add_insecure_port(address)
        assert self.port, f"could not bind 127.0.0.1:{port}"
        self.server.start()

    def stop(self) -> None:
        self.runtime.release()
        self.server.stop(grace=None).wait(5)

