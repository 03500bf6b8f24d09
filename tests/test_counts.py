"""Trends of live tensors and compiles per step, and the diagnosis built on them."""

import random

from tpumon.diagnose.counts import CountTracker, CountTrend, diagnose


def feed(values, start=1):
    tracker = CountTracker()
    for step, value in enumerate(values, start):
        tracker.update(step, value)
    return tracker.trend()


def test_one_tensor_per_step_is_growth_and_a_flat_loop_is_not():
    assert feed([15] * 500).growing is False
    leak = feed([15 + s for s in range(500)])
    assert leak.growing and abs(leak.per_step - 1.0) < 1e-9


def test_a_bounded_in_step_sawtooth_is_not_growth():
    rng = random.Random(4)
    assert not feed([100 + rng.randint(0, 12) for _ in range(2000)]).growing
    assert not feed([100 + (s % 7) for s in range(2000)]).growing


def test_growth_that_stopped_is_not_a_leak():
    """Lazy state created over the first few hundred steps, then flat for longer."""
    assert not feed([10 + min(s, 300) for s in range(1500)]).growing


def test_slow_growth_is_caught_and_too_little_data_is_not_judged():
    assert feed([50 + s // 20 for s in range(4000)]).growing  # one tensor every 20 steps
    early = feed([50 + s for s in range(30)])
    assert not early.growing and early.per_step is None


def test_a_restart_resets_the_trend_and_memory_stays_bounded():
    tracker = CountTracker()
    for step in range(1, 600):
        tracker.update(step, 10 + step)
    assert tracker.trend().growing
    for step in range(1, 600):  # the job restarted from step 1, healthy this time
        tracker.update(step, 10)
    assert not tracker.trend().growing
    for step in range(600, 200_000):
        tracker.update(step, 10)
    assert tracker.trend().points <= tracker.s.max_points


def test_diagnosis_names_the_most_specific_cause():
    growing, flat = (CountTrend(True, 1.0, 0.9, 9.0, 100, 500),
                     CountTrend(False, 0.0, 0.0, 0.0, 100, 500))
    assert diagnose(growing, growing, True).code == "retained_tensors"
    assert diagnose(flat, CountTrend(True, 0.1, 0.05, 6.0, 100, 500), True).code == "recompilation"
    assert diagnose(flat, flat, True).code == "allocator"
    assert diagnose(flat, flat, False) is None
    assert diagnose(None, None, True) is None  # no reporter: no guess


def test_a_trend_asked_for_at_every_report_lags_a_fresh_fit_by_a_few_points():
    """The agent asks each poll; the fit is redone once a sixteenth of the window is new,
    so the first "growing" comes at most that many points after a fit at every point's."""
    values = [30] * 400 + [30 + s for s in range(1, 400)]
    asked, fresh = CountTracker(), CountTracker()
    first = {}
    for step, value in enumerate(values, 1):
        for name, tracker in (("asked", asked), ("fresh", fresh)):
            tracker.update(step, value)
            if name == "fresh":
                tracker._fitted = None  # refit every time
            if tracker.trend().growing:
                first.setdefault(name, step)
    lag = asked._stride * (asked.s.max_points // 16)  # points kept, in steps
    assert 400 < first["fresh"] <= first["asked"] <= first["fresh"] + lag
    assert abs(asked.trend().per_step - fresh.trend().per_step) < 0.1


def test_a_constant_count_is_judged_as_the_full_fit_would_without_fitting():
    """The shortcut for a constant window (a healthy loop's live count, compiles after
    warm-up) gives exactly what Sen's slope and Mann-Kendall give on it."""
    for values, start in (([15] * 500, 1), ([0] * 100, 7), ([3] * 5000, 100)):
        tracker = CountTracker()
        for step, value in enumerate(values, start):
            tracker.update(step, value)
        assert tracker.trend() == tracker._fit_slopes()
        assert tracker.trend().reason == "flat"


def test_the_retained_tensors_text_fits_the_framework():
    """JAX has no in-place sharding helper: its diagnosis must not send people to one."""
    growing = CountTrend(True, 1.0, 0.9, 9.0, 100, 500)
    jax_text = diagnose(growing, None, False, "jax").text
    torch_text = diagnose(growing, None, False, "torch_xla").text
    assert "sharding helper" not in jax_text and "closure" in jax_text
    assert "in-place sharding helper keeping gradients alive" in torch_text
