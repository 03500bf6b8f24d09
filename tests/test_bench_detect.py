"""The leak benchmark (bench/detect.py): Prometheus baselines, corpus labels, scoring, report.

Its figures are only worth something if the baselines are evaluated as Prometheus does and
the ground truth is right, so both are checked on cases whose answer is known by hand.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tpumon.trace.read import read_trace
from tpumon.trace.schema import TraceRow

ROOT = Path(__file__).resolve().parent.parent


def _load_bench():
    """bench/ is not a package: load the script as a module (registered, for its dataclasses)."""
    spec = importlib.util.spec_from_file_location("bench_detect", ROOT / "bench" / "detect.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_detect"] = module
    spec.loader.exec_module(module)
    return module


bd = _load_bench()

HOUR = 3600.0
T0 = 1_750_000_020.0  # a multiple of 60: the first evaluation lands on the first sample
TOTAL = 32e9


def series(times, used, total=TOTAL):
    times = np.asarray(times, dtype=float)
    return bd.Series(times, np.asarray(used, dtype=float), np.full(len(times), float(total)))


def line(hours, rate_per_s, start=10e9, dt=10.0):
    times = T0 + np.arange(0, hours * HOUR, dt)
    return times, start + rate_per_s * (times - T0)


# ---------------------------------------------------------------- Prometheus baselines


def test_windowed_ols_is_least_squares_with_the_intercept_at_the_evaluation_time():
    rng = np.random.default_rng(1)
    xs = np.sort(T0 + rng.uniform(0, 4 * HOUR, 500))
    ys = 20e9 + 3e4 * (xs - T0) + rng.normal(0, 5e8, len(xs))
    at = T0 + np.array([0.0, 600.0, 2 * HOUR, 4 * HOUR])
    slope, level = bd.windowed_ols(xs, ys, at, HOUR)
    assert math.isnan(slope[0]) and math.isnan(level[0])  # fewer than two points
    for i in range(1, len(at)):
        window = (xs > at[i] - HOUR) & (xs <= at[i])  # (t - range, t]
        b, a = np.polyfit(xs[window] - at[i], ys[window], 1)
        assert slope[i] == pytest.approx(b, rel=1e-6)
        assert level[i] == pytest.approx(a, rel=1e-9)


def test_a_line_crossing_the_total_in_3_hours_fires_rule_a_after_15_minutes():
    rate = (TOTAL - 10e9) / (3 * HOUR)  # reaches the total 3 h after T0
    d = bd.evaluate_rule(bd.RULE_RAW, series(*line(3, rate)))
    # True from the first evaluation with two samples (T0 + 60 s), held for 15 m.
    assert d.alert_time == T0 + 60 + 900
    assert d.forecast_oom_time == pytest.approx(T0 + 3 * HOUR, abs=1.0)


def test_a_line_crossing_beyond_the_horizon_does_not_fire_rule_a():
    rate = (TOTAL - 10e9) / (30 * HOUR)  # would cross after 30 h; the series ends long before
    assert bd.evaluate_rule(bd.RULE_RAW, series(*line(12, rate))) == bd.Detection()


@pytest.mark.parametrize("rule", [bd.RULE_RAW, bd.RULE_FLOOR], ids=["raw", "floor"])
def test_a_flat_series_never_fires(rule):
    rng = np.random.default_rng(2)
    times = T0 + np.arange(0, 24 * HOUR, 5.0)
    used = 20e9 + rng.uniform(0, 6e9, len(times))  # a GB-high sawtooth on a flat floor
    assert bd.rule_firings(rule, series(times, used)) == []


def test_for_duration_is_held_at_every_evaluation_and_a_gap_resets_it():
    grid = T0 + 60.0 * np.arange(60)
    cond = np.zeros(60, dtype=bool)
    cond[5:20] = True  # 15 evaluations: held 14 min, not 15
    cond[25:41] = True  # 16 evaluations: 15 min at index 40
    cond[45:60] = True
    cond[52] = False  # one false evaluation resets the pending alert
    assert bd.firing_starts(grid, cond, 900.0) == [40]
    assert bd.firing_starts(grid, cond, 0.0) == [5, 25, 45, 53]  # no for: each run fires at once


def test_floor_rule_sees_through_the_sawtooth_that_rule_a_fits():
    rng = np.random.default_rng(3)
    times = T0 + np.arange(0, 12 * HOUR, 10.0)
    # the floor reaches the total in 20 h
    floor = 16e9 + (TOTAL - 16e9) / (20 * HOUR) * (times - T0)
    used = floor + 5e9 * rng.uniform(0, 1, len(times)) ** 3
    s = series(times, used)
    d = bd.evaluate_rule(bd.RULE_FLOOR, s)
    # Crosses within 24 h from the start, but the first 15 m minima come from part-filled windows
    # (higher minima: a falling start that flattens the fit for a while); then 1 h of for.
    assert d.alert_time is not None and T0 + HOUR < d.alert_time <= T0 + 3 * HOUR
    assert abs(d.forecast_oom_time - (T0 + 20 * HOUR)) < 2 * HOUR
    raw = bd.evaluate_rule(bd.RULE_RAW, s).alert_time
    assert raw is None or raw > T0 + 15 * HOUR  # a 4 h horizon: late if ever


def test_min_over_time_points_match_a_brute_force_subquery():
    rng = np.random.default_rng(4)
    times = np.sort(T0 + rng.uniform(0, 3 * HOUR, 400))
    times = times[(times < T0 + HOUR) | (times > T0 + 1.5 * HOUR)]  # a 30 min gap
    s = series(times, rng.uniform(1e9, 2e9, len(times)))
    grid = bd.eval_grid(times, 60.0)
    xs, ys = bd.min_over_time_points(s, grid, 900.0)
    expected = [(g, s.used[(times > g - 900) & (times <= g)].min())
                for g in grid if ((times > g - 900) & (times <= g)).any()]
    assert list(xs) == [g for g, _ in expected]
    assert list(ys) == [m for _, m in expected]


def test_total_goes_stale_after_the_lookback():
    times = np.array([T0, T0 + 100.0])
    vals = np.array([1.0, 2.0])
    got = bd.instant(times, vals, np.array([T0 - 1, T0 + 50, T0 + 100 + 300, T0 + 100 + 301]))
    assert math.isnan(got[0]) and got[1] == 1.0 and got[2] == 2.0 and math.isnan(got[3])


# ---------------------------------------------------------------- scoring


SPEC = bd.TraceSpec("g", "linear-leak", "h", 1, 3600.0, 10.0, 0.0, 0.0, 1, True)


def leak(chip="0", onset=1000.0, oom=11000.0):
    return bd.Truth(SPEC, chip, "linear-leak@0", True, onset, 0, oom)


def clean(chip="9", category="healthy"):
    return bd.Truth(SPEC, chip, category, False)


def test_judge_gives_lead_and_forecast_error_and_names_every_failure():
    hit = bd.judge(leak(), bd.Detection(3500.0, 12000.0))
    assert hit.verdict == bd.HIT
    assert hit.lead == pytest.approx(0.75)  # 7500 s of 10000 left
    assert hit.forecast_error == pytest.approx(1000 / 7500)
    # no forecast: no credit
    assert bd.judge(leak(), bd.Detection(3500.0)).forecast_error == math.inf
    assert bd.judge(leak(), bd.Detection()).verdict == bd.MISS
    assert bd.judge(leak(), bd.Detection(11000.0, 0.0)).verdict == bd.LATE
    assert bd.judge(leak(), bd.Detection(999.0, 0.0)).verdict == bd.EARLY
    assert bd.judge(clean(), bd.Detection(5.0)).verdict == bd.FALSE_ALARM
    assert bd.judge(clean(), bd.Detection()).verdict == bd.QUIET


def test_scores_count_early_alerts_as_false_and_medians_over_hits():
    truths = [leak("0"), leak("1"), leak("2"), leak("3"), clean("4"), clean("5", "step-change")]
    detections = {
        ("h", "0"): bd.Detection(1000.0, 11000.0),  # lead 1.0, exact forecast
        ("h", "1"): bd.Detection(6000.0, 16000.0),  # lead 0.5, error 1.0
        ("h", "2"): bd.Detection(500.0, 11000.0),  # before the onset
        ("h", "5"): bd.Detection(10.0),  # ("h", "3") and ("h", "4") are not reported: quiet
    }
    s = bd.Scores(tuple(bd.judge_all(truths, detections)))
    assert (s.count(bd.HIT), s.count(bd.EARLY), s.count(bd.MISS),
            s.count(bd.FALSE_ALARM)) == (2, 1, 1, 1)
    assert s.precision == pytest.approx(2 / 4) and s.recall == pytest.approx(2 / 4)
    assert s.f1 == pytest.approx(0.5)
    assert s.median_lead == pytest.approx(0.75) and s.median_lead_all == pytest.approx(0.25)
    assert s.median_forecast_error == pytest.approx(0.5)
    assert s.where(lambda t: t.category == "step-change").count(bd.FALSE_ALARM) == 1


def test_alerts_right_after_a_job_start_are_counted():
    truth = bd.Truth(SPEC, "0", "job-restart", False, job_starts=(0.0, 50_000.0))
    assert truth.since_job_start(50_100.0) == 100.0 and truth.since_job_start(-1.0) == math.inf
    s = bd.Scores(tuple(bd.judge(truth, bd.Detection(t)) for t in (60.0, 20_000.0, 51_000.0)))
    assert s.near_job_start(2 * HOUR) == 2


def test_every_firing_judging_takes_the_first_firing_in_time_and_flags_earlier_pages():
    outcome, paged = bd.judge_firings(leak(), [bd.Detection(500.0), bd.Detection(6000.0, 11000.0)])
    assert outcome.verdict == bd.HIT and outcome.lead == pytest.approx(0.5) and paged
    outcome, paged = bd.judge_firings(clean(), [])
    assert outcome.verdict == bd.QUIET and not paged


# ---------------------------------------------------------------- corpus


def test_full_corpus_has_the_required_composition():
    cases = bd.plan_corpus(0)
    truths = [t for _, ts in cases for t in ts]
    leaking = [t for t in truths if t.leaking]
    assert len(truths) >= 500
    assert len(truths) - len(leaking) >= 0.4 * len(truths)  # false alarms are measured too
    assert {t.category for t in leaking} == {g.name for g in bd.GROUPS if g.leak}
    assert any(t.onset_step == 0 for t in leaking) and any(t.onset_step >= 5000 for t in leaking)
    assert any(not t.spec.steps for t in leaking) and any(
        not t.spec.steps for t in truths if not t.leaking)
    assert len({t.key for t in truths}) == len(truths)
    # the late kinds of issue 20: multi-host slices, slow polls, JSON Lines traces
    assert any(spec.hosts >= 4 for spec, _ in cases) and any(
        spec.poll_interval_s >= 30 for spec, _ in cases)
    assert any(g.jsonl for g in bd.GROUPS) and any(not g.jsonl for g in bd.GROUPS)


@pytest.mark.parametrize("group", [g for g in bd.GROUPS if g.leak], ids=lambda g: g.name)
def test_leaks_are_calibrated_to_oom_in_their_groups_range_after_the_onset(group):
    spec, truths = bd.plan_case(group, 0, 77, True, random.Random(group.name))
    w = spec.workload()
    positives = [t for t in truths if t.leaking]
    onset = positives[0].onset_step
    leak_onset = dict(spec.overrides)["leak_onset_step"]  # irregular stairs: onset = 1st jump
    assert onset == leak_onset + (w.irregular_stair_steps[0] if w.irregular_stair_steps else 0)
    low, high = group.oom_steps
    assert low <= bd.steps_after_onset_at_oom(w, leak_onset) <= high
    assert all(t.oom_time == w.oom_time for t in truths) and w.jobs[-1].end_reason == "oom"
    job = w.jobs[-1]
    at_onset = w.sample(positives[0].onset_time).step - job.resume_step
    assert at_onset == max(onset, 1) or (onset <= 1 and at_onset <= 1)
    assert spec.duration_s > w.oom_time - bd.START_TIME  # the trace runs until the job dies
    chips = bd.CHIPS * group.hosts
    assert len(positives) == (1 if group.scenario == "chip0-leak" else chips)
    assert [t.category for t in truths if not t.leaking] == \
        [bd.OTHER_CHIPS] * (chips - len(positives))
    if group.name == "restart+leak":
        first = w.jobs[0]
        assert first.end_reason == "crash" and bd.steps_done(w, first) < onset


# ---------------------------------------------------------------- the harness end to end


def stand_in_analyze(path):
    """A trivial detector with tpumon's replay API: alerts halfway through any "leak" host."""
    if isinstance(path, str):  # the corpus directory
        rows = [r for name in sorted(os.listdir(path))
                for r in read_trace(os.path.join(path, name))]
    else:
        rows = path
    by_series = defaultdict(list)
    for r in rows:
        by_series[(r.host, r.chip)].append(r)
    results = []
    for (host, chip), rs in by_series.items():
        alert = {"time": rs[len(rs) // 2].time, "step": None} if "leak" in host else None
        forecast = {"time": rs[-1].time, "step": None} if alert else None
        results.append(SimpleNamespace(host=host, chip=chip, verdict="leak" if alert else "ok",
                                       alert=alert, alert_forecast=forecast))
    return results


def test_tpumon_results_are_read_into_detections_and_contract_violations_found(tmp_path):
    rows = [TraceRow(T0 + i, "h", "0", i, 10, 100) for i in range(10)]
    results = stand_in_analyze(rows) + [
        SimpleNamespace(host="x", chip=3, verdict="leak", alert=None)]
    assert bd.tpumon_detections(results)[("x", "3")] == bd.Detection()
    assert bd.contract_violations(results) == ["x chip 3: verdict leak with alert null"]


@pytest.mark.slow
def test_a_small_benchmark_runs_end_to_end(monkeypatch, tmp_path):
    groups = [g for g in bd.GROUPS if g.name in ("linear-leak@0", "healthy")]
    monkeypatch.setattr(bd, "GROUPS", tuple(groups))
    monkeypatch.setattr(bd, "HEALTHY_HOURS", (2.0, 2.0))
    monkeypatch.setattr(bd, "POLL_INTERVAL_S", (30.0, 30.0))
    trace = tmp_path / "corpus"
    run = bd.run_benchmark(0, True, str(trace), stand_in_analyze)
    assert trace.exists() and run.throughput.samples == run.samples > 0
    tpumon = run.columns[0][1]
    assert tpumon.count(bd.HIT) == 4 and tpumon.count(bd.QUIET) == 8  # halfway: lead about 0.5
    assert all(0.3 < o.lead < 0.7 for o in tpumon.outcomes if o.verdict == bd.HIT)
    report = bd.render(run, all_failures=True)
    assert "| precision | >= 0.98 | 1.000 ✓" in report and "median lead (detected leaks)" in report
    assert not bd.targets_met(run)  # lead about 0.5 < 0.8
    assert "not there yet" in bd.render(bd.run_benchmark(0, True, None, None), all_failures=False)


@pytest.mark.e2e
def test_seeds_scores_tpumon_on_each_corpus_seed(capsys):
    """``--seeds`` is the held-out check: one row per seed, each on its own corpus (a
    replay of two quick corpora: seconds)."""
    assert bd.seed_range("0-2") == [0, 1, 2] and bd.seed_range("3,7") == [3, 7]
    assert bd.main(["--quick", "--seeds", "1,2"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| 1", "| 2"]
    for row in rows[1:]:
        f1, false_alarms = row.split(" | ")[1:3]
        assert 0.0 <= float(f1) <= 1.0 and int(false_alarms) >= 0
