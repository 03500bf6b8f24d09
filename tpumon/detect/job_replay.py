"""One job of a trace replayed: each chip's series through its own detector, the chips'
evidence shared (:mod:`tpumon.detect.pooling`) as the agent shares it, and what each chip's
replay came to (:class:`SeriesResult`). :mod:`tpumon.detect.replay` reads traces and runs
their jobs (in forked workers too); :mod:`tpumon.detect.early_replay` runs some while the
trace is still being read.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from tpumon.detect.detector import ChipDetector
from tpumon.detect.verdict import Assessment, DetectorSettings, Verdict, leak_alert
from tpumon.detect.pooling import JobPool, pool_job
from tpumon.trace.schema import SeriesColumns, SeriesSource

def _opt(value: float | None, digits: int | None = None) -> float | int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return round(value, digits) if digits is not None else value


def _interval_per_hour(a: Assessment) -> list[float] | None:
    """The 95 % interval of the floor's growth, bytes per hour."""
    low, high = a.slope_bytes_per_second_low, a.slope_bytes_per_second_high
    if low is None or high is None:
        return None
    return [round(low * 3600, 1), round(high * 3600, 1)]


@dataclass(frozen=True)
class SeriesResult:
    """One series' outcome, serialised in the shape of contracts.md §2."""

    host: str
    chip: str
    samples: int
    assessment: Assessment
    alert: dict | None
    #: the first sample after the alert with HBM all but full (time, step): where the OOM
    #: came, to hold the forecast made at the alert against; None if HBM never filled
    full_after_alert: dict | None = None
    #: samples whose HBM used is above the chip's capacity: the trace is taken as it is,
    #: but such rows are said (a runtime that misreports, or a mislabelled column)
    over_capacity: int = 0
    #: the first moment the verdict was ``growing`` or ``leak`` (time, step): the warning
    #: that does not page; at or before the alert
    growing: dict | None = None
    #: where the alert's job was followed by another (a restart): the detector's last
    #: assessment of the alert's job, and when the next job began (its post-mortem is
    #: that job's end, not the trace's)
    alert_job_end: tuple[Assessment, float] | None = None

    @property
    def verdict(self) -> str:
        return self.assessment.verdict.value

    @property
    def slope_bytes_per_step(self) -> float | None:
        return _opt(self.assessment.slope_bytes_per_step, 3)

    @property
    def slope_bytes_per_hour(self) -> float | None:
        return _opt(self.assessment.slope_bytes_per_hour, 1)

    @property
    def predicted_oom(self) -> dict | None:
        """The OOM forecast at the end of the trace, with its interval."""
        return _forecast(vars(self.assessment))

    @property
    def alert_forecast(self) -> dict | None:
        """The OOM forecast as it stood when the alert fired (scored by the benchmark)."""
        return None if self.alert is None else _forecast(self.alert)

    def to_json(self) -> dict[str, Any]:
        a = self.assessment
        return {
            "host": self.host,
            "chip": self.chip,
            "verdict": self.verdict,
            "alert": None if self.alert is None else {
                "time": self.alert["time"], "step": self.alert["step"],
                "predicted_oom": self.alert_forecast,
                "slope_bytes_per_step": _opt(self.alert["slope_bytes_per_step"], 3),
                "slope_bytes_per_hour": _opt(None if self.alert["slope_bytes_per_second"] is None
                                             else self.alert["slope_bytes_per_second"] * 3600, 1)},
            "growing": None if self.growing is None else {
                "time": self.growing["time"], "step": self.growing["step"]},
            "slope_bytes_per_step": self.slope_bytes_per_step,
            "slope_bytes_per_hour": self.slope_bytes_per_hour,
            "predicted_oom": self.predicted_oom,
            "hbm_full_after_alert": self.full_after_alert,
            "reason": a.reason,
            "floor_bytes": _opt(a.floor_bytes, 0),
            "slope_bytes_per_hour_interval": None if a.slope_bytes_per_second_low is None
            or a.slope_bytes_per_second_high is None else [
                round(a.slope_bytes_per_second_low * 3600, 1),
                round(a.slope_bytes_per_second_high * 3600, 1)],
            "window_seconds": _opt(a.window_seconds, 1),
            "z": _opt(a.z, 2),
            "samples": self.samples,
            "restarts": a.restarts,
        }


