"""tpumon/common/units.py: the one way every output writes bytes and intervals."""

import pytest

from tpumon.common.describe import describe_growth
from tpumon.report.render import size
from tpumon.common.describe import describe_oom, summarize_verdicts
from tpumon.common.units import format_bytes, format_growth, format_hours, format_span

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


def test_a_summary_of_verdicts_says_only_what_is_known():
    """/report's title read "no leak on 4 chips" while they warmed up or collected."""
    assert summarize_verdicts(["ok"] * 4) == "4 chips: no leak"
    assert summarize_verdicts(["ok", "ok", "step_change"]) == \
        "3 chips: no leak (1 stepped up, 2 ok)"
    assert summarize_verdicts(["warming_up", "warming_up", "insufficient_data",
                               "insufficient_data"]) == "4 chips: 2 warming up, 2 collecting"
    assert summarize_verdicts(["ok", "leak", None]) == "3 chips: 1 leaking, 1 ok, 1 no verdict"
    assert summarize_verdicts(["leak"]) == "1 chip: 1 leaking"
    assert "no leak" not in summarize_verdicts(["ok", "ok", "insufficient_data"])


def test_one_time_to_oom_everywhere():
    """The log once said "OOM in 4.4 h" and "in 4 h 23 min" in one second."""
    assert [format_hours(s) for s in (30, 45 * 60, 4.4 * 3600, 3 * 86400)] == \
        ["30 s", "45 min", "4.4 h", "3 d"]
    assert describe_oom(4.4 * 3600) == "OOM in 4.4 h" and describe_oom(None) == ""


def test_a_range_is_written_in_one_unit():
    """The report's 95 % interval read "+1,021.4 MiB to +1.01 GiB/h": two scales at a
    glance. Both ends take the larger end's unit."""
    from tpumon.common.units import format_byte_range

    assert format_byte_range(1021.4 * 2**20, 1.01 * 2**30, signed=True) == \
        ("+1.00 GiB", "+1.01 GiB")
    assert format_byte_range(-300 * 2**10, 2 * 2**20, signed=True) == ("-0.3 MiB", "+2.0 MiB")
    assert format_byte_range(512, 900) == ("512 B", "900 B")
