"""Chips of one job share evidence: an SPMD program leaks alike on every chip it runs on.

Each chip's detector decides on its own evidence, so a leak on one rank only (rank 0
keeping logs, say) is still caught alone. But when some chips of a job are called
``leak``, a chip of the same job whose own floor grows alike is taken to be leaking too,
on weaker evidence of its own than a chip alone would need: its growth must be significant
at 95 % (the lower bound of its slope interval above zero, where a chip alone needs a
Mann-Kendall z of 4) and of the same size (its own estimate at least half the leaking
chips' median rate, its interval's lower end at most twice it: a healthy chip whose cache
still fills, at a quarter of a one-rank leak's rate, does not join it at that rate). It
then gets the job's rate and its own forecast (its floor, its largest transient, its
capacity). So the chips of a job that grow alike get one verdict,
and the reason says so ("all 16 chips of job 4242 grow 39.1 KiB/step"); chips that do not
keep their own.

A job is what the caller knows: the agent groups chips by the process that holds them,
``tpumon analyze`` by slice (a host name less its ``-w-N`` worker suffix). Pure and
deterministic: the pooled verdicts are a function of the chips' assessments at one moment,
so the agent (every poll) and ``analyze`` (at every moment an assessment changed) agree.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from typing import Mapping

from tpumon.detect.detector import Assessment, Verdict, describe_growth, slope_fields


def pool_jobs(assessments: Mapping[str, Assessment],
              job_of: Mapping[str, str]) -> dict[str, Assessment]:
    """The assessments with evidence shared within each job (``job_of``: chip -> job name;
    chips without a job, and jobs of one chip, are left as they are)."""
    groups: dict[str, list[str]] = defaultdict(list)
    for chip in assessments:
        job = job_of.get(chip)
        if job is not None:
            groups[job].append(chip)
    pooled = dict(assessments)
    for job, chips in groups.items():
        if len(chips) > 1 and any(assessments[c].verdict is Verdict.LEAK for c in chips):
            pooled.update(pool_job(job, {c: assessments[c] for c in chips}))
    return pooled


def pool_job(job: str, chips: Mapping[str, Assessment]) -> dict[str, Assessment]:
    """One job's chips with evidence shared (see the module docstring)."""
    leaks = [a for a in chips.values()
             if a.verdict is Verdict.LEAK and a.slope_bytes_per_second]
    if not leaks:
        return dict(chips)
    rate = statistics.median(a.slope_bytes_per_second or 0.0 for a in leaks)
    interval = (min(a.slope_bytes_per_second_low or rate for a in leaks),
                max(a.slope_bytes_per_second_high or rate for a in leaks))
    out = {chip: a if a.verdict is Verdict.LEAK
           else _joined(a, rate, interval) if _grows_alike(a, rate) else a
           for chip, a in chips.items()}
    leaking = [c for c, a in out.items() if a.verdict is Verdict.LEAK]
    if len(leaking) == len(out):
        growth = _growth(leaks, rate)
        return {c: dataclasses.replace(a, reason=f"all {len(out)} chips of {job} grow "
                                       f"{growth}; {_oom_in(a)}") for c, a in out.items()}
    return {c: dataclasses.replace(a, reason=f"{a.reason} ({len(leaking)} of {len(out)} chips "
                                   f"of {job})") if c in leaking else a
            for c, a in out.items()}


def _grows_alike(a: Assessment, rate: float) -> bool:
    """A fitted chip whose growth is significant at 95 % and the size of the job's: its
    interval within twice the job's rate, its own estimate at least half of it."""
    low, high, own = (a.slope_bytes_per_second_low, a.slope_bytes_per_second_high,
                      a.slope_bytes_per_second)
    return (a.verdict in (Verdict.OK, Verdict.STEP_CHANGE) and low is not None
            and high is not None and own is not None and low > 0 and low <= 2 * rate
            and own >= rate / 2
            and a.floor_bytes is not None and a.total_bytes is not None
            and a.window_start is not None and a.window_seconds is not None)


def _joined(a: Assessment, rate: float, interval: tuple[float, float]) -> Assessment:
    """``a`` as a leak at the job's rate: its own headroom over that rate."""
    assert a.total_bytes is not None and a.floor_bytes is not None
    assert a.window_start is not None and a.window_seconds is not None
    now = a.window_start + a.window_seconds
    headroom = max(a.total_bytes - (a.transient_bytes or 0.0) - a.floor_bytes, 0.0)
    steps_per_second = a.slope_bytes_per_second / a.slope_bytes_per_step \
        if a.slope_bytes_per_step and a.slope_bytes_per_second else None
    slowest, fastest = interval
    ttos = (headroom / rate, headroom / max(fastest, rate),
            headroom / slowest if 0 < slowest <= rate else None)
    times = [None if t is None else now + t for t in ttos]
    steps = [None if t is None or steps_per_second is None or a.step is None
             else a.step + t * steps_per_second for t in ttos]
    fields: dict = slope_fields(rate, slowest, fastest, steps_per_second)
    joined = dataclasses.replace(
        a, verdict=Verdict.LEAK, predicted_oom_time=times[0], predicted_oom_time_low=times[1],
        predicted_oom_time_high=times[2], predicted_oom_step=steps[0],
        predicted_oom_step_low=steps[1], predicted_oom_step_high=steps[2], **fields)
    return dataclasses.replace(joined, reason=f"floor grows {_growth([joined], rate)} like "
                               f"the job's leaking chips; {_oom_in(joined)}")


def _growth(leaks: list[Assessment], rate: float) -> str:
    per_step = [a.slope_bytes_per_step for a in leaks if a.slope_bytes_per_step]
    return describe_growth(statistics.median(per_step) if per_step else None, rate * 3600)


def _oom_in(a: Assessment) -> str:
    if a.predicted_oom_time is None or a.window_start is None or a.window_seconds is None:
        return "no OOM forecast"
    hours = (a.predicted_oom_time - a.window_start - a.window_seconds) / 3600
    return f"OOM in {hours:.1f} h"
