"""The replay's worker processes (tpumon/detect/workers.py): a worker that dies mid-task is
one error, not a wait for ever; Ctrl-C at the terminal does not kill them."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import psutil
import pytest
from click.testing import CliRunner

from tpumon.cli import main
from tpumon.detect import replay
from tpumon.detect.workers import WorkerDied, Workers
from tpumon.sim.tracegen import generate_trace
from tpumon.trace.write import write_trace


def _pid_then_sleep(path: str, seconds: float) -> str:
    """Says it started (its pid in ``path``, whole when seen), then sleeps."""
    with open(f"{path}.part", "w") as out:
        out.write(str(os.getpid()))
    os.replace(f"{path}.part", path)
    time.sleep(seconds)
    return "done"


def _pid_of(path) -> int:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.01)
    return int(path.read_text())


@pytest.fixture
def workers():
    pool = Workers(2)
    yield pool
    pool.end()


def waited(function, limit: float = 60.0):
    """``function()`` in a thread: what it returned or raised, failing if it took longer
    than ``limit`` (a hang)."""
    out: list = []

    def run():
        try:
            out.append(("returned", function()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    assert out, f"still waiting after {limit} s"
    return out[0]


def test_a_worker_killed_mid_task_ends_the_wait_with_an_error(tmp_path, workers):
    started = tmp_path / "pid"
    result = workers.pool.apply_async(_pid_then_sleep, (str(started), 60.0))
    os.kill(_pid_of(started), signal.SIGKILL)  # as the kernel's OOM killer does
    how, what = waited(lambda: workers.result(result))
    assert how == "raised" and isinstance(what, WorkerDied)
    assert str(what).startswith("a replay worker process died (killed by signal 9) "
                                "(out of memory?); the replay cannot finish")
    began = time.monotonic()
    assert waited(workers.end)[0] == "returned"
    assert time.monotonic() - began < 30


def test_a_worker_killed_before_the_wait_began_still_ends_it(tmp_path, workers):
    """The pool replaces a dead worker at once, and the task the dead one ran is lost, and
    the pool cannot say which it was: any wait after a death ends (the replay needs every
    result), though the pool's workers are all alive again."""
    started = tmp_path / "pid"
    lost = workers.pool.apply_async(_pid_then_sleep, (str(started), 60.0))
    os.kill(_pid_of(started), signal.SIGKILL)
    time.sleep(1.0)  # replaced: the pool's worker thread looks every 0.1 s
    assert all(w.exitcode is None for w in workers.pool._pool)
    later = workers.pool.apply_async(_pid_then_sleep, (str(tmp_path / "later"), 60.0))
    assert waited(lambda: workers.result(later))[0] == "raised"
    assert not lost.ready()


def _sibling_pids() -> list[int]:
    return [c.pid for c in psutil.Process(os.getppid()).children() if c.pid != os.getpid()]


def _kill_idle_sibling(path: str) -> str:
    """Kill the other worker, idle: waiting for a task, it holds the task queue's lock."""
    time.sleep(0.3)  # the other worker back in its wait for a task
    for pid in _sibling_pids():
        os.kill(pid, signal.SIGKILL)
    return _pid_then_sleep(path, 0.5)


@pytest.mark.slow
def test_a_pool_whose_idle_worker_was_killed_ends_without_waiting_for_its_lock(tmp_path,
                                                                                 workers):
    """``Pool.terminate()`` waits for the task queue's lock, which a worker killed while
    it waited for a task holds for ever: the end gives it ABANDON_WAIT_S, then kills what
    is left (a review found analyze's end hung so)."""
    result = workers.pool.apply_async(_kill_idle_sibling, (str(tmp_path / "pid"),))
    assert waited(lambda: workers.result(result))[0] == "raised"
    began = time.monotonic()
    assert waited(workers.end)[0] == "returned"
    assert time.monotonic() - began < 30
    assert all(w.exitcode is not None for w in [*workers.first, *workers.pool._pool])


def test_results_come_as_they_did_while_the_workers_live(tmp_path, workers):
    result = workers.pool.apply_async(_pid_then_sleep, (str(tmp_path / "pid"), 0.5))
    assert waited(lambda: workers.result(result)) == ("returned", "done")


def test_a_worker_sent_sigint_finishes_its_task(tmp_path, workers):
    """The terminal sends Ctrl-C to the whole process group: the reading process ends the
    workers; a worker killed by it would take its task's result with it."""
    started = tmp_path / "pid"
    result = workers.pool.apply_async(_pid_then_sleep, (str(started), 1.0))
    os.kill(_pid_of(started), signal.SIGINT)
    assert waited(lambda: workers.result(result)) == ("returned", "done")


def _die(task):
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_the_other_once_idle(flag, task):
    """The first task: once the other worker has run the rest and waits for more (holding
    the task queue's lock), kill it; the others: nothing."""
    try:
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return None
    time.sleep(2.0)
    for pid in _sibling_pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)


@pytest.mark.parametrize("killed", ["busy", "idle"])
@pytest.mark.slow
def test_analyze_says_in_one_line_that_a_worker_died(tmp_path, monkeypatch, killed):
    """A trace replayed by forked workers (2 cores), one of which the kernel kills, busy or
    idle: before, ``tpumon analyze`` waited for ever for its result, or at its end for
    the lock the idle one held."""
    rows = []
    for host, seed in (("a", 1), ("b", 2), ("c", 3)):
        rows += generate_trace("linear-leak", duration_s=3600, poll_interval_s=30, chips=2,
                               seed=seed, host=host)
    path = tmp_path / "trace.csv"
    write_trace(rows, path, "csv")
    monkeypatch.setattr(replay, "PARALLEL_MIN_SAMPLES", 0)
    monkeypatch.setattr("tpumon.cli.analyze.usable_cores", lambda: 2)
    task = _die if killed == "busy" else \
        functools.partial(_kill_the_other_once_idle, str(tmp_path / "flag"))
    monkeypatch.setattr(replay, "_replay_forked", task)  # in the forked workers
    how, out = waited(lambda: CliRunner().invoke(main, ["analyze", str(path)]))
    assert how == "returned"
    assert out.exit_code == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: a replay worker process died (killed by signal 9)")
