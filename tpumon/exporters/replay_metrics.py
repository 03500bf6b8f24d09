"""The two series that let a slice's history be replayed from Prometheus.

``tpumon analyze --prometheus`` rebuilds each chip's trace from what Prometheus scraped.
A scrape is stamped with Prometheus' clock when it was taken, not with the moment the
agent polled, and the training step driving each chip is otherwise only per process.
These give both: the time of the latest runtime reading on the agent's own clock (the
simulated one under --simulate, so an accelerated simulation replays as it ran) and each
chip's step at that reading.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tpumon.identity import LABELS
from tpumon.state import Snapshot

IDENTITY = list(LABELS)


class ReplayCollector(Collector):
    """tpumon_runtime_sample_timestamp_seconds and tpumon_chip_step."""

    def __init__(self, get_snapshot: Callable[[], Snapshot]) -> None:
        self._get_snapshot = get_snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self._get_snapshot()
        ident = [snap.identity.labels()[k] for k in IDENTITY]
        stamp = GaugeMetricFamily(
            "tpumon_runtime_sample_timestamp_seconds",
            "When the latest runtime reading was taken, on the agent's clock (simulated "
            "under --simulate).", labels=IDENTITY)
        if snap.runtime is not None and snap.runtime.chips:
            stamp.add_metric(ident, snap.runtime.time)
        yield stamp
        step = GaugeMetricFamily("tpumon_chip_step",
                                 "Training step of the process driving the chip, at the "
                                 "latest runtime reading.", labels=IDENTITY + ["chip"])
        for chip, value in sorted(snap.chip_steps.items()):
            step.add_metric(ident + [chip], value)
        yield step
