"""The simulated workload and trace generation: ground truth the detector's tests rely on."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest

from tpumon.sim.tracegen import generate_trace
from tpumon.sim.workload import SCENARIOS, V4_HBM_TOTAL_BYTES, Scenario, Workload
from tpumon.trace.read import read_trace
from tpumon.trace.write import write_trace

HOUR = 3600.0
MB = 10**6


def t_at_step(w: Workload, step: int, job: int = 0) -> float:
    """First time at which ``job`` reports ``step`` (bisection: steps only grow within a job)."""
    j = w.jobs[job]
    lo, hi = j.start_time, min(j.end_time, j.start_time + 1000 * HOUR)
    assert w.sample(hi - 1e-3).step >= step, "job never reaches that step"
    while hi - lo > 1e-3:
        mid = (lo + hi) / 2
        if w.sample(mid).step >= step:
            hi = mid
        else:
            lo = mid
    return hi


def floors_on_grid(w: Workload, t0: float, t1: float, dt: float) -> list[tuple[int, ...]]:
    return [w.floor_bytes(t0 + i * dt) for i in range(int((t1 - t0) / dt) + 1)]


def after_first_eval(w: Workload) -> float:
    """A time just past the first eval, when the eval executable exists (healthy floor is
    then flat but for the cache)."""
    return t_at_step(w, w.params.eval_every_steps + 1)


def test_scenario_registry_has_the_documented_names():
    assert set(SCENARIOS) == {"healthy", "linear-leak", "fast-leak", "staircase-leak",
                              "chip0-leak", "step-change", "job-restart", "job-exit", "host-oom",
                              "saturating-cache", "irregular-staircase", "leak-rate-change",
                              "stall", "slow-dcn"}
    for name, s in SCENARIOS.items():
        assert s.name == name and s.description and "\n" not in s.description


def test_unknown_scenario_and_unknown_override_are_rejected():
    with pytest.raises(ValueError, match="healthy"):
        Workload("leaky")
    with pytest.raises(TypeError):
        Workload("healthy", leak_per_step=1)
    with pytest.raises(ValueError, match="leak_bytes_per_step"):
        Workload("healthy", leak_bytes_per_step=-1)


def test_overrides_are_applied_exactly_and_ranges_are_drawn_per_seed():
    w = Workload("linear-leak", leak_bytes_per_step=41000, leak_chip_spread=0, step_time_s=0.5)
    assert w.params.leak_bytes_per_step == 41000 and w.params.step_time_s == 0.5
    assert w.leak_bytes_per_step_by_chip == (41000,) * 4
    assert w.scenario.leak_bytes_per_step == 41000
    draws = {Workload("healthy", seed=s).params.weights_bytes for s in range(5)}
    assert len(draws) == 5
    lo, hi = SCENARIOS["healthy"].weights_bytes
    assert all(lo <= d <= hi for d in draws)
    assert all(isinstance(Workload("healthy", seed=s).params.eval_every_steps, int)
               for s in range(5))


def test_custom_scenario_object_is_accepted():
    s = Scenario("mine", "a fixed shape", weights_bytes=10 * 10**9, eval_every_steps=0,
                 checkpoint_every_steps=0)
    w = Workload(s, chips=2)
    assert w.chips == 2 and w.scenario is s
    assert w.sample(10 * HOUR).runtime_up


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_samples_lie_between_floor_and_total(name):
    w = (Workload(name, seed=3, leak_bytes_per_step=600_000) if "leak" in name
         else Workload(name, seed=3))
    total = w.hbm_total_bytes
    seen_up = 0
    for i in range(2500):
        t = i * 13.7
        s, floor = w.sample(t), w.floor_bytes(t)
        assert s.hbm_total_bytes == total
        if not s.runtime_up:
            assert s.step is None and s.hbm_used_bytes == () and s.duty_cycle_pct == () \
                and floor == ()
            continue
        seen_up += 1
        assert len(s.hbm_used_bytes) == len(floor) == len(s.duty_cycle_pct) == 4
        assert all(f <= u <= total for f, u in zip(floor, s.hbm_used_bytes, strict=True))
        assert all(0.0 <= d <= 100.0 for d in s.duty_cycle_pct)
    assert seen_up > 500


def test_same_seed_same_samples_and_other_seed_differs():
    times = [i * 7.3 for i in range(600)]
    a = [Workload("healthy", seed=11).sample(t) for t in times]  # fresh workloads, same sequence
    w1, w2, w3 = (Workload("healthy", seed=s) for s in (11, 11, 12))
    assert [w1.sample(t) for t in times] == [w2.sample(t) for t in times]
    assert [w3.sample(t) for t in times] != [Workload("healthy", seed=11).sample(t) for t in times]
    assert a[0] == Workload("healthy", seed=11).sample(times[0])


def test_warm_up_ramps_in_steps_at_step_zero_with_idle_chips():
    w = Workload("healthy", seed=2)
    warmup = w.params.warmup_s
    floors = [w.floor_bytes(t)[1] for t in range(int(warmup))]
    assert floors == sorted(floors)  # only loads, never frees
    assert len(set(floors)) >= 4  # several chunks: steps, not a line
    assert floors[-1] - floors[0] > 0.8 * w.params.weights_bytes
    for t in range(0, int(warmup), 7):
        s = w.sample(t)
        assert s.step == 0 and max(s.duty_cycle_pct) <= 5.0
    s = w.sample(warmup + 120)
    assert s.step > 0 and min(s.duty_cycle_pct) > 75.0


def test_optimizer_state_appears_at_step_one():
    w = Workload("healthy", seed=4)
    f0 = w.floor_bytes(w.params.warmup_s + 0.1)  # first step running: no optimizer state yet
    f1 = w.floor_bytes(t_at_step(w, 1) + 1e-3)
    expected = w.params.weights_bytes * w.params.optimizer_ratio
    assert all(abs((b - a) - expected) < 0.05 * expected for a, b in zip(f0, f1, strict=True))


def test_first_eval_compiles_an_executable_that_stays():
    w = Workload("healthy", seed=6, cache_cap_bytes=0)  # no cache: nothing else moves the floor
    p = w.params
    before = w.floor_bytes(t_at_step(w, p.eval_every_steps - 1) + 1e-3)
    during = w.floor_bytes(t_at_step(w, p.eval_every_steps) + 1.0)
    later = w.floor_bytes(t_at_step(w, 3 * p.eval_every_steps + 7))
    assert p.eval_executable_bytes > 10 * MB
    assert all(abs(d - b - p.eval_executable_bytes) <= 1
               for b, d in zip(before, during, strict=True))
    assert later == during


def test_sawtooth_is_gigabytes_high_and_reaches_the_floor():
    w = Workload("healthy", seed=5)
    t0 = after_first_eval(w) + 60
    above = [u - f for i in range(3000) for u, f in
             zip(w.sample(t0 + i * 0.21).hbm_used_bytes, w.floor_bytes(t0 + i * 0.21), strict=True)]
    assert max(above) > 0.7 * w.params.train_transient_bytes
    assert min(above) < w.params.noise_bytes  # some polls land in the idle part of a step


@pytest.mark.parametrize("seed", range(8))
def test_healthy_floor_does_not_drift_beyond_the_cache_and_never_ooms(seed):
    w = Workload("healthy", seed=seed)
    assert w.oom_time is None
    t0 = after_first_eval(w)
    grid = floors_on_grid(w, t0, t0 + 48 * HOUR, 600.0)
    for chip in range(4):
        series = [f[chip] for f in grid]
        assert series == sorted(series)  # the cache only fills
        assert series[-1] - series[0] <= w.params.cache_cap_bytes * 1.03
    late = floors_on_grid(w, t0 + 24 * HOUR, t0 + 48 * HOUR, 1800.0)
    assert max(late[-1][c] - late[0][c] for c in range(4)) < 1 * MB


def test_linear_leak_grows_by_the_rate_per_step_on_every_chip():
    w = Workload("linear-leak", seed=1)
    rates = w.leak_bytes_per_step_by_chip
    p = w.params
    assert all(abs(r - p.leak_bytes_per_step) <= p.leak_chip_spread * p.leak_bytes_per_step + 1e-6
               for r in rates)
    assert len(set(rates)) == 4  # small per-chip differences
    # the cache has (nearly) saturated; the fastest leak OOMs at 5 h
    t1, t2 = 2.5 * HOUR, 4.5 * HOUR
    s1, s2 = w.sample(t1), w.sample(t2)
    f1, f2 = w.floor_bytes(t1), w.floor_bytes(t2)
    steps = s2.step - s1.step
    assert steps > 5_000
    for chip in range(4):
        assert abs((f2[chip] - f1[chip]) - rates[chip] * steps) < \
            0.002 * rates[chip] * steps + 3 * MB


def test_linear_leak_ends_in_oom_hours_into_the_run():
    w = Workload("linear-leak", seed=0, leak_bytes_per_step=150_000)
    oom = w.oom_time
    assert oom is not None and 4 * HOUR < oom < 30 * HOUR
    before, after = w.sample(oom - 1.0), w.sample(oom)
    assert before.runtime_up and not after.runtime_up
    assert not w.sample(oom + 10 * HOUR).runtime_up
    # It died because the next peak did not fit, not at an arbitrary moment.
    p = w.params
    biggest = (max(p.train_transient_bytes + p.checkpoint_bytes, p.eval_transient_bytes)
               * (1 + p.chip_imbalance))
    headroom = w.hbm_total_bytes - max(w.floor_bytes(oom - 1.0))
    assert 0 < headroom <= biggest + 1 * MB


def test_chip0_leak_leaks_only_on_chip_0():
    w = Workload("chip0-leak", seed=2)
    assert w.leak_bytes_per_step_by_chip[0] > 0
    assert w.leak_bytes_per_step_by_chip[1:] == (0.0, 0.0, 0.0)
    f1, f2 = w.floor_bytes(3 * HOUR), w.floor_bytes(6 * HOUR)
    assert f2[0] - f1[0] > 500 * MB
    assert all(f2[c] - f1[c] < 5 * MB for c in (1, 2, 3))


def test_staircase_leak_jumps_by_a_fixed_amount_every_k_steps():
    w = Workload("staircase-leak", seed=3)
    p = w.params
    t0 = after_first_eval(w) + 3 * HOUR  # cache saturated: only the stairs move
    grid = floors_on_grid(w, t0, t0 + 2 * HOUR, 2.0)
    jumps = [b[0] - a[0] for a, b in zip(grid, grid[1:], strict=False) if b[0] - a[0] > 1 * MB]
    steps = w.sample(t0 + 2 * HOUR).step - w.sample(t0).step
    assert abs(len(jumps) - steps / p.stair_every_steps) <= 1
    assert all(abs(j - p.stair_bytes) < 0.05 * p.stair_bytes for j in jumps)


def test_step_change_is_one_permanent_jump_and_no_oom():
    w = Workload("step-change", seed=4)
    p = w.params
    assert w.oom_time is None
    t0 = after_first_eval(w)
    grid = floors_on_grid(w, t0, t0 + 12 * HOUR, 5.0)
    for chip in range(4):
        diffs = [b[chip] - a[chip] for a, b in zip(grid, grid[1:], strict=False)]
        big = [i for i, d in enumerate(diffs) if d > 0.5 * p.step_change_bytes]
        assert len(big) == 1
        assert abs(diffs[big[0]] - p.step_change_bytes) < 0.05 * p.step_change_bytes
        assert min(diffs) >= 0  # permanent: never comes back down
    jump_time = t0 + 5.0 * big[0]
    assert w.sample(jump_time + 5.0).step >= p.step_change_at_step


def test_job_restart_has_a_gap_a_step_going_back_and_memory_back_to_baseline():
    w = Workload("job-restart", seed=5)
    first, second = w.jobs
    assert first.end_reason == "crash" and second.end_reason is None
    samples = [w.sample(first.end_time - 600 + i * 5.0) for i in range(400)]
    up = [s.runtime_up for s in samples]
    down = [i for i, u in enumerate(up) if not u]
    assert down and down == list(range(down[0], down[-1] + 1))  # one gap
    gap = (down[-1] - down[0] + 1) * 5.0
    lo, hi = SCENARIOS["job-restart"].restart_downtime_s
    assert lo - 5 <= gap <= hi + 5
    before, after = samples[down[0] - 1], samples[down[-1] + 1]
    assert after.step < before.step
    assert after.step == second.resume_step and after.step % w.params.checkpoint_every_steps == 0
    assert before.step - after.step < w.params.checkpoint_every_steps
    assert max(after.hbm_used_bytes) < 2 * 10**9  # warming up again from nothing
    # Same offset into each job after warm-up: the same memory (cache, eval executable... start
    # over). During warm-up the weight chunks load on a different schedule each time.
    assert w.floor_bytes(first.start_time + 30) != w.floor_bytes(second.start_time + 30)
    for offset in (w.params.warmup_s + 10, 2 * HOUR):
        assert w.floor_bytes(first.start_time + offset) == w.floor_bytes(second.start_time + offset)


def test_restart_resets_a_leak():
    w = Workload("job-restart", seed=6, leak_bytes_per_step=100_000)
    first, second = w.jobs
    late_first = max(w.floor_bytes(first.end_time - 1))
    early_second = max(w.floor_bytes(second.start_time + 2 * w.params.warmup_s))
    assert late_first - early_second > 1e9


def test_saturating_cache_grows_gigabytes_slowly_then_flattens():
    w = Workload("saturating-cache", seed=7)
    assert w.oom_time is None
    t0 = after_first_eval(w)
    f = [w.floor_bytes(t0 + h * HOUR)[1] for h in (0, 1, 3, 6, 30, 40)]
    assert f[2] - f[0] > 0.35 * w.params.cache_cap_bytes  # hours of apparent "leak"
    assert f[3] - f[2] > 100 * MB
    assert f[5] - f[4] < 5 * MB  # ... that saturates
    assert f[5] - f[0] <= w.params.cache_cap_bytes * 1.03


def test_eval_and_checkpoint_lower_the_duty_cycle():
    w = Workload("healthy", seed=8, eval_s=60.0)
    eval_at = t_at_step(w, w.params.eval_every_steps)
    during_eval = w.sample(eval_at + 20)
    assert during_eval.step == w.params.eval_every_steps
    assert max(during_eval.duty_cycle_pct) < 80
    saving = w.sample(t_at_step(w, w.params.checkpoint_every_steps + 1) + 0.1)
    assert max(saving.duty_cycle_pct) < 0.85 * (w.params.duty_train_pct - 2)


def test_model_is_scaled_to_smaller_chips():
    v5e = 16 * 2**30
    w = Workload("healthy", hbm_total_bytes=v5e, seed=1)
    assert w.oom_time is None
    assert w.params.weights_bytes < Workload("healthy", seed=1).params.weights_bytes
    assert all(u <= v5e for u in w.sample(5 * HOUR).hbm_used_bytes)


def test_sample_is_cheap():
    w = Workload("linear-leak", seed=0)
    n = 4000
    start = time.perf_counter()
    for i in range(n):
        w.sample(1000.0 + i * 5.0)
    per_call = (time.perf_counter() - start) / n
    assert per_call < 200e-6  # ~15 us on a slow core; loose for loaded CI machines


# ---------------------------------------------------------------- trace generation


@pytest.mark.slow
def test_a_simulated_day_is_quick_and_complete():
    start = time.perf_counter()
    rows = list(generate_trace("healthy", duration_s=24 * HOUR, seed=1))
    assert time.perf_counter() - start < 10.0
    assert len(rows) == 24 * 720 * 4
    assert {r.chip for r in rows} == {"0", "1", "2", "3"}
    by_chip = defaultdict(list)
    for r in rows:
        by_chip[r.chip].append(r.time)
    assert all(ts == sorted(ts) for ts in by_chip.values())
    assert rows[0].time >= 1750000000.0 and rows[-1].time < 1750000000.0 + 24 * HOUR
    assert all(r.time == round(r.time, 3) for r in rows[:1000])


def test_trace_round_trips_through_the_file_format(tmp_path):
    rows = list(generate_trace("job-restart", duration_s=4 * HOUR, seed=2, poll_interval_s=30.0))
    path = tmp_path / "sim.csv"
    write_trace(rows, path)
    assert list(read_trace(path)) == rows


def test_no_rows_while_the_runtime_is_down():
    rows = list(generate_trace("job-restart", duration_s=8 * HOUR, seed=5, poll_interval_s=10.0))
    w = Workload("job-restart", seed=5, start_time=1750000000.0)
    first, second = w.jobs
    assert not any(first.end_time <= r.time < second.start_time for r in rows)
    times = sorted({r.time for r in rows})
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) >= \
        second.start_time - first.end_time - 10.0
    steps = [r.step for r in rows if r.chip == "0"]
    assert any(b < a for a, b in zip(steps, steps[1:], strict=False))


def test_drop_probability_drops_about_that_fraction_without_changing_values():
    full = list(generate_trace("healthy", duration_s=4 * HOUR, seed=3))
    dropped = list(generate_trace("healthy", duration_s=4 * HOUR, seed=3, drop_probability=0.2))
    polls, kept = len(full) / 4, len(dropped) / 4
    assert abs((1 - kept / polls) - 0.2) < 0.03
    assert set(dropped) <= set(full)  # the same values at the polls that were kept


def test_trace_leak_matches_the_workload_ground_truth():
    rows = [r for r in generate_trace("chip0-leak", duration_s=6 * HOUR, seed=4,
                                      poll_interval_s=60.0)]
    per_chip = defaultdict(list)
    for r in rows:
        per_chip[r.chip].append(r)
    # Lower envelope of the last hour minus that of the second hour: chip 0 grew, others did not.
    def envelope(rs, lo, hi):
        return min(r.hbm_used_bytes for r in rs if lo <= r.time - 1750000000.0 < hi)
    growth = {c: envelope(rs, 5 * HOUR, 6 * HOUR) - envelope(rs, 1 * HOUR, 2 * HOUR)
              for c, rs in per_chip.items()}
    assert growth["0"] > 1e9
    assert all(abs(growth[c]) < 300 * MB for c in ("1", "2", "3"))


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError):
        list(generate_trace("healthy", duration_s=10, poll_interval_s=1.0, poll_jitter_s=2.0))
    with pytest.raises(ValueError):
        list(generate_trace("healthy", duration_s=10, drop_probability=1.5))


def test_chips_and_host_are_passed_through():
    rows = list(generate_trace("healthy", duration_s=60, chips=8, host="w-3",
                               hbm_total_bytes=V4_HBM_TOTAL_BYTES))
    assert {r.chip for r in rows} == {str(i) for i in range(8)} and \
        {r.host for r in rows} == {"w-3"}
    assert not math.isnan(rows[0].time)


# ---------------------------------------------------------------- leak onset


def test_leak_starts_at_the_onset_step_and_the_oom_moves_out_by_as_many_steps():
    onset = 20_000
    kw = dict(leak_bytes_per_step=150_000, leak_chip_spread=0)
    ref = Workload("linear-leak", seed=3, **kw)  # leaks from step 0; otherwise the same run
    w = Workload("linear-leak", seed=3, leak_onset_step=onset, **kw)
    assert w.params.leak_onset_step == onset and ref.params == replace(w.params, leak_onset_step=0)
    for n in (5_000, onset, 30_000):
        t = t_at_step(w, n) + 1e-3
        leaked_by_ref = min(n, onset) * 150_000  # what ref leaked that w had not yet
        assert all(abs((r - f) - leaked_by_ref) <= 1
                   for r, f in zip(ref.floor_bytes(t), w.floor_bytes(t), strict=True))
    # The OOM bisection still holds: up one second before, gone at it, and the peak did not fit.
    oom = w.oom_time
    assert oom is not None and w.sample(oom - 1.0).runtime_up and not w.sample(oom).runtime_up
    slack = max(w.params.eval_every_steps, w.params.checkpoint_every_steps)  # which peak trips it
    steps_more = w.sample(oom - 1.0).step - ref.sample(ref.oom_time - 1.0).step
    assert abs(steps_more - onset) <= slack


def test_staircase_counts_its_stairs_from_the_onset():
    w = Workload("staircase-leak", seed=4, leak_onset_step=6_000, stair_every_steps=500,
                 cache_cap_bytes=0, eval_every_steps=0, leak_chip_spread=0)
    stair = w.params.stair_bytes
    floor = lambda n: w.floor_bytes(t_at_step(w, n) + 1e-3)[1]  # noqa: E731
    assert floor(6_000) == floor(2_000)  # nothing yet
    assert floor(6_499) == floor(6_000)
    # first stair a full period after the onset
    assert abs(floor(6_500) - floor(6_499) - stair) <= 1
    assert abs(floor(8_000) - floor(6_000) - 4 * stair) <= 1


def test_negative_onset_is_rejected():
    with pytest.raises(ValueError, match="leak_onset_step"):
        Workload("linear-leak", leak_onset_step=-1)


def test_irregular_stairs_come_at_random_steps_and_a_leak_can_change_rate():
    w = Workload("irregular-staircase", chips=1, seed=4, stair_every_steps=1000,
                 cache_cap_bytes=0, eval_every_steps=100)
    floors = [w._train_floors(n)[0] for n in range(200, 40_000, 20)]
    rises = [i for i, (a, b) in enumerate(zip(floors, floors[1:], strict=False)) if b - a > 1e8]
    assert 20 <= len(rises) <= 60  # ~40 expected
    gaps = np.diff(rises)
    assert gaps.std() > 0.4 * gaps.mean()  # irregular, not every N steps
    steady = Workload("leak-rate-change", chips=1, seed=4, leak_change_step=5000,
                      leak_change_factor=2.0, cache_cap_bytes=0)
    f = [steady._train_floors(n)[0] for n in (3000, 4000, 10_000, 11_000)]
    assert (f[3] - f[2]) == pytest.approx(2 * (f[1] - f[0]), rel=1e-6)
