"""bench/line_to_oom.py: its windowed line fits are least squares, a floor that never heads
for capacity has no must-page moment, a near-straight one is close to its line, a curved one
far, and the cross-tabulation counts the pages it is given."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bench_line_to_oom",
                                              ROOT / "bench" / "line_to_oom.py")
assert spec is not None and spec.loader is not None
lto = importlib.util.module_from_spec(spec)
sys.modules["bench_line_to_oom"] = lto
spec.loader.exec_module(lto)
nz = lto.nz
HOUR = 3600.0


def test_window_fits_are_least_squares_and_nan_before_the_start():
    rng = np.random.default_rng(3)
    x = np.linspace(0, 5, 300)
    y = 2 + 0.3 * x + 0.05 * x * x + rng.normal(0, 0.01, len(x))
    windows, ends = np.array([10, 50, 200]), np.array([40, 120, 299])
    slope, at_end, rms = lto.segment_moments(x, y, windows, ends)
    for i, e in enumerate(ends):
        for k, w in enumerate(windows):
            if e - w + 1 < 0:
                assert math.isnan(slope[i, k]) and math.isnan(rms[i, k])
                continue
            xs, ys = x[e - w + 1:e + 1], y[e - w + 1:e + 1]
            b, a = np.polyfit(xs, ys, 1)
            assert abs(slope[i, k] - b) < 1e-6 and abs(at_end[i, k] - (a + b * x[e])) < 1e-6
            assert abs(rms[i, k] - np.sqrt(np.mean((ys - (a + b * xs)) ** 2))) < 1e-6


def _one_cache(tau_hours: float, slope_share_per_hour: float):
    """A healthy job's model with one cache from its start, filling at first by that share
    of HBM per hour with that time constant, and nothing else."""
    m = nz.make_model("cache-slow", 0)
    m.steps, m.holds, m.evals = [], [], []
    size = slope_share_per_hour * m.capacity * tau_hours
    m.caches = [(nz.T0, tau_hours * HOUR, size)] if tau_hours else []
    return m


def test_a_flat_floor_has_no_must_page_moment():
    assert lto.least_separation(_one_cache(0, 0.0)) == math.inf


def test_a_straight_climb_to_capacity_is_its_own_line_and_a_curved_one_is_not():
    straight = lto.least_separation(_one_cache(2000, 0.05))
    assert straight < 1  # a cache that would take 2,000 h to settle: a leak, over hours
    curved = lto.least_separation(_one_cache(2, 0.5))
    assert curved > 10 * max(straight, 0.01)  # fills within hours: far from any line


def test_the_cross_tabulation_counts_the_pages_it_is_given(tmp_path, capsys):
    todo = nz.tasks(["cache-fast"], 1, 0.005)
    pages = tmp_path / "pages.json"
    pages.write_text(json.dumps({"jobs": [
        {"family": f, "seed": s, "chips": [{"paged": True}]} for f, s in todo]}))
    lto.main(["--seed", "1", "--scale", "0.005", "--families", "cache-fast",
              "--pages", str(pages)])
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| cache-fast |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    jobs, must = int(cells[1]), int(cells[2])
    assert jobs == len(todo)
    assert cells[4] == f"{must} of {must} / {jobs - must} of {jobs - must}"


def test_pages_of_another_sweep_are_one_clear_error(tmp_path):
    pages = tmp_path / "pages.json"
    pages.write_text(json.dumps({"jobs": []}))
    try:
        lto.main(["--scale", "0.005", "--families", "steps", "--pages", str(pages)])
    except SystemExit as e:
        assert "has no job steps" in str(e.code) and "another seed or scale" in str(e.code)
    else:
        raise AssertionError("no error")


def test_a_model_is_the_one_its_job_is_made_of():
    for family, seed in (("cache-slow", 3), ("linear", 5)):
        model, job = nz.make_model(family, seed), nz.make_job(family, seed)
        assert (model.end, model.poll, model.caches, model.steps) == \
            (job.end, job.model.poll, job.model.caches, job.model.steps)
        assert lto.least_separation(model) == lto.least_separation(job.model)
