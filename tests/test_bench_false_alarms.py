"""bench/false_alarms.py: each family yields the chips asked for, seeded, and the table
counts pages out of them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bench_false_alarms",
                                              ROOT / "bench" / "false_alarms.py")
assert spec is not None and spec.loader is not None
sweep = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep)


def test_each_family_draws_the_same_chips_each_run():
    first = [(name, u.copy()) for name, (_, _, u, _) in sweep.holds(3)]
    again = list(sweep.holds(3))
    assert [n for n, _ in first] == ["holds, 30 s polls", "holds+cache, 30 s polls"] * 3
    assert all(np.array_equal(u, s[2]) for (_, u), (_, s) in zip(first, again, strict=True))
    # the cache is added on top of the same chip
    assert (first[1][1] >= first[0][1]).all() and (first[1][1] > first[0][1]).any()
    names = [name for name, _ in sweep.steps(2)] + [name for name, _ in sweep.caches(2)]
    assert names == [f"{kind}, {p} s polls" for kind in ("steps", "cache")
                     for p in ("15", "30", "60") for _ in range(2)]


@pytest.mark.slow
def test_the_table_counts_pages_out_of_each_familys_chips():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "false_alarms.py"),
                          "--per-poll", "2", "--holds", "1"], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ")][1:]
    totals = {name.lstrip("| "): int(of.rstrip(" |")) for name, _, of in rows}
    assert totals == {"steps, 15 s polls": 2, "steps, 30 s polls": 2, "steps, 60 s polls": 2,
                      "holds, 30 s polls": 1, "holds+cache, 30 s polls": 1,
                      "cache, 15 s polls": 1, "cache, 30 s polls": 1, "cache, 60 s polls": 1}
    assert all(0 <= int(paged) <= totals[name.lstrip("| ")] for name, paged, _ in rows)
