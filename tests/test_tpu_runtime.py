"""The runtime source against a real gRPC server built from tpu-info's stubs."""

import time

import pytest

from fake_runtime import V4_TOTAL, chips_metrics, gauge_entry
from tools import free_port, wait_for
from tpu_info.proto import tpu_metric_service_pb2 as pb
from tpumon.sources.chips import ChipInventory, inventory_for
from tpumon.sources.health import SourceUnavailable
from tpumon.sources.tpu_runtime import DUTY_CYCLE, TOTAL, USAGE, TpuRuntimeSource

V4x4 = inventory_for("v4", 4)
UNKNOWN = ChipInventory(None, 0)


def source(ports, inventory=V4x4, timeout=1.0):
    return TpuRuntimeSource("localhost", ports, timeout, inventory)


def test_reads_every_chip_by_device_id(runtime_servers):
    used = {0: 10 * 2**30, 1: 11 * 2**30, 2: 12 * 2**30, 3: 13 * 2**30}
    metrics = chips_metrics(used, duty=87.5)
    metrics[USAGE].reverse()  # answers in another order than the totals: must not matter
    server = runtime_servers(metrics)
    reading = source([server.port]).poll()
    assert sorted(reading.chips) == ["0", "1", "2", "3"]
    assert reading.missing == ()
    for device, value in used.items():
        chip = reading.chips[str(device)]
        assert chip.hbm_used_bytes == value
        assert chip.hbm_total_bytes == V4_TOTAL
        assert chip.duty_cycle == pytest.approx(0.875)
        assert chip.port == server.port


def test_matches_totals_by_id_not_position(runtime_servers):
    metrics = {
        USAGE: [gauge_entry(2, 200), gauge_entry(0, 100)],
        TOTAL: [gauge_entry(0, 1000), gauge_entry(2, 2000)],
        DUTY_CYCLE: [gauge_entry(2, 20.0), gauge_entry(0, 10.0)],
    }
    reading = source([runtime_servers(metrics).port], UNKNOWN).poll()
    assert (reading.chips["0"].hbm_total_bytes, reading.chips["2"].hbm_total_bytes) == (1000, 2000)
    assert (reading.chips["0"].duty_cycle, reading.chips["2"].duty_cycle) == (0.1, 0.2)


def test_partial_answer_reports_missing_chip(runtime_servers):
    metrics = chips_metrics({0: 1, 1: 2, 3: 4})
    reading = source([runtime_servers(metrics).port]).poll()
    assert sorted(reading.chips) == ["0", "1", "3"]
    assert reading.missing == ("2",)


def test_missing_total_falls_back_to_last_known_then_spec(runtime_servers):
    server = runtime_servers(chips_metrics({0: 5, 1: 6}))
    src = source([server.port])
    assert src.poll().chips["1"].hbm_total_bytes == V4_TOTAL
    server.runtime.metrics[TOTAL] = [gauge_entry(0, V4_TOTAL)]  # device 1's total vanishes
    assert src.poll().chips["1"].hbm_total_bytes == V4_TOTAL  # last known
    fresh = source([server.port]).poll()
    assert fresh.chips["1"].hbm_total_bytes == V4x4.hbm_bytes_per_device  # spec value


def test_missing_duty_cycle_is_none_not_zero(runtime_servers):
    metrics = chips_metrics({0: 5})
    del metrics[DUTY_CYCLE]
    chip = source([runtime_servers(metrics).port]).poll().chips["0"]
    assert chip.duty_cycle is None and chip.hbm_used_bytes == 5


def test_hung_runtime_hits_the_deadline(runtime_servers):
    server = runtime_servers(chips_metrics({0: 1}))
    server.runtime.delay = 30
    src = source([server.port], timeout=0.3)
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match="did not answer within 0.3 s"):
        src.poll()
    assert time.monotonic() - started < 1.5
    assert src.ports_up == {server.port: False}


def test_the_calls_to_one_port_run_at_once_within_one_deadline(runtime_servers):
    """A slow runtime costs one wait per poll, not one per call: usage, total and duty
    cycle are all in flight together (each would be cut off if they went in turn)."""
    server = runtime_servers(chips_metrics({0: 1}))
    server.runtime.delay = 0.4
    src = source([server.port], timeout=1.0)
    started = time.monotonic()
    reading = src.poll()
    assert time.monotonic() - started < 0.9
    assert sorted(server.runtime.requested[:3]) == sorted([USAGE, TOTAL, DUTY_CYCLE])
    assert reading.chips["0"].duty_cycle is not None and reading.chips["0"].hbm_total_bytes


def test_no_runtime_is_a_reported_state_and_polling_resumes(runtime_servers):
    port = free_port()
    src = source([port])
    with pytest.raises(SourceUnavailable, match=f"no runtime answering on localhost:{port}"):
        src.poll()
    with pytest.raises(SourceUnavailable):
        src.poll()
    runtime_servers(chips_metrics({0: 42}), port=port)  # the next job starts

    def answered():
        try:
            return src.poll()
        except SourceUnavailable:
            return None

    started = time.monotonic()
    reading = wait_for(answered, timeout=10)
    assert reading.chips["0"].hbm_used_bytes == 42
    assert time.monotonic() - started < 5  # reconnect back-off is capped, not gRPC's 120 s


