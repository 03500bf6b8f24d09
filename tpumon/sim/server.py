"""A stand-in for libtpu's runtime metric service, driven by a simulated workload.

It speaks the same gRPC service from tpu-info's own stubs, so the agent's real runtime
source talks to it exactly as to libtpu. When the workload's job is not running (between
jobs, after an OOM) the port is really closed, as it is on a TPU VM, so the agent's
reconnect path is exercised too. Simulated time runs ``acceleration`` times faster than
the wall clock.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from concurrent import futures
from typing import Callable

import grpc
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc

from tpumon.sim.runtime_entries import device_attribute, gauge_entry
from tpumon.sim.runtime_metrics import SERVED, RuntimeMetricsModel
from tpumon.sim.workload import Workload, WorkloadSample
from tpumon.sources.tpu_runtime import DUTY_CYCLE, TOTAL, USAGE

log = logging.getLogger("tpumon.sim")


class SimClock:
    """Simulated Unix time: starts at ``start`` (default now) and runs ``acceleration``x,
    but never more than ``max_lag`` simulated seconds past the observer's last look.

    The observer is whoever reads the runtime (the agent's polls, tpu-info). At high
    accelerations a host that stalls the agent for a fraction of a second would otherwise
    let the simulated job run minutes ahead unseen: gaps a real agent polling every
    second never sees, and which its detector rightly treats as breaks. With the bound,
    the simulated world waits for a late observer instead, so what the agent sees depends
    on its polls, not on how busy the host is. 0 (or less) means no bound.
    """

    def __init__(self, acceleration: float, start: float | None = None,
                 max_lag: float = 0.0) -> None:
        self.acceleration = acceleration
        self._mono0 = time.monotonic()
        self._start = time.time() if start is None else start
        self._max_lag_real = max_lag / acceleration if max_lag > 0 else math.inf
        self._waited = 0.0  # real seconds the simulated world spent waiting for the observer
        self._seen = self._mono0  # real time of the observer's last look
        self._last = -math.inf  # the latest time given out: never go back, not by a rounding
        self._lock = threading.Lock()

    def now(self) -> float:
        """The simulated time, for anyone but the observer: it does not move the bound."""
        with self._lock:
            return self._simulated(min(time.monotonic(), self._seen + self._max_lag_real))

    def observe(self) -> float:
        """The simulated time as the observer's look sees it; the look moves the bound."""
        with self._lock:
            real = time.monotonic()
            self._waited += max(0.0, real - self._seen - self._max_lag_real)
            self._seen = real
            return self._simulated(real)

    def _simulated(self, real: float) -> float:
        self._last = max(self._last, self._start + (real - self._mono0 - self._waited)
                         * self.acceleration)
        return self._last


class SampleCache:
    """One workload sample shared by the calls of one poll, so they agree with each other.

    An agent poll is three calls in quick succession; without this each would land at
    another random phase of the step and used/total/duty would not belong together.
    """

    def __init__(self, workload: Workload, clock: SimClock, hold_seconds: float = 0.05) -> None:
        self.workload = workload
        self.clock = clock
        self._hold = hold_seconds
        self._lock = threading.Lock()
        self._sample: WorkloadSample | None = None
        self._taken = -1e9

    def current(self, observed: bool = False) -> WorkloadSample:
        """The shared sample, renewed once ``hold_seconds`` passed, on the wall clock or
        (scaled by the acceleration) on the simulated one; ``observed`` when the runtime's
        reader asks (see :class:`SimClock`)."""
        with self._lock:
            now = time.monotonic()
            sim_now = self.clock.observe() if observed else self.clock.now()
            sample = self._sample
            if sample is None or now - self._taken > self._hold or \
                    abs(sim_now - sample.time) > self._hold * self.clock.acceleration:
                sample = self._sample = self.workload.sample(sim_now)
                self._taken = now
            return sample


def gauge_metric(device_id: int, value: int | float, timestamp: float | None = None) -> pb.Metric:
    """One entry of a runtime metric response, keyed by device id as libtpu does; stamped
    with the (simulated) time it describes when ``timestamp`` is given."""
    return gauge_entry(device_attribute(device_id), value, timestamp)


class SimulatedRuntime(pb_grpc.RuntimeMetricServiceServicer):
    """The service for one port, answering for the device ids this port owns; the
    megascale (DCN) metrics on one port only (``megascale``)."""

    def __init__(self, samples: SampleCache, device_ids: list[int],
                 model: RuntimeMetricsModel | None = None, megascale: bool = False,
                 on_down: Callable[[], None] | None = None) -> None:
        self._samples = samples
        self._device_ids = device_ids
        self._model = model
        self._megascale = megascale
        self._on_down = on_down  # before a reader learns the job is gone (its kernel line)

    def GetRuntimeMetric(self, request: pb.MetricRequest,
                         context: grpc.ServicerContext) -> pb.MetricResponse:
        sample = self._samples.current(observed=True)
        if not sample.runtime_up:
            if self._on_down is not None:
                self._on_down()
            context.abort(grpc.StatusCode.UNAVAILABLE, "runtime is not running")
        if self._model is not None and request.metric_name in SERVED:
            self._model.advance(sample)
            entries = self._model.entries(request.metric_name, sample, self._device_ids,
                                          self._megascale)
            return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name,
                                                         metrics=entries))
        values = {
            USAGE: lambda d: sample.hbm_used_bytes[d],
            TOTAL: lambda d: sample.hbm_total_bytes,
            DUTY_CYCLE: lambda d: float(sample.duty_cycle_pct[d]),
        }.get(request.metric_name)
        if values is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown metric {request.metric_name}")
        metrics = [gauge_metric(d, values(d), sample.time) for d in self._device_ids]
        return pb.MetricResponse(metric=pb.TPUMetric(name=request.metric_name, metrics=metrics))

    def ListSupportedMetrics(self, request: pb.ListSupportedMetricsRequest,
                             context: grpc.ServicerContext) -> pb.ListSupportedMetricsResponse:
        names = (USAGE, TOTAL, DUTY_CYCLE) + (SERVED if self._model is not None else ())
        return pb.ListSupportedMetricsResponse(
            supported_metric=[pb.SupportedMetric(metric_name=n) for n in names])


