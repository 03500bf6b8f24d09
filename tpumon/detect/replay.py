"""Replays the streaming detector over a recorded trace (``tpumon analyze``).

Each (host, chip) series is fed to its own ChipDetector with the agent's default settings,
in time order, exactly as the agent would have seen it poll by poll; the result is the
verdict at the end and the first moment the leak alert would have fired.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import re
import time
from dataclasses import dataclass
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from tpumon.detect.detector import (Assessment, ChipDetector, DetectorSettings, Verdict,
                                    leak_alert)
from tpumon.detect.pooling import JobPool, pool_job
from tpumon.trace.spill import Keep, Spill, SpilledSeries
from tpumon.trace.read import read_trace_columns, spill_trace
from tpumon.trace.schema import SeriesColumns, SeriesSource, TraceFormatError


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
        return None if value is None else int(value)

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


class _ChipRun(NamedTuple):
    """One chip's detector replayed over its whole series: what it said at the end, its
    own alert, and (for a chip of a job of several) every assessment as it was set."""

    assessment: Assessment
    alert: dict | None
    log: list[tuple[float, float, Assessment]] | None
    growing: dict | None = None


def _run_chip(series: SeriesSource, settings: DetectorSettings | None, log: bool) -> _ChipRun:
    """Run one detector over one series' arrays (the agent's code path, in one batch); a
    spilled series is read for it, and let go of after."""
    c = series.load()
    detector = ChipDetector(settings)
    if log:
        detector.log = []
    detector.update(c.times, c.steps, c.used, c.total)
    return _ChipRun(detector.assessment, detector.alert, detector.log, detector.growing)


def _result(host: str, chip: str, series: SeriesSource, assessment: Assessment,
            alert: dict | None, growing: dict | None) -> SeriesResult:
    """A series' outcome: its verdict and alert, where HBM filled after the alert, the
    samples over capacity, and its first warning (its own, or the alert if earlier: a chip
    that joins its job's leak warns when it pages)."""
    c = series.load()
    if alert is not None and (growing is None or alert["time"] < growing["time"]):
        growing = {"time": alert["time"], "step": alert["step"]}
    return SeriesResult(host, chip, len(c.times), assessment, alert,
                        full_after(alert, c.times, c.steps, c.used, c.total),
                        int(np.count_nonzero(np.asarray(c.used) > np.asarray(c.total))),
                        growing)


def replay_series(host: str, chip: str, times: np.ndarray, steps: np.ndarray,
                  used: np.ndarray, totals: np.ndarray,
                  settings: DetectorSettings | None = None) -> SeriesResult:
    """Run one detector over one series' arrays (the agent's code path, in one batch)."""
    c = SeriesColumns(times, steps, used, totals)
    run = _run_chip(c, settings, log=False)
    return _result(host, chip, c, run.assessment, run.alert, run.growing)


#: Told how much work was done since it was last told (files read, samples replayed): what
#: a command line's progress bar advances by. Never told anything it must act on.
Advance = Callable[[int], None]


def analyze_path(path: str, settings: DetectorSettings | None = None,
                 workers: int = 1) -> list[SeriesResult]:
    """``analyze_file`` of a trace file, or of every trace file (.csv, .jsonl, .parquet) in a
    directory, in name order: a slice recorded one file per host, its chips pooled as one
    job. A series in two files is an error. ``workers``: as in :func:`replay_columns`.
    In bounded memory, whatever the trace's length (:func:`spilled_path`)."""
    with spilled_path(path) as series:
        return replay_columns(series, settings, workers)


def trace_files(path: str) -> list[str]:
    """The trace files ``path`` names: itself, or a directory's, in name order."""
    if path == "-" or not os.path.isdir(path):
        return [path]
    return [os.path.join(path, n) for n in sorted(os.listdir(path))
            if n.lower().endswith(TRACE_SUFFIXES)]


@contextmanager
def spilled_path(path: str, read: Advance | None = None,
                 keep: Keep | None = None) -> Iterator[dict[tuple[str, str], SpilledSeries]]:
    """The series of a trace file or of a directory's trace files (``trace_files``), as
    :func:`read_path` gives them, but kept in a temporary spill file (under TMPDIR, 32
    bytes a sample) for as long as the context lasts, each read back when replayed: a
    trace of any length in bounded memory (:mod:`tpumon.trace.spill`). ``read`` is told
    the rows of each part of a file as it is read. ``keep`` selects the rows spilled
    (:class:`tpumon.trace.spill.Spill`): a series it keeps nothing of has no samples."""
    with tempfile.TemporaryDirectory(prefix="tpumon-analyze-") as directory:
        spill = Spill(directory, keep)
        try:
            for file in trace_files(path):
                spill_trace(file, spill, read=read)
        finally:
            spill.close()
        yield spill.series


def read_path(path: str, read: Advance | None = None) -> dict[tuple[str, str], SeriesColumns]:
    """The series of a trace file or of a directory's trace files (``trace_files``); a
    series in two files is an error. ``read`` is told of each file read."""
    columns: dict[tuple[str, str], SeriesColumns] = {}
    for file in trace_files(path):
        for key, c in read_trace_columns(file).items():
            if key in columns:
                raise TraceFormatError(file, None, f"host {key[0]!r} chip {key[1]!r} is also "
                                       "in an earlier file of the directory")
            columns[key] = c
        if read is not None:
            read(1)
    return columns


#: What a trace file's name ends with, in a directory that ``analyze_path`` reads.
TRACE_SUFFIXES = (".csv", ".jsonl", ".parquet")


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
    runs = [_run_chip(c, settings, log=len(series) > 1) for _, _, c in series]
    return _job_results(job, series, runs)


def _job_results(job: str, series: Sequence[tuple[str, str, SeriesSource]],
                 runs: Sequence[_ChipRun]) -> list[SeriesResult]:
    """The results of a job's chips from their detectors' runs, pooled if several."""
    if len(series) == 1:
        (host, chip, c), (run,) = series[0], runs
        return [_result(host, chip, c, run.assessment, run.alert, run.growing)]
    pooled = replay_pooling(job, [run.log or [] for run in runs], [c for _, _, c in series],
                            timelines=False)
    final = pool_job(job, {str(i): run.assessment for i, run in enumerate(runs)})
    return [_result(host, chip, c, final[str(i)], pooled.alerts.get(i), runs[i].growing)
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


def analyze_file(path: str, settings: DetectorSettings | None = None) -> list[SeriesResult]:
    """Read a trace (CSV, JSON Lines or Parquet) into per-series arrays, whole, and replay
    each series (:func:`analyze_path` reads in bounded memory, for a file too).

    Raises TraceFormatError (with the line number) before any result exists, so a caller
    prints all or nothing.
    """
    return replay_columns(read_trace_columns(path), settings)


def replay_columns(columns: Mapping[tuple[str, str], SeriesSource],
                   settings: DetectorSettings | None = None,
                   workers: int = 1, replayed: Advance | None = None) -> list[SeriesResult]:
    """Replay every series, the chips of each job (slice, or host) together, in the
    columns' order. Jobs are independent, so with ``workers`` > 1 a large trace's jobs are
    replayed by that many forked processes (``tpumon analyze`` uses every usable core):
    the same results, as each job is replayed whole by one detector per chip wherever it
    runs. Only a command-line process forks; the agent (threads) replays in itself.
    ``replayed`` is told the samples of each job or chip as its replay ends. A series may
    be spilled (:func:`spilled_path`): each is then read when it is replayed."""
    jobs: dict[str, list[tuple[str, str, SeriesSource]]] = {}
    named = group_jobs(columns)
    for (host, chip), c in columns.items():
        jobs.setdefault(named[host, chip], []).append((host, chip, c))
    by_key = {(r.host, r.chip): r for r in _replay_jobs(list(jobs.items()), settings, workers,
                                                         replayed or _ignore)}
    return [by_key[key] for key in columns]


#: Fewer samples than this are replayed in this process: forking would cost more than it
#: saves (a 2-core VM replays about 2M samples a second per core).
PARALLEL_MIN_SAMPLES = 1_000_000

Jobs = list[tuple[str, list[tuple[str, str, SeriesSource]]]]

#: A worker's task: a job replayed whole (its index, None), or one chip of a job too large
#: for one worker (job index, chip index), pooled afterwards by the parent.
_Task = tuple[int, int | None]

#: What forked workers replay: inherited from the parent at the fork, never pickled.
_FORKED: tuple[Jobs, DetectorSettings | None] | None = None


def usable_cores() -> int:
    """Cores this process may run on (its affinity, else the machine's)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _ignore(_: int) -> None:
    return None


def _replay_jobs(jobs: Jobs, settings: DetectorSettings | None, workers: int,
                 replayed: Advance) -> list[SeriesResult]:
    sizes = [sum(c.samples for _, _, c in series) for _, series in jobs]
    tasks = _tasks(jobs, sizes, workers)
    if workers < 2 or len(tasks) < 2 or sum(sizes) < PARALLEL_MIN_SAMPLES or \
            "fork" not in multiprocessing.get_all_start_methods():
        results = []
        for (job, series), size in zip(jobs, sizes, strict=True):
            results += replay_job(job, series, settings)
            replayed(size)
        return results
    global _FORKED
    _FORKED = (jobs, settings)
    try:
        with multiprocessing.get_context("fork").Pool(min(workers, len(tasks))) as pool:
            outputs: list[list[SeriesResult] | _ChipRun] = []  # in the tasks' order
            for (j, i), done in zip(tasks, pool.imap(_replay_forked, tasks, chunksize=1),
                                    strict=True):
                outputs.append(done)
                replayed(sizes[j] if i is None else jobs[j][1][i][2].samples)
    finally:
        _FORKED = None
    whole: dict[int, list[SeriesResult]] = {}
    runs: dict[tuple[int, int], _ChipRun] = {}
    for (j, i), out in zip(tasks, outputs, strict=True):
        if i is None:
            assert not isinstance(out, _ChipRun)
            whole[j] = out
        else:
            assert isinstance(out, _ChipRun)
            runs[j, i] = out
    return [r for j, (job, series) in enumerate(jobs) for r in (
        whole[j] if j in whole else
        _job_results(job, series, [runs[j, i] for i in range(len(series))]))]


def _tasks(jobs: Jobs, sizes: list[int], workers: int) -> list[_Task]:
    """The workers' tasks, largest first (the last to finish is then a small one): each
    job whole, but a job of more than a 1/(2 workers) share of the samples (a slice of
    hundreds of chips may be the whole trace) chip by chip, so that it keeps every worker
    busy; its chips are pooled by the parent, from their detectors' logs."""
    share = sum(sizes) / (2 * max(workers, 1))
    tasks: list[tuple[int, _Task]] = []
    for j, (_, series) in enumerate(jobs):
        if sizes[j] <= share or len(series) == 1:
            tasks.append((sizes[j], (j, None)))
        else:
            tasks += [(c.samples, (j, i)) for i, (_, _, c) in enumerate(series)]
    return [task for _, task in sorted(tasks, key=lambda t: -t[0])]


def _replay_forked(task: _Task) -> list[SeriesResult] | _ChipRun:
    assert _FORKED is not None
    jobs, settings = _FORKED
    j, chip = task
    if chip is None:
        return replay_job(*jobs[j], settings)
    return _run_chip(jobs[j][1][chip][2], settings, log=True)
