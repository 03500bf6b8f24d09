"""Bad input, fuzzed: never a crash, a documented error of one line (issue 9, part 2).

The trace reader raises only TraceFormatError naming the file and the line; the
configuration loader only ConfigError; the runtime source turns any MetricResponse a
runtime can send into chips and a count of the entries it could not read. (The reporter
datagram parser is fuzzed in test_reporter.py.)
"""

from __future__ import annotations

import atexit
import io
import json
import math
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fake_runtime import FakeRuntime, RuntimeServer
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
from tpumon.common.config import KEYS, SCHEMA, SECTIONS, ConfigError, load_config
from tpumon.metrics.collectors import build_registry
from tpumon.common.identity import Identity
from tpumon.sources.chips import ChipInventory
from tpumon.sources.tpu_runtime import DUTY_CYCLE, METRICS, TOTAL, USAGE, TpuRuntimeSource
from tpumon.state import AgentState
from tpumon.web.status import status_document
from tpumon.trace.read import read_trace, read_trace_columns
from tpumon.trace.schema import COLUMNS, TraceFormatError, TraceRow
from tpumon.trace.write import write_trace

FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
WORK = Path(tempfile.mkdtemp(prefix="tpumon-fuzz-"))  # one file per test, rewritten per example
atexit.register(shutil.rmtree, WORK, True)


def one_line(message: str) -> bool:
    return bool(message) and len(message.splitlines()) == 1


# --- trace files ----------------------------------------------------------------------


def read_both(path: Path) -> tuple[str, object]:
    """The outcome of read_trace and of read_trace_columns, which must agree: the rows
    read, or the error message. Anything but TraceFormatError escapes (and fails)."""
    outcomes = []
    for read in (lambda: len(list(read_trace(path))),
                 lambda: sum(len(c.times) for c in read_trace_columns(path).values())):
        try:
            outcomes.append(("rows", read()))
        except TraceFormatError as exc:
            message = str(exc)
            assert one_line(message), message
            assert exc.line is not None and exc.line >= 1, message  # text: always a line
            assert message.startswith(f"{path}:{exc.line}: "), message
            outcomes.append(("error", message))
    assert outcomes[0] == outcomes[1], outcomes
    event(f"trace: {outcomes[0][0]}")
    return outcomes[0]


CSV_HEADER = ",".join(COLUMNS) + "\n"
TRACE_BITS = st.sampled_from(
    list("0123456789.,-+eE\"'\n\r \t{}[]:") + [
        "time", "host", "chip", "step", "hbm_used_bytes", "hbm_total_bytes", "null", "true",
        "NaN", "Infinity", "1e999", "\x00", "\ufeff", "\u00e9", "\u00b2", "\u2028",
        '"time": 1.5', '"host": "h"', '"chip": 0', '"hbm_used_bytes": 5',
        '"hbm_total_bytes": 9', "9" * 25])
ANY_TEXT = st.lists(TRACE_BITS | st.characters(exclude_categories=("Cs",)),
                    max_size=80).map("".join)


@FUZZ
@given(suffix=st.sampled_from([".csv", ".jsonl"]),
       prefix=st.sampled_from(["", CSV_HEADER, "chip,hbm_total_bytes,time,hbm_used_bytes,host\n",
                               '{"time": 1.0, "host": "h", "chip": "0", "hbm_used_bytes": 1, '
                               '"hbm_total_bytes": 2}\n']),
       text=ANY_TEXT)
@example(".jsonl", "", "1" * 5000 + "\n")       # an integer beyond Python's 4300 digits
@example(".jsonl", "", "[" * 100_000 + "\n")    # nesting beyond the recursion limit
@example(".jsonl", "", '{"a": ' * 100_000 + "\n")
@example(".csv", CSV_HEADER, "1," * 5 + "9" * 5000 + "\n")
def test_any_text_is_a_trace_or_one_trace_format_error(suffix, prefix, text):
    path = WORK / f"arbitrary{suffix}"
    path.write_text(prefix + text, encoding="utf-8")
    read_both(path)


def valid_rows() -> st.SearchStrategy[list[TraceRow]]:
    row = st.tuples(st.floats(0, 1e4), st.sampled_from(["h1", "w-2"]),
                    st.sampled_from(["0", "1", "17"]), st.none() | st.integers(0, 10**6),
                    st.integers(0, 2**40), st.integers(1, 2**40))

    def build(parts):
        t = 1.75e9
        rows = []
        for dt, host, chip, step, used, total in parts:
            t += dt  # one clock for all series: times never go back within one
            rows.append(TraceRow(round(t, 3), host, chip, step, used, total))
        return rows
    return st.lists(row, min_size=1, max_size=12).map(build)


