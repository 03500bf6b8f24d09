"""Metrics of training jobs' ends (tpumon.diagnose.job_ends): how many, of what, and the last one.

Every cause is exported from the start at 0, so that ``increase()`` in an alert rule sees
the first end of a kind (a series born at 1 has no increase to see).
"""

from __future__ import annotations

from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tpumon.common.identity import LABELS
from tpumon.diagnose.job_ends import CAUSES
from tpumon.state import PollState


def job_end_metrics(snap: PollState, ident: list[str]) -> Iterator[Metric]:
    ends = CounterMetricFamily("tpumon_job_ends", "Training jobs seen to end on this host, by "
                               "likely cause: hbm_oom, host_oom, exited, unknown "
                               "(docs/job-ends.md).", labels=[*LABELS, "cause"])
    for cause in CAUSES:
        ends.add_metric(ident + [cause], snap.job_ends_total.get(cause, 0))
    yield ends
    last = GaugeMetricFamily("tpumon_job_last_end_timestamp_seconds", "When the last job "
                             "that ended in the past hour was seen to end; its cause, pid and "
                             "step in labels.", labels=[*LABELS, "cause", "pid", "step"])
    if snap.job_ends:
        end = snap.job_ends[-1]
        step = "" if end.view.step is None else str(end.view.step)
        last.add_metric(ident + [end.cause, str(end.pid), step], end.time)
    yield last