def _forecast(fields: dict) -> dict | None:
    """An OOM forecast (time, step) and its interval (earliest, latest; None where the growth's
    lower bound is not above zero), from an assessment's or an alert's fields."""
    if fields.get("predicted_oom_time") is None:
        return None

    def step(value: float | None) -> int | None:
        # rounded as every other view writes a forecast step (f"{step:,.0f}"): truncated
        # here, the same band read 56,975 in analyze and the report, 56,976 in the log
        return None if value is None else round(value)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {"time": ms(fields["predicted_oom_time"]),
            "step": step(fields["predicted_oom_step"]),
            "interval": {"time": [ms(fields["predicted_oom_time_low"]),
                                  ms(fields["predicted_oom_time_high"])],
                         "step": [step(fields["predicted_oom_step_low"]),
                                  step(fields["predicted_oom_step_high"])]}}


def describe_forecast(fields: dict) -> str | None:
    """An OOM forecast (an alert's or an assessment's fields) as people read it: "step
    27,500 (26,900-28,200)", or a time (UTC) and its interval without steps; None if none."""
    forecast = _forecast(fields)
    if forecast is None:
        return None

    def when(unix: float | None) -> str:
        return "?" if unix is None else time.strftime("%m-%d %H:%M", time.gmtime(unix))

    if forecast["step"] is not None:
        low, high = ("?" if s is None else f"{s:,}" for s in forecast["interval"]["step"])
        return f"step {forecast['step']:,} ({low}-{high})"
    low, high = (when(t) for t in forecast["interval"]["time"])
    return f"{when(forecast['time'])} UTC ({low} to {high})"


#: HBM in use at this share of capacity is full: the job is at its OOM.
FULL_FRACTION = 0.98


def full_after(alert: dict | None, times: np.ndarray, steps: np.ndarray, used: np.ndarray,
               totals: np.ndarray) -> dict | None:
    """The first sample at or after the alert with HBM at least FULL_FRACTION full."""
    if alert is None:
        return None
    start = int(np.searchsorted(times, alert["time"]))
    full = np.flatnonzero(used[start:] >= FULL_FRACTION * totals[start:])
    if not len(full):
        return None
    i = start + int(full[0])
    return {"time": float(times[i]), "step": None if math.isnan(steps[i]) else int(steps[i])}


class ChipRun(NamedTuple):
    """One chip's detector replayed over its whole series: what it said at the end, its
    own alert, and (for a chip of a job of several) every assessment as it was set."""

    assessment: Assessment
    alert: dict | None
    log: list[tuple[float, float, Assessment]] | None
    growing: dict | None = None


def run_chip(series: SeriesSource, settings: DetectorSettings | None, log: bool) -> ChipRun:
    """Run one detector over one series' arrays (the agent's code path, in one batch); a
    spilled series is read for it, and let go of after."""
    c = series.load()
    detector = ChipDetector(settings)
    if log:
        detector.log = []
    detector.update(c.times, c.steps, c.used, c.total)
    return ChipRun(detector.assessment, detector.alert, detector.log, detector.growing)


def _result(host: str, chip: str, series: SeriesSource, assessment: Assessment,
            alert: dict | None, growing: dict | None, said: Said | None = None) -> SeriesResult:
    """A series' outcome: its verdict and alert, where HBM filled after the alert, the
    samples over capacity, and its first warning (its own, or the alert if earlier: a chip
    that joins its job's leak warns when it pages)."""
    c = series.load()
    if alert is not None and (growing is None or alert["time"] < growing["time"]):
        growing = {"time": alert["time"], "step": alert["step"]}
    return SeriesResult(host, chip, len(c.times), assessment, alert,
                        full_after(alert, c.times, c.steps, c.used, c.total),
                        int(np.count_nonzero(np.asarray(c.used) > np.asarray(c.total))),
                        growing, alert_job_end(alert, assessment, c, said))


