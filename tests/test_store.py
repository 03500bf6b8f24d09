"""The history store: tiers, cap, export round trip, resume after restart, damaged files."""

import json
import logging
import math
import sqlite3
import time
from itertools import groupby

import numpy as np
import pytest
from click.testing import CliRunner

from tpumon.cli import main
from tpumon.detect import ChipDetector, Verdict
from tpumon.detect.replay import analyze_file
from tpumon.sim.tracegen import generate_trace
from tpumon.store import checkpoint
from tpumon.store.checkpoint import CheckpointError, dump_detector, load_detector
from tpumon.store.database import (CACHE_KIB, DB_NAME, HistoryDB, Retention, database_path,
                                   open_database)
from tpumon.common.samples import Sample
from tpumon.store.trace_rows import export_rows
from tpumon.store.resume import feed, restore_detectors
from tpumon.store.writer import PollRecord, StoreWriter
from tpumon.trace.read import read_trace
from tpumon.trace.write import write_trace

HOST = "t1v-n-test-w-0"


def polls(rows):
    """Trace rows -> one PollRecord per poll."""
    for _, group in groupby(rows, key=lambda r: r.time):
        yield PollRecord(HOST, tuple((r.chip, Sample(r.time, r.step, r.hbm_used_bytes,
                                                     r.hbm_total_bytes)) for r in group))


def trace(scenario="linear-leak", hours=8.0, interval=5.0, chips=2, seed=3, **kw):
    return list(generate_trace(scenario, duration_s=hours * 3600, poll_interval_s=interval,
                               chips=chips, seed=seed, host=HOST, **kw))


def record_all(state_dir, rows, retention=None, checkpoint_every=None):
    """Write rows through the real writer thread, as the agent does (with ``retention``,
    default ``Retention()``); return the writer (stopped) and, with ``checkpoint_every``,
    the detectors fed alongside."""
    retention = Retention() if retention is None else retention
    writer = StoreWriter(state_dir, retention, open_database(state_dir, retention))
    writer.start()
    detectors: dict[str, ChipDetector] = {}
    for k, record in enumerate(polls(rows)):
        if checkpoint_every:
            for chip, s in record.samples:
                feed(detectors.setdefault(chip, ChipDetector()), [s])
            if k % checkpoint_every == checkpoint_every - 1:
                record = PollRecord(record.host, record.samples,
                                    {c: dump_detector(d) for c, d in detectors.items()})
        writer.submit(record)
        if k % 256 == 0:
            assert writer.flush()
    assert writer.flush()
    writer.stop()
    return writer, detectors


def as_tuples(rows):
    return [(r.time, r.host, r.chip, r.step, r.hbm_used_bytes, r.hbm_total_bytes) for r in rows]