@FUZZ
@given(fmt=st.sampled_from(["csv", "jsonl"]), rows=valid_rows(), data=st.data())
@pytest.mark.slow
def test_mutated_valid_traces_are_read_or_one_trace_format_error(fmt, rows, data):
    buffer = io.StringIO()
    write_trace(rows, buffer, fmt)
    text = buffer.getvalue()
    path = WORK / f"mutated.{fmt}"
    path.write_text(text, encoding="utf-8")
    assert read_both(path) == ("rows", len(rows))  # as written: read back whole
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        at = data.draw(st.integers(0, len(text)), label="at")
        cut = data.draw(st.integers(0, 3), label="cut")
        put = data.draw(st.one_of(st.just(""), TRACE_BITS, ANY_TEXT), label="put")
        text = text[:at] + put + text[at + cut:]
    path.write_text(text, encoding="utf-8")
    read_both(path)


# --- the configuration ----------------------------------------------------------------


TOML_SCALARS = st.one_of(
    st.integers(-2**70, 2**70).map(str),
    st.floats().map(repr),                      # nan, inf, -inf, 1e+300 are TOML too
    st.text(max_size=12).map(json.dumps),       # basic strings (a lone surrogate: invalid)
    st.sampled_from([
        "true", "false", "1979-05-27T07:32:00Z", "07:32:00", "'lit'", "'''multi\nline'''",
        "0x10", "0o7", "0b1", "1_000", "+inf", "-0.0", "1e400", '""', '"{host}"',
        '"{host.x}"', '"{host[x]}"', '"{0}"', '"{"', '"{host!z}"', '"http://{host}:9847/"',
        '":9847"', '"[::1]:1"', '":\u00b2"', '"127.0.0.1:99999"', '"debug"', '"leak"',
        "[8431, 8432]", "[0, 70000]", "[1, 'a']", "[true]", "[]", "{}", "{a = 1}",
        "[[1]]", "", "=", "5", "0.5", "30", "0", "-1", "1e-300",
    ]))
TOML_VALUES = st.recursive(TOML_SCALARS, lambda inner: st.lists(inner, max_size=3).map(
    lambda xs: "[" + ", ".join(xs) + "]"), max_leaves=6)
KEY_NAMES = st.sampled_from(sorted({k.name for k in SCHEMA}) + ["bogus", "poll_intervall"]) | \
    st.text(max_size=8)
SECTION_NAMES = st.sampled_from(list(SECTIONS) + ["agnet", "agent.sub", ""]) | st.text(max_size=8)
CHOICES = ["debug", "info", "warning", "critical", "auto", "on", "off", "v4", "v5e",
           "healthy", "linear-leak", ":9847", "127.0.0.1:0", "https://hooks.example/x", ""]


def typed_value(key) -> st.SearchStrategy[str]:
    """A TOML value of the key's own type (so that the key's check decides), or any."""
    own = {
        float: st.floats().map(repr) | st.integers(-10, 10**7).map(str),
        int: st.integers(-10, 10**7).map(str) | st.integers(-2**70, 2**70).map(str),
        str: st.sampled_from(CHOICES).map(json.dumps) | st.text(max_size=12).map(json.dumps),
        bool: st.sampled_from(["true", "false"]),
        list: st.lists(st.integers(-5, 70000).map(str), max_size=3).map(
            lambda xs: "[" + ", ".join(xs) + "]"),
    }[key.type]
    return own | TOML_VALUES


def real_keys_file(assignments) -> str:
    """[section] tables with each key once (a table or key twice is invalid TOML)."""
    sections: dict[str, dict[str, str]] = {}
    for key, value in assignments:
        sections.setdefault(key.section, {})[key.name] = value
    return "\n".join(f"[{section}]\n" + "\n".join(f"{k} = {v}" for k, v in keys.items())
                     for section, keys in sections.items())


REAL_KEY_LINES = st.sampled_from(SCHEMA).flatmap(lambda k: typed_value(k).map(
    lambda v: f"[{k.section}]\n{k.name} = {v}"))
TOML_LINES = st.one_of(
    SECTION_NAMES.map(lambda s: f"[{s}]"),
    st.tuples(KEY_NAMES, TOML_VALUES).map(lambda kv: f"{kv[0]} = {kv[1]}"),
    REAL_KEY_LINES,
    st.text(max_size=20))
TOML_FILES = st.one_of(
    st.lists(st.sampled_from(SCHEMA).flatmap(lambda k: st.tuples(st.just(k), typed_value(k))),
             max_size=5).map(real_keys_file),  # real keys, any values: the checks decide
    st.lists(TOML_LINES, max_size=8).map("\n".join))


