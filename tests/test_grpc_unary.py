"""tpumon's gRPC client (libcurl's HTTP/2 through pycurl) against real grpcio servers and
against peers that are not gRPC at all: every outcome is a reply or a CallFailed with a
status."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tpu_info.proto import tpu_metric_service_pb2 as pb

from fake_runtime import DUTY_CYCLE, FakeRuntime, RuntimeServer, chips_metrics
from tools import free_port
from tpumon.sources.grpc_unary import Call, CallFailed, Endpoint, UnaryClient, _Exchange
from tpumon.sources.runtime_names import GET_RUNTIME_METRIC, LIST_SUPPORTED_METRICS
from tpumon.sources.tpu_runtime import USAGE

GiB = 2**30


def ask(client: UnaryClient, port: int, name: str = USAGE, timeout: float = 2.0):
    return client.call(Endpoint("127.0.0.1", port), GET_RUNTIME_METRIC,
                       pb.MetricRequest(metric_name=name), pb.MetricResponse, timeout)


@pytest.fixture
def client():
    c = UnaryClient()
    yield c
    c.close()


@pytest.mark.parametrize("local", [False, True], ids=["insecure", "local-credentials"])
def test_a_grpcio_server_answers_whatever_its_credentials(client, local):
    """tpu-info dials libtpu with local credentials; they put nothing on the wire."""
    server = RuntimeServer(FakeRuntime(chips_metrics({0: GiB, 1: 2 * GiB})), local=local)
    try:
        reply = ask(client, server.port)
        assert sorted(m.gauge.as_int for m in reply.metric.metrics) == [GiB, 2 * GiB]
        server.runtime.supported = [USAGE]
        listed = client.call(Endpoint("127.0.0.1", server.port), LIST_SUPPORTED_METRICS,
                             pb.ListSupportedMetricsRequest(),
                             pb.ListSupportedMetricsResponse, 2.0)
        assert [m.metric_name for m in listed.supported_metric] == [USAGE]
    finally:
        server.stop()


@pytest.mark.slow
def test_calls_and_rounds_share_one_connection_per_endpoint(client):
    """One HTTP/2 connection carries every call to an endpoint: a round's calls as streams
    side by side, and round after round (no new connection, no new dial per poll)."""
    slow = FakeRuntime(chips_metrics({0: GiB}))
    slow.delay = 0.3
    server = RuntimeServer(slow)
    try:
        endpoint = Endpoint("127.0.0.1", server.port)
        calls = [Call(endpoint, GET_RUNTIME_METRIC, pb.MetricRequest(metric_name=USAGE),
                      pb.MetricResponse)] * 5
        for _ in range(3):
            started = time.monotonic()
            assert all(isinstance(r, pb.MetricResponse) for r in client.call_all(calls, 2.0))
            assert time.monotonic() - started < 1.0  # five 0.3 s calls at once
        ask(client, server.port)
        assert len(server.runtime.peers) == 16 and len(set(server.runtime.peers)) == 1
    finally:
        server.stop()


def test_each_call_on_a_kept_handle_sends_its_own_request_method_and_deadline(client):
    """Handles keep their options between calls and a request is set only when it
    changes: lone calls and rounds that alternate requests, methods and deadlines reach
    the server as each was made."""
    runtime = FakeRuntime(chips_metrics({0: GiB}))
    runtime.supported = [USAGE, DUTY_CYCLE]
    server = RuntimeServer(runtime)
    try:
        endpoint = Endpoint("127.0.0.1", server.port)
        order = [USAGE, USAGE, DUTY_CYCLE, USAGE, DUTY_CYCLE, DUTY_CYCLE]
        assert [ask(client, server.port, name).metric.name for name in order] == order
        assert runtime.requested == order
        listed = client.call(endpoint, LIST_SUPPORTED_METRICS, pb.ListSupportedMetricsRequest(),
                             pb.ListSupportedMetricsResponse, 2.0)
        assert [m.metric_name for m in listed.supported_metric] == [USAGE, DUTY_CYCLE]
        with pytest.raises(CallFailed, match="NOT_FOUND.*no.such.metric"):
            ask(client, server.port, "no.such.metric")
        for names in ([USAGE, DUTY_CYCLE], [DUTY_CYCLE, USAGE], [DUTY_CYCLE, DUTY_CYCLE, USAGE]):
            calls = [Call(endpoint, GET_RUNTIME_METRIC, pb.MetricRequest(metric_name=n),
                          pb.MetricResponse) for n in names]
            assert [r.metric.name for r in client.call_all(calls, 2.0)] == names
        runtime.delay = 0.3
        assert ask(client, server.port, DUTY_CYCLE, timeout=2.0).metric.name == DUTY_CYCLE
        started = time.monotonic()
        with pytest.raises(CallFailed, match="DEADLINE_EXCEEDED"):
            ask(client, server.port, DUTY_CYCLE, timeout=0.1)  # the same, a shorter deadline
        assert time.monotonic() - started < 0.25
        runtime.delay = 0.0
        assert ask(client, server.port, USAGE).metric.name == USAGE
        # one Call made again and again (as the agent's usage call), between others
        usage, duty = (Call(endpoint, GET_RUNTIME_METRIC, pb.MetricRequest(metric_name=n),
                            pb.MetricResponse) for n in (USAGE, DUTY_CYCLE))
        runtime.requested.clear()
        order = [usage, usage, duty, usage, duty, duty, usage]
        assert [client.call_all([c], 2.0)[0].metric.name for c in order] == \
            [c.request.metric_name for c in order] == runtime.requested
    finally:
        runtime.release()
        server.stop()


def test_a_connection_that_failed_a_call_is_not_used_again(client):
    """A reply refused mid-way leaves the rest of it on the wire: the next call dials a new
    connection instead of reading it."""
    runtime = Padded(chips_metrics({0: GiB}))
    server = RuntimeServer(runtime)
    small = UnaryClient(max_reply_bytes=1 << 20)
    try:
        assert ask(small, server.port).metric.metrics[0].gauge.as_int == GiB
        runtime.pad = 2 << 20
        with pytest.raises(CallFailed):
            ask(small, server.port)
        runtime.pad = 0
        assert ask(small, server.port).metric.metrics[0].gauge.as_int == GiB
        first, second, third = server.runtime.peers
        assert first == second != third
    finally:
        small.close()
        server.stop()


def test_a_status_from_the_server_is_its_name_and_message(client):
    server = RuntimeServer(FakeRuntime({}))
    try:
        with pytest.raises(CallFailed) as failed:
            ask(client, server.port, "no.such.metric")
        assert failed.value.status == "NOT_FOUND" and "no.such.metric" in failed.value.detail
        assert len({*server.runtime.peers}) == 1
    finally:
        server.stop()


def test_nothing_listening_is_unavailable_at_once_and_the_next_call_dials_again(client):
    port = free_port()
    started = time.monotonic()
    with pytest.raises(CallFailed) as failed:
        ask(client, port)
    assert failed.value.status == "UNAVAILABLE" and time.monotonic() - started < 1.0
    server = RuntimeServer(FakeRuntime(chips_metrics({0: GiB})), port=port)
    try:
        assert ask(client, port).metric.metrics[0].gauge.as_int == GiB
    finally:
        server.stop()


def test_a_server_restart_is_one_failed_call_at_most(client):
    server = RuntimeServer(FakeRuntime(chips_metrics({0: GiB})))
    port = server.port
    ask(client, port)
    server.stop()
    server = RuntimeServer(FakeRuntime(chips_metrics({0: 3 * GiB})), port=port)
    try:
        outcomes = []
        for _ in range(2):
            try:
                outcomes.append(ask(client, port).metric.metrics[0].gauge.as_int)
            except CallFailed as exc:
                outcomes.append(exc.status)
        assert outcomes[-1] == 3 * GiB and outcomes[0] in (3 * GiB, "UNAVAILABLE")
    finally:
        server.stop()


class Padded(FakeRuntime):
    """Answers with ``pad`` bytes of description around the usual reply."""

    pad = 0

    def GetRuntimeMetric(self, request, context):
        reply = super().GetRuntimeMetric(request, context)
        reply.metric.description = "x" * self.pad
        return reply


def test_a_reply_over_the_limit_is_refused_before_it_is_read():
    runtime = Padded(chips_metrics({0: GiB}))
    server = RuntimeServer(runtime)
    small = UnaryClient(max_reply_bytes=1 << 20)
    try:
        runtime.pad = (1 << 20) - 100
        assert ask(small, server.port).metric.metrics[0].gauge.as_int == GiB  # within
        runtime.pad = 5 << 20
        with pytest.raises(CallFailed) as failed:
            ask(small, server.port)
        assert failed.value.status == "RESOURCE_EXHAUSTED"
        assert "5.0 MiB" in failed.value.detail  # the announced length, never read
        runtime.pad = 0
        assert ask(small, server.port).metric.metrics[0].gauge.as_int == GiB  # afresh
    finally:
        small.close()
        server.stop()


class Peer:
    """A TCP listener on loopback that does ``behave(conn)`` with each connection."""

    def __init__(self, behave) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._behave = behave
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            try:
                self._behave(conn)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def continuation_flood(conn: socket.socket) -> None:
    """Answers the call with a header block that never ends (HTTP/2 CONTINUATION frames)."""
    from hyperframe.frame import ContinuationFrame, HeadersFrame, SettingsFrame
    conn.recv(65536)
    conn.sendall(SettingsFrame(0).serialize())
    headers = HeadersFrame(1)
    headers.data = b"\x88"  # ":status: 200", without END_HEADERS
    conn.sendall(headers.serialize())
    more = ContinuationFrame(1)
    more.data = b"\x00" * 16000
    frame = more.serialize()
    for _ in range(100_000):  # 1.6 GB unless the client hangs up first
        conn.sendall(frame)


# libcurl ends a call on a peer that breaks HTTP/2 as a failed receive (UNAVAILABLE) or an
# HTTP/2 error (UNKNOWN); the deadline is the backstop
BROKEN = {"UNKNOWN", "UNAVAILABLE", "DEADLINE_EXCEEDED"}


@pytest.mark.parametrize("behave, statuses", [
    (lambda conn: None, {"DEADLINE_EXCEEDED"}),  # accepts, never answers
    (lambda conn: conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n" * 100), BROKEN),
    (lambda conn: conn.sendall(bytes(range(256)) * 64), BROKEN),
    (lambda conn: conn.close(), {"UNAVAILABLE", "UNKNOWN"}),
    (continuation_flood, {"UNAVAILABLE", "UNKNOWN"}),
], ids=["silent", "http1", "garbage", "hang-up", "endless-headers"])
@pytest.mark.slow
def test_a_peer_that_is_not_grpc_is_a_status_within_the_deadline(client, behave, statuses):
    peer = Peer(behave)
    try:
        for _ in range(2):  # and again, on whatever connection is left
            started = time.monotonic()
            with pytest.raises(CallFailed) as failed:
                ask(client, peer.port, timeout=0.25)
            assert failed.value.status in statuses
            assert time.monotonic() - started < 1.0
    finally:
        peer.close()


def test_calls_to_several_endpoints_run_at_once_and_fail_alone(client):
    slow = FakeRuntime(chips_metrics({0: GiB}))
    slow.delay = 0.4
    servers = [RuntimeServer(slow), RuntimeServer(FakeRuntime(chips_metrics({1: 2 * GiB})))]
    dead = free_port()
    try:
        calls = [Call(Endpoint("127.0.0.1", port), GET_RUNTIME_METRIC,
                      pb.MetricRequest(metric_name=USAGE), pb.MetricResponse)
                 for port in (servers[0].port, servers[0].port, servers[1].port, dead)]
        started = time.monotonic()
        outcomes = client.call_all(calls, timeout=2.0)
        assert time.monotonic() - started < 0.8  # the two slow calls overlapped
        assert [o.metric.metrics[0].gauge.as_int for o in outcomes[:3]] == [GiB, GiB, 2 * GiB]
        assert isinstance(outcomes[3], CallFailed) and outcomes[3].status == "UNAVAILABLE"
    finally:
        for server in servers:
            server.stop()


def test_a_unix_socket_endpoint(tmp_path):
    import grpc
    from concurrent import futures
    from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_RuntimeMetricServiceServicer_to_server(
        FakeRuntime(chips_metrics({0: GiB})), server)
    path = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{path}")
    server.start()
    client = UnaryClient()
    try:
        reply = client.call(Endpoint(path=str(path)), GET_RUNTIME_METRIC,
                            pb.MetricRequest(metric_name=USAGE), pb.MetricResponse, 2.0)
        assert reply.metric.metrics[0].gauge.as_int == GiB
    finally:
        client.close()
        server.stop(None).wait(5)


def test_a_closed_client_fails_its_calls_instead_of_raising_another_error():
    client = UnaryClient()
    client.close()
    client.close()  # twice is harmless
    with pytest.raises(CallFailed) as failed:
        ask(client, 1)
    assert failed.value.status == "CANCELLED"


def test_statuses_and_messages_as_a_grpc_peer_sends_them():
    """Trailers (or Trailers-Only headers) as libcurl hands them over, one line each."""
    call = Call(Endpoint("127.0.0.1", 1), GET_RUNTIME_METRIC, pb.MetricRequest(),
                pb.MetricResponse)

    def outcome(*lines: bytes, http: int = 200):
        exchange = _Exchange(call, 1 << 20)
        for line in lines:
            exchange.header(line)
        return exchange.outcome(0, "", http)

    failed = outcome(b"HTTP/2 200\r\n", b"grpc-status: 5\r\n",
                     b"grpc-message: no metric caf%C3%A9 %25\r\n")
    assert (failed.status, failed.detail) == ("NOT_FOUND", "no metric café %")
    assert outcome(b"grpc-status: 17\r\n").status == "UNKNOWN"  # beyond the table
    assert outcome(b"grpc-status: " + b"9" * 5000 + b"\r\n").status == "UNKNOWN"
    assert outcome(b"Grpc-Status: 0\r\n").status == "INTERNAL"  # OK, but no message
    assert outcome(http=404).status == "UNIMPLEMENTED"  # no grpc-status: the HTTP status
    assert outcome(http=503).status == "UNAVAILABLE"


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.binary(max_size=64), max_size=6),
       headers=st.lists(st.binary(max_size=80), max_size=6))
def test_any_reply_bytes_and_headers_are_a_reply_or_a_status(chunks, headers):
    """What a peer sends reaches the write and header callbacks, which must never raise:
    pycurl would print the traceback and the poll would lose the call's reason."""
    exchange = _Exchange(Call(Endpoint("127.0.0.1", 1), GET_RUNTIME_METRIC,
                              pb.MetricRequest(), pb.MetricResponse), 32)
    for line in headers:
        exchange.header(line)
    for chunk in chunks:
        if exchange.write(chunk) == 0:
            break
    result = exchange.outcome(0, "", 200)
    assert isinstance(result, (pb.MetricResponse, CallFailed))
    if exchange.size > 32 and exchange.body[0] == 0:  # refused on its announced length
        assert result.status == "RESOURCE_EXHAUSTED"


def test_lone_calls_and_rounds_in_turn_hold_the_same_descriptors(client):
    """A lone call runs in an easy handle's perform, whose private multi handle libcurl
    closes when that handle joins a multi handle: the two paths keep handles apart, so the
    agent's descriptors stay put poll after poll (bench/soak.py checks them flat)."""
    server = RuntimeServer(FakeRuntime(chips_metrics({0: GiB})))
    try:
        endpoint = Endpoint("127.0.0.1", server.port)
        calls = [Call(endpoint, GET_RUNTIME_METRIC, pb.MetricRequest(metric_name=USAGE),
                      pb.MetricResponse)] * 3
        descriptors = []
        for _ in range(3):
            ask(client, server.port)
            descriptors.append(len(os.listdir("/proc/self/fd")))
            assert all(isinstance(r, pb.MetricResponse) for r in client.call_all(calls, 2.0))
            descriptors.append(len(os.listdir("/proc/self/fd")))
        assert len(set(descriptors)) == 1, descriptors
    finally:
        server.stop()
