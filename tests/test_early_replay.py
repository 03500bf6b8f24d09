"""``tpumon analyze`` replays jobs whose series look whole while the rest of the trace is
read (tpumon/detect/early_replay.py): the results are those of replaying the trace after
reading it whole, whether the guesses held or not."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest
from click.testing import CliRunner

from tpumon.cli import main
from tpumon.detect import early_replay
from tpumon.detect.early_replay import EarlyReplay
from tpumon.detect.replay import read_path, replay_columns, spilled_path
from tpumon.sim.tracegen import generate_trace
from tpumon.trace import TraceFormatError
from tpumon.trace.write import write_trace

SLICE = "t1v-n-5f0c1a2b"


@pytest.fixture(autouse=True)
def as_a_large_trace(small_tables, monkeypatch):
    """Tables of a few hundred rows (conftest's small_tables), and workers for any trace:
    a small trace read as a large one."""
    monkeypatch.setattr(early_replay, "EARLY_MIN_BYTES", 0)


def rows_of(hosts):
    """Rows of (host, scenario, seed), 3 h of 30 s polls, 2 chips each."""
    rows = []
    for host, scenario, seed in hosts:
        rows += generate_trace(scenario, duration_s=3 * 3600, poll_interval_s=30, chips=2,
                               seed=seed, host=host)
    return rows


HOSTS = [("a", "linear-leak", 1), ("b", "healthy", 2), ("c", "staircase-leak", 3),
         ("d", "step-change", 4)]


def by_series(rows):
    """As ``tpumon export`` writes a trace: one series after another."""
    return sorted(rows, key=lambda r: (r.host, r.chip, r.time))


def analyzed(path, **early):
    """The results through the early replay, and the EarlyReplay (to see what it did)."""
    with EarlyReplay(workers=2) as replay, spilled_path(str(path), early=replay) as series:
        results = replay_columns(series, workers=2, early=replay)
        return [r.to_json() for r in results], replay


def expected(path):
    return [r.to_json() for r in replay_columns(read_path(str(path)))]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_trace_written_series_after_series_is_replayed_while_read_with_the_same_results(
        tmp_path, fmt):
    path = tmp_path / f"trace.{fmt}"
    write_trace(by_series(rows_of(HOSTS)), path, fmt)
    got, replay = analyzed(path)
    assert got == expected(path)
    # every host but the last closed before the end of the file: replayed while reading
    assert sorted(replay._hosts) == ["a", "b", "c"]


def test_rows_interleaved_by_time_close_no_series_and_are_replayed_after_the_read(tmp_path):
    path = tmp_path / "trace.csv"
    write_trace(sorted(rows_of(HOSTS), key=lambda r: r.time), path, "csv")
    got, replay = analyzed(path)
    assert got == expected(path)
    assert not replay._hosts and not replay._chips


def test_a_series_that_comes_back_after_it_was_replayed_is_replayed_again_whole(tmp_path):
    rows = by_series(rows_of(HOSTS))
    first_a = [r for r in rows if r.host == "a"]
    cut = len(first_a) * 2 // 3
    late = {id(r) for r in first_a[cut:]}  # a's last third comes after every other host
    ordered = [r for r in rows if id(r) not in late] + first_a[cut:]
    path = tmp_path / "trace.csv"
    write_trace(ordered, path, "csv")
    got, replay = analyzed(path)
    assert got == expected(path)
    # "a" was replayed on its first two thirds, a guess that did not hold
    guessed = sum(samples for _, samples in replay._hosts["a"].sources)
    assert guessed < len(first_a) == sum(s.samples for s, _ in replay._hosts["a"].sources)


def test_a_slices_chips_are_run_while_read_and_pooled_at_the_end(tmp_path):
    hosts = [(f"{SLICE}-w-{i}", scenario, seed) for i, (_, scenario, seed) in
             enumerate(HOSTS)]
    path = tmp_path / "slice.csv"
    write_trace(by_series(rows_of(hosts)), path, "csv")
    got, replay = analyzed(path)
    assert got == expected(path)
    assert not replay._hosts
    assert len(replay._chips) >= 6  # the first three workers' chips


def test_a_directory_of_one_file_per_host(tmp_path):
    rows = rows_of(HOSTS)
    for host, *_ in HOSTS:
        write_trace([r for r in rows if r.host == host], tmp_path / f"{host}.csv", "csv")
    got, replay = analyzed(tmp_path)
    assert got == expected(tmp_path)
    assert sorted(replay._hosts) == ["a", "b", "c"]


def test_a_file_read_again_by_the_validating_parser_drops_what_was_guessed(tmp_path):
    """A row that pyarrow does not take as is (a name padded with spaces) sends the whole
    file to the validating parser after some hosts were replayed from pyarrow's tables:
    the results are the validating parser's."""
    path = tmp_path / "trace.csv"
    write_trace(by_series(rows_of(HOSTS)), path, "csv")
    lines = path.read_text().splitlines()
    lines[-1] = lines[-1].replace(",d,", ", d ,", 1)
    assert ", d ," in lines[-1]
    path.write_text("\n".join(lines) + "\n")
    got, replay = analyzed(path)
    assert got == expected(path)
    assert replay._hosts  # guessed from pyarrow's tables, then not kept


def test_analyze_on_the_command_line_gives_what_it_gave_before(tmp_path):
    path = tmp_path / "trace.csv"
    write_trace(by_series(rows_of(HOSTS)), path, "csv")
    out = CliRunner().invoke(main, ["analyze", str(path), "--format", "json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["series"] == expected(path)


def _slow_touch(path, seconds=0.5):
    """A task that says it started (its pid in ``path``.pid), then ends after ``seconds``."""
    with open(f"{path}.pid.part", "w") as out:
        out.write(str(os.getpid()))
    os.replace(f"{path}.pid.part", f"{path}.pid")  # whole when seen
    time.sleep(seconds)
    with open(path, "w") as out:
        out.write("done")


def started(trace):
    """An EarlyReplay whose workers run (2 of them)."""
    replay = EarlyReplay(workers=2)
    replay.start([str(trace)])
    assert replay.started
    return replay


def wait_for(path):
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.01)


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("x\n")
    return path


def test_a_guess_still_running_at_the_end_is_let_finish_not_killed(tmp_path, trace):
    """Killing a worker mid-task can leave the pool's results queue locked, and the pool's
    own threads then wait on it for ever; at a normal end the workers finish what runs."""
    done = tmp_path / "done"
    with started(trace) as replay:
        replay._run(_slow_touch, (str(done),))
        wait_for(tmp_path / "done.pid")
    assert done.read_text() == "done"
    assert not replay.started


@pytest.mark.slow
def test_after_an_error_what_runs_ends_and_what_is_queued_is_dropped(tmp_path, trace):
    running = [tmp_path / f"running{i}" for i in range(2)]
    queued = [tmp_path / f"queued{i}" for i in range(4)]
    with pytest.raises(ValueError), started(trace) as replay:
        for path in running:
            replay._run(_slow_touch, (str(path), 3.0))
        for path in running:
            wait_for(tmp_path / f"{path.name}.pid")  # both workers busy
        for path in queued:
            replay._run(_slow_touch, (str(path), 0.0))
        raise ValueError("a malformed row")
    assert [p.read_text() for p in running] == ["done", "done"]
    assert not any(p.exists() or (tmp_path / f"{p.name}.pid").exists() for p in queued)


def test_ctrl_c_ends_the_workers_at_once(tmp_path, trace):
    done = tmp_path / "done"
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt), started(trace) as replay:
        replay._run(_slow_touch, (str(done), 60.0))
        wait_for(tmp_path / "done.pid")
        raise KeyboardInterrupt
    assert time.monotonic() - began < 30
    assert not done.exists()


def test_ctrl_c_at_the_terminal_reaches_the_reading_process_not_the_workers(tmp_path, trace):
    """The terminal sends SIGINT to the whole process group: a worker it killed would
    take its task's result with it, and the pool would wait for that result for ever."""
    done = tmp_path / "done"
    replay = started(trace)
    try:
        result = replay._run(_slow_touch, (str(done), 1.0))
        wait_for(tmp_path / "done.pid")
        os.kill(int((tmp_path / "done.pid").read_text()), signal.SIGINT)
        result.get(timeout=60)
    finally:
        replay.__exit__(KeyboardInterrupt, None, None)
    assert done.read_text() == "done"


def test_a_malformed_row_after_hosts_were_guessed_is_one_error_line(tmp_path):
    """The error reaches the reader after hosts were replayed early: the workers end (what
    runs ends, what is queued is dropped) and ``analyze`` says what and where, once."""
    path = tmp_path / "trace.csv"
    write_trace(by_series(rows_of(HOSTS)), path, "csv")
    lines = path.read_text().splitlines()
    fields = lines[-1].split(",")
    fields[4] = "lots"  # hbm_used_bytes of the last host's last row
    lines[-1] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    replay = EarlyReplay(workers=2)
    with pytest.raises(TraceFormatError, match="lots"), replay, \
            spilled_path(str(path), early=replay) as series:
        replay_columns(series, workers=2, early=replay)
    assert replay._hosts and not replay.started  # guessed before the row was read; ended
    out = CliRunner().invoke(main, ["analyze", str(path), "--format", "json"])
    assert out.exit_code == 1 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"Error: {path}:{len(lines)}: column 'hbm_used_bytes': 'lots' is not an integer"]