def check_loaded(load, secret: str = "") -> None:
    """``load()`` gives a configuration whose numbers are usable, or one ConfigError line
    (which never shows a secret's value)."""
    try:
        config = load()
    except ConfigError as exc:
        assert one_line(str(exc)), str(exc)
        assert len(secret) < 4 or repr(secret) not in str(exc), str(exc)  # shown as repr
        event("config: ConfigError")
        return
    event("config: taken")
    for key in SCHEMA:
        value = config[key.dotted]
        assert isinstance(value, key.type), (key.dotted, value)
        if key.type is float:
            assert math.isfinite(value), (key.dotted, value)  # inf: a crash later


@FUZZ
@given(TOML_FILES)
@example("[agent]\npoll_interval = inf")
@example("[store]\nmax_size_mb = inf")
@example("a = " + "[" * 3000 + "]" * 3000)       # nesting beyond the recursion limit
@example("a = " + "{a = " * 3000 + "1" + "}" * 3000)
@example("[alerts]\ndashboard_url = '{host.x}'")
@example("[alerts]\nreport_url = '{host[x]}'")
@pytest.mark.slow
def test_any_toml_file_is_a_configuration_or_one_config_error(text):
    path = WORK / "config.toml"
    path.write_text(text, encoding="utf-8")
    check_loaded(lambda: load_config(path, env={}))


@FUZZ
@given(st.binary(max_size=60))
def test_any_bytes_as_a_configuration_file_are_one_config_error_at_most(raw):
    path = WORK / "config.bin"
    path.write_bytes(raw)
    check_loaded(lambda: load_config(path, env={}))


ENV_TEXT = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["inf", "-inf", "nan", "1e999", "0", "-1", "1_0", " 5 ", "0x10", "\u0663",
                     "8431-8434", "8434-8431", "1-99999999999", "0-65535", "8431,,8432",
                     "a-b", "1-2-3", "-", ",", "true", "{host.x}", "{host[x]}", ":\u00b2",
                     "127.0.0.1:9847", "[::1]:0", "9" * 5000]))


@FUZZ
@given(key=st.sampled_from(SCHEMA), raw=ENV_TEXT)
@example(KEYS["runtime.ports"], "1-99999999999")  # would build a list of 10**11 ports
@example(KEYS["agent.poll_interval"], "inf")      # the poll loop's wait overflows on inf
@example(KEYS["alerts.dashboard_url"], "{host.x}")
@example(KEYS["exporter.listen_address"], ":\u00b2")
def test_any_environment_value_is_taken_or_one_config_error(key, raw):
    empty = WORK / "empty.toml"
    empty.write_text("")
    check_loaded(lambda: load_config(empty, env={key.env_var: raw}),
                 secret=raw if key.secret else "")


# --- runtime answers ------------------------------------------------------------------


INT64 = st.integers(-2**63, 2**63 - 1)
DEVICE_IDS = st.integers(0, 5) | INT64
ATTR_VALUES = st.one_of(
    DEVICE_IDS.map(lambda i: pb.AttrValue(int_attr=i)),
    (st.sampled_from(["0", "1", "007", "-1", " 1", "1 ", "\u00b2", "\u0663", "9" * 19,
                      "9" * 5000, ""]) | st.text(max_size=4)).map(
        lambda s: pb.AttrValue(string_attr=s)),
    st.booleans().map(lambda b: pb.AttrValue(bool_attr=b)),
    st.floats().map(lambda f: pb.AttrValue(double_attr=f)),
    st.binary(max_size=3).map(lambda b: pb.AttrValue(bytes_attr=b)),
    st.just(pb.AttrValue()))
ATTRIBUTES = st.builds(lambda key, value: pb.Attribute(key=key, value=value),
                       st.sampled_from(["device-id", "", "chip"]), ATTR_VALUES)
GAUGES = st.one_of(
    (st.integers(0, 2**36) | INT64).map(lambda v: pb.Gauge(as_int=v)),
    (st.floats(0, 2**36) | st.floats()).map(lambda v: pb.Gauge(as_double=v)),
    st.text(max_size=4).map(lambda v: pb.Gauge(as_string=v)),
    st.booleans().map(lambda v: pb.Gauge(as_bool=v)),
    st.just(pb.Gauge()))