def alert_job_end(alert: dict | None, assessment: Assessment, c: SeriesColumns,
                  said: Said | None = None) -> tuple[Assessment, float] | None:
    """The detector's last assessment of the job the alert fired in, and when the job after
    it began, where one did (a restart after a page). A demo run twice read "HBM did not
    fill up in the trace" beside the first run's alert, which ran out of HBM, judged on the
    second run's floors. From the detector's log of assessments where the replay kept one
    (a job of several chips); else the samples are replayed up to each later job's start,
    latest first."""
    if alert is None or assessment.job_start is None or assessment.job_start <= alert["time"]:
        return None
    if said:
        return _job_end_said(alert["time"], said)
    start: float | None = assessment.job_start
    last = None
    while start is not None and start > alert["time"]:
        keep = c.times < start
        detector = ChipDetector()
        detector.update(c.times[keep], c.steps[keep], c.used[keep], c.total[keep])
        last = (detector.assessment, start)
        start = detector.assessment.job_start
    return last


def _job_end_said(alerted: float, said: Said) -> tuple[Assessment, float] | None:
    """The last assessment of the job that was running at ``alerted``, and when the next
    began, from a detector's log (time, step, assessment) of every assessment as set."""
    last = None
    for _, _, a in said:
        start = a.job_start
        if start is not None and start > alerted and last is not None and \
                last.job_start is not None and last.job_start <= alerted:
            return last, start
        last = a
    return None


def replay_series(host: str, chip: str, times: np.ndarray, steps: np.ndarray,
                  used: np.ndarray, totals: np.ndarray,
                  settings: DetectorSettings | None = None) -> SeriesResult:
    """Run one detector over one series' arrays (the agent's code path, in one batch)."""
    c = SeriesColumns(times, steps, used, totals)
    run = run_chip(c, settings, log=False)
    return _result(host, chip, c, run.assessment, run.alert, run.growing)


#: Told how much work was done since it was last told (files read, samples replayed): what
#: a command line's progress bar advances by. Never told anything it must act on.
Advance = Callable[[int], None]

#: Jobs by name, each with its chips' series: (host, chip, series).
Jobs = list[tuple[str, list[tuple[str, str, SeriesSource]]]]

#: A worker's task: a job replayed whole (its index, None), or one chip of a job too large
#: for one worker (job index, chip index), pooled afterwards by the parent.
Task = tuple[int, int | None]


def worker_tasks(jobs: Jobs, sizes: list[int], workers: int) -> list[Task]:
    """The workers' tasks, largest first (the last to finish is then a small one): each
    job whole, but a job of more than a 1/(2 workers) share of the samples (a slice of
    hundreds of chips may be the whole trace) chip by chip, so that it keeps every worker
    busy; its chips are pooled by the parent, from their detectors' logs."""
    share = sum(sizes) / (2 * max(workers, 1))
    tasks: list[tuple[int, Task]] = []
    for j, (_, series) in enumerate(jobs):
        if sizes[j] <= share or len(series) == 1:
            tasks.append((sizes[j], (j, None)))
        else:
            tasks += [(c.samples, (j, i)) for i, (_, _, c) in enumerate(series)]
    return [task for _, task in sorted(tasks, key=lambda t: -t[0])]


def replay_job(job: str, series: Sequence[tuple[str, str, SeriesSource]],
               settings: DetectorSettings | None = None) -> list[SeriesResult]:
    """Replay the chips of one job, each on its own detector, and share their evidence
    (:mod:`tpumon.detect.pooling`) at every moment one of their assessments changed: what
    the agent does at every poll, as pooled verdicts change only at those moments. A chip's
    alert is the first moment its pooled verdict was ``leak``. The chips' series are read
    one at a time (a spilled one again where its results need it)."""
    if len(series) == 1:  # read once for its run and its results
        host, chip, c = series[0]
        series = [(host, chip, c.load())]
    runs = [run_chip(c, settings, log=len(series) > 1) for _, _, c in series]
    return job_results(job, series, runs)


