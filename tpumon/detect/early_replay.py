"""Jobs replayed while the rest of their trace is still being read (``tpumon analyze``).

A trace is spilled table by table (:mod:`tpumon.trace.spill`); replaying only once the
whole file is read would leave a core half idle through the read, a third of the time on 2
cores. But a series whose rows stopped coming is most likely whole: a trace written series
after series (``tpumon export``) or host after host ends each series long before the file
ends. So once every series of a host is absent from the table just read, that host's job is
replayed at once by a forked worker, from what the spill file holds of it; a slice's chips
(hosts ``…-w-N``: more of its workers may come) are each run on their own, to be pooled at
the end. At the end a guess is kept only where it proved right: the job has exactly those
series, and none of them got another row or was read again (the validating parser reads a
file anew). Its results are then what replaying after the read gives, and a wrong guess
costs only the work spent on it; a series is guessed twice at most. A trace whose rows are
interleaved by time closes no series before its end, and is replayed after the read.
"""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing.pool import AsyncResult
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Sequence

from tpumon.detect.job_replay import (Advance, ChipRun, Jobs, SeriesResult, job_name,
                                      job_results, replay_job, run_chip, worker_tasks)
from tpumon.detect.workers import Workers, start_worker

if TYPE_CHECKING:
    from tpumon.detect.verdict import DetectorSettings
    from tpumon.trace.spill import Spill, SpilledSeries

Key = tuple[str, str]

#: Traces smaller than this (a table or two) are replayed after the read.
EARLY_MIN_BYTES = 64 << 20

#: In a worker: the pool's event, set when what is still queued is no longer wanted.
_CANCELLED: Any = None


def _start_worker(cancelled: Any) -> None:
    """A worker (``workers.start_worker``: below the reading threads, deaf to Ctrl-C), told
    by ``cancelled`` when the tasks still queued are no longer wanted."""
    global _CANCELLED
    start_worker()
    _CANCELLED = cancelled


def _unless_cancelled(task: Callable[..., Any], args: tuple) -> Any:
    """``task(*args)``, or None once the reading process has given up on the results."""
    return None if _CANCELLED is not None and _CANCELLED.is_set() else task(*args)


class _Guess:
    """Series replayed early: each with the spill's object and its samples then."""

    def __init__(self, series: Sequence[tuple[Key, SpilledSeries]], result: AsyncResult
                 ) -> None:
        self.keys = [key for key, _ in series]
        self.sources = [(spilled, spilled.samples) for _, spilled in series]
        self.result = result

    def holds(self, series: Sequence[tuple[str, str, object]]) -> bool:
        """Whether the job's final series are exactly these, unchanged since."""
        return [(h, c) for h, c, _ in series] == self.keys and all(
            s is spilled and s.samples == samples
            for (_, _, s), (spilled, samples) in zip(series, self.sources, strict=True))


