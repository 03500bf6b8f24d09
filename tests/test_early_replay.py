"""``tpumon analyze`` replays jobs whose series look whole while the rest of the trace is
read (tpumon/detect/early_replay.py): the results are those of replaying the trace after
reading it whole, whether the guesses held or not."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tpumon.cli import main
from tpumon.detect import early_replay
from tpumon.detect.early_replay import EarlyReplay
from tpumon.detect.replay import read_path, replay_columns, spilled_path
from tpumon.sim.tracegen import generate_trace
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


def _slow_touch(path):
    import time
    time.sleep(0.5)
    with open(path, "w") as out:
        out.write("done")


def test_a_guess_still_running_at_the_end_is_let_finish_not_killed(tmp_path):
    """Killing a worker mid-task can leave the pool's results queue locked, and the pool's
    own threads then wait on it for ever; at a normal end the workers finish what runs."""
    trace = tmp_path / "trace.csv"
    trace.write_text("x\n")
    done = tmp_path / "done"
    with EarlyReplay(workers=2) as replay:
        replay.start([str(trace)])
        assert replay.started
        replay._workers().apply_async(_slow_touch, (str(done),))
    assert done.read_text() == "done"
    assert not replay.started