def job_results(job: str, series: Sequence[tuple[str, str, SeriesSource]],
                 runs: Sequence[ChipRun]) -> list[SeriesResult]:
    """The results of a job's chips from their detectors' runs, pooled if several."""
    if len(series) == 1:
        (host, chip, c), (run,) = series[0], runs
        return [_result(host, chip, c, run.assessment, run.alert, run.growing)]
    pooled = replay_pooling(job, [run.log or [] for run in runs], [c for _, _, c in series],
                            timelines=False)
    final = pool_job(job, {str(i): run.assessment for i, run in enumerate(runs)})
    return [_result(host, chip, c, final[str(i)], pooled.alerts.get(i), runs[i].growing,
                    runs[i].log)
            for i, (host, chip, c) in enumerate(series)]


Said = Sequence[tuple[float, float, Assessment]]


@dataclass
class Pooling:
    """What sharing evidence said of each chip (by index) over a replay."""

    #: (moment, verdict) at every moment one chip's own assessment changed
    verdicts: list[list[tuple[float, str]]]
    #: the first moment the pooled verdict was ``leak``, as the agent's alert
    alerts: dict[int, dict]


def replay_pooling(job: str, logs: Sequence[Said], columns: Sequence[SeriesSource],
                   timelines: bool = True) -> Pooling:
    """The pooled verdicts and alerts of a job's chips, from their detectors' logs; the
    verdicts only with ``timelines`` (``tpumon report`` draws them, ``analyze`` does not).

    The pooled verdicts change only at the moments one chip's own assessment changed, so
    the job's pool (:class:`JobPool`) is told each change in time order: what the agent's
    pooling at each poll would have said. Verdicts are decided at every moment; a chip's
    pooled assessment is built once, when its alert fires (on a slice of hundreds of
    chips, building them all at every moment cost more than replaying the chips)."""
    out = Pooling([[] for _ in logs], {})
    pool = JobPool(job)
    events = sorted(((t, i, a) for i, log in enumerate(logs) for t, _, a in log),
                    key=lambda e: (e[0], e[1]))
    for moment, group in itertools.groupby(events, key=lambda e: e[0]):
        changed = []
        for _, i, a in group:
            pool.update(i, a)
            changed.append(i)
        if timelines:
            leaking = pool.leaking()
            for i, a in pool.chips.items():
                out.verdicts[i].append(
                    (moment, Verdict.LEAK.value if i in leaking else a.verdict.value))
        first = pool.first_leaks(changed)
        if first:
            _alert(out.alerts, moment, first, pool, columns)
            if not timelines and len(out.alerts) == len(logs):
                break  # every chip has its alert: nothing later changes what is returned
    return out


def _alert(alerts: dict[int, dict], moment: float, chips: list[int], pool: JobPool,
           columns: Sequence[SeriesSource]) -> None:
    """The alerts of ``chips``, whose pooled verdict turned leak at ``moment``."""
    shared = pool.shared(len(pool.leaking()))
    for i in chips:
        c = columns[i].load()
        at = max(int(np.searchsorted(c.times, moment, side="right")) - 1, 0)
        a = pool.chips[i]
        alerts[i] = leak_alert(moment, float(c.steps[at]),
                               a if shared is None else shared.assessment(a))


#: A slice's hosts are named ``PREFIX-w-N``: the chips of a slice run one job.
_WORKER = re.compile(r"-w-\d+$")


def job_name(host: str) -> str:
    """The job a host's chips belong to in a trace: its slice, else the host itself."""
    prefix = _WORKER.sub("", host)
    return f"slice {prefix}" if prefix != host else f"host {host}"


def group_jobs(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each (host, chip)'s job (:func:`job_name`), where a slice of which the data hold one
    worker is that host: one agent's store of a 16-chip slice said "all 4 chips of slice
    demo-pod grow"."""
    keys = list(keys)
    hosts: dict[str, set[str]] = {}
    for host, _ in keys:
        hosts.setdefault(job_name(host), set()).add(host)
    return {(host, chip): job_name(host) if len(hosts[job_name(host)]) > 1 else f"host {host}"
            for host, chip in keys}
