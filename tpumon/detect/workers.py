"""The forked worker processes that replay a trace's jobs (``tpumon analyze``), and a wait
for their results that cannot hang.

A ``multiprocessing`` pool loses a task whose worker dies: the kernel's OOM killer ends it,
or a signal, and its result never comes; ``AsyncResult.get()`` and ``Pool.imap`` then wait
for ever, and so did ``tpumon analyze``, silently, on a trace too big for the machine.
:func:`result_of` waits in short slices and looks at the workers between them: one that
died ends the wait with :class:`WorkerDied`, which ``analyze`` prints as one line.

The workers run below the reading process (the read is what everything waits for) and
ignore SIGINT: the terminal sends Ctrl-C to the whole process group, and a worker killed
mid-task can leave the pool's results queue locked, and the pool's own threads waiting on
it for ever. The reading process gets the Ctrl-C and ends the workers itself.
"""

from __future__ import annotations

import os
import signal
from multiprocessing.pool import AsyncResult, Pool
from typing import Any, Sequence, TypeVar

#: The workers' niceness.
NICENESS = 5

#: How long a wait for a result sleeps between looks at the workers, in seconds.
LOOK_EVERY_S = 0.2

T = TypeVar("T")


class WorkerDied(RuntimeError):
    """A worker process died mid-task (killed for memory, say): its result never comes."""

    def __init__(self, exitcode: int) -> None:
        how = f"killed by signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
        hint = " (out of memory?)" if exitcode == -signal.SIGKILL else ""
        super().__init__(f"a replay worker process died ({how}){hint}; its jobs' results "
                         "are lost: analyze again, with fewer jobs in parallel "
                         "(taskset -c 0 tpumon analyze ...)")
        self.exitcode = exitcode


def start_worker(*_: Any) -> None:
    """A worker's initializer: below the reading process, deaf to Ctrl-C."""
    os.nice(NICENESS)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def dead_worker(pool: Pool, first: Sequence[Any]) -> int | None:
    """The exit code of a worker of ``pool`` that died, None if none did. ``first``: the
    pool's processes as started (``Pool._pool`` then); one that died was replaced since, and
    only they still know. A worker ends by itself (exit code 0) only once the pool is
    closed, after its last task."""
    for worker in [*first, *pool._pool]:  # type: ignore[attr-defined]  # CPython's Pool
        if worker.exitcode not in (None, 0):
            return int(worker.exitcode)
    return None


def result_of(result: AsyncResult, pool: Pool, first: Sequence[Any]) -> Any:
    """``result.get()``, or :class:`WorkerDied` as soon as a worker of ``pool`` has died: its
    task, maybe this one, is lost (the pool cannot say which)."""
    while not result.ready():
        result.wait(LOOK_EVERY_S)
        if not result.ready():
            exitcode = dead_worker(pool, first)
            if exitcode is not None:
                raise WorkerDied(exitcode)
    return result.get()
