"""bench/nuisances.py: healthy jobs stay under their margin, leaking ones reach HBM at their
labelled OOM, a seed regenerates its job exactly, and each family draws what it says."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tpumon.detect.job_replay import job_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bench_nuisances", ROOT / "bench" / "nuisances.py")
assert spec is not None and spec.loader is not None
nz = importlib.util.module_from_spec(spec)
sys.modules["bench_nuisances"] = nz
spec.loader.exec_module(nz)

SEEDS = range(12)


def _dense_levels(job, chip: int, until: float, step: float = 2.0):
    """The model's floor + transient peak of a chip, every ``step`` s up to ``until``."""
    t = np.arange(job.start, until, step)
    parts = job.model.parts(t)
    return t, job.model.level(parts, chip) + job.model.peak * parts["training"]


@pytest.mark.parametrize("family", nz.HEALTHY)
def test_healthy_jobs_never_pass_92_percent(family):
    for seed in SEEDS:
        job = nz.make_job(family, seed)
        cap = job.model.capacity
        assert job.oom_time is None and job.onset is None
        assert 6 * 3600 <= job.end - job.start <= 24 * 3600
        for i, c in enumerate(job.chips):
            assert not c.leaking
            assert (c.floor + c.peak <= nz.HEALTHY_CEILING * cap).all()
            assert (c.used <= nz.HEALTHY_CEILING * cap).all()  # noise is in the margin
            assert len(c.times) <= nz.MAX_SAMPLES + 1 and (np.diff(c.times) > 0).all()
            if i % 4 == 0:  # and between the polls, on the host's first chip
                _, levels = _dense_levels(job, i, job.end)
                assert levels.max() <= nz.HEALTHY_CEILING * cap


@pytest.mark.parametrize("family", nz.LEAKS)
def test_leaks_reach_hbm_at_their_oom(family):
    for seed in SEEDS:
        job = nz.make_job(family, seed)
        cap = job.model.capacity
        assert 2 * 3600 <= job.oom_time - job.onset <= 20 * 3600
        assert job.oom_time <= job.end <= job.oom_time + 120
        leaking = [i for i, c in enumerate(job.chips) if c.leaking]
        first = min(leaking, key=lambda i: job.chips[i].oom_time or math.inf)
        assert job.chips[first].oom_time == job.oom_time
        t, levels = _dense_levels(job, first, job.oom_time - nz.GRID_S)
        assert levels.max() < cap  # not full before the OOM (to the OOM grid's step)
        parts = job.model.parts(np.array([job.oom_time]))
        assert job.model.level(parts, first)[0] + job.model.peak >= cap
        for c in job.chips:
            assert (c.used <= c.total).all()  # clipped at HBM after the OOM
            if not c.leaking:  # the job's other chips stay healthy
                assert (c.floor + c.peak <= nz.HEALTHY_CEILING * cap).all()
            else:  # no leak before the onset
                before = c.times < job.onset
                assert (c.floor[before] + c.peak[before] <= nz.HEALTHY_CEILING * cap).all()


@pytest.mark.parametrize("family", ["mixed", "restarts", "irregular-staircase", "one-chip"])
def test_a_seed_regenerates_its_job_byte_for_byte(family):
    for seed in (0, 7):
        a, b = nz.make_job(family, seed), nz.make_job(family, seed)
        assert nz.describe(a) == nz.describe(b)
        for ca, cb in zip(a.chips, b.chips, strict=True):
            assert (ca.host, ca.chip) == (cb.host, cb.chip)
            for name in ("times", "steps", "used", "total"):
                x, y = getattr(ca, name), getattr(cb, name)
                assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
        other = nz.make_job(family, seed + 1)
        assert other.chips[0].used.tobytes() != a.chips[0].used.tobytes()


def _only(job, *kinds):
    m = job.model
    drawn = {"caches": m.caches, "steps": m.steps, "holds": m.holds, "evals": m.evals,
             "restarts": m.segments[1:], "leak": [m.leak] if m.leak else []}
    return all(not v for k, v in drawn.items() if k not in kinds)


