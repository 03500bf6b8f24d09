"""The runtime's other metrics as the simulator serves them, moving with the workload.

Gauges follow the workload sample: HBM bandwidth with the duty cycle, the TensorCore's
idle time growing while it does nothing (warm-up, a stall), the HLO queue emptying in a
stall. Distributions are cumulative as libtpu keeps them: each look adds what happened
since the last one (HLO executions at the step rate, a few DCN transfers per step of two
buffer sizes) as seeded lognormal draws around plausible medians, DCN latencies scaled by
the sample's ``dcn_slowdown`` (scenario "slow-dcn"). Exponential buckets of factor 2 from
1 us, as Google's Distribution lays them out.
"""

from __future__ import annotations

import math
import random
import threading

from tpu_info.metrics import MetricName as M
from tpu_info.proto import tpu_metric_service_pb2 as pb

from tpumon.sim.runtime_entries import (buffer_attribute, device_attribute, distribution_entry,
                                        gauge_entry, hlo_attribute)
from tpumon.sim.workload import WorkloadSample

SCALE_US, GROWTH, FINITE = 1.0, 2.0, 34  # 1 us .. 2^34 us (~4.8 h)
DRAWS = 24  # lognormal draws per look and distribution; their weights add up to the events
BUFFERS = ("1MiB", "16MiB")
# median (us, or Mbps for the delivery rate), spread (lognormal sigma), events per step,
# whether the host's DCN slowdown applies (as a factor, or divides for a rate)
MEGASCALE: dict[str, tuple[float, float, float, str]] = {
    M.BUFFER_TRANSFER_LATENCY_US.value: (400.0, 0.35, 4, "times"),
    M.INBOUND_BUFFER_TRANSFER_LATENCY_US.value: (450.0, 0.35, 4, "times"),
    M.HOST_TO_DEVICE_TRANSFER_LATENCY_US.value: (60.0, 0.3, 2, ""),
    M.DEVICE_TO_HOST_TRANSFER_LATENCY_US.value: (70.0, 0.3, 2, ""),
    M.COLLECTIVE_E2E_LATENCY_US.value: (2500.0, 0.3, 2, "times"),
    M.HOST_COMPUTE_LATENCY_US.value: (35.0, 0.25, 2, ""),
    M.GRPC_TCP_MIN_RTT_US.value: (45.0, 0.2, 1, "sqrt"),
    M.GRPC_TCP_DELIVERY_RATE_MBPS.value: (20000.0, 0.2, 1, "divide"),
}
GAUGES = (M.HBM_BW_UTIL.value, M.TENSORCORE_IDLE_DURATION.value, M.HLO_QUEUE_SIZE.value)
HLO_TIMING = M.HLO_EXECUTION_TIMING_DISTRIBUTION_MICROSECONDS.value
SERVED = GAUGES + (HLO_TIMING,) + tuple(MEGASCALE)
BUSY_PCT = 20.0  # duty cycle above which the TensorCore counts as working


class _Cumulative:
    """One cumulative distribution: per-bucket counts and the sum of the values."""

    def __init__(self) -> None:
        self.counts = [0] * (FINITE + 2)
        self.total = 0.0

    def add(self, value: float, weight: int) -> None:
        index = 0 if value < SCALE_US else min(
            int(math.log(value / SCALE_US, GROWTH)) + 1, FINITE + 1)
        self.counts[index] += weight
        self.total += value * weight

    def entry(self, attribute: pb.Attribute) -> pb.Metric:
        n = sum(self.counts)
        return distribution_entry(attribute, self.counts, self.total / n if n else 0.0,
                                  SCALE_US, GROWTH, FINITE)


class RuntimeMetricsModel:
    """The simulated runtime's counters for one host, advanced by each workload sample."""

    def __init__(self, chips: int, step_time_s: float, seed: int = 0) -> None:
        self._rng = random.Random(f"tpumon-sim:{seed}:runtime-metrics")
        self._step_time = step_time_s
        self._hlo = [_Cumulative() for _ in range(chips)]
        self._megascale = {name: {b: _Cumulative() for b in BUFFERS} for name in MEGASCALE}
        self._idle_since: list[float | None] = [None] * chips
        self._last: float | None = None
        self._lock = threading.Lock()

    def advance(self, sample: WorkloadSample) -> None:
        """Add what happened between the last sample and this one (once per sample time)."""
        with self._lock:
            if self._last is not None and sample.time <= self._last:
                return
            elapsed = 0.0 if self._last is None else min(sample.time - self._last, 86400.0)
            previous, self._last = self._last, sample.time
            for chip, duty in enumerate(sample.duty_cycle_pct):
                busy = duty >= BUSY_PCT
                if busy:
                    self._idle_since[chip] = None
                elif self._idle_since[chip] is None:  # idle since the last look saw it busy
                    self._idle_since[chip] = sample.time if previous is None else previous
                steps = elapsed / self._step_time if busy else 0.0
                self._draw(self._hlo[chip], steps, self._step_time * 1e6 * duty / 100, 0.08)
            if sample.stalled or not sample.duty_cycle_pct:
                return
            steps = elapsed / self._step_time
            for name, (median, sigma, per_step, mode) in MEGASCALE.items():
                factor = {"times": sample.dcn_slowdown, "sqrt": math.sqrt(sample.dcn_slowdown),
                          "divide": 1.0 / sample.dcn_slowdown}.get(mode, 1.0)
                for i, size in enumerate(BUFFERS):
                    self._draw(self._megascale[name][size], steps * per_step,
                               median * factor * (4.0 if i else 1.0) ** (mode != "divide"),
                               sigma)

    def _draw(self, dist: _Cumulative, events: float, median: float, sigma: float) -> None:
        """``events`` (rounded) values spread over a few seeded draws."""
        n = int(events + self._rng.random())
        draws = min(n, DRAWS)
        for k in range(draws):
            weight = n // draws + (1 if k < n % draws else 0)
            dist.add(median * math.exp(self._rng.gauss(0.0, sigma)), weight)

    def entries(self, name: str, sample: WorkloadSample, device_ids: list[int],
                megascale: bool) -> list[pb.Metric] | None:
        """The response entries for ``name`` on a port serving ``device_ids`` (megascale
        only on the port that serves it); None for a metric not modelled here."""
        with self._lock:
            if name in MEGASCALE:
                return [d.entry(buffer_attribute(b)) for b, d in self._megascale[name].items()
                        ] if megascale else []
            if name == HLO_TIMING:
                return [self._hlo[d].entry(hlo_attribute(d)) for d in device_ids]
            if name == M.HLO_QUEUE_SIZE.value:
                return [gauge_entry(hlo_attribute(d), 0 if sample.stalled else
                                    1 + int(sample.duty_cycle_pct[d] / 40)) for d in device_ids]
            if name == M.HBM_BW_UTIL.value:
                return [gauge_entry(device_attribute(d), round(
                    sample.duty_cycle_pct[d] * 0.55 + self._rng.random(), 2)) for d in device_ids]
            if name == M.TENSORCORE_IDLE_DURATION.value:
                return [gauge_entry(device_attribute(d), self._idle(d, sample.time))
                        for d in device_ids]
            return None

    def _idle(self, chip: int, now: float) -> float:
        since = self._idle_since[chip]
        return round(now - since, 3) if since is not None else round(0.002 * self._rng.random(), 4)
