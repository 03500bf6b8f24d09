"""The agent's log speaks: one line per chip verdict change, and per alert raised or
resolved, with or without Slack and PagerDuty (journald shows nothing otherwise)."""

from __future__ import annotations

import logging

import numpy as np

from test_notify import SETTINGS, healthy, snap
from test_notify import leak as leaking
from tpumon.agent.loop import log_verdict_changes
from tpumon.detect import Assessment, Verdict
from tpumon.notify.alerts import AlertLog


def leak(verdict: Verdict, reason: str) -> Assessment:
    return Assessment(verdict, reason, slope_bytes_per_second=40.0,
                      slope_bytes_per_step=121_300.0, predicted_oom_time=1_764_090_000.0,
                      predicted_oom_step=62_000.0)


def test_one_log_line_per_verdict_change(caplog):
    ok = {"0": leak(Verdict.OK, "slow growth: OOM would take 20 h"),
          "1": Assessment(Verdict.WARMING_UP, "job starting")}
    called = {"0": leak(Verdict.LEAK, "floor grows 118.5 KiB/step; OOM in 5.3 h"),
              "1": Assessment(Verdict.INSUFFICIENT_DATA, "0 of 30 min")}
    with caplog.at_level(logging.INFO, logger="tpumon.agent"):
        log_verdict_changes({}, ok)
        log_verdict_changes(ok, called)
        log_verdict_changes(called, called)
        log_verdict_changes(called, ok)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("INFO", "chip 0: verdict ok: slow growth: OOM would take 20 h; floor grows "
                 "118.5 KiB/step; OOM at step ~62,000 (2025-11-25 17:00 UTC)"),
        ("WARNING", "chip 0: verdict leak (was ok): floor grows 118.5 KiB/step; OOM in 5.3 h; "
                    "OOM at step ~62,000 (2025-11-25 17:00 UTC)"),
        ("INFO", "chip 0: verdict ok (was leak): slow growth: OOM would take 20 h; floor "
                 "grows 118.5 KiB/step; OOM at step ~62,000 (2025-11-25 17:00 UTC)"),
    ]


def test_alerts_are_logged_without_a_notifier(caplog):
    """Without Slack or PagerDuty no notifier runs, and an alert raised or resolved was
    written nowhere."""
    alerts = AlertLog(SETTINGS)
    with caplog.at_level(logging.INFO, logger="tpumon.notify"):
        for t in range(0, 4000, 60):  # past every hold-down
            alerts(snap(1000.0 + t, {"0": leaking(2.0, 1000.0 + t)}, polls=t))
        for t in range(4000, 8000, 60):
            alerts(snap(1000.0 + t, {"0": healthy()}, polls=t))
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    raised = [m for level, m in lines if level == "WARNING"]
    assert any(m.startswith("alert trigger: TPUMonHBMLeakSuspected on chip 0 (warning)")
               for m in raised), lines
    assert any(m.startswith("alert trigger: TPUMonOOMForecast on chip 0 (critical)")
               for m in raised), lines
    assert len(raised) == 2
    assert sum(m.startswith("alert resolve: ") for _, m in lines) == 2, lines


def test_a_restart_of_the_job_is_logged_once(caplog):
    """A real detector sees the step go back after an hour of training: the log says the
    job restarted, once, beside the verdict's return to warming up."""
    from tpumon.detect import ChipDetector

    detector = ChipDetector()
    total = 32 * 2**30
    every = np.arange(0.0, 3 * 3600.0, 10.0)
    first, second = every[every < 5400], every[every >= 5460]  # a minute's gap between
    polls = np.concatenate([first, second])
    steps = np.concatenate([first / 2, (second - 5460) / 2])  # the step counter starts over
    used = np.concatenate([12 * 2**30 + 2e5 * first, 8 * 2**30 + 0 * second])
    assessments = []
    with caplog.at_level(logging.INFO, logger="tpumon.agent"):
        for i in range(0, len(polls), 6):  # a minute at a time, as the agent's polls come
            before = {"0": detector.assessment}
            detector.update(polls[i:i + 6] + 1.7e9, steps[i:i + 6], used[i:i + 6],
                            np.full(len(polls[i:i + 6]), float(total)))
            assessments.append(detector.assessment)
            log_verdict_changes(before, {"0": detector.assessment})
    restarted = [r.getMessage() for r in caplog.records if "restarted" in r.getMessage()]
    assert restarted == ["chip 0: its job restarted (the step went back or memory fell to "
                         "a new baseline; 1 restart(s) seen): the trend starts over"]
    assert assessments[-1].restarts == 1 and assessments[0].restarts == 0