@st.composite
def metrics(draw) -> pb.Metric:
    m = pb.Metric()
    if draw(st.booleans()) or draw(st.booleans()):
        m.attribute.CopyFrom(draw(ATTRIBUTES))
    measure = draw(st.sampled_from(["gauge", "gauge", "gauge", "counter", "distribution",
                                    "summary", None]))
    if measure == "gauge":
        m.gauge.CopyFrom(draw(GAUGES))
    elif measure == "counter":
        m.counter.as_int = draw(st.integers(0, 2**64 - 1))  # uint64
    elif measure == "distribution":
        m.distribution.count = draw(st.integers(0, 9))
    elif measure == "summary":
        m.summary.sample_count = draw(st.integers(0, 9))
    if draw(st.booleans()):
        m.timestamp.seconds = draw(st.integers(-2**62, 2**62))  # protobuf: years 1-9999
        m.timestamp.nanos = draw(st.integers(0, 999_999_999))
    return m


GOOD_METRICS = st.builds(  # what libtpu sends: an id and a byte count (often repeated ids)
    lambda device, value: pb.Metric(
        attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=device)),
        gauge=pb.Gauge(as_int=value)), st.integers(0, 5), st.integers(0, 2**36))


def responses() -> st.SearchStrategy[dict[str, pb.MetricResponse]]:
    def answer(requested):
        return st.builds(
            lambda name, entries: pb.MetricResponse(metric=pb.TPUMetric(
                name=name, metrics=entries)),
            st.sampled_from([requested, "", "tpu.runtime.bogus"]),
            st.lists(GOOD_METRICS | metrics(), max_size=10))
    return st.fixed_dictionaries({name: answer(name) for name in METRICS})


def readable(m: pb.Metric) -> tuple[int, float] | None:
    """The documented rule: a device id (an int, or ASCII digits), a gauge with a number,
    and that number a byte count or percentage (not negative, finite, within int64)."""
    value = m.attribute.value
    kind = value.WhichOneof("attr")
    if kind == "int_attr":
        device = value.int_attr
    elif kind == "string_attr" and re.fullmatch(r"[0-9]{1,18}", value.string_attr):
        device = int(value.string_attr)
    else:
        return None
    if device < 0 or m.WhichOneof("measure") != "gauge":
        return None
    which = m.gauge.WhichOneof("value")
    if which not in ("as_int", "as_double"):
        return None
    number = float(getattr(m.gauge, which))
    return (device, number) if 0 <= number < 2.0**63 else None


def expected(response: pb.MetricResponse) -> tuple[dict[int, float], int]:
    values: dict[int, float] = {}
    for m in response.metric.metrics:
        got = readable(m)
        if got is not None and got[0] not in values:
            values[got[0]] = got[1]
    return values, len(response.metric.metrics) - len(values)


class Scripted(FakeRuntime):
    def __init__(self) -> None:
        super().__init__()
        self.responses: dict[str, pb.MetricResponse] = {}

    def GetRuntimeMetric(self, request, context):
        return self.responses[request.metric_name]


@pytest.fixture(scope="module")
def scripted():
    server = RuntimeServer(Scripted())
    source = TpuRuntimeSource("127.0.0.1", [server.port], 10.0, ChipInventory(None, 0))
    yield server.runtime, source
    source.close()
    server.stop()


@FUZZ
@given(answers=responses())
@pytest.mark.slow
def test_any_runtime_answer_is_chips_and_a_count_of_unreadable_entries(scripted, answers):
    runtime, source = scripted
    runtime.responses = answers
    state = AgentState(Identity(host="h"), source.inventory)
    registry = build_registry(lambda: state.current)
    agent = Agent(AgentInputs(state, source, OwnerScanner(dict, 60), 1.0, registry))
    before = source.malformed_total
    snap = agent.poll_once()
    health = snap.health[0]
    assert health.up and health.error is None, health.error  # nothing raised in the source
    usage, bad = expected(answers[USAGE])
    bad += expected(answers[TOTAL])[1] + expected(answers[DUTY_CYCLE])[1]
    assert snap.runtime_malformed_total - before == bad
    event(f"runtime: {'some' if usage else 'no'} chips, {'some' if bad else 'no'} unreadable")
    assert {c: s.hbm_used_bytes for c, s in snap.runtime.chips.items()} == {
        str(d): int(v) for d, v in usage.items()}
    for chip in snap.runtime.chips.values():
        assert chip.duty_cycle is None or 0 <= chip.duty_cycle <= 1
        assert chip.hbm_total_bytes is None or 0 <= chip.hbm_total_bytes < 2**63
    parsed = {s.name: s.value for f in text_string_to_metric_families(
        generate_latest(registry).decode()) for s in f.samples}
    assert parsed["tpumon_runtime_malformed_entries_total"] == source.malformed_total
    json.dumps(status_document(snap), allow_nan=False)