def split_devices(chips: int, ports: int) -> list[list[int]]:
    """Contiguous device ids per port: 4 chips on 4 ports is one each (PyTorch/XLA style)."""
    return [[d for d in range(chips) if d * ports // chips == p] for p in range(ports)]


class Simulator:
    """Runs one gRPC server per port and closes/reopens them as the simulated job stops/starts."""

    def __init__(self, workload: Workload, clock: SimClock, host: str, ports: list[int],
                 chips: int, kernel_log: str | None = None) -> None:
        self.samples = SampleCache(workload, clock)
        self.workload = workload
        #: where the simulated kernel says it killed the job for memory (the agent reads it
        #: as its kernel log): a "host_oom" end is the kernel's word, as on a TPU VM
        self.kernel_log = kernel_log
        self._told: set[float] = set()  # start times of the jobs whose kill was written
        self._telling = threading.Lock()
        self.model = RuntimeMetricsModel(chips, workload.params.step_time_s,
                                         seed=int(workload.params.step_time_s * 1e6))
        self.host = host
        self.ports = list(ports)
        self._devices = split_devices(chips, len(ports))
        self._servers: list[grpc.Server | None] = [None] * len(ports)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> list[int]:
        """Open the ports (port 0 picks a free one, kept across restarts); returns them."""
        for i in range(len(self.ports)):
            self._open(i)
        self._watcher = threading.Thread(target=self._follow_job, name="sim-job", daemon=True)
        self._watcher.start()
        return list(self.ports)

    def _open(self, i: int) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(
            SimulatedRuntime(self.samples, self._devices[i], self.model, megascale=i == 0,
                             on_down=self._tell_kernel_kills),
            server)
        bound = server.add_insecure_port(f"{self.host}:{self.ports[i]}")
        if bound == 0:
            raise OSError(f"cannot listen on {self.host}:{self.ports[i]}")
        self.ports[i] = bound
        server.start()
        self._servers[i] = server

    def _close(self, i: int) -> None:
        server, self._servers[i] = self._servers[i], None
        if server is not None:
            server.stop(grace=None)

    def _follow_job(self) -> None:
        """Close the ports while the simulated runtime is down, reopen them when it is back.
        While they are closed no reader can look, so time runs on unobserved."""
        while not self._stop.wait(0.1):
            closed = all(server is None for server in self._servers)
            up = self.samples.current(observed=closed).runtime_up
            if not up:  # the kernel writes its kill before the process is gone
                self._tell_kernel_kills()
            for i, server in enumerate(self._servers):
                if up and server is None:
                    log.info("simulated runtime back on port %d", self.ports[i])
                    self._open(i)
                elif not up and server is not None:
                    log.info("simulated runtime gone from port %d", self.ports[i])
                    self._close(i)

    def _tell_kernel_kills(self) -> None:
        """A job that ended killed for host memory: the kernel's line, once per job, in
        /dev/kmsg's record format, naming this process (the chips' holder)."""
        if self.kernel_log is None:
            return
        with self._telling:  # the watcher and the gRPC threads may both ask
            self._tell_once(self.kernel_log)

    def _tell_once(self, kernel_log: str) -> None:
        now = self.samples.current().time
        for job in self.workload.jobs:
            if job.end_reason == "host_oom" and job.end_time <= now \
                    and job.start_time not in self._told:
                self._told.add(job.start_time)
                pid = os.getpid()
                with open(kernel_log, "a", encoding="utf-8") as kmsg:
                    kmsg.write(f"3,{len(self._told)},{int(job.end_time * 1e6)},-;Out of memory: "
                               f"Killed process {pid} (python3) total-vm:104857600kB, "
                               "anon-rss:99614720kB\n")

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=2)
        for i in range(len(self._servers)):
            self._close(i)
