"""bench/detect_speed.py's bit-for-bit comparison of results: what differs is named, what
is the same (NaN included, inside a dataclass) is not."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from tpumon.detect.jumps import Jump

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import detect_speed  # noqa: E402


def test_jumps_with_unknown_steps_are_the_same_and_a_changed_size_is_named():
    a = {"level_jumps": [Jump(1.0, math.nan, 5.0)], "z": math.nan}
    assert detect_speed.differences(a, {"level_jumps": [Jump(1.0, math.nan, 5.0)],
                                        "z": math.nan}, "s") == []
    found = detect_speed.differences(a, {"level_jumps": [Jump(1.0, math.nan, 6.0)],
                                         "z": math.nan}, "s")
    assert found == ["s.level_jumps[0].size: 5.0 != 6.0"]


def test_floats_are_compared_bit_for_bit_and_tuples_entry_by_entry():
    assert detect_speed.differences((0.1 + 0.2,), (0.3,), "t") == [
        "t[0]: 0.30000000000000004 != 0.3"]
    assert detect_speed.differences((1.0, 2.0), (1.0,), "t") == ["t: 2 entries != 1"]