class EarlyReplay:
    """Replays jobs whose series look whole while the trace is read (the module's
    docstring); a context that ends its worker processes. With fewer than 2 ``workers``,
    or a small trace, it guesses nothing (:meth:`start`): replaying in the reading
    process would only delay the read."""

    def __init__(self, settings: DetectorSettings | None = None, workers: int = 1) -> None:
        self.settings, self.workers = settings, workers
        self._workers: Workers | None = None
        self._cancelled: Any = None  # the workers' event (_start_worker)
        self._last: dict[Key, tuple[int, float]] = {}  # each series' (samples, last time)
        self._hosts: dict[str, _Guess] = {}
        self._chips: dict[Key, _Guess] = {}
        self._guessed: dict[Key, int] = {}  # times each series was guessed

    def __enter__(self) -> EarlyReplay:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._workers is None:
            return
        workers, self._workers = self._workers, None
        # Pool.terminate() kills a worker mid-task, maybe while it holds the results
        # queue's lock, and the pool's task thread then waits on that lock for ever (CI hung
        # so once, on a guess that did not hold and was still running): the workers end
        # what runs, and what is still queued (a guess that did not hold, or anything after
        # an error) returns at once. After Ctrl-C they are terminated at once (Workers.end:
        # a pool left waiting on a lock is abandoned).
        if kind is not None and not issubclass(kind, Exception):
            workers.end()
            return
        if workers.dead() is None:  # a worker killed in the event's lock would hold it
            self._cancelled.set()  # every result wanted was collected, or none is
        workers.finish()

    @property
    def started(self) -> bool:
        """Whether the workers run (they then replay the rest too)."""
        return self._workers is not None

    def start(self, files: Sequence[str]) -> None:
        """Told the trace's files before any is read: start the workers if they are large
        enough to be read in several tables. Started now, before the reader's threads:
        a process forked while other threads run may inherit a lock one of them held."""
        try:
            size = sum(os.path.getsize(f) for f in files)
        except OSError:  # stdin, or a file that reading will name
            return
        if self.workers >= 2 and size >= EARLY_MIN_BYTES:
            # below the reading threads: the workers take what CPU the read leaves idle
            self._cancelled = multiprocessing.get_context("fork").Event()
            self._workers = Workers(self.workers, _start_worker, (self._cancelled,))

    def after_table(self, spill: Spill) -> None:
        """Told after each table is spilled: replay what it closed."""
        if self._workers is None:
            return
        hosts: dict[str, list[tuple[Key, SpilledSeries]]] = {}
        active: set[str] = set()
        for key, spilled in spill.series.items():
            now = (spilled.samples, spilled.last_time)
            if self._last.get(key) != now:
                self._last[key] = now
                active.add(key[0])
            hosts.setdefault(key[0], []).append((key, spilled))
        closed = {host: series for host, series in hosts.items() if host not in active
                  and all(self._guessed.get(key, 0) < 2 for key, _ in series)}
        if closed:
            spill.flush()  # the workers read the spill file
        for host, series in closed.items():
            self._guess(host, series)

    def _guess(self, host: str, series: list[tuple[Key, SpilledSeries]]) -> None:
        if job_name(host).startswith("host "):
            old = self._hosts.get(host)
            if old is None or not old.holds([(*key, s) for key, s in series]):
                self._hosts[host] = self._submit(series, replay_job, (
                    f"host {host}", [(*key, s.snapshot()) for key, s in series],
                    self.settings))
            return
        for key, spilled in series:
            old = self._chips.get(key)
            if old is None or not old.holds([(*key, spilled)]):
                self._chips[key] = self._submit([(key, spilled)], run_chip, (
                    spilled.snapshot(), self.settings, True))

    def _submit(self, series: list[tuple[Key, SpilledSeries]], task: Callable[..., Any],
                args: tuple) -> _Guess:
        for key, _ in series:
            self._guessed[key] = self._guessed.get(key, 0) + 1
        return _Guess(series, self._run(task, args))

    def _run(self, task: Callable[..., Any], args: tuple) -> AsyncResult:
        """``task(*args)`` queued to the workers."""
        assert self._workers is not None, "start() decides whether there are workers"
        return self._workers.pool.apply_async(_unless_cancelled, (task, args))

    def replay(self, jobs: Jobs, sizes: list[int], replayed: Advance) -> list[SeriesResult]:
        """Every job's results, in order: a guess that held, else replayed now by the same
        workers, as ``job_replay.worker_tasks`` splits them (largest first)."""
        held = [self._held(job, series) for job, series in jobs]
        whole: dict[int, AsyncResult] = {}
        chips: dict[tuple[int, int], AsyncResult] = {}
        for j, i in worker_tasks(jobs, sizes, self.workers):
            if held[j] is not None:
                continue
            job, series = jobs[j]
            if i is None:
                whole[j] = self._run(replay_job, (job, series, self.settings))
            else:
                chips[j, i] = self._run(run_chip, (series[i][2], self.settings, True))
        results: list[SeriesResult] = []
        for j, ((job, series), size) in enumerate(zip(jobs, sizes, strict=True)):
            done = held[j] or whole.get(j) or [chips[j, i] for i in range(len(series))]
            if isinstance(done, list):
                runs: list[ChipRun] = [self._result(r) for r in done]
                results += job_results(job, series, runs)
            else:
                results += self._result(done)
            replayed(size)
        return results

    def _result(self, result: AsyncResult) -> Any:
        """A task's result (``Workers.result``: ``WorkerDied`` if a worker died)."""
        assert self._workers is not None
        return self._workers.result(result)

    def _held(self, job: str, series: Sequence[tuple[str, str, Any]]
              ) -> AsyncResult | list[AsyncResult] | None:
        """The guess of a job that held: its whole replay, or its chips' runs."""
        host = self._hosts.get(series[0][0]) if job.startswith("host ") else None
        if host is not None and host.holds(series):
            return host.result
        chips = [self._chips.get((h, c)) for h, c, _ in series]
        if all(g is not None and g.holds([(h, c, s)])
               for g, (h, c, s) in zip(chips, series, strict=True)):
            return [g.result for g in chips if g is not None]
        return None
