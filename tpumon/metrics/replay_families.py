"""The two series that let a slice's history be replayed from Prometheus.

``tpumon analyze --prometheus`` rebuilds each chip's trace from what Prometheus scraped.
A scrape is stamped with Prometheus' clock when it was taken, not with the moment the
agent polled, and the training step driving each chip is otherwise only per process.
These give both: the time of the latest runtime reading on the agent's own clock (the
simulated one under --simulate, so an accelerated simulation replays as it ran) and each
chip's step at that reading.
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily

from tpumon.common.identity import LABELS
from tpumon.state import PollState

IDENTITY = list(LABELS)


def replay_metrics(snap: PollState, ident: list[str]) -> Iterator[GaugeMetricFamily]:
    """tpumon_runtime_sample_timestamp_seconds and tpumon_chip_step, from the poll state the
    scrape's other chip series come from (a poll published between two reads of the
    snapshot would date one poll's HBM by the next one's clock)."""
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
