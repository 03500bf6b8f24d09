"""HBM, duty cycle and the runtime's other metrics from libtpu's runtime metric service
(what tpu-info reads).

Built on the gRPC stubs that ship in the tpu-info wheel and on its metric names, but
sturdier than ``tpu_info.metrics.get_chip_usage``, which an agent cannot afford:

* every call has a deadline, so a hung runtime costs one ``timeout`` per poll, never a hang;
* every port in TPU_RUNTIME_METRICS_PORTS is asked (PyTorch/XLA multiprocess runs serve
  8431-8434, one process each), all calls in flight at once;
* one connection per port lives as long as the source and is dialled again at the next
  poll after it failed, so "no runtime between jobs" heals unaided when the next job starts;
* the calls go through :mod:`tpumon.sources.grpc_unary` (libcurl's HTTP/2 on the poll
  thread) rather than grpcio: the same wire protocol at ~11 MiB less RSS and a fraction of
  the CPU (docs/benchmarks.md);
* answers are matched by device id, not list position, and a partial answer (fewer devices
  than chips, or a metric missing for one chip) is handled chip by chip;
* each port is asked which metrics it serves (``ListSupportedMetrics``) when it first
  answers and again after it comes back (a runtime restart may be another libtpu); of those,
  the ones in :data:`~tpumon.sources.runtime_catalog.CATALOG` are asked with the slow
  metrics (every ``slow_interval``), one call each, a failure costing that metric only.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from google.protobuf.message import Message
from tpu_info.proto import tpu_metric_service_pb2 as pb

from tpumon.common.samples import (ChipSample, Distribution, RuntimeReading, RuntimeSeries,
                                   chip_sort_key)
from tpumon.sources.runtime_catalog import BY_RUNTIME_NAME, MetricSpec, entry_key, \
    gauge_value, histogram_of
from tpumon.sources.chips import ChipInventory
from tpumon.sources.grpc_unary import Call, CallFailed, Endpoint, UnaryClient
from tpumon.sources.health import SourceUnavailable
from tpumon.sources.runtime_names import GET_RUNTIME_METRIC, LIST_SUPPORTED_METRICS, \
    MetricName
from tpumon.sources.runtime_server import RuntimeServer, RuntimeTrust, is_loopback

log = logging.getLogger("tpumon.sources.tpu_runtime")

USAGE = MetricName.MEMORY_USAGE.value
TOTAL = MetricName.TOTAL_MEMORY.value
DUTY_CYCLE = MetricName.DUTY_CYCLE_PCT.value
METRICS = (USAGE, TOTAL, DUTY_CYCLE)

# one readable entry of a catalogue metric: its spec, label values, gauge value or histogram
_Entry = tuple[MetricSpec, tuple[str, ...], "float | Distribution"]

_DIGITS = re.compile(r"[0-9]{1,18}")  # a device id as text: ASCII digits, within int64


@dataclass(frozen=True, slots=True)
class DeviceValue:
    """One entry of a metric response: the value for one device id."""

    device_id: int
    value: float


def parse_metric(response: pb.MetricResponse) -> tuple[dict[int, float], int]:
    """Device id -> gauge value, and the number of entries that could not be read.

    The device id is the attribute's int value (tpu-info relies on the same); entries
    without one, without a gauge, or repeating a device id are counted, not trusted.
    """
    values: dict[int, float] = {}
    bad = 0
    for metric in response.metric.metrics:
        entry = _device_value(metric)
        if entry is None or entry.device_id in values:
            bad += 1
            continue
        values[entry.device_id] = entry.value
    return values, bad


def _device_value(metric: pb.Metric) -> DeviceValue | None:
    attr = metric.attribute.value
    kind = attr.WhichOneof("attr")
    if kind == "int_attr":
        device_id = attr.int_attr
    elif kind == "string_attr" and _DIGITS.fullmatch(attr.string_attr):
        device_id = int(attr.string_attr)
    else:
        return None
    if metric.WhichOneof("measure") != "gauge" or device_id < 0:
        return None
    gauge = metric.gauge
    which = gauge.WhichOneof("value")
    if which == "as_int":
        value = float(gauge.as_int)
    elif which == "as_double":
        value = gauge.as_double
    else:
        return None
    # Bytes and percentages: never negative, NaN or beyond int64 (what the store holds).
    return DeviceValue(device_id, value) if 0 <= value < 2.0**63 else None


def describe_server(server: RuntimeServer) -> str:
    """'pid 1234 (uid 1001)', or 'a process of uid 1001 this agent cannot see'."""
    if server.pid is None:
        return f"a process of uid {server.uid} this agent cannot see"
    return f"pid {server.pid} (uid {server.uid})"


def _describe(failure: CallFailed, target: str, timeout: float) -> str:
    if failure.status == "UNAVAILABLE":
        return f"no runtime answering on {target}"
    if failure.status == "DEADLINE_EXCEEDED":
        return f"runtime on {target} did not answer within {timeout:g} s"
    return f"runtime on {target}: {failure.status}: {failure.detail}"


@dataclass
class _PortAnswer:
    """The three metrics from one port (None where that call failed)."""

    port: int
    usage: dict[int, float] | None
    total: dict[int, float] | None
    duty: dict[int, float] | None
    error: str | None


class TpuRuntimeSource:
    """Polls every configured port of the runtime metric service; one instance per agent."""

    def __init__(self, address: str, ports: Iterable[int], timeout: float,
                 inventory: ChipInventory, clock: Callable[[], float] = time.time,
                 runtime_clock: bool = False, slow_interval: float = 0.0,
                 trust: RuntimeTrust | None = None) -> None:
        """``runtime_clock``: date readings by the timestamps the runtime puts on its metrics
        (the simulator's simulated time) instead of ``clock``. Off for libtpu, whose
        timestamp semantics are not verified.

        ``slow_interval``: ask for total memory and duty cycle at most this often (seconds;
        0: every poll), and for usage alone in between. Usage is what the detector samples
        every poll; the total never changes and duty cycle is read at scrape resolution,
        while a slow round of 15 calls costs 4-5 ms of CPU against ~0.8 ms for usage alone.

        ``trust``: who may serve the figures (:mod:`tpumon.sources.runtime_server`); a port
        whose server it does not believe is treated as down. None, or a runtime that is
        not on loopback (not in this VM's /proc/net/tcp): every server is believed."""
        self.address = address
        self.slow_interval = slow_interval
        self._slow_due = 0.0  # monotonic time the slow metrics are next asked for
        self._last_duty: dict[int, dict[int, float] | None] = {}
        self._slow_ok: set[int] = set()  # ports that answered the last slow round
        self.ports = list(dict.fromkeys(ports))
        self.timeout = timeout
        self.inventory = inventory
        self.malformed_total = 0
        self.ports_up: dict[int, bool] = {port: False for port in self.ports}
        self._trust = trust if is_loopback(address) else None
        self.servers: dict[int, RuntimeServer] = {}  # port -> who serves it (with trust)
        self._clock = clock
        self._runtime_clock = runtime_clock
        self._stamps: list[float] = []
        self._seen: set[str] = set()
        self._last_total: dict[str, int] = {}
        self._per_process = False
        self._slow_round = False  # this poll asked for the slow metrics
        self._supported: dict[int, frozenset[str] | None] = {p: None for p in self.ports}
        self._extras: dict[int, dict[str, list[_Entry]]] = {}  # port -> metric -> entries
        self._series: tuple[RuntimeSeries, ...] = ()
        # tpu-info dials libtpu with gRPC's local credentials, which send nothing on the
        # wire (the connection is checked to be local and is plain HTTP/2): plain HTTP/2
        # is the same conversation (tested against a server with local credentials).
        self._client = UnaryClient()
        self._endpoints = {port: Endpoint(self.address.strip("[]"), port)
                           for port in self.ports}
        self._calls: dict[tuple[int, str], Call] = {}

    def target(self, port: int) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{port}"

    def close(self) -> None:
        self._client.close()

    def poll(self) -> RuntimeReading:
        """One reading of every chip; raises SourceUnavailable when no port answers."""
        self._stamps = []
        answers = self._screen(self._ask_all_ports())
        now = max(self._stamps) if self._runtime_clock and self._stamps else self._clock()
        self.ports_up = {a.port: a.usage is not None for a in answers}
        live = [a for a in answers if a.usage is not None]
        self._forget_ports_down()
        if not live:
            raise SourceUnavailable("; ".join(a.error or "" for a in answers))
        chips = self._merge(live)
        self._seen.update(chips)
        expected = self.inventory.devices or sorted(self._seen, key=chip_sort_key)
        missing = tuple(c for c in expected if c not in chips)
        if self._list_supported() or self._slow_round:
            self._ask_extras()
        return RuntimeReading(now, chips, missing, self._series, self.supported_metrics)

    def _screen(self, answers: list[_PortAnswer]) -> list[_PortAnswer]:
        """The answers with those of untrusted servers taken out (the port then reads as
        down, with the reason); who serves each port is logged when it changes, and the
        connection to a port whose server changed is dialled afresh (it may still reach
        the process that answered before)."""
        if self._trust is None:
            return answers
        servers = self._trust.judge(self.ports)
        for port, server in servers.items():
            before = self.servers.get(port)
            if before is not None and (before.pid, before.uid) != (server.pid, server.uid):
                self._client.forget(self._endpoints[port])
            if server != before:
                self._log_server(port, server)
        self.servers = servers
        return [a if servers[a.port].trusted or a.usage is None else
                _PortAnswer(a.port, None, None, None,
                            self._distrusted(a.port, servers[a.port]))
                for a in answers]

    def _distrusted(self, port: int, server: RuntimeServer) -> str:
        if server.uid is None:
            return f"no runtime listening on {self.target(port)}"
        return f"runtime on {self.target(port)} is served by {describe_server(server)}: " \
            f"its figures are ignored ({server.reason})"

    def _log_server(self, port: int, server: RuntimeServer) -> None:
        if server.uid is None:
            return  # nobody listens: the failed call says so
        if server.trusted:
            log.info("runtime on %s is served by %s: trusted as %s", self.target(port),
                     describe_server(server), server.reason)
        else:
            log.warning("%s", self._distrusted(port, server))

    @property
    def supported_metrics(self) -> tuple[str, ...]:
        """Every metric name some port said it serves, sorted (empty until one said)."""
        return tuple(sorted(set().union(*(s for s in self._supported.values() if s))))

    def _forget_ports_down(self) -> None:
        """A port that stopped answering: its list of metrics is asked again when it is back
        (the runtime restarted, maybe another libtpu) and its last values are dropped."""
        for port, up in self.ports_up.items():
            if not up and (self._supported[port] is not None or port in self._extras):
                self._supported[port] = None
                self._extras.pop(port, None)
                self._series = self._build_series()

    def _list_supported(self) -> bool:
        """Ask each answering port that has not said yet which metrics it serves; True if one
        said (its metrics are then asked at once). A runtime without ListSupportedMetrics
        (UNIMPLEMENTED) is served the three core metrics only; another failure is asked
        again next poll."""
        listed = False
        for port, up in self.ports_up.items():
            if not up or self._supported[port] is not None:
                continue
            try:
                answer = self._client.call(
                    self._endpoints[port], LIST_SUPPORTED_METRICS,
                    pb.ListSupportedMetricsRequest(), pb.ListSupportedMetricsResponse,
                    self.timeout)
            except CallFailed as exc:
                if exc.status == "UNIMPLEMENTED":
                    self._supported[port] = frozenset(METRICS)
                else:
                    log.info("ListSupportedMetrics: %s", _describe(exc, self.target(port),
                                                                   self.timeout))
                continue
            names = frozenset(m.metric_name[:256] for m in answer.supported_metric[:1024])
            self._supported[port] = names
            unknown = sorted(n for n in names if n not in BY_RUNTIME_NAME and n not in METRICS)
            log.info("runtime on %s serves %d metric(s)%s", self.target(port), len(names),
                     f"; not exported by tpumon: {', '.join(unknown)}" if unknown else "")
            listed = True
        return listed

    def _ask_extras(self) -> None:
        """The catalogue's metrics each answering port serves, all asked at once within one
        deadline; a metric the port does not have after all (NOT_FOUND, UNIMPLEMENTED) is
        dropped from its list, any other failure leaves that metric's last values standing
        until the next round."""
        asked = [(port, name) for port, up in self.ports_up.items() if up
                 for name in sorted(n for n in self._supported.get(port) or ()
                                    if n in BY_RUNTIME_NAME)]
        for (port, name), outcome in zip(asked, self._ask(asked), strict=True):
            entries = self._extras.setdefault(port, {})
            if not isinstance(outcome, CallFailed):
                entries[name] = self._entries(port, BY_RUNTIME_NAME[name], outcome)
            elif outcome.status in ("NOT_FOUND", "UNIMPLEMENTED"):
                self._supported[port] = (self._supported[port] or frozenset()) - {name}
                entries.pop(name, None)
            else:
                log.debug("%s", _describe(outcome, self.target(port), self.timeout))
        self._series = self._build_series()

    def _entries(self, port: int, spec: MetricSpec,
                 response: pb.MetricResponse) -> list[_Entry]:
        """(spec, label values, value or histogram) per readable entry; the rest counted."""
        out: list[_Entry] = []
        for metric in response.metric.metrics:
            key = entry_key(spec, metric)
            value: float | Distribution | None = None if key is None else (
                gauge_value(spec, metric) if spec.kind == "gauge" else histogram_of(spec, metric))
            if key is None or value is None:
                self.malformed_total += 1
                continue
            if spec.key == "buffer":
                labels: tuple[str, ...] = (key.buffer_size,)
            else:
                chip = str(self.ports.index(port)) if self._per_process else str(key.device_id)
                labels = (chip,) if spec.key == "device" else (chip, key.core_type)
            out.append((spec, labels, value))
        return out

    def _build_series(self) -> tuple[RuntimeSeries, ...]:
        """One series per family and labels across ports: histograms of one buffer size
        added up (as tpu-info does), a repeated gauge counted as malformed."""
        merged: dict[tuple[str, tuple[str, ...]], RuntimeSeries] = {}
        for by_metric in self._extras.values():
            for spec, labels, value in (e for entries in by_metric.values() for e in entries):
                key = (spec.family, labels)
                seen = merged.get(key)
                if seen is None:
                    merged[key] = (RuntimeSeries(spec.family, labels, histogram=value)
                                   if isinstance(value, Distribution) else
                                   RuntimeSeries(spec.family, labels, value=value))
                    continue
                both = seen.histogram.merged(value) if seen.histogram is not None and \
                    isinstance(value, Distribution) else None
                if both is None:
                    self.malformed_total += 1
                else:
                    merged[key] = RuntimeSeries(spec.family, labels, histogram=both)
        return tuple(merged.values())

    def _ask_all_ports(self) -> list[_PortAnswer]:
        """Every call on every port, one deadline for the lot; usage alone between the
        slow metrics' turns (then each port's last duty cycle stands)."""
        slow = self._slow_round = time.monotonic() >= self._slow_due
        calls = [(port, name) for port in self.ports for name in (METRICS if slow else (USAGE,))]
        results: dict[tuple[int, str], dict[int, float] | None] = {}
        errors: dict[int, str] = {}
        for (port, name), response in zip(calls, self._call_all(calls), strict=True):
            if isinstance(response, str):
                errors.setdefault(port, response)
                results[(port, name)] = None
                continue
            values, bad = parse_metric(response)
            self.malformed_total += bad
            if self._runtime_clock:  # not ToNanoseconds(): it raises outside years 1-9999
                self._stamps.extend(m.timestamp.seconds + m.timestamp.nanos / 1e9
                                    for m in response.metric.metrics if m.HasField("timestamp"))
            results[(port, name)] = values
        if slow:
            self._slow_ok = {port for port in self.ports if results[(port, TOTAL)] is not None}
            self._last_duty = {port: results[(port, DUTY_CYCLE)] for port in self.ports}
            self._slow_due = time.monotonic() + self.slow_interval
        elif any(results[(port, USAGE)] is not None and port not in self._slow_ok
                 for port in self.ports):
            self._slow_due = 0.0  # a port back up: its total and duty cycle next poll
        return [_PortAnswer(port, results[(port, USAGE)], results.get((port, TOTAL)),
                            results.get((port, DUTY_CYCLE), self._last_duty.get(port)),
                            errors.get(port))
                for port in self.ports]

    def _call_all(self, calls: list[tuple[int, str]]) -> list[pb.MetricResponse | str]:
        """Each call's response, or the error text for its port; all at once (HTTP/2 streams
        on one connection per port), within one deadline: a slow runtime costs one wait, and
        a round of calls a third less CPU than the same calls one after the other."""
        return [_describe(o, self.target(port), self.timeout) if isinstance(o, CallFailed)
                else o for (port, _), o in zip(calls, self._ask(calls), strict=True)]

    def _ask(self, calls: list[tuple[int, str]]) -> list[Message | CallFailed]:
        """GetRuntimeMetric of each (port, metric name), all at once within one deadline:
        each reply, or its failure."""
        return self._client.call_all([self._call(port, name) for port, name in calls],
                                     self.timeout)

    def _call(self, port: int, name: str) -> Call:
        """GetRuntimeMetric of ``name`` on ``port``, made once (the client sends a call it
        sent last without serializing it again); names are the catalogue's and METRICS."""
        call = self._calls.get((port, name))
        if call is None:
            call = self._calls[(port, name)] = Call(
                self._endpoints[port], GET_RUNTIME_METRIC, pb.MetricRequest(metric_name=name),
                pb.MetricResponse)
        return call

    def _merge(self, answers: list[_PortAnswer]) -> dict[str, ChipSample]:
        """Chip name -> sample, across ports.

        Device ids are normally unique on the VM. If two ports report the same id, each
        process is numbering its own devices from 0 (one chip per process, PyTorch/XLA
        multiprocess style): the chip is then the port's position in the configured list.
        """
        ids = [d for a in answers for d in (a.usage or {})]
        overlap = len(ids) != len(set(ids))
        if overlap and all(len(a.usage or {}) == 1 for a in answers):
            if not self._per_process:
                log.info("each runtime port numbers its own device from 0: naming chips by "
                         "port position in %s", self.ports)
            self._per_process = True  # sticky: later partial answers cannot tell
        elif overlap:
            log.warning("ports %s report overlapping device ids; keeping the first port's",
                        [a.port for a in answers])
        per_process = self._per_process
        chips: dict[str, ChipSample] = {}
        for answer in answers:
            for device_id, used in (answer.usage or {}).items():
                name = str(self.ports.index(answer.port)) if per_process else str(device_id)
                if name not in chips:
                    chips[name] = self._sample(name, device_id, used, answer)
        return chips

    def _sample(self, name: str, device_id: int, used: float, answer: _PortAnswer) -> ChipSample:
        total = (answer.total or {}).get(device_id)
        if total is not None:
            self._last_total[name] = int(total)
        total_bytes = self._last_total.get(name, self.inventory.hbm_bytes_per_device)
        duty_id = device_id // max(self.inventory.devices_per_chip, 1)
        duty = (answer.duty or {}).get(duty_id)
        duty_ratio = None if duty is None else min(max(duty / 100.0, 0.0), 1.0)
        return ChipSample(name, int(used), total_bytes, duty_ratio, device_id, answer.port)

