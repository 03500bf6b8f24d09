"""Faults the agent must ride through, each provoked for real (issue 9, part 1).

Already covered elsewhere, and not repeated here: no runtime, a hung runtime, a partial
device list and several ports (test_tpu_runtime.py); a read-only or full state directory
(test_store_agent.py); a notifier endpoint that is down or answers errors (test_notify.py);
SIGTERM and SIGHUP (test_cli.py, test_reload.py, test_systemd.py).

Here: a runtime that answers garbage (entries, wire bytes, huge answers), a chip that
disappears between polls, the wall clock jumping, /proc entries vanishing mid-read,
scrapes racing polls, and a notifier endpoint slower than the notifier's timeout.
No test asserts a duration or a cadence other than a generous upper bound.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import threading
import time
import urllib.request
from concurrent import futures
from types import SimpleNamespace

import grpc
from google.protobuf.message import DecodeError
import numpy as np
import psutil
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fake_alert_apis import FakeAlertAPI
from fake_runtime import V4_TOTAL, FakeRuntime, RuntimeServer, chips_metrics, gauge_entry
from tools import wait_for
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpumon.agent import loop as agent_module
from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
from tpumon.detect import Assessment, ChipDetector, Verdict
from tpumon.web.http import MetricsServer
from tpumon.metrics.collectors import build_registry
from tpumon.common.identity import Identity
from tpumon.notify.alerts import AlertSettings, AlertTracker
from tpumon.notify.notifier import Notifier
from tpumon.notify.outbox import Outbox
from tpumon.notify.slack import SlackChannel
from tpumon.sources import chips as chips_module
from tpumon.sources.chips import inventory_for
from tpumon.sources.host import HostSource
from tpumon.sources.tpu_runtime import DUTY_CYCLE, TOTAL, USAGE, TpuRuntimeSource
from tpumon.state import AgentState
from tpumon.web.status import status_document
from tpumon.store.database import Retention, open_database
from tpumon.store.trace_rows import export_rows
from tpumon.store.writer import StoreWriter

GiB = 2**30
V4x4 = inventory_for("v4", 4)


def make_agent(ports, inventory=V4x4, interval=1.0, timeout=5.0, **kw):
    """An agent on the given runtime ports (loopback), with its state and registry."""
    clock = kw.pop("clock", time.time)
    state = kw.pop("state", None) or AgentState(Identity(host="h"), inventory)
    registry = build_registry(lambda: state.current,
                              notifier_health=kw.pop("notifier_health", None))
    source = TpuRuntimeSource("127.0.0.1", ports, timeout, inventory, clock=clock)
    agent = Agent(AgentInputs(state, source, OwnerScanner(dict, 60), interval, registry, **kw))
    return SimpleNamespace(agent=agent, state=state, registry=registry, source=source)


def scrape(registry) -> dict[tuple[str, tuple], float]:
    """One scrape, parsed as Prometheus does; identity labels dropped."""
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k not in ("host", "worker", "accelerator_type", "slice")))
            out[(s.name, labels)] = s.value
    return out


def chip_values(parsed, name: str) -> dict[str, float]:
    return {dict(labels)["chip"]: v for (n, labels), v in parsed.items() if n == name}


def attr(**value) -> pb.Attribute:
    return pb.Attribute(key="device-id", value=pb.AttrValue(**value))


def entry(device_id: int, **gauge) -> pb.Metric:
    return pb.Metric(attribute=attr(int_attr=device_id), gauge=pb.Gauge(**gauge))


class ScriptedRuntime(FakeRuntime):
    """A runtime whose whole answer per metric name is set by the test (any name inside)."""

    def __init__(self, responses: dict[str, pb.MetricResponse]) -> None:
        super().__init__()
        self.responses = responses

    def GetRuntimeMetric(self, request, context):
        self.calls += 1
        response = self.responses.get(request.metric_name)
        if response is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no metric {request.metric_name}")
        return response


def answer(name: str, metrics, **kw) -> pb.MetricResponse:
    return pb.MetricResponse(metric=pb.TPUMetric(name=name, metrics=metrics, **kw))


# --- the runtime answering garbage ----------------------------------------------------


GARBAGE_USAGE = [
    entry(0, as_int=GiB),                                   # good
    entry(1, as_double=2.0 * GiB),                          # good (a double)
    entry(2, as_int=-5),                                    # negative bytes
    entry(3, as_double=1e300),                              # absurd bytes
    entry(3, as_double=math.nan),
    entry(3, as_double=math.inf),
    entry(3, as_double=-math.inf),
    entry(3, as_double=2.0**63),                            # beyond int64
    pb.Metric(attribute=attr(string_attr="abc"), gauge=pb.Gauge(as_int=1)),  # ids not ints
    pb.Metric(attribute=attr(string_attr="\u00b2"), gauge=pb.Gauge(as_int=1)),  # isdigit()
    pb.Metric(attribute=attr(string_attr="9" * 5000), gauge=pb.Gauge(as_int=1)),
    pb.Metric(attribute=attr(string_attr="-1"), gauge=pb.Gauge(as_int=1)),
    pb.Metric(attribute=attr(double_attr=1.0), gauge=pb.Gauge(as_int=1)),
    pb.Metric(attribute=attr(bool_attr=True), gauge=pb.Gauge(as_int=1)),
    pb.Metric(attribute=attr(bytes_attr=b"\x00"), gauge=pb.Gauge(as_int=1)),
    pb.Metric(attribute=attr(int_attr=-1), gauge=pb.Gauge(as_int=1)),
    pb.Metric(gauge=pb.Gauge(as_int=1)),                    # no attribute at all
    entry(2, as_string="123"),                              # gauges of the wrong type
    entry(2, as_bool=True),
    pb.Metric(attribute=attr(int_attr=2), gauge=pb.Gauge()),  # a gauge without a value
    pb.Metric(attribute=attr(int_attr=2), counter=pb.Counter(as_int=3)),  # not gauges
    pb.Metric(attribute=attr(int_attr=2), distribution=pb.Distribution(count=1)),
    pb.Metric(attribute=attr(int_attr=2), summary=pb.Summary(sample_count=1)),
    pb.Metric(attribute=attr(int_attr=2)),                  # no measure
    entry(0, as_int=5),                                     # a repeated id
]


def test_a_runtime_answering_garbage_is_counted_and_the_poll_goes_on(runtime_servers, tmp_path):
    """Every unreadable entry is counted and skipped; the good ones are reported; chips
    with nothing readable are up 0; nothing escapes and no value poisons the history store
    (an int beyond SQLite's INTEGER would block every later write)."""
    responses = {
        USAGE: answer(USAGE, GARBAGE_USAGE),
        TOTAL: answer(TOTAL, [entry(0, as_int=V4_TOTAL), entry(1, as_int=V4_TOTAL),
                              entry(2, as_double=math.nan)]),
        DUTY_CYCLE: answer(DUTY_CYCLE, []),                 # an empty metric list
    }
    server = RuntimeServer(ScriptedRuntime(responses))
    store = StoreWriter(tmp_path, Retention(), open_database(tmp_path, Retention()))
    store.start()
    a = make_agent([server.port], store=store)
    try:
        bad = len(GARBAGE_USAGE) - 2 + 1  # all but two usage entries, and the NaN total
        snap = a.agent.poll_once()
        runtime = snap.health[0]
        assert (runtime.name, runtime.up, runtime.error) == ("tpu_runtime", True, None)
        assert {c: s.hbm_used_bytes for c, s in snap.runtime.chips.items()} == {
            "0": GiB, "1": 2 * GiB}
        assert snap.runtime.missing == ("2", "3")
        assert snap.runtime.chips["0"].hbm_total_bytes == V4_TOTAL
        assert snap.runtime.chips["0"].duty_cycle is None
        assert snap.runtime_malformed_total == bad
        m = scrape(a.registry)
        assert m[("tpumon_runtime_malformed_entries_total", ())] == bad
        assert chip_values(m, "tpumon_chip_up") == {"0": 1, "1": 1, "2": 0, "3": 0}
        assert chip_values(m, "tpumon_hbm_used_bytes") == {"0": GiB, "1": 2 * GiB}
        assert m[("tpumon_source_up", (("source", "tpu_runtime"),))] == 1
        json.dumps(status_document(snap), allow_nan=False)  # no NaN reaches the status
        assert a.agent.poll_once().runtime_malformed_total == 2 * bad  # a counter
        assert store.flush() and store.health.up, store.health.error
        rows = list(export_rows(store._db))
        assert {(r.chip, r.hbm_used_bytes) for r in rows} == {("0", GiB), ("1", 2 * GiB)}
    finally:
        a.source.close()
        store.stop()
        server.stop()


def test_a_runtime_without_some_metric_names_still_reports_usage(runtime_servers):
    """A runtime that knows only the usage metric (NOT_FOUND for the others, as for names
    it does not have): chips are reported with the spec capacity and no duty cycle."""
    server = runtime_servers({USAGE: [gauge_entry(0, 3 * GiB), gauge_entry(1, GiB)]})
    a = make_agent([server.port])
    try:
        snap = a.agent.poll_once()
        assert snap.health[0].up
        assert {c: (s.hbm_used_bytes, s.hbm_total_bytes, s.duty_cycle)
                for c, s in snap.runtime.chips.items()} == {
            "0": (3 * GiB, V4x4.hbm_bytes_per_device, None),
            "1": (GiB, V4x4.hbm_bytes_per_device, None)}
        assert snap.runtime.missing == ("2", "3")
    finally:
        a.source.close()


class RawBytes:
    """A RuntimeMetricService whose answers are raw bytes on the wire, unchecked."""

    def __init__(self) -> None:
        self.payload = b""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.unary_unary_rpc_method_handler(
            lambda request, context: self.payload,
            request_deserializer=None, response_serializer=None)  # bytes in, bytes out
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "tpu.monitoring.runtime.RuntimeMetricService", {"GetRuntimeMetric": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()


def test_undecodable_bytes_from_the_runtime_are_a_reported_state():
    raw = RawBytes()
    good = answer(USAGE, [gauge_entry(0, GiB)]).SerializeToString()
    # field 1 (the metric), length-delimited, claiming far more bytes than follow
    raw.payload = b"\x0a\xff\xff\xff\x07garbage"
    with pytest.raises(DecodeError):
        pb.MetricResponse.FromString(raw.payload)  # truly undecodable
    a = make_agent([raw.port], inventory=inventory_for("v4", 1))
    try:
        snap = a.agent.poll_once()
        assert not snap.health[0].up and "INTERNAL" in snap.health[0].error
        assert snap.runtime_ports_up == {raw.port: False}
        raw.payload = good  # the runtime talks sense again
        snap = a.agent.poll_once()
        assert snap.health[0].up and snap.runtime.chips["0"].hbm_used_bytes == GiB
    finally:
        a.source.close()
        raw.server.stop(None).wait(5)


@pytest.mark.slow
def test_huge_answers_are_bounded_and_do_not_hang_the_poll():
    """60,000 entries for 4 devices: 4 chips and the rest counted. An answer beyond gRPC's
    4 MB message limit: the port is down with the reason, and up again when it shrinks."""
    usage = [gauge_entry(i % 4, GiB + i % 4) for i in range(60_000)]
    runtime = ScriptedRuntime({name: answer(name, metrics) for name, metrics in
                               chips_metrics({0: 1, 1: 1, 2: 1, 3: 1}).items()})
    runtime.responses[USAGE] = answer(USAGE, usage)
    server = RuntimeServer(runtime)
    a = make_agent([server.port], timeout=20.0)
    try:
        started = time.monotonic()
        snap = a.agent.poll_once()
        assert time.monotonic() - started < 30  # does not hang
        assert {c: s.hbm_used_bytes for c, s in snap.runtime.chips.items()} == {
            "0": GiB, "1": GiB + 1, "2": GiB + 2, "3": GiB + 3}
        assert snap.runtime_malformed_total == 60_000 - 4
        runtime.responses[USAGE] = answer(USAGE, [gauge_entry(0, GiB)],
                                          description="x" * (5 << 20))
        snap = a.agent.poll_once()
        assert not snap.health[0].up and "RESOURCE_EXHAUSTED" in snap.health[0].error
        runtime.responses[USAGE] = answer(USAGE, [gauge_entry(0, GiB)])
        assert a.agent.poll_once().health[0].up
    finally:
        a.source.close()
        server.stop()


# --- a chip disappearing between polls ------------------------------------------------


class SpyDetector(ChipDetector):
    """A real detector that remembers the sample times it was fed."""

    def __init__(self) -> None:
        super().__init__()
        self.fed: list[float] = []

    def update(self, times, steps, used, totals) -> None:
        self.fed.extend(float(t) for t in times)
        super().update(times, steps, used, totals)


def test_a_chip_that_disappears_is_down_not_fed_and_comes_back(runtime_servers):
    server = runtime_servers(chips_metrics({0: GiB, 1: GiB, 2: GiB, 3: GiB}))
    ticks = iter(1000.0 + 5 * i for i in range(100))
    spies = {str(c): SpyDetector() for c in range(4)}
    a = make_agent([server.port], clock=lambda: next(ticks), detectors=spies)
    try:
        a.agent.poll_once()  # t=1000: all four
        server.runtime.metrics = chips_metrics({0: GiB, 1: GiB, 3: GiB})
        snap = a.agent.poll_once()  # t=1005: chip 2 gone
        assert snap.runtime.missing == ("2",)
        m = scrape(a.registry)
        assert chip_values(m, "tpumon_chip_up") == {"0": 1, "1": 1, "2": 0, "3": 1}
        assert "2" not in chip_values(m, "tpumon_hbm_used_bytes")
        doc = status_document(snap)
        assert [c["up"] for c in doc["chips"]] == [True, True, False, True]
        assert doc["chips"][2]["verdict"] is not None  # its detector keeps its last word
        server.runtime.metrics = chips_metrics({0: GiB, 1: GiB, 2: 2 * GiB, 3: GiB})
        snap = a.agent.poll_once()  # t=1010: back
        assert snap.runtime.missing == ()
        m = scrape(a.registry)
        assert chip_values(m, "tpumon_chip_up") == {c: 1 for c in "0123"}
        assert chip_values(m, "tpumon_hbm_used_bytes")["2"] == 2 * GiB
        assert spies["2"].fed == [1000.0, 1010.0]  # a gap where it was missing
        assert spies["0"].fed == [1000.0, 1005.0, 1010.0]
    finally:
        a.source.close()


# --- the wall clock jumping -----------------------------------------------------------


@pytest.mark.slow
def test_wall_clock_jumps_neither_stall_nor_burst_the_polls(runtime_servers, monkeypatch, caplog):
    """The wall clock goes back an hour, then forward two, mid-run (only the agent's and
    the runtime source's view of it): polls go on at the monotonic cadence, each poll is
    dated by the wall clock, nothing raises, and the detector takes the jumps as breaks
    (no restart: the floor did not drop)."""
    server = runtime_servers(chips_metrics({0: 5 * GiB}))
    offset = [0.0]
    real_time = time.time

    def wall() -> float:
        return real_time() + offset[0]

    monkeypatch.setattr(agent_module, "time", SimpleNamespace(time=wall, monotonic=time.monotonic))
    interval = 0.05
    a = make_agent([server.port], inventory=inventory_for("v4", 1), interval=interval,
                   clock=wall)
    seen: list[tuple[float, float]] = []
    stop = threading.Event()
    thread = threading.Thread(target=a.agent.run,
                              args=(stop, lambda s: seen.append((s.time, s.runtime.time))))
    started = time.monotonic()
    thread.start()
    try:
        for jump in (-3600.0, 7200.0, 0.0):
            n = len(seen)
            wait_for(lambda n=n: len(seen) >= n + 8, 30)  # polls go on (a stall fails here)
            offset[0] += jump
    finally:
        stop.set()
        thread.join(10)
    elapsed = time.monotonic() - started
    assert not thread.is_alive()
    polls = a.state.current.polls_total
    assert polls == len(seen) >= 24
    assert polls <= elapsed / interval + 2  # no burst of catch-up polls after a jump
    times = [t for _, t in seen]
    steps = np.diff(times)
    assert steps.min() < -3000 and steps.max() > 6000  # the jumps reached the samples
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assessment = a.state.current.assessments["0"]
    assert assessment.verdict is not Verdict.LEAK and assessment.restarts == 0
    a.source.close()


def test_the_detector_takes_time_going_back_as_a_break():
    """Hours of samples, then the clock an hour back: with the floor where it was, one
    job goes on (no restart, no leak); with memory back at baseline, a restart."""
    for later_floor, restarts in ((10 * GiB, 0), (2 * GiB, 1)):
        d = ChipDetector()
        t = np.arange(0, 3 * 3600, 5.0)
        used = 10 * GiB + (np.arange(t.size) % 7) * 2**20  # a sawtooth over a flat floor
        d.update(t, np.full(t.size, np.nan), used, np.full(t.size, 32.0 * GiB))
        t2 = t[-1] - 3600 + np.arange(0, 3 * 3600, 5.0)
        used2 = later_floor + (np.arange(t2.size) % 7) * 2**20
        d.update(t2, np.full(t2.size, np.nan), used2, np.full(t2.size, 32.0 * GiB))
        a = d.assessment
        assert a.verdict is not Verdict.LEAK and a.restarts == restarts, (later_floor, a)


# --- /proc entries vanishing mid-read -------------------------------------------------


class FlakyProcess:
    """psutil.Process for a set of pids, where one call fails as a process does that exits
    (or is another user's, or a zombie) between the owner scan and the read."""

    failures: dict[int, tuple[str, Exception]] = {}

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fail("Process")

    def _fail(self, call: str) -> None:
        failing = self.failures.get(self.pid)
        if failing is not None and failing[0] == call:
            raise failing[1]

    def is_running(self) -> bool:
        self._fail("is_running")
        return True

    def oneshot(self):
        self._fail("oneshot")
        return open(os.devnull)  # any context manager

    def name(self) -> str:
        self._fail("name")
        return f"train-{self.pid}"

    def memory_info(self):
        self._fail("memory_info")
        return SimpleNamespace(rss=self.pid * 2**20)


@pytest.mark.parametrize("call", ["Process", "is_running", "oneshot", "name", "memory_info"])
@pytest.mark.parametrize("error", [psutil.NoSuchProcess(102), psutil.AccessDenied(102),
                                   psutil.ZombieProcess(102)],
                         ids=lambda e: type(e).__name__)
def test_a_process_vanishing_mid_read_is_skipped(monkeypatch, call, error):
    owners = {"0": 101, "1": 102, "2": 103}
    monkeypatch.setattr(psutil, "Process", FlakyProcess)
    monkeypatch.setattr(FlakyProcess, "failures", {})
    source = HostSource(lambda: owners)
    assert [p.pid for p in source.poll().processes] == [101, 102, 103]  # cached now
    monkeypatch.setattr(FlakyProcess, "failures", {102: (call, error)})
    if call == "Process":  # only asked when not cached (or no longer running)
        source._processes.pop(102)
    sample = source.poll()
    assert [(p.pid, p.chips, p.rss_bytes) for p in sample.processes] == [
        (101, ("0",), 101 * 2**20), (103, ("2",), 103 * 2**20)]
    assert 102 not in source._processes  # a later poll looks it up afresh
    monkeypatch.setattr(FlakyProcess, "failures", {})
    assert [p.pid for p in source.poll().processes] == [101, 102, 103]


def fake_proc(tmp_path):
    """A /proc of three processes whose fds link to files of a fake /dev (tmp_path/dev,
    the agent's device files: accel0-2) and elsewhere."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("null", "accel0", "accel1", "accel2", "x", "closing"):
        (dev / name).touch()
    proc = tmp_path / "proc"
    for pid, fds in {"40": {"0": "null", "5": "x", "7": "accel0"},
                     "41": {"3": "accel1"},
                     "42": {"0": "null", "5": "closing", "9": "accel2"}}.items():
        (proc / pid / "fd").mkdir(parents=True)
        for fd, target in fds.items():
            os.symlink(dev / target, proc / pid / "fd" / fd)
    return proc


def test_proc_entries_vanishing_mid_walk_hide_no_other_owner(tmp_path, monkeypatch):
    """Process 41 exits between the /proc listing and its fd walk (its directory is
    gone); process 42 closes a file between its fd listing and the stat of it. The
    other owners, and 42's still-open chip, are found."""
    proc = fake_proc(tmp_path)
    devices = chips_module.device_files(str(tmp_path / "dev"))
    real_scandir, real_stat = os.scandir, os.stat

    def scandir(path="."):
        if not isinstance(path, str):  # shutil.rmtree's own calls (the os module is shared)
            return real_scandir(path)
        if path == f"{proc}/41/fd":
            shutil.rmtree(proc / "41")  # exits now
        it = real_scandir(path)
        if path.endswith("/fd"):  # fd 5 listed before fd 9, whatever the file system's order
            entries = sorted(it, key=lambda e: int(e.name))
            it.close()
            return _Listing(entries)
        return it

    def stat(path, *a, **kw):
        if os.fspath(path) == f"{proc}/42/fd/5":
            os.unlink(path)  # closed meanwhile
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(chips_module.os, "scandir", scandir)
    monkeypatch.setattr(chips_module.os, "stat", stat)
    found = chips_module.device_owners(devices, proc=str(proc))
    dev = tmp_path / "dev"
    assert found == {f"{dev}/accel0": 40, f"{dev}/accel2": 42}


class _Listing(list):
    """A list of entries usable like os.scandir's iterator (a context manager)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- scrapes racing polls -------------------------------------------------------------


class PollCounter(FakeRuntime):
    """Every chip's HBM usage is the number of usage requests so far: within one poll all
    chips carry the same value, which is also the poll's number."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.lock = threading.Lock()

    def GetRuntimeMetric(self, request, context):
        if request.metric_name == USAGE:
            with self.lock:
                self.n += 1
                value = self.n
        else:
            value = V4_TOTAL if request.metric_name == TOTAL else 50.0
        return answer(request.metric_name, [gauge_entry(d, value) for d in range(4)])


def metrics_scrape_problems(text: str, seen: set[int]) -> list[str]:
    """What is wrong with one scrape of /metrics: chips from more than one poll, or from
    another poll than the poll counter's; adds the poll its chips came from to ``seen``."""
    problems = []
    parsed = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            parsed[(s.name, s.labels.get("chip"), s.labels.get("source"))] = s.value
    used = {v for (n, _, _), v in parsed.items() if n == "tpumon_hbm_used_bytes"}
    polls = parsed.get(("tpumon_source_polls_total", None, "tpu_runtime"))
    errors = parsed.get(("tpumon_source_errors_total", None, "tpu_runtime"))
    if used:
        if len(used) != 1:
            problems.append(f"/metrics mixed polls: {sorted(used)}")
        elif errors == 0 and polls != next(iter(used)):
            problems.append(f"/metrics: chips from poll {used}, counter {polls}")
        seen.add(int(next(iter(used))))
    return problems


def status_scrape_problems(doc: dict) -> list[str]:
    """What is wrong with one /api/status document: chips from more than one poll, or
    (the runtime up) from another poll than the one it counts."""
    used = {c["hbm_used_bytes"] for c in doc["chips"] if c["up"]}
    if used and (len(used) != 1 or (doc["sources"]["tpu_runtime"]["up"]
                                    and used != {doc["polls_total"]})):
        return [f"/api/status mixed: {used} at poll {doc['polls_total']}"]
    return []


@pytest.mark.slow
def test_scrapes_during_fast_polls_each_see_one_whole_poll():
    server = RuntimeServer(PollCounter())
    a = make_agent([server.port], interval=0.002)
    http = MetricsServer("127.0.0.1:0")
    host, port = http.start()
    http.attach(a.registry, lambda: a.state.current)
    stop, loop_stop = threading.Event(), threading.Event()
    problems: list[str] = []
    seen: set[int] = set()
    scrapes = [0]

    def get(path: str) -> str:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=30) as r:
            return r.read().decode()

    def metrics_scraper() -> None:
        while not stop.is_set():
            try:
                problems.extend(metrics_scrape_problems(get("/metrics"), seen))
                scrapes[0] += 1
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                problems.append(f"/metrics: {type(exc).__name__}: {exc}")

    def status_scraper() -> None:
        while not stop.is_set():
            try:
                problems.extend(status_scrape_problems(json.loads(get("/api/status"))))
                scrapes[0] += 1
            except Exception as exc:  # noqa: BLE001
                problems.append(f"/api/status: {type(exc).__name__}: {exc}")

    poller = threading.Thread(target=a.agent.run, args=(loop_stop,))
    scrapers = [threading.Thread(target=f) for f in (metrics_scraper,) * 3 + (status_scraper,) * 3]
    poller.start()
    for t in scrapers:
        t.start()
    try:
        wait_for(lambda: problems or (scrapes[0] >= 150 and len(seen) >= 10), 60)
    finally:
        stop.set()
        for t in scrapers:
            t.join(30)
        loop_stop.set()
        poller.join(10)
        http.stop()
        a.source.close()
        server.stop()
    assert not problems, problems[:5]
    assert len(seen) >= 10  # scrapes saw many different polls: they ran during polling


# --- a notifier endpoint slower than the notifier's timeout ---------------------------


@pytest.mark.e2e
def test_a_slow_slack_is_a_network_failure_retried_while_polling_goes_on(runtime_servers):
    """Slack holds every request for longer than the notifier waits: each attempt ends at
    the timeout as a network failure and is retried; the agent keeps polling while a
    request is held, and a scrape reads the notifier's health from the notifier."""
    server = runtime_servers(chips_metrics({0: 20 * GiB}))
    with FakeAlertAPI("slack", delay=60.0) as api:
        state = AgentState(Identity(host="h"), inventory_for("v4", 1))
        leak = Assessment(Verdict.LEAK, "floor grows", floor_bytes=20 * GiB,
                          total_bytes=32 * GiB, slope_bytes_per_second=3e5,
                          predicted_oom_time=time.time() + 20 * 3600)
        channel = SlackChannel(api.url, ("warning", "critical"))
        channel.group_wait = 0.0
        channel.min_interval = 0.0
        # The notifier reads the agent's published poll states, with a leak on chip 0.
        n = Notifier(
            lambda: dataclasses.replace(state.current, assessments={"0": leak}),
            AlertTracker(AlertSettings()), Outbox(None), [channel], timeout=2.0,
            backoff_base=0.05)
        a = make_agent([server.port], inventory=inventory_for("v4", 1), interval=0.02,
                       state=state, notifier_health=n.health)
        stop = threading.Event()
        poller = threading.Thread(target=a.agent.run, args=(stop,))
        poller.start()
        n.start()
        try:
            assert api.delayed.wait(30), "no request reached slack"
            held_from = a.state.current.polls_total  # the first request is held now
            wait_for(lambda: a.state.current.polls_total >= held_from + 3, 30)
            # ... and it still was when those polls were made (failures only grow):
            assert n.health().channels[0].failures_total.get("network", 0) == 0
            wait_for(lambda: n.health().channels[0].failures_total.get("network", 0) >= 2, 60)
            h = n.health().channels[0]
            assert not h.up and h.pending == 1 and h.delivered_total == 0
            assert "timed out" in (h.last_error or ""), h.last_error
            m = scrape(a.registry)
            assert m[("tpumon_notifier_failures_total",
                      (("notifier", "slack"), ("reason", "network")))] >= 1
            api.delay = 0.0  # the service recovers
            wait_for(lambda: api.accepted, 60)
            wait_for(lambda: n.health().channels[0].pending == 0, 30)
            assert n.health().channels[0].up
        finally:
            stop.set()
            poller.join(10)
            n.stop()
            a.source.close()
        assert not poller.is_alive()
