"""Two live-tensor snapshots diffed (issue 10): which groups grew, how fast, where they
were created, how much of the HBM slope they explain, and the one line alerts carry."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpumon.sources.tensor_diff import diff, percent, rate_text
from tpumon.instrument.snapshot import Snapshot, TensorGroup

BIG = 4096 * 14336 * 2  # bf16[4096,14336]: 112.0 MiB
SITE = "train.py:88 (loss = model(x).mean())"


def snap(step: int, *groups: TensorGroup, truncated: int = 0, framework: str = "torch_xla",
         tracking: bool = True) -> Snapshot:
    return Snapshot(framework=framework, step=step, time=1.7e9 + step, duration_s=0.01,
                    groups=list(groups), total_count=sum(g.count for g in groups) + 10,
                    total_bytes=sum(g.bytes for g in groups) + 1000, tracking=tracking,
                    truncated_groups=truncated)


def scalars(n: int, sites: dict[str, int] | None = None) -> TensorGroup:
    return TensorGroup((), "float32", "", n, 4 * n, sites or {})


def weights(n: int, device: str = "") -> TensorGroup:
    return TensorGroup((4096, 14336), "bfloat16", device, n, n * BIG, {})


def params() -> TensorGroup:
    return TensorGroup((64, 32), "float32", "", 4, 4 * 64 * 32 * 4, {})


def test_a_clean_pair_has_nothing_grown():
    d = diff(snap(100, params(), scalars(3)), snap(150, params(), scalars(3)))
    assert d.grown == [] and d.shrunk == [] and d.steps == 50
    assert d.summary() == "no live tensors grew between steps 100 and 150"
    assert d.explained_fraction(1e6) == 0.0


def test_one_loss_kept_per_step():
    before = snap(100, params(), scalars(5, {SITE: 2}))
    after = snap(150, params(), scalars(55, {SITE: 52}))
    d = diff(before, after)
    (g,) = d.grown
    assert (g.count_delta, g.bytes_delta, g.count_per_step, g.bytes_per_step) == (50, 200, 1.0, 4.0)
    assert g.cadence() == "+1 per step" and g.describe() == "+1 f32[] per step"
    assert g.sites == {SITE: 50}
    assert d.summary() == f"likely leak: +1 f32[] per step (4 B each), created at {SITE}"
    assert d.summary(hbm_bytes_per_step=40000.0) == (
        f"likely leak: +1 f32[] per step (4 B each, ~0.01% of the growth), created at {SITE}")
    assert d.explained_fraction(40000.0) == pytest.approx(1e-4)


def test_a_big_tensor_every_100_steps():
    d = diff(snap(1000, params(), weights(2)), snap(1500, params(), weights(7)))
    (g,) = d.grown
    assert g.cadence() == "+1 every 100 steps"
    assert g.count_per_step == pytest.approx(0.01)
    assert g.explained_fraction(BIG / 100 / 0.97) == pytest.approx(0.97)
    assert d.summary(hbm_bytes_per_step=BIG / 100 / 0.97) == (
        "likely leak: +1 bf16[4096,14336] every 100 steps (112.0 MiB each, 97% of the growth)")


def test_groups_are_sorted_by_bytes_growth_and_cut_to_top():
    before = snap(0, scalars(0), weights(1), TensorGroup((8,), "int32", "", 0, 0),
                  TensorGroup((1024,), "float32", "", 0, 0), TensorGroup((2,), "int8", "", 0, 0))
    after = snap(10, scalars(10), weights(2), TensorGroup((8,), "int32", "", 10, 320),
                 TensorGroup((1024,), "float32", "", 20, 20 * 4096),
                 TensorGroup((2,), "int8", "", 30, 60))
    d = diff(before, after)
    assert [g.label() for g in d.grown] == ["bf16[4096,14336]", "f32[1024]", "s32[8]", "s8[2]",
                                            "f32[]"]
    text = d.summary(top=2)
    assert text.startswith("likely leak: +1 bf16[4096,14336] every 10 steps (112.0 MiB each); "
                           "+2 f32[1024] per step (4.0 KiB each); and 3 more growing groups")
    assert d.summary(top=4).endswith("; and 1 more growing group")


def test_shrinking_groups_are_not_growth():
    d = diff(snap(0, scalars(50), weights(3)), snap(10, scalars(60), weights(1)))
    assert [g.label() for g in d.grown] == ["f32[]"]
    assert [g.label() for g in d.shrunk] == ["bf16[4096,14336]"]
    assert d.shrunk[0].count_delta == -2
    assert d.bytes_delta == 40  # a shrinking group does not cancel a leak


def test_groups_appear_and_vanish():
    d = diff(snap(0, weights(2)), snap(20, scalars(20, {SITE: 20})))
    assert [g.label() for g in d.grown] == ["f32[]"] and d.grown[0].count_before == 0
    assert [g.label() for g in d.shrunk] == ["bf16[4096,14336]"] and d.shrunk[0].count_after == 0


def test_devices_are_separate_groups():
    d = diff(snap(0, weights(1), weights(1, "xla:1")), snap(10, weights(1), weights(3, "xla:1")))
    (g,) = d.grown
    assert g.label() == "bf16[4096,14336]@xla:1" and g.count_delta == 2


def test_sites_of_the_growth():
    before = scalars(10, {"a.py:1": 3, "b.py:2 (y = g())": 5})
    after = scalars(40, {"a.py:1": 3, "b.py:2 (y = g())": 20, "c.py:3": 10, "d.py:4": 1})
    (g,) = diff(snap(0, before), snap(30, after)).grown
    assert g.sites == {"b.py:2 (y = g())": 15, "c.py:3": 10, "d.py:4": 1}
    summary = diff(snap(0, before), snap(30, after)).summary()
    assert summary.endswith("created at b.py:2 (y = g()) and 2 other sites")


@pytest.mark.parametrize("count,steps,text", [
    (50, 50, "+1 per step"), (49, 50, "+1 per step"), (51, 50, "+1 per step"),
    (100, 50, "+2 per step"), (125, 50, "+2.5 per step"), (60, 50, "+1.2 per step"),
    (5, 50, "+1 every 10 steps"), (1, 100, "+1 every 100 steps"), (5, 500, "+1 every 100 steps"),
    (3, 500, "+1 every ~167 steps"), (7, 100, "+1 every ~14 steps"),
    (49, 100, "+1 every ~2 steps"), (1, 1000000, "+1 every 1000000 steps"),
    (3, 0, "+3 at the same step"),
])
def test_cadence_text(count, steps, text):
    assert " ".join(rate_text(count, steps)) == text


def test_the_same_step_twice():
    d = diff(snap(100, scalars(5)), snap(100, scalars(8)))
    (g,) = d.grown
    assert g.count_per_step is None and g.bytes_per_step is None
    assert g.cadence() == "+3 at the same step"
    assert d.explained_fraction(1e6) is None and g.explained_fraction(1e6) is None
    assert d.summary(hbm_bytes_per_step=1e6) == "likely leak: +3 f32[] at the same step (4 B each)"


def test_a_restarted_process_is_an_error():
    with pytest.raises(ValueError, match="restarted"):
        diff(snap(500, scalars(5)), snap(20, scalars(5)))


def test_another_framework_is_an_error():
    with pytest.raises(ValueError, match="not one process"):
        diff(snap(0, scalars(5)), snap(20, scalars(5), framework="jax"))


@pytest.mark.parametrize("slope,expected", [
    (None, None), (0.0, None), (-5.0, None), (math.nan, None), (math.inf, None),
    (400.0, 1.0),    # the slope is smaller than the tensors' growth: all of it, not 150%
    (600.0, 1.0), (1200.0, 0.5), (6e6, 1e-4)])
def test_explained_fraction_is_clamped(slope, expected):
    d = diff(snap(0, scalars(0)), snap(100, TensorGroup((150,), "float32", "", 100, 60000)))
    assert d.bytes_per_step == 600.0
    got = d.explained_fraction(slope)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_all_of_the_growth():
    d = diff(snap(0, weights(0)), snap(100, weights(100)))
    assert "(112.0 MiB each, all of the growth)" in d.summary(hbm_bytes_per_step=BIG * 0.9)


def test_bytes_growth_at_a_constant_count():
    """A sharded group whose addressable share grew (resharded onto more local devices)."""
    a = TensorGroup((8, 4), "bfloat16", "P('data',None) data=4", 2, 64)
    b = TensorGroup((8, 4), "bfloat16", "P('data',None) data=4", 2, 2 * 64 * 1024)
    (g,) = diff(snap(0, a), snap(10, b)).grown
    assert g.count_delta == 0 and g.cadence() == "+12.8 KiB per step"


def test_truncated_snapshots_do_not_invent_growth():
    """A group missing from a truncated snapshot may just have been cut (the smallest go):
    it is not compared, and the summary says how many were not."""
    before = snap(0, weights(1), truncated=5)
    after = snap(50, weights(1), scalars(50))
    d = diff(before, after)
    assert d.grown == [] and d.uncompared == 1
    assert d.summary() == ("no live tensors grew between steps 0 and 50 "
                           "(1 small groups not compared: snapshot truncated)")
    d = diff(snap(0, weights(1), scalars(3)), snap(50, weights(2), truncated=1))
    assert [g.label() for g in d.grown] == ["bf16[4096,14336]"] and d.uncompared == 1


def test_percentages():
    assert [percent(f) for f in (1.0, 0.97, 0.042, 0.0001, 0.0)] == \
        ["all", "97%", "4.2%", "~0.01%", "none"]


def test_a_round_trip_through_the_wire_diffs_the_same():
    before = snap(100, params(), scalars(5, {SITE: 2}))
    after = snap(150, params(), scalars(55, {SITE: 52}))
    wired = diff(Snapshot.from_json(before.to_json()), Snapshot.from_json(after.to_json()))
    assert wired == diff(before, after)


group_st = st.builds(lambda shape, n, dev: TensorGroup(tuple(shape), "float32", dev, n, 4 * n),
                     st.lists(st.integers(0, 3), max_size=2), st.integers(0, 50),
                     st.sampled_from(["", "xla:1"]))


@given(st.lists(group_st, max_size=6, unique_by=lambda g: g.key),
       st.lists(group_st, max_size=6, unique_by=lambda g: g.key),
       st.integers(0, 1000), st.integers(0, 1000), st.none() | st.floats(-1e9, 1e9))
@settings(max_examples=300, deadline=None)
@pytest.mark.slow
def test_fuzz_diff_invariants(a, b, s1, s2, slope):
    before, after = snap(min(s1, s2), *a), snap(max(s1, s2), *b)
    d = diff(before, after)
    growth = sum(max(g.count, 0) for g in b) - sum(g.count for g in a)
    assert sum(g.count_delta for g in d.grown) + sum(g.count_delta for g in d.shrunk) == growth
    assert all(g.count_delta > 0 or g.bytes_delta > 0 for g in d.grown)
    assert [g.bytes_delta for g in d.grown] == sorted((g.bytes_delta for g in d.grown),
                                                      reverse=True)
    f = d.explained_fraction(slope)
    assert f is None or 0.0 <= f <= 1.0
    text = d.summary(slope)
    assert "\n" not in text and text


def test_an_empty_diff_beside_a_rising_live_count_does_not_say_nothing_grew():
    """Both snapshots listed the same tensors while the process's count rose one a step:
    the growth is held where a snapshot cannot list it, and the summary says so."""
    d = diff(snap(100, params(), scalars(3)), snap(150, params(), scalars(3)))
    text = d.summary(live_per_step=1.0)
    assert text.startswith("no tensor the snapshots list grew between steps 100 and 150, "
                           "though the live count rose by about 50 (+1.00 per step)"), text
    assert d.summary(live_per_step=0.0) == "no live tensors grew between steps 100 and 150"
