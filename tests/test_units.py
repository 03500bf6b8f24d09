"""tpumon/units.py: the one way every output writes bytes and intervals."""

import pytest

from tpumon.detect import describe_growth
from tpumon.report.render import size
from tpumon.units import format_bytes, format_growth, format_span

GiB = 2**30


@pytest.mark.parametrize("value, kwargs, text", [
    (34_091_302_912, {}, "31.75 GiB"),  # a v4 chip's HBM: the report once said 34.09 GB
    (812 * 2**20, {}, "812.0 MiB"),
    (121_300, {}, "118.5 KiB"),
    (512, {}, "512 B"),
    (0, {}, "0 B"),
    (-41, {}, "-41 B"),
    (-10, {"signed": True}, "-10 B"),
    (1.5 * 2**20, {"signed": True}, "+1.5 MiB"),
    (-0.01, {"signed": True}, "0 B"),  # never "-0 B"
    (-0.0, {}, "0 B"),
    (31.7 * GiB, {}, "31.70 GiB"),  # watch too: it once wrote "31.7Gi"
    (4200, {"signed": True}, "+4.1 KiB"),
    (None, {}, "-"),
])
def test_format_bytes(value, kwargs, text):
    assert format_bytes(value, **kwargs) == text


def test_growth_has_no_negative_zero_and_one_unit_everywhere():
    """'-0.0 KB/step' was shown for a floor that did not move."""
    assert describe_growth(-20.0, None) == "-20 B/step"
    assert describe_growth(-0.4, None) == "0 B/step"
    assert describe_growth(None, -256e6) == "-244.1 MiB/h"
    assert format_growth(121_300, None) == describe_growth(121_300, None) == "118.5 KiB/step"
    assert size(34_091_302_912) == "31.75 GiB"  # the report and the index page agree


def test_an_interval_is_shown_only_when_it_has_width():
    t = 1_764_077_000.0  # 2025-11-25 13:23:20 UTC
    assert format_span(t, t + 20) == "2025-11-25 13:23 UTC"
    assert format_span(t, t + 20, seconds=True) == "2025-11-25 13:23:20 to 13:23:40 UTC"
    assert format_span(t, t + 86400) == "2025-11-25 13:23 UTC to 2025-11-26 13:23 UTC"
