"""bench/revision.py: tpumon at a git revision imports beside today's, under its own name,
with none of its modules reaching today's package."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import tpumon.trace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import revision  # noqa: E402


def test_a_revision_imports_apart_from_todays_package(tmp_path):
    package = revision.import_revision("HEAD")
    assert package.startswith("_tpumon_at_HEAD")
    assert revision.import_revision("HEAD") == package  # once per process
    trace = importlib.import_module(f"{package}.trace")
    assert trace is not tpumon.trace and trace.read_trace is not tpumon.trace.read_trace
    path = tmp_path / "t.csv"
    path.write_text("time,host,chip,step,hbm_used_bytes,hbm_total_bytes\n"
                    "1.0,h,0,5,100,1000\n2.0,h,0,6,200,1000\n")
    theirs = [dataclasses.astuple(r) for r in trace.read_trace(str(path))]
    ours = [dataclasses.astuple(r) for r in tpumon.trace.read_trace(str(path))]
    assert theirs == ours == [(1.0, "h", "0", 5, 100, 1000), (2.0, "h", "0", 6, 200, 1000)]
    loaded = [m for name, m in sys.modules.items() if name.startswith(package)]
    assert len(loaded) > 3
    for module in loaded:  # every import inside the revision was renamed
        for value in vars(module).values():
            home = getattr(value, "__module__", None) or getattr(value, "__name__", "")
            assert not (isinstance(home, str) and (home == "tpumon" or
                                                   home.startswith("tpumon."))), \
                (module.__name__, value)
