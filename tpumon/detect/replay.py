"""Replays the streaming detector over a recorded trace (``tpumon analyze``).

Each (host, chip) series is fed to its own ChipDetector with the agent's default settings,
in time order, exactly as the agent would have seen it poll by poll; the result is the
verdict at the end and the first moment the leak alert would have fired.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from tpumon.common.samples import chip_sort_key, host_sort_key
from tpumon.detect.verdict import DetectorSettings
from tpumon.detect.early_replay import EarlyReplay
from tpumon.detect.workers import Workers
from tpumon.detect.job_replay import (Advance, ChipRun, Jobs, SeriesResult, Task, group_jobs,
                                      job_results, replay_job, run_chip, worker_tasks)
from tpumon.trace.read import read_trace_columns, spill_trace
from tpumon.trace.schema import SeriesColumns, SeriesSource, TraceFormatError
from tpumon.trace.spill import Keep, Spill, SpilledSeries


def analyze_path(path: str, settings: DetectorSettings | None = None,
                 workers: int = 1) -> list[SeriesResult]:
    """``analyze_file`` of a trace file, or of every trace file (.csv, .jsonl, .parquet) in a
    directory, in name order: a slice recorded one file per host, its chips pooled as one
    job. A series in two files is an error. ``workers``: as in :func:`replay_columns`.
    In bounded memory, whatever the trace's length (:func:`spilled_path`)."""
    with EarlyReplay(settings, workers) as early, spilled_path(path, early=early) as series:
        return replay_columns(series, settings, workers, early=early)


def trace_files(path: str) -> list[str]:
    """The trace files ``path`` names: itself, or a directory's, in name order."""
    if path == "-" or not os.path.isdir(path):
        return [path]
    named = (os.path.join(path, n) for n in sorted(os.listdir(path))
             if n.lower().endswith(TRACE_SUFFIXES))
    return [p for p in named if not os.path.isdir(p)]


@contextmanager
def spilled_path(path: str, read: Advance | None = None, keep: Keep | None = None,
                 early: EarlyReplay | None = None
                 ) -> Iterator[dict[tuple[str, str], SpilledSeries]]:
    """The series of a trace file or of a directory's trace files (``trace_files``), as
    :func:`read_path` gives them, but kept in a temporary spill file (under TMPDIR, 32
    bytes a sample) for as long as the context lasts, each read back when replayed: a
    trace of any length in bounded memory (:mod:`tpumon.trace.spill`). ``read`` is told
    the rows of each part of a file as it is read. ``keep`` selects the rows spilled
    (:class:`tpumon.trace.spill.Spill`): a series it keeps nothing of has no samples.
    ``early`` replays, while the rest is read, the jobs whose series look whole."""
    with tempfile.TemporaryDirectory(prefix="tpumon-analyze-") as directory:
        spill = Spill(directory, keep)

        def told(rows: int) -> None:
            if read is not None:
                read(rows)
            if early is not None:
                early.after_table(spill)

        files = trace_files(path)
        if early is not None:
            early.start(files)
        try:
            for file in files:
                spill_trace(file, spill, read=told)
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


def analyze_file(path: str, settings: DetectorSettings | None = None) -> list[SeriesResult]:
    """Read a trace (CSV, JSON Lines or Parquet) into per-series arrays, whole, and replay
    each series (:func:`analyze_path` reads in bounded memory, for a file too).

    Raises TraceFormatError (with the line number) before any result exists, so a caller
    prints all or nothing.
    """
    return replay_columns(read_trace_columns(path), settings)


def replay_columns(columns: Mapping[tuple[str, str], SeriesSource],
                   settings: DetectorSettings | None = None,
                   workers: int = 1, replayed: Advance | None = None,
                   early: EarlyReplay | None = None) -> list[SeriesResult]:
    """Replay every series, the chips of each job (slice, or host) together, in the
    columns' order. Jobs are independent, so with ``workers`` > 1 a large trace's jobs are
    replayed by that many forked processes (``tpumon analyze`` uses every usable core):
    the same results, as each job is replayed whole by one detector per chip wherever it
    runs. Only a command-line process forks; the agent (threads) replays in itself.
    ``replayed`` is told the samples of each job or chip as its replay ends. A series may
    be spilled (:func:`spilled_path`): each is then read when it is replayed. ``early``:
    what :func:`spilled_path` replayed while reading (its guesses that held are kept)."""
    jobs: dict[str, list[tuple[str, str, SeriesSource]]] = {}
    named = group_jobs(columns)
    for (host, chip), c in columns.items():
        jobs.setdefault(named[host, chip], []).append((host, chip, c))
    tasks, told = list(jobs.items()), replayed or _ignore
    sizes = [sum(c.samples for _, _, c in series) for _, series in tasks]
    if early is not None and early.started:
        done = early.replay(tasks, sizes, told)
    else:
        done = _replay_jobs(tasks, sizes, settings, workers, told)
    by_key = {(r.host, r.chip): r for r in done}
    return [by_key[key] for key in sorted(columns, key=_in_slice_order)]


def _in_slice_order(key: tuple[str, str]) -> tuple:
    """Hosts as a slice counts its workers, then chips in numeric order (a trace merged in
    time listed w-0, w-3, w-2, w-1)."""
    return host_sort_key(key[0]), chip_sort_key(key[1])


#: Fewer samples than this are replayed in this process: forking would cost more than it
#: saves (a 2-core VM replays about 2M samples a second per core).
PARALLEL_MIN_SAMPLES = 1_000_000

#: What forked workers replay: inherited from the parent at the fork, never pickled.
_FORKED: tuple[Jobs, DetectorSettings | None] | None = None


def usable_cores() -> int:
    """Cores this process may run on (its affinity, else the machine's)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def _ignore(_: int) -> None:
    return None


def _replay_jobs(jobs: Jobs, sizes: list[int], settings: DetectorSettings | None,
                 workers: int, replayed: Advance) -> list[SeriesResult]:
    tasks = worker_tasks(jobs, sizes, workers)
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
        forked = Workers(min(workers, len(tasks)))
        try:
            queued = [forked.pool.apply_async(_replay_forked, (task,)) for task in tasks]
            outputs: list[list[SeriesResult] | ChipRun] = []  # in the tasks' order
            for (j, i), result in zip(tasks, queued, strict=True):
                outputs.append(forked.result(result))
                replayed(sizes[j] if i is None else jobs[j][1][i][2].samples)
        finally:
            forked.end()
    finally:
        _FORKED = None
    whole: dict[int, list[SeriesResult]] = {}
    runs: dict[tuple[int, int], ChipRun] = {}
    for (j, i), out in zip(tasks, outputs, strict=True):
        if i is None:
            assert not isinstance(out, ChipRun)
            whole[j] = out
        else:
            assert isinstance(out, ChipRun)
            runs[j, i] = out
    return [r for j, (job, series) in enumerate(jobs) for r in (
        whole[j] if j in whole else
        job_results(job, series, [runs[j, i] for i in range(len(series))]))]


def _replay_forked(task: Task) -> list[SeriesResult] | ChipRun:
    assert _FORKED is not None
    jobs, settings = _FORKED
    j, chip = task
    if chip is None:
        return replay_job(*jobs[j], settings)
    return run_chip(jobs[j][1][chip][2], settings, log=True)
