"""The values that flow from sources to the agent's state: plain, immutable records.

Sources create these and know nothing of what happens to them; the state, the metrics,
the detector and the store only read them. Keeping them frozen is what lets a scrape read
one poll while the poll thread builds the next, without locks.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True, slots=True)
class ChipSample:
    """One chip's HBM and duty cycle at one poll, as libtpu's runtime reported it."""

    chip: str
    hbm_used_bytes: int
    hbm_total_bytes: int | None
    duty_cycle: float | None  # 0-1; None when the runtime did not report it
    device_id: int
    port: int


@dataclass(frozen=True, slots=True)
class Distribution:
    """A runtime distribution metric (tpu-info's word: bucket counts, as libtpu serves them)
    in the family's base unit; exported as a Prometheus histogram.

    ``bounds`` are the finite buckets' upper bounds, increasing; ``counts`` has one entry
    more (the overflow bucket) and holds per-bucket (not cumulative) counts."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def merged(self, other: Distribution) -> Distribution | None:
        """Both added up (ports or entries of one buffer size); None if the buckets differ."""
        if other.bounds != self.bounds:
            return None
        return Distribution(self.bounds, tuple(a + b for a, b in zip(self.counts, other.counts,
                                                                   strict=True)),
                         self.sum + other.sum)

    def quantile(self, q: float) -> float | None:
        """The q-quantile by linear interpolation within its bucket (as histogram_quantile
        does); None when empty. The overflow bucket answers its lower bound."""
        total = self.count
        if total == 0:
            return None
        rank, seen = q * total, 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                if i == len(self.bounds):
                    return self.bounds[-1] if self.bounds else None
                low = self.bounds[i - 1] if i else min(0.0, self.bounds[0])
                return low + (self.bounds[i] - low) * (rank - seen) / n
            seen += n
        return self.bounds[-1] if self.bounds else None


@dataclass(frozen=True, slots=True)
class RuntimeSeries:
    """One series of a family: label values (in the spec's label order) and its value."""

    family: str
    labels: tuple[str, ...]
    value: float | None = None  # gauges
    histogram: Distribution | None = None  # histograms


@dataclass(frozen=True, slots=True)
class RuntimeReading:
    """What one poll of the runtime metric service returned, chip by chip.

    ``missing`` lists the chips expected on this VM that did not answer this time (a
    partial answer): they are reported as down individually, not dropped silently.
    """

    time: float
    chips: dict[str, ChipSample]
    missing: tuple[str, ...] = ()
    series: tuple[RuntimeSeries, ...] = ()  # the other runtime metrics (runtime_catalog.py)
    supported: tuple[str, ...] = ()  # what the runtime says it serves (ListSupportedMetrics)


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """A process that owns TPU chips, and its host memory."""

    pid: int
    name: str
    rss_bytes: int
    chips: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HostSample:
    """Host memory: the other way a long run dies (the kernel OOM-kills the trainer)."""

    time: float
    memory_total_bytes: int
    memory_available_bytes: int
    memory_used_bytes: int
    processes: tuple[ProcessSample, ...] = ()


def host_sort_key(name: str) -> tuple[tuple[int, str], ...]:
    """Host names with their numbers in numeric order (t1v-n-x-w-2 before t1v-n-x-w-10):
    a slice's workers listed as the slice counts them."""
    parts = re.split(r"([0-9]+)", name)  # odd places: the runs of ASCII digits
    return tuple((int(part), "") if k % 2 else (-1, part) for k, part in enumerate(parts))


def chip_sort_key(name: str) -> tuple[int, str]:
    """Chips in numeric order ("2" before "10"); odd names after, alphabetically."""
    return (int(name), name) if name.isascii() and name.isdigit() else (1 << 30, name)


class Sample(NamedTuple):
    """One chip at one poll, as the detector is fed it and the store keeps and exports it
    (step None when unknown)."""

    time: float
    step: int | None
    used: int
    total: int


class StoredEnd(NamedTuple):
    """A job's end as the history store keeps it with its evidence (diagnose/job_ends.py makes
    it, the store, the agent and ``tpumon report`` read it)."""

    id: int
    host: str
    time: float
    cause: str
    pid: int | None
    step: int | None
    summary: str