@pytest.mark.slow
def test_export_round_trip_and_analyze_agree(tmp_path):
    rows = trace(hours=10)
    record_all(tmp_path, rows)
    out = tmp_path / "export.csv"
    result = CliRunner().invoke(main, ["export", "--state-dir", str(tmp_path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    exported = list(read_trace(out))
    key = lambda r: (r.chip, r.time)  # noqa: E731 - export groups by series
    assert as_tuples(sorted(exported, key=key)) == as_tuples(sorted(rows, key=key))
    original = tmp_path / "original.csv"
    write_trace(rows, original)
    assert [r.to_json() for r in analyze_file(str(out))] == \
        [r.to_json() for r in analyze_file(str(original))]
    assert analyze_file(str(out))[0].verdict == "leak"


def test_export_parquet_analyzes_as_the_csv(tmp_path):
    record_all(tmp_path, trace(hours=3))
    runner, base = CliRunner(), ["export", "--state-dir", str(tmp_path)]
    for name in ("export.csv", "export.parquet"):
        result = runner.invoke(main, [*base, "-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    assert list(read_trace(tmp_path / "export.parquet")) == \
        list(read_trace(tmp_path / "export.csv"))
    assert [r.to_json() for r in analyze_file(str(tmp_path / "export.parquet"))] == \
        [r.to_json() for r in analyze_file(str(tmp_path / "export.csv"))]
    to_stdout = runner.invoke(main, [*base, "--format", "parquet"])
    assert to_stdout.exit_code != 0 and "parquet is written to a file" in to_stdout.output


def test_export_filters_and_jsonl(tmp_path):
    rows = trace(hours=2, chips=3)
    record_all(tmp_path, rows)
    since, until = rows[len(rows) // 3].time, rows[2 * len(rows) // 3].time
    out = tmp_path / "part.jsonl"
    result = CliRunner().invoke(main, ["export", "--state-dir", str(tmp_path), "--chip", "1",
                                       "--since", repr(since), "--until", repr(until),
                                       "-o", str(out)])
    assert result.exit_code == 0, result.output
    got = list(read_trace(out))
    want = [r for r in rows if r.chip == "1" and since <= r.time <= until]
    assert as_tuples(got) == as_tuples(want) and want
    assert json.loads(out.read_text().splitlines()[0])["chip"] == "1"
    other = CliRunner().invoke(main, ["export", "--state-dir", str(tmp_path), "--host", "nope"])
    assert other.exit_code == 1 and "no samples match the selection" in other.output


@pytest.mark.parametrize("args, message", [
    (["--since", "yesterday-ish"], "is not a time"),
    ([], "no history store here"),
])
def test_export_errors_are_one_line(tmp_path, args, message):
    result = CliRunner().invoke(main, ["export", "--state-dir", str(tmp_path / "none"), *args])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert [line for line in result.output.splitlines() if line.startswith("Error:")] == \
        [result.output.strip().splitlines()[-1]]


@pytest.mark.slow
def test_old_samples_roll_up_into_minute_floors_and_peaks(tmp_path):
    rows = trace(hours=6, interval=2.0, chips=1)
    retention = Retention(raw_seconds=3600, minute_seconds=4 * 3600)
    record_all(tmp_path, rows, retention)
    db = HistoryDB(database_path(tmp_path), retention)
    newest = rows[-1].time
    exported = list(export_rows(db))
    raw_start = db.conn.execute("SELECT min(time) FROM samples").fetchone()[0]
    raw = [r for r in exported if r.time >= raw_start]
    old = [r for r in exported if r.time < raw_start]
    # the raw tier is whole and about an hour long (rolled up once a minute, on minutes);
    # the minute tier reaches back 4 h, two rows (floor, peak) a minute
    assert 3600 <= newest - raw_start <= 3600 + 120
    assert as_tuples(raw) == as_tuples([r for r in rows if r.time >= raw_start])
    assert newest - 4 * 3600 - 60 <= old[0].time < newest - 4 * 3600 + 60
    by_minute = {m: list(g) for m, g in groupby(rows, key=lambda r: math.floor(r.time / 60))}
    for minute, rolled_up in groupby(old, key=lambda r: math.floor(r.time / 60)):
        group, source = list(rolled_up), by_minute[minute]
        assert [r.hbm_used_bytes for r in group] == [min(r.hbm_used_bytes for r in source),
                                                      max(r.hbm_used_bytes for r in source)]
        assert (group[0].time, group[0].step) == (source[0].time, source[0].step)
        assert (group[-1].time, group[-1].step) == (source[-1].time, source[-1].step)
    db.close()


def test_the_writers_page_cache_is_bounded_below_sqlites_default(tmp_path):
    """SQLite's default cache (2,000 KiB a connection) grew with the file for days and was
    most of the agent's RSS growth in the week-long soak (docs/benchmarks.md)."""
    db = open_database(tmp_path, Retention())
    assert db.conn.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB
    assert CACHE_KIB < 2000
    db.close()


@pytest.mark.e2e
def test_size_cap_is_honoured_and_keeps_the_newest(tmp_path):
    cap = 2 * 2**20
    retention = Retention(raw_seconds=86400, minute_seconds=30 * 86400, max_bytes=cap)
    writer = StoreWriter(tmp_path, retention, open_database(tmp_path, retention))
    writer.start()
    rows = trace("healthy", hours=30, interval=2.0, chips=4)
    sizes = []
    for k, record in enumerate(polls(rows)):
        writer.submit(record)
        if k % 200 == 0:
            assert writer.flush()
            sizes.append(sum(f.stat().st_size for f in tmp_path.iterdir()))
    assert writer.flush()
    writer.stop()
    assert writer.health.up and writer.health.write_errors_total == 0
    assert writer.health.dropped_polls_total == 0
    assert max(sizes) <= cap, f"{max(sizes)} bytes on disk over a cap of {cap}"
    assert sizes[-1] > cap / 4  # it filled up to the cap, then kept to it
    db = HistoryDB(database_path(tmp_path), retention, read_only=True)
    kept = list(export_rows(db, chips={"0"}))
    assert kept[-1].time == rows[-1].time  # the newest poll is never what goes
    assert kept[0].time > rows[0].time + 3600  # the oldest did
    db.close()


def test_checkpoint_round_trip_is_exact_and_refuses_other_classes():
    rows = trace(hours=12, chips=1)
    t = np.array([r.time for r in rows])
    cols = (t, np.array([r.step for r in rows], float),
            np.array([r.hbm_used_bytes for r in rows], float),
            np.array([r.hbm_total_bytes for r in rows], float))
    whole = ChipDetector()
    whole.update(*cols)
    half = len(t) // 2
    first = ChipDetector()
    first.update(*(c[:half] for c in cols))
    resumed = load_detector(dump_detector(first))
    resumed.update(*(c[half:] for c in cols))
    assert resumed.assessment == whole.assessment and resumed.alert == whole.alert
    assert whole.assessment.verdict is Verdict.LEAK
    import pickle
    with pytest.raises(CheckpointError, match="system, which it may not"):
        load_detector(pickle.dumps(__import__("os").system))
    with pytest.raises(CheckpointError, match="damaged"):
        load_detector(dump_detector(first)[:-40])


def test_a_checkpoint_names_only_the_detectors_classes_and_numpys():
    """A checkpoint is read back only by the same detector code (its fingerprint), and the
    classes it names are tpumon.detect's: modules moved elsewhere in tpumon (as the package
    layout moved diagnose/counts.py out of detect/) never break an agent's checkpoints."""
    import io
    import pickle

    rows = trace(hours=12, chips=1)
    detector = ChipDetector()
    detector.update(np.array([r.time for r in rows]), np.array([r.step for r in rows], float),
                    np.array([r.hbm_used_bytes for r in rows], float),
                    np.array([r.hbm_total_bytes for r in rows], float))
    assert detector.assessment.verdict is Verdict.LEAK
    named = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            named.add(module)
            return super().find_class(module, name)

    Recording(io.BytesIO(dump_detector(detector))).load()
    assert any(m.startswith("tpumon.detect.") for m in named)
    assert all(m == "tpumon.detect" or m.startswith(("tpumon.detect.", "numpy"))
               or m == "builtins" for m in named), sorted(named)


def resumed_equals_continuous(tmp_path, live):
    """Resume from what record_all left (a 'crash' after its last poll) and compare with
    the detectors that were fed the same samples without interruption."""
    db = open_database(tmp_path, Retention())
    restored = restore_detectors(db, HOST)
    db.close()
    assert set(restored) == set(live)
    for chip, detector in live.items():
        assert restored[chip].assessment == detector.assessment, chip
        assert restored[chip].alert == detector.alert, chip
    return restored


@pytest.mark.e2e
def test_resume_from_checkpoint_plus_samples_after_it(tmp_path):
    rows = trace(hours=10)
    # 997 polls between checkpoints: the last one is followed by samples it never saw
    _, live = record_all(tmp_path, rows, checkpoint_every=997)
    restored = resumed_equals_continuous(tmp_path, live)
    assert restored["0"].assessment.verdict is Verdict.LEAK


@pytest.mark.e2e
def test_resume_after_an_upgrade_replays_the_stored_samples(tmp_path, monkeypatch, caplog):
    rows = trace(hours=10)
    _, live = record_all(tmp_path, rows, checkpoint_every=500)
    checkpoint.fingerprint.cache_clear()
    monkeypatch.setattr(checkpoint, "_DETECT_DIR", tmp_path)  # "different detector code"
    caplog.set_level(logging.INFO, "tpumon.store")
    try:
        resumed_equals_continuous(tmp_path, live)
        assert "0 from checkpoints, 2 replayed" in caplog.text
    finally:
        checkpoint.fingerprint.cache_clear()


@pytest.mark.e2e
def test_damaged_checkpoint_falls_back_to_replay(tmp_path, caplog):
    rows = trace(hours=6)
    _, live = record_all(tmp_path, rows, checkpoint_every=300)
    conn = sqlite3.connect(database_path(tmp_path))
    conn.execute("UPDATE checkpoints SET state = substr(state, 1, 100)")
    conn.commit()
    conn.close()
    with caplog.at_level(logging.WARNING):
        resumed_equals_continuous(tmp_path, live)
    assert "ignoring its detector checkpoint" in caplog.text


def test_corrupt_database_is_moved_aside(tmp_path, caplog):
    path = tmp_path / DB_NAME
    path.write_bytes(b"this is not SQLite at all" * 400)
    with caplog.at_level(logging.ERROR):
        db = open_database(tmp_path, Retention())
    assert [r.message for r in caplog.records if "moved it to" in r.message]
    assert len(caplog.records) == 1
    aside = list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not SQLite")
    with db.transaction():
        db.add_samples(HOST, [("0", Sample(1.0, None, 1, 2))])
    assert list(export_rows(db))[0].hbm_used_bytes == 1
    db.close()


def test_the_store_says_its_size_before_its_first_write(tmp_path):
    """`status` 4 s after a start said "history.db (0 B)" where the log said 108.5 KiB."""
    db = open_database(tmp_path, Retention())
    with db.transaction():
        db.add_samples(HOST, [("0", Sample(float(t), None, 1, 2)) for t in range(500)])
    db.close()
    reopened = open_database(tmp_path, Retention())
    writer = StoreWriter(tmp_path, Retention(), reopened)
    assert writer.health.size_bytes == reopened.size_bytes() > 0
    reopened.close()


@pytest.mark.slow
def test_database_damaged_while_open_is_replaced(tmp_path, caplog):
    retention = Retention()
    writer = StoreWriter(tmp_path, retention, open_database(tmp_path, retention))
    writer.start()
    rows = trace(hours=3, chips=4)
    records = list(polls(rows))
    for r in records[:1000]:
        writer.submit(r)
    assert writer.flush()
    writer._db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    writer._db.conn.execute("PRAGMA cache_size = 2")  # read pages from disk, not memory
    with open(database_path(tmp_path), "r+b") as f:  # scribble over every page but the first
        f.seek(4096)
        f.write(b"\xa5" * (database_path(tmp_path).stat().st_size - 4096))
    with caplog.at_level(logging.ERROR):
        for r in records[1000:1400]:
            writer.submit(r)
            writer.flush()
    writer.stop()
    health = writer.health
    assert health.moved_aside_total == 1 and health.up, health
    assert "moved it to" in caplog.text
    db = HistoryDB(database_path(tmp_path), retention, read_only=True)
    assert len(list(export_rows(db))) > 0
    db.close()


def test_polls_wait_for_the_write_delay_to_share_a_transaction_unless_flushed(tmp_path):
    retention = Retention()
    writer = StoreWriter(tmp_path, retention, open_database(tmp_path, retention),
                         write_delay=3600)
    writer.start()
    try:
        for record in list(polls(trace(hours=0.05)))[:5]:
            writer.submit(record)
        time.sleep(0.3)  # the writer was woken by the first poll and went back to waiting
        assert writer.health.polls_written_total == 0 and writer.health.queued_polls == 5
        assert writer.flush(timeout=10)  # a flush does not wait for the delay
        assert writer.health.polls_written_total == 5
        writer.submit(list(polls(trace(hours=0.05)))[6])
    finally:
        writer.stop()  # stopping writes what is queued
    assert writer.health.polls_written_total == 6
