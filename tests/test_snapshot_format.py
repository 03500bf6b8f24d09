"""Live-tensor snapshots on the wire (issue 10): round trip, the size bound, labels, and a
strict decoder (the agent reads snapshots from another process: anything malformed is a
ValueError with a short reason, never another exception)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpumon.instrument.snapshot import (MAX_GROUPS, MAX_SITE_CHARS, MAX_SITES, SiteNamer,
                                        Snapshot, TensorGroup, clean_text, make_snapshot,
                                        short_dtype, track_sites_setting)

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def snap(groups: list[TensorGroup], **kw) -> Snapshot:
    fields = dict(framework="torch_xla", step=100, time=1.7e9, duration_s=0.05, groups=groups,
                  total_count=sum(g.count for g in groups),
                  total_bytes=sum(g.bytes for g in groups), tracking=True)
    fields.update(kw)
    return Snapshot(**fields)


def doc() -> dict:
    return json.loads(
        snap([TensorGroup((4, 8), "float32", "", 2, 256, {"a.py:1 (x)": 1})]).to_json())


@pytest.mark.parametrize("dtype,short", [
    ("float32", "f32"), ("torch.float32", "f32"), ("bfloat16", "bf16"), ("torch.bfloat16", "bf16"),
    ("float16", "f16"), ("float64", "f64"), ("int32", "s32"), ("int64", "s64"), ("int8", "s8"),
    ("uint8", "u8"), ("uint32", "u32"), ("bool", "pred"), ("torch.bool", "pred"),
    ("complex64", "c64"), ("float8_e4m3fn", "f8e4m3fn"), ("float8_e5m2", "f8e5m2"),
    ("int4", "s4"), ("torch.half", "f16"), ("qint8", "qint8")])
def test_short_dtype_names(dtype, short):
    assert short_dtype(dtype) == short


def test_labels():
    assert TensorGroup((), "float32", "", 1, 4).label() == "f32[]"
    assert TensorGroup((4096, 14336), "bfloat16", "", 1, 1).label() == "bf16[4096,14336]"
    assert TensorGroup((8,), "float32", "xla:1", 1, 32).label() == "f32[8]@xla:1"
    assert TensorGroup((8, 4), "bfloat16", "P('data',None) data=4", 1, 1).label() == \
        "bf16[8,4]@P('data',None) data=4"


def test_round_trip():
    s = snap([TensorGroup((4096, 14336), "bfloat16", "", 3, 3 * 117440512,
                          {"train.py:88 (loss = model(x).mean())": 2}),
              TensorGroup((), "float32", "tpu:1", 7, 28, {}),
              TensorGroup((2, 3), "int32", "P('data',None) data=4", 1, 24, {"x.py:1": 1})],
             truncated_groups=2, total_count=20, total_bytes=10**12)
    back = Snapshot.from_json(s.to_json())
    assert back.groups == sorted(s.groups, key=lambda g: -g.bytes)
    for field in ("framework", "step", "time", "duration_s", "total_count", "total_bytes",
                  "tracking", "truncated_groups"):
        assert getattr(back, field) == getattr(s, field)


def test_truncation_keeps_the_largest_groups_and_counts_the_rest():
    groups = [TensorGroup((i + 1, 1000), "float32", "", i % 7 + 1, (i + 1) * 4000 * (i % 7 + 1),
                          {f"train.py:{i} (x{i} = f())": 1}) for i in range(2000)]
    s = snap(groups)
    data = s.to_json(max_bytes=20000)
    assert len(data) <= 20000
    back = Snapshot.from_json(data)
    assert 0 < len(back.groups) < 2000
    assert back.truncated_groups == 2000 - len(back.groups)
    assert back.total_count == s.total_count and back.total_bytes == s.total_bytes
    biggest = sorted(groups, key=lambda g: (-g.bytes, -g.count))[:len(back.groups)]
    assert [g.key for g in back.groups] == [g.key for g in biggest]
    # sites go to the largest groups first; whatever is left over is cut
    with_sites = [bool(g.sites) for g in back.groups]
    assert with_sites == sorted(with_sites, reverse=True)


def test_sites_fill_what_groups_leave():
    g = TensorGroup((), "float32", "", 100, 400, {f"t.py:{i} (line {i})": 1 for i in range(60)})
    small = Snapshot.from_json(snap([g]).to_json(max_bytes=800))
    assert small.groups[0].count == 100 and 0 < len(small.groups[0].sites) < 60
    assert len(snap([g]).to_json(max_bytes=800)) <= 800
    full = Snapshot.from_json(snap([g]).to_json())
    assert len(full.groups[0].sites) == 60


@given(st.integers(min_value=250, max_value=5000), st.integers(min_value=0, max_value=60))
@FUZZ
def test_never_over_max_bytes(max_bytes, n):
    groups = [TensorGroup((i, i + 1), "bfloat16", "tpu:%d" % (i % 3), i + 1, 100 * i,
                          {f"file{i}.py:{j} ({'x' * j})": 1 for j in range(i % 5)})
              for i in range(n)]
    s = snap(groups, truncated_groups=3)
    try:
        data = s.to_json(max_bytes=max_bytes)
    except ValueError:
        assert max_bytes < 400  # only when not even the totals fit
        return
    assert len(data) <= max_bytes
    back = Snapshot.from_json(data)
    assert back.truncated_groups == 3 + n - len(back.groups)


def test_too_many_groups_and_sites_are_cut_to_the_limits():
    groups = [TensorGroup((i,), "float32", "", 1, 4 * i + 4,
                          {f"s{j}": 1 for j in range(MAX_SITES + 5)} if i == 0 else {})
              for i in range(MAX_GROUPS + 10)]
    for g in groups:
        g.count = len(g.sites) or 1
    back = Snapshot.from_json(snap(groups).to_json(max_bytes=1 << 20))
    assert len(back.groups) == MAX_GROUPS and back.truncated_groups == 10
    assert all(len(g.sites) <= MAX_SITES for g in back.groups)


def test_a_snapshot_too_small_for_its_header_is_an_error():
    with pytest.raises(ValueError, match="too small"):
        snap([]).to_json(max_bytes=50)


def mutate(path: tuple, value) -> bytes:
    d = doc()
    target = d
    for p in path[:-1]:
        target = target[p]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(d).encode()


@pytest.mark.parametrize("path,value,reason", [
    (("v",), 2, "version"),
    (("step",), -1, "step"),
    (("step",), 2**70, "step"),
    (("step",), 1.5, "step"),
    (("step",), True, "step"),
    (("tracking",), 1, "tracking"),
    (("time",), "now", "time"),
    (("duration_s",), -0.1, "duration_s"),
    (("framework",), "Torch XLA", "framework"),
    (("framework",), "x" * 40, "framework"),
    (("total_count",), 1, "more tensors"),
    (("total_bytes",), 1, "more bytes"),
    (("groups",), {}, "groups"),
    (("groups", 0), [], "group"),
    (("groups", 0, "shape"), [1] * 65, "shape"),
    (("groups", 0, "shape"), [-1], "dim"),
    (("groups", 0, "shape"), "4,8", "shape"),
    (("groups", 0, "dtype"), "float32\n", "dtype"),
    (("groups", 0, "device"), "xla\x00", "device"),
    (("groups", 0, "device"), "x" * 200, "device"),
    (("groups", 0, "count"), None, "count"),
    (("groups", 0, "sites"), {"a.py:1": 5}, "sites hold more"),
    (("groups", 0, "sites"), {"": 1}, "site"),
    (("groups", 0, "sites"), {"a\u2028b": 1}, "site"),
    (("groups", 0, "sites"), {"x" * (MAX_SITE_CHARS + 1): 1}, "site"),
    (("groups", 0, "sites"), {f"s{i}": 0 for i in range(MAX_SITES + 1)}, "sites"),
    (("groups", 0, "extra"), 1, "unknown keys"),
    (("groups", 0, "bytes"), KeyError, "missing"),
    (("extra",), 1, "unknown keys"),
])
def test_malformed_fields_are_named(path, value, reason):
    with pytest.raises(ValueError, match=reason):
        Snapshot.from_json(mutate(path, value))


@pytest.mark.parametrize("data", [
    b"", b"nul", b"[]", b"\xff\xfe", b"{" * 100000, b"[" * 100000 + b"]" * 100000,
    b'{"v": NaN}', b'{"v": Infinity}', b"1" * 5000, b" " * (2 << 20),
    json.dumps(doc()).replace('"time": 1700000000.0', '"time": NaN').encode(),
    json.dumps(doc()).replace('"time": 1700000000.0', '"time": 1e400').encode(),
])
def test_garbage_is_a_value_error(data):
    with pytest.raises(ValueError, match="bad snapshot"):
        Snapshot.from_json(data)


def test_duplicate_groups_are_rejected():
    d = doc()
    d["groups"].append(dict(d["groups"][0]))
    d["total_count"] *= 2
    d["total_bytes"] *= 2
    with pytest.raises(ValueError, match="twice"):
        Snapshot.from_json(json.dumps(d).encode())


def test_not_bytes_is_a_value_error():
    with pytest.raises(ValueError):
        Snapshot.from_json("{}")  # type: ignore[arg-type]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30)


@given(json_values)
@FUZZ
@pytest.mark.slow
def test_fuzz_arbitrary_json(value):
    try:
        Snapshot.from_json(json.dumps(value).encode())
    except ValueError:
        pass


@given(st.binary(max_size=300))
@FUZZ
def test_fuzz_arbitrary_bytes(data):
    try:
        Snapshot.from_json(data)
    except ValueError:
        pass


@st.composite
def valid_docs(draw) -> dict:
    """A well-formed snapshot document (the starting point for mutations)."""
    groups = draw(st.lists(st.fixed_dictionaries({
        "shape": st.lists(st.integers(min_value=0, max_value=2**20), max_size=4),
        "dtype": st.sampled_from(["float32", "bfloat16", "int8", "bool"]),
        "device": st.sampled_from(["", "xla:1", "P('data',None) data=4"]),
        "count": st.integers(min_value=3, max_value=2**20),
        "bytes": st.integers(min_value=0, max_value=2**40),
        "sites": st.dictionaries(st.sampled_from(["a.py:1 (x = f())", "b.py:2", "c.py:3 (y)"]),
                                 st.integers(min_value=0, max_value=1), max_size=3),
    }), max_size=4, unique_by=lambda g: (tuple(g["shape"]), g["dtype"], g["device"])))
    return {"v": 1, "framework": draw(st.sampled_from(["jax", "torch_xla"])),
            "step": draw(st.integers(min_value=0, max_value=2**40)),
            "time": draw(st.floats(min_value=0, max_value=1e10)),
            "duration_s": draw(st.floats(min_value=0, max_value=100)),
            "total_count": sum(g["count"] for g in groups) + draw(st.integers(0, 5)),
            "total_bytes": sum(g["bytes"] for g in groups) + draw(st.integers(0, 5)),
            "tracking": draw(st.booleans()), "truncated_groups": draw(st.integers(0, 9)),
            "groups": groups}


@st.composite
def mutated_docs(draw) -> dict:
    """A valid document with up to three values replaced (by anything JSON can hold, or
    a near miss), keys dropped or added, at any depth."""
    d = draw(valid_docs())
    for _ in range(draw(st.integers(0, 3))):
        target = d
        while True:  # walk down a random path
            keys = list(target) if isinstance(target, dict) else list(range(len(target)))
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            if target is d and d.get("groups") and draw(st.booleans()):
                key = "groups"  # where most of the checks are
            if not isinstance(target[key], (dict, list)) or draw(st.integers(0, 3)) == 0:
                break
            target = target[key]
        if not keys:
            continue
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        if action == "replace":
            target[key] = draw(json_values | st.integers(-3, 3) | st.just(2**63))
        elif action == "drop" and isinstance(target, dict):
            del target[key]
        elif isinstance(target, dict):
            target[draw(st.text(max_size=8))] = draw(json_values)
        else:
            target.append(draw(json_values))
    return d


@given(mutated_docs())
@FUZZ
@pytest.mark.slow
def test_fuzz_nearly_valid_snapshots(d):
    """Structurally close to the real thing, so the field checks are exercised (not just
    the JSON parser); whatever is accepted must survive a round trip unchanged."""
    try:
        s = Snapshot.from_json(json.dumps(d).encode())
    except ValueError:
        return
    assert Snapshot.from_json(s.to_json(max_bytes=1 << 20)).groups == \
        sorted(s.groups, key=lambda g: (-g.bytes, -g.count, g.label()))


@given(st.lists(st.tuples(st.lists(st.integers(min_value=0, max_value=2**20), max_size=4),
                          st.sampled_from(["float32", "bfloat16", "int8", "bool"]),
                          st.sampled_from(["", "xla:1"]), st.integers(min_value=1, max_value=1000),
                          st.dictionaries(
                              st.text(max_size=30).map(lambda t: clean_text(t or "x", 50)),
                              st.integers(min_value=1, max_value=3), max_size=3)),
                unique_by=lambda g: (tuple(g[0]), g[1], g[2]), max_size=30))
@FUZZ
@pytest.mark.slow
def test_fuzz_round_trip(groups):
    gs = [TensorGroup(tuple(shape), dtype, dev, count + sum(sites.values()),
                      (count + sum(sites.values())) * 4, sites)
          for shape, dtype, dev, count, sites in groups]
    s = snap(gs)
    back = Snapshot.from_json(s.to_json(max_bytes=1 << 20))
    assert sorted(back.groups, key=lambda g: g.key) == sorted(gs, key=lambda g: g.key)


def test_make_snapshot_groups_and_counts_sites():
    s = make_snapshot("jax", 7, 0.0, True, {
        ((), "float32", "", "a.py:1"): [3, 12], ((), "float32", "", None): [2, 8],
        ((), "float32", "", "b.py:2"): [1, 4], ((4,), "bfloat16", "tpu:1", None): [1, 8]})
    groups = {g.key: g for g in s.groups}
    assert groups[(), "float32", ""] == TensorGroup((), "float32", "", 6, 24,
                                                    {"a.py:1": 3, "b.py:2": 1})
    assert groups[(4,), "bfloat16", "tpu:1"].sites == {}
    assert (s.total_count, s.total_bytes, s.step, s.tracking) == (7, 32, 7, True)
    Snapshot.from_json(s.to_json())


def test_clean_text():
    assert clean_text("a\tb\nc", 10) == "a b c"
    assert clean_text("x" * 20, 10) == "xxxxxxx..."


def test_site_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text(
        "x = 1\n    loss = model(x).mean()   \n" + "y" * 100 + "\n")
    namer = SiteNamer(("pytest",))
    path = str(tmp_path / "sub" / "train.py")
    assert namer.name(path, 2) == "sub/train.py:2 (loss = model(x).mean())"
    assert namer.name(path, 3).endswith("yyy...)") and len(namer.name(path, 3)) < 80
    assert namer.name("/elsewhere/lib/model.py", 5) == "model.py:5"
    assert namer.internal(os.__file__) and namer.internal(pytest.__file__)
    assert namer.internal(sys.modules["tpumon"].__file__)
    assert not namer.internal(path) and not namer.internal("<string>")
    assert namer.internal("<frozen importlib._bootstrap>")


def test_track_sites_setting(monkeypatch):
    monkeypatch.delenv("TPUMON_TRACK_SITES", raising=False)
    assert track_sites_setting(None) is False
    for value, on in (("1", True), ("true", True), ("TRUE", True), ("0", False), ("no", False)):
        monkeypatch.setenv("TPUMON_TRACK_SITES", value)
        assert track_sites_setting(None) is on
    assert track_sites_setting(False) is False and track_sites_setting(True) is True


def test_make_snapshot_never_builds_what_from_json_refuses():
    """An odd dtype name is cleaned; a shape beyond the limits is counted, not listed."""
    s = make_snapshot("jax", -5, 0.0, False, {
        ((2,), "key<fry>", "", None): [1, 8], ((1,) * 70, "float32", "", None): [2, 8],
        ((2**50,), "float32", "", None): [1, 4], ((3,), "float32", "", None): [1, 12]})
    assert sorted(g.label() for g in s.groups) == ["f32[3]", "key_fry_[2]"]
    assert (s.total_count, s.total_bytes, s.truncated_groups, s.step) == (5, 32, 2, 0)
    assert Snapshot.from_json(s.to_json()).total_count == 5
