"""The replay's worker processes (tpumon/detect/workers.py): a worker that dies mid-task is
one error, not a wait for ever; Ctrl-C at the terminal does not kill them."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from click.testing import CliRunner

from tpumon.cli import main
from tpumon.detect import replay
from tpumon.detect.workers import WorkerDied, result_of, start_worker
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
def pool():
    with multiprocessing.get_context("fork").Pool(2, initializer=start_worker) as p:
        yield p, list(p._pool)


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


def test_a_worker_killed_mid_task_ends_the_wait_with_an_error(tmp_path, pool):
    p, first = pool
    started = tmp_path / "pid"
    result = p.apply_async(_pid_then_sleep, (str(started), 60.0))
    os.kill(_pid_of(started), signal.SIGKILL)  # as the kernel's OOM killer does
    how, what = waited(lambda: result_of(result, p, first))
    assert how == "raised" and isinstance(what, WorkerDied)
    assert str(what).startswith("a replay worker process died (killed by signal 9) "
                                "(out of memory?)")


def test_a_wait_for_a_task_queued_behind_a_killed_one_ends_too(tmp_path, pool):
    """The pool replaces the dead worker; the task it ran is lost, and the pool cannot say
    which it was: any wait after a death ends (the replay needs every result)."""
    p, first = pool
    started = tmp_path / "pid"
    lost = p.apply_async(_pid_then_sleep, (str(started), 60.0))
    os.kill(_pid_of(started), signal.SIGKILL)
    time.sleep(1.0)  # replaced: the pool's worker thread looks every 0.1 s
    later = p.apply_async(_pid_then_sleep, (str(tmp_path / "later"), 60.0))
    assert waited(lambda: result_of(later, p, first))[0] == "raised"
    assert not lost.ready()


def test_results_come_as_they_did_while_the_workers_live(tmp_path, pool):
    p, first = pool
    result = p.apply_async(_pid_then_sleep, (str(tmp_path / "pid"), 0.5))
    assert waited(lambda: result_of(result, p, first)) == ("returned", "done")


def test_a_worker_sent_sigint_finishes_its_task(tmp_path, pool):
    """The terminal sends Ctrl-C to the whole process group: the reading process ends the
    workers; a worker killed by it would take its task's result with it."""
    p, first = pool
    started = tmp_path / "pid"
    result = p.apply_async(_pid_then_sleep, (str(started), 1.0))
    os.kill(_pid_of(started), signal.SIGINT)
    assert waited(lambda: result_of(result, p, first)) == ("returned", "done")


def _die(task):
    os.kill(os.getpid(), signal.SIGKILL)


def test_analyze_says_in_one_line_that_a_worker_died(tmp_path, monkeypatch):
    """A trace replayed by forked workers (2 cores), one of which the kernel kills: before,
    ``tpumon analyze`` waited for its result for ever."""
    rows = []
    for host, seed in (("a", 1), ("b", 2), ("c", 3)):
        rows += generate_trace("linear-leak", duration_s=3600, poll_interval_s=30, chips=2,
                               seed=seed, host=host)
    path = tmp_path / "trace.csv"
    write_trace(rows, path, "csv")
    monkeypatch.setattr(replay, "PARALLEL_MIN_SAMPLES", 0)
    monkeypatch.setattr("tpumon.cli.analyze.usable_cores", lambda: 2)
    monkeypatch.setattr(replay, "_replay_forked", _die)  # in the forked workers
    how, out = waited(lambda: CliRunner().invoke(main, ["analyze", str(path)]))
    assert how == "returned"
    assert out.exit_code == 1 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: a replay worker process died (killed by signal 9)")