@pytest.mark.slow
def test_at_a_normal_end_what_is_still_queued_is_not_run(tmp_path, trace):
    """Every result wanted was collected: a guess still queued is dropped, not replayed."""
    running = [tmp_path / f"running{i}" for i in range(2)]
    queued = tmp_path / "queued"
    with started(trace) as replay:
        for path in running:
            replay._run(_slow_touch, (str(path), 3.0))
        for path in running:
            wait_for(tmp_path / f"{path.name}.pid")
        replay._run(_slow_touch, (str(queued), 0.0))
    assert [p.read_text() for p in running] == ["done", "done"]
    assert not queued.exists()


@pytest.mark.parametrize("error", [None, ValueError])
@pytest.mark.parametrize("replaced", [False, True])
def test_a_worker_killed_mid_task_does_not_hold_the_end_for_ever(tmp_path, trace, error,
                                                                 replaced):
    """A worker killed (for memory, say) takes its task's result with it: the end does
    not wait for that result, at once or after the pool has replaced the worker."""
    lost = tmp_path / "lost"

    def kill(replay):
        replay._run(_slow_touch, (str(lost), 60.0))
        wait_for(tmp_path / "lost.pid")
        os.kill(int((tmp_path / "lost.pid").read_text()), signal.SIGKILL)
        if replaced:
            time.sleep(1.0)  # the pool's worker thread looks every 0.1 s

    assert ends(trace, kill, error), "the end waited for a task whose worker was killed"
    assert not lost.exists()


