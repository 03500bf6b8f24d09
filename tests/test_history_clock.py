"""One clock per history: samples never run backwards in the store, and simulated and real
runs never share a history (tpumon/store/database.py, bootstrap.history_for_clock)."""

from __future__ import annotations

import logging
import time

import pytest

from tpumon.agent.bootstrap import RESTART_GAP, history_for_clock, simulated_start
from tpumon.common.config import ConfigError, load_config
from tpumon.store.database import Retention, open_database
from tpumon.common.samples import Sample

GiB = 2**30


def add(db, t, chip="0"):
    with db.transaction():
        return db.add_samples("vm", [(chip, Sample(t, None, GiB, 32 * GiB))])


def test_samples_running_backwards_are_refused_with_one_line(tmp_path, caplog):
    db = open_database(tmp_path, Retention())
    for t in (1000.0, 1001.0, 1002.0):
        assert add(db, t)
    db.close()
    db = open_database(tmp_path, Retention())  # a new run: the newest comes from the file
    with caplog.at_level(logging.INFO, logger="tpumon.store"):
        assert add(db, 500.0) == {} and add(db, 501.0) == {} and add(db, 502.0, "1")
        assert add(db, 1003.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "refusing samples dated before the newest stored" in \
        warnings[0].getMessage() and "chip 0" in warnings[0].getMessage()
    assert any("in order again" in r.getMessage() for r in caplog.records)
    assert db.refused_total == 2
    times = [s.time for s in db.read_series(db.series_id("vm", "0"))]
    assert times == [1000.0, 1001.0, 1002.0, 1003.0]


def test_a_simulated_run_continues_the_last_ones_clock(tmp_path):
    """The demo's 60x clock ran hours ahead of the wall clock; the next run started at
    now, behind it, and the two runs' samples interleaved."""
    ahead = time.time() + 7200  # where the last run's simulated clock stopped
    db = history_for_clock(open_database(tmp_path, Retention()), True, Retention())
    add(db, ahead)
    db.close()
    config = load_config(overrides={"store.state_dir": str(tmp_path)}, env={})
    assert simulated_start(config, True) == ahead + RESTART_GAP
    assert simulated_start(config, False) is None
    db = history_for_clock(open_database(tmp_path, Retention()), True, Retention())
    assert db.has_samples() and add(db, ahead + RESTART_GAP)
    db.close()
    # a real agent sets a simulated history aside too, and keeps its own afterwards
    db = history_for_clock(open_database(tmp_path, Retention()), False, Retention())
    assert not db.has_samples() and db.meta("clock") == "real"
    add(db, 200.0)
    db.close()
    db = history_for_clock(open_database(tmp_path, Retention()), False, Retention())
    assert db.has_samples()
    db.close()


def test_a_simulation_never_touches_a_real_agents_history(tmp_path):
    db = open_database(tmp_path, Retention())
    add(db, 100.0)  # an agent from before the clock was recorded: real
    db.close()
    with pytest.raises(ConfigError, match="holds a real agent's history"):
        history_for_clock(open_database(tmp_path, Retention()), True, Retention())
    db = open_database(tmp_path, Retention())
    assert db.has_samples()
