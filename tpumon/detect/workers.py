"""The forked worker processes that replay a trace's jobs (``tpumon analyze``), and a wait
for their results that cannot hang.

A ``multiprocessing`` pool loses a task whose worker dies: the kernel's OOM killer ends it,
or a signal, and its result never comes; ``AsyncResult.get()`` and ``Pool.imap`` then wait
for ever, and so did ``tpumon analyze``, silently, on a trace too big for the machine.
:meth:`Workers.result` waits in short slices and looks at the workers between them: one
that died ends the wait with :class:`WorkerDied`, which ``analyze`` prints as one line;
and :meth:`Workers.end` does not wait on the locks a dead worker may hold.

The workers run below the reading process (the read is what everything waits for) and
ignore SIGINT: the terminal sends Ctrl-C to the whole process group, and a worker killed
mid-task can leave the pool's results queue locked, and the pool's own threads waiting on
it for ever. The reading process gets the Ctrl-C and ends the workers itself.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from multiprocessing.pool import AsyncResult
from typing import Any, Callable

#: The workers' niceness.
NICENESS = 5

#: How long a wait for a result sleeps between looks at the workers, in seconds.
LOOK_EVERY_S = 0.2

#: How long a pool that lost a worker is given to end (``Workers.abandon``), in seconds.
ABANDON_WAIT_S = 2.0


class WorkerDied(RuntimeError):
    """A worker process died (killed for memory, say): the task it ran, if any, never ends,
    and the pool cannot say which that was."""

    def __init__(self, exitcode: int) -> None:
        how = f"killed by signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
        hint = " (out of memory?)" if exitcode == -signal.SIGKILL else ""
        super().__init__(f"a replay worker process died ({how}){hint}; the replay cannot "
                         "finish: analyze again, with fewer jobs in parallel "
                         "(taskset -c 0 tpumon analyze ...)")
        self.exitcode = exitcode


def start_worker(*_: Any) -> None:
    """A worker's initializer: below the reading process, deaf to Ctrl-C."""
    os.nice(NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Workers:
    """A pool of forked workers (``count``, each started by ``initializer(*initargs)``)
    whose results are waited for, and whose end is, without hanging on a worker that
    died."""

    def __init__(self, count: int, initializer: Callable[..., None] = start_worker,
                 initargs: tuple = ()) -> None:
        self.pool = multiprocessing.get_context("fork").Pool(
            count, initializer=initializer, initargs=initargs)
        # the processes as started: one that died is replaced by the pool, and only this
        # list still knows it
        self.first: list[Any] = list(self.pool._pool)  # type: ignore[attr-defined]

    def dead(self, ours: tuple[int, ...] = (0,)) -> int | None:
        """The exit code of a worker that died, None if none did; ``ours``: exit codes that
        are no death. A worker ends by itself (exit code 0) only once the pool is closed,
        after its last task (a task that called ``sys.exit(0)`` would go unseen: none
        does); ``Pool.terminate()`` ends the workers with SIGTERM."""
        for worker in self._processes():
            if worker.exitcode is not None and worker.exitcode not in ours:
                return int(worker.exitcode)
        return None

    def _processes(self) -> list[Any]:
        """The workers as started and those the pool started in place of any that ended."""
        return [*self.first, *self.pool._pool]  # type: ignore[attr-defined]

    def result(self, result: AsyncResult) -> Any:
        """``result.get()``, or :class:`WorkerDied` as soon as a worker has died: its task,
        maybe this one, is lost."""
        while not result.ready():
            result.wait(LOOK_EVERY_S)
            if not result.ready():
                exitcode = self.dead()
                if exitcode is not None:
                    raise WorkerDied(exitcode)
        return result.get()

    def end(self) -> None:
        """Stop the workers, whatever they are doing (``Pool.terminate()``)."""
        if self.dead() is not None:
            self.abandon()
        else:  # terminate() sends SIGTERM last, once past its waits
            self._unless_one_dies(self._terminate, ours=(0, -signal.SIGTERM))

    def finish(self) -> None:
        """Let the workers end what they run, then stop (``Pool.close()``, ``join()``):
        what is queued is the caller's to have made quick."""
        self.pool.close()
        self._unless_one_dies(self.pool.join)

    def _terminate(self) -> None:
        self.pool.terminate()
        self.pool.join()

    def _unless_one_dies(self, end: Callable[[], None], ours: tuple[int, ...] = (0,)
                         ) -> None:
        """``end()``, in a thread of its own, waited for while every worker lives; if one
        dies first (or had), :meth:`abandon`: the pool's ``join()`` and ``terminate()``
        wait without a limit for workers to take their stop signal, on a queue whose lock a
        dead one may hold."""
        ender = threading.Thread(target=end, daemon=True, name="tpumon-pool-end")
        ender.start()
        while ender.is_alive() and self.dead(ours) is None:
            ender.join(LOOK_EVERY_S)
        if self.dead(ours) is not None:
            # also when ``end()`` returned: a join() that found the dead workers gone ends
            # at once, and the pool's finalizer, run when it is collected, would wait for
            # the lock one of them held
            self.abandon()

    def abandon(self) -> None:
        """End a pool that lost a worker. ``Pool.terminate()`` waits on the queues' locks,
        and a worker killed while it held one (an idle worker holds the task queue's while
        it waits for a task; one sending a result, the results queue's) holds it for ever:
        so it is given ``ABANDON_WAIT_S`` in a thread of its own, the workers still alive
        then are killed, and the pool's threads, if stuck, are left (daemon threads do not
        hold the process's exit)."""
        ender = threading.Thread(target=self.pool.terminate, daemon=True,
                                 name="tpumon-pool-end")
        ender.start()
        ender.join(ABANDON_WAIT_S)
        alive = [w for w in self._processes() if w.exitcode is None]
        for worker in alive:
            worker.kill()
        for worker in alive:
            worker.join(ABANDON_WAIT_S)  # SIGKILL: at once