def ends(trace, body, error, limit: float = 60.0) -> bool:
    """Whether an EarlyReplay whose workers run ``body(replay)``, then ``error`` raised (if
    not None), ends (its ``__exit__``) within ``limit`` seconds, in a thread of its own."""
    ended = threading.Event()

    def run():
        with contextlib.suppress(ValueError), started(trace) as replay:
            body(replay)
            if error is not None:
                raise error("a malformed row")
        ended.set()

    threading.Thread(target=run, daemon=True).start()
    return ended.wait(limit)


def test_a_worker_killed_mid_task_whose_result_is_wanted_is_an_error_not_a_wait(tmp_path,
                                                                               trace):
    """Before, ``replay()`` waited in ``AsyncResult.get()`` for ever."""
    from tpumon.detect.workers import WorkerDied

    lost = tmp_path / "lost"
    with pytest.raises(WorkerDied, match="killed by signal 9"), started(trace) as replay:
        result = replay._run(_slow_touch, (str(lost), 60.0))
        wait_for(tmp_path / "lost.pid")
        os.kill(int((tmp_path / "lost.pid").read_text()), signal.SIGKILL)
        replay._result(result)
    assert not lost.exists() and not replay.started


@pytest.mark.parametrize("error", [None, ValueError])
@pytest.mark.slow
def test_an_idle_worker_killed_does_not_hold_the_end_for_ever(trace, error):
    """An idle worker waits for a task holding the task queue's lock: killed so, it keeps
    the others from their stop signal, and the pool's join() waited for ever (a review
    hung `analyze` so on a 72 MB trace). Both are killed here: one of them held it."""
    def kill(replay):
        time.sleep(0.5)  # both idle, waiting for a task
        for worker in replay._workers.first:
            os.kill(worker.pid, signal.SIGKILL)

    assert ends(trace, kill, error), "the end waited for workers that could not stop"