def test_several_ports_merge_and_fail_independently(runtime_servers):
    a = runtime_servers(chips_metrics({0: 10, 1: 11}))
    b = runtime_servers(chips_metrics({2: 12, 3: 13}))
    src = source([a.port, b.port])
    reading = src.poll()
    assert {c: s.hbm_used_bytes for c, s in reading.chips.items()} == {
        "0": 10, "1": 11, "2": 12, "3": 13}
    assert reading.chips["3"].port == b.port
    b.stop()
    reading = src.poll()
    assert sorted(reading.chips) == ["0", "1"] and reading.missing == ("2", "3")
    assert src.ports_up == {a.port: True, b.port: False}


def test_per_process_ports_numbering_from_zero_are_named_by_port(runtime_servers):
    servers = [runtime_servers(chips_metrics({0: 100 + i})) for i in range(4)]
    src = source([s.port for s in servers])
    reading = src.poll()
    assert {c: s.hbm_used_bytes for c, s in reading.chips.items()} == {
        "0": 100, "1": 101, "2": 102, "3": 103}
    servers[0].stop()  # a partial answer later must keep the same naming
    reading = src.poll()
    assert {c: s.hbm_used_bytes for c, s in reading.chips.items()} == {
        "1": 101, "2": 102, "3": 103}


def test_malformed_entries_are_counted_and_skipped(runtime_servers):
    metrics = chips_metrics({0: 7, 1: 8})
    metrics[USAGE] += [
        pb.Metric(gauge=pb.Gauge(as_int=5)),  # no device id
        pb.Metric(attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=2)),
                  counter=pb.Counter(as_int=3)),  # a counter, not a gauge
        gauge_entry(1, 999),  # duplicate id: not trusted
    ]
    src = source([runtime_servers(metrics).port], UNKNOWN)
    reading = src.poll()
    assert sorted(reading.chips) == ["0", "1"]
    assert reading.chips["1"].hbm_used_bytes == 8
    assert src.malformed_total == 3


def test_unknown_metric_on_server_leaves_port_down(runtime_servers):
    server = runtime_servers({})
    with pytest.raises(SourceUnavailable, match="NOT_FOUND"):
        source([server.port]).poll()


def test_one_connection_is_reused_across_polls(runtime_servers):
    server = runtime_servers(chips_metrics({0: 1}))
    src = source([server.port])
    for _ in range(5):
        src.poll()
    assert server.runtime.calls == 15
    assert len(set(server.runtime.peers)) == 1  # same client address:port every call


def test_runtime_timestamps_are_used_only_when_asked(runtime_servers):
    from tpumon.sim.server import gauge_metric
    metrics = {name: [gauge_metric(0, 7, timestamp=1750000123.5)]
               for name in (USAGE, TOTAL, DUTY_CYCLE)}
    port = runtime_servers(metrics).port
    simulated = TpuRuntimeSource("localhost", [port], 1.0, UNKNOWN, clock=lambda: 42.0,
                                 runtime_clock=True)
    assert simulated.poll().time == pytest.approx(1750000123.5)
    assert source([port], UNKNOWN).poll().time == pytest.approx(time.time(), abs=5)


def test_total_and_duty_cycle_are_asked_for_at_their_own_slower_cadence(runtime_servers):
    """Usage every poll; total memory and duty cycle once per ``slow_interval``, their last
    values standing in between (a call costs ~1 ms of CPU; the agent polls every second)."""
    server = runtime_servers(chips_metrics({0: 5 * 2**30}, duty=40.0))
    src = TpuRuntimeSource("localhost", [server.port], 1.0, V4x4, slow_interval=3600)
    assert src.poll().chips["0"].duty_cycle == pytest.approx(0.40)
    assert sorted(server.runtime.requested) == sorted([USAGE, TOTAL, DUTY_CYCLE])
    server.runtime.metrics.update(chips_metrics({0: 6 * 2**30}, duty=90.0))
    server.runtime.requested.clear()
    chip = src.poll().chips["0"]
    assert server.runtime.requested == [USAGE]
    assert chip.hbm_used_bytes == 6 * 2**30  # usage is fresh
    assert chip.duty_cycle == pytest.approx(0.40) and chip.hbm_total_bytes == V4_TOTAL
    src.slow_interval, src._slow_due = 0.0, 0.0  # 0: all three every poll
    assert src.poll().chips["0"].duty_cycle == pytest.approx(0.90)
    src.poll()
    assert server.runtime.requested.count(DUTY_CYCLE) == 2


def test_a_port_that_comes_up_between_slow_rounds_is_asked_for_its_total_next(runtime_servers):
    first = runtime_servers(chips_metrics({0: 2**30}))
    late_port = free_port()
    src = TpuRuntimeSource("localhost", [first.port, late_port], 1.0, UNKNOWN,
                           slow_interval=3600)
    src.poll()  # the slow round: the late port is down
    late = runtime_servers(chips_metrics({1: 3 * 2**30}, total=V4_TOTAL // 2), port=late_port)
    wait_for(lambda: "1" in src.poll().chips, 20)
    assert TOTAL not in late.runtime.requested  # usage only: not its turn
    assert src.poll().chips["1"].hbm_total_bytes == V4_TOTAL // 2
    assert late.runtime.requested.count(TOTAL) == 1