def test_families_draw_what_they_say():
    hour, minute = 3600.0, 60.0
    for seed in range(30):
        job = nz.make_job("steps", seed)
        assert 1 <= len(job.model.steps) <= 3 and _only(job, "steps")
        assert all(0 < s <= 3e9 for _, s in job.model.steps)
        job = nz.make_job("cache-slow", seed)
        assert 1 <= len(job.model.caches) <= 3 and _only(job, "caches")
        assert all(hour <= tau <= 12 * hour for _, tau, _ in job.model.caches)
        job = nz.make_job("cache-fast", seed)
        assert 1 <= len(job.model.caches) <= 3 and _only(job, "caches")
        assert all(5 * minute <= tau < hour for _, tau, _ in job.model.caches)
        job = nz.make_job("steps+cache", seed)
        steps, caches = job.model.steps, job.model.caches
        assert 1 <= len(steps) <= 2 and 1 <= len(caches) <= len(steps)
        assert _only(job, "steps", "caches")
        after = [min(c for c, _, _ in caches) - steps[0][0]]
        assert 0 <= after[0] <= 5 * minute  # the first step change is followed by a cache
        assert all(any(0 <= a - t <= 5 * minute for t, _ in steps) for a, _, _ in caches)
        job = nz.make_job("holds", seed)
        assert (job.model.holds or job.model.evals) and _only(job, "holds", "evals")
        assert all(2 * minute <= b - a <= 40 * minute for a, b, _ in job.model.holds)
        job = nz.make_job("restarts", seed)
        assert 1 <= len(job.model.segments) - 1 <= 3 and _only(job, "restarts")
        for s in job.model.segments[1:]:  # each restart is followed by a warm-up
            assert s.alloc < s.warm_end <= s.alloc + 20 * minute
            for c in job.chips[:1]:
                after = (c.times >= s.alloc) & (c.times < s.warm_end)
                full = c.floor[(c.times >= s.warm_end) & (c.times < s.stop)].min()
                assert (c.floor[after] <= full + 1).all()
                if job.model.steps_known:  # the step counter goes back
                    before = c.steps[c.times < s.start]
                    assert c.steps[c.times >= s.start][0] < before[-1]
                if not s.polled_down:  # a preemption: no polls while the VM was away
                    assert not ((c.times >= s.start) & (c.times < s.alloc)).any()
        for family in ("linear", "rate-change", "irregular-staircase", "late-onset"):
            job = nz.make_job(family, seed)
            assert len(job.chips) == 4 and all(c.leaking for c in job.chips)
        assert nz.make_job("late-onset", seed).onset >= job.start + 3 * hour
        kinds = {"linear": "linear", "rate-change": "rate-change",
                 "irregular-staircase": "staircase", "late-onset": "linear"}
        for family, kind in kinds.items():
            assert nz.make_job(family, seed).model.leak.kind == kind
        job = nz.make_job("late-onset", seed)
        assert all(s.warm_end < job.onset for s in job.model.segments)
        job = nz.make_job("one-chip", seed)
        assert sum(c.leaking for c in job.chips) == 1
        job = nz.make_job("slice-wide", seed)
        assert len(job.chips) >= 8 and all(c.leaking for c in job.chips)


def test_a_jobs_hosts_pool_as_one_slice_with_four_chips_each():
    for family in nz.FAMILIES:
        job = nz.make_job(family, 3)
        assert len(job.chips) == 4 * nz.job_hosts(family, 3)
        assert {job_name(c.host) for c in job.chips} == {f"slice {job.name}"}
        assert len({(c.host, c.chip) for c in job.chips}) == len(job.chips)
        assert {int(c.total[0]) for c in job.chips} <= set(nz.CAPACITIES.values())


def test_a_tiny_sweep_scores_every_family(tmp_path, capsys):
    tasks = nz.tasks(list(nz.FAMILIES), 0, 0.01)
    for family in nz.HEALTHY:
        chips = sum(4 * nz.job_hosts(f, s) for f, s in tasks if f == family)
        assert chips >= math.ceil(nz.HEALTHY_CHIP_RUNS * 0.01)
    assert {f for f, _ in tasks} == set(nz.FAMILIES)
    out = tmp_path / "scores.json"
    nz.main(["--scale", "0.01", "--families", "steps,linear,one-chip", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "| steps |" in printed and "| linear |" in printed and "| one-chip |" in printed
    assert "samples; wall" in printed
    import json
    scores = json.loads(out.read_text())
    assert set(scores["healthy"]) == {"steps"} and set(scores["leaks"]) == {"linear", "one-chip"}
    assert scores["samples"] == sum(c["samples"] for j in scores["jobs"] for c in j["chips"])


def test_a_written_trace_is_the_job(tmp_path):
    from tpumon.trace.read import read_trace_columns
    nz.main(["--write-trace", str(tmp_path), "--families", "restarts", "--job", "2"])
    job = nz.make_job("restarts", 2)
    columns = read_trace_columns(str(tmp_path / f"{job.name}.csv"))
    assert len(columns) == len(job.chips)
    for c in job.chips:
        got = columns[c.host, c.chip]
        assert np.array_equal(got.used, c.used) and np.array_equal(got.total, c.total)
        assert np.allclose(got.times, c.times, atol=1e-3)
        assert np.array_equal(np.isnan(got.steps), np.isnan(c.steps))
