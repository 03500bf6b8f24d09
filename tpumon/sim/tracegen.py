"""Trace files from simulated workloads, polled the way the agent polls.

Tests and benchmarks of the leak detector need long traces with known
ground truth; recording them from real TPUs is not possible in CI. This
polls a :class:`~tpumon.sim.workload.Workload` on the agent's schedule (a
fixed interval, a little timing jitter, optionally dropped polls) and emits
one :class:`~tpumon.trace.read.TraceRow` per chip per successful poll. Polls that
find the runtime down produce no rows, as in a real recording.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from tpumon.sim.workload import V4_HBM_TOTAL_BYTES, Scenario, Workload
from tpumon.trace.schema import TraceRow

__all__ = ["SINGLE_HOST", "generate_trace"]

#: The host a trace of one simulated VM names (a slice's workers: naming.worker_hostname).
SINGLE_HOST = "sim-w-0"


def generate_trace(
    scenario: Scenario | str,
    *,
    duration_s: float,
    poll_interval_s: float = 5.0,
    chips: int = 4,
    host: str = SINGLE_HOST,
    seed: int = 0,
    start_time: float = 1750000000.0,
    drop_probability: float = 0.0,
    poll_jitter_s: float = 0.05,
    hbm_total_bytes: int = V4_HBM_TOTAL_BYTES,
    **overrides: object,
) -> Iterator[TraceRow]:
    """Yield the trace of ``duration_s`` seconds of a scenario, starting at job start.

    Poll ``k`` happens at ``start_time + k * poll_interval_s`` plus a uniform
    delay in ``[0, poll_jitter_s)``, which must be below the interval so
    that time never goes back. Each poll is dropped (no rows at all, as when
    the agent's poll timed out) with ``drop_probability``. Times are rounded
    to milliseconds, the resolution of the trace format, so a trace written
    and read back compares equal. ``overrides`` are Scenario fields.
    """
    if poll_interval_s <= 0 or not 0 <= poll_jitter_s < poll_interval_s:
        raise ValueError("need poll_interval_s > 0 and 0 <= poll_jitter_s < poll_interval_s")
    if not 0.0 <= drop_probability <= 1.0:
        raise ValueError("drop_probability must be in [0, 1]")
    workload = Workload(scenario, chips=chips, hbm_total_bytes=hbm_total_bytes, seed=seed,
                        start_time=start_time, **overrides)
    # Its own stream, and the workload is sampled even at dropped polls: the
    # same seed with and without drops reports identical values at kept polls.
    rng = random.Random(f"tpumon-tracegen:{seed}")
    chip_names = [str(i) for i in range(chips)]
    polls = int(duration_s // poll_interval_s)
    for k in range(polls):
        t = round(start_time + k * poll_interval_s + poll_jitter_s * rng.random(), 3)
        s = workload.sample(t)
        if rng.random() < drop_probability or not s.runtime_up:
            continue
        for chip, used in zip(chip_names, s.hbm_used_bytes, strict=True):
            yield TraceRow(t, host, chip, s.step, used, s.hbm_total_bytes)
