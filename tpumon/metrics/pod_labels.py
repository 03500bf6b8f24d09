"""Kubernetes labels on every per-chip series: the chip's ``accelerator_id`` and the
``pod``, ``namespace`` and ``container`` it is allocated to (tpumon.sources.pod_resources).

Added in one place, around tpumon's collectors, rather than in each family: every
family with a ``chip`` label gains them, the runtime's other metrics included, and a
family added later cannot forget them. Off Kubernetes (no pod-resources source) the
families pass through untouched, so the exposition is exactly what it was. Only
non-empty labels are added: Prometheus reads an empty label as an absent one, and a chip
that no container holds carries its ``accelerator_id`` alone.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from tpumon.state import PollState


class PodLabels(Collector):
    """Collects ``inner`` and adds each chip's Kubernetes labels to its samples."""

    def __init__(self, inner: Collector, get_snapshot: Callable[[], PollState]) -> None:
        self._inner = inner
        self._get_snapshot = get_snapshot

    def collect(self) -> Iterator[Metric]:
        assignment = self._get_snapshot().chip_pods
        if assignment is None:
            yield from self._inner.collect()
            return
        labels = {chip: pod.labels() for chip, pod in assignment.chips.items()}
        for family in self._inner.collect():
            yield with_pod_labels(family, labels)


def with_pod_labels(family: Metric, labels: Mapping[str, Mapping[str, str]]) -> Metric:
    """The family with each sample of a known chip given that chip's labels."""
    if not labels or not any("chip" in s.labels for s in family.samples):
        return family
    out = Metric(family.name, family.documentation, family.type, family.unit)
    for s in family.samples:
        extra = labels.get(s.labels.get("chip", ""))
        out.samples.append(s._replace(labels={**s.labels, **extra}) if extra else s)
    return out


