"""The runtime's other metrics end to end: the simulator's real gRPC server (tpu-info's
stubs) -> the agent's runtime source -> the exporter, every family with its labels, the
output clean under promtool; and the values move with the workload (a stall, a slow DCN)."""

import json
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tpu_info import metrics as tpu_info_metrics

from test_sim_server import ManualClock
from tools import require_tool
from tpumon.agent.loop import Agent, AgentInputs, OwnerScanner
from tpumon.metrics.collectors import build_registry
from tpumon.common.identity import LABELS, Identity
from tpumon.sim.server import Simulator
from tpumon.sim.workload import Workload
from tpumon.sources.chips import inventory_for
from tpumon.sources.runtime_catalog import CATALOG
from tpumon.sources.tpu_runtime import TpuRuntimeSource
from tpumon.state import AgentState

IDENT = Identity(host="t1v-n-0a1b2c3d-w-3", worker="3", accelerator_type="v4-32", slice="pod-a")


@pytest.fixture
def simulated():
    started = []

    def start(scenario, at, ports=(0,)):
        workload = Workload(scenario, seed=5, start_time=0.0)
        clock = ManualClock(at)
        sim = Simulator(workload, clock, "127.0.0.1", list(ports), 4)
        sim.start()
        source = TpuRuntimeSource("127.0.0.1", sim.ports, 1.0, inventory_for("v4", 4),
                                  runtime_clock=True)
        started.append((sim, source))
        return workload, clock, sim, source

    yield start
    for sim, source in started:
        source.close()
        sim.stop()


def scrape(source):
    state = AgentState(IDENT, inventory_for("v4", 4))
    registry = build_registry(lambda: state.current)
    Agent(AgentInputs(state, source, OwnerScanner(dict, 60), 1.0, registry)).poll_once()
    return generate_latest(registry).decode()


def test_every_runtime_family_with_its_labels_and_promtool_clean(simulated):
    _, clock, sim, source = simulated("healthy", 3600.0, ports=(0, 0))
    text = scrape(source)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for spec in CATALOG:
        family = families[spec.family]
        assert family.type == spec.kind, spec.family
        assert family.samples, f"{spec.family}: no series"
        for sample in family.samples:
            assert set(sample.labels) >= set(LABELS) | set(spec.labels), sample
            assert sample.labels["host"] == IDENT.host and sample.labels["slice"] == "pod-a"
        values = {s.labels.get("chip") for s in family.samples}
        if spec.key != "buffer":
            assert values == {"0", "1", "2", "3"}, spec.family  # both ports' devices
        else:
            assert {s.labels["buffer_size"] for s in family.samples} == {"1MiB", "16MiB"}
    listed = [s for s in families["tpumon_runtime_metric_supported"].samples]
    assert len(listed) == len(CATALOG) + 3 and all(s.value == 1 for s in listed)
    assert source.malformed_total == 0
    result = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text,
                            text=True, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def family_values(source, family):
    return {s.labels: s for s in source.poll().series if s.family == family}


def test_a_stall_drops_duty_cycle_empties_the_queue_and_stops_hlo_executions(simulated):
    workload, clock, sim, source = simulated("stall", 0.0)
    p = workload.params
    begin = p.warmup_s + p.stall_after_s
    clock.t = begin - 60
    before = source.poll()
    hlo = [s for s in before.series if s.family == "tpumon_hlo_execution_seconds"]
    counts_before = sum(s.histogram.count for s in hlo)
    assert min(c.duty_cycle for c in before.chips.values()) > 0.8
    clock.t = begin + p.stall_s / 2
    during = source.poll()
    assert max(c.duty_cycle for c in during.chips.values()) < 0.05
    by = {(s.family, s.labels): s for s in during.series}
    assert by[("tpumon_hlo_queue_size", ("0", "TPU_CORE_TYPE_TENSOR_CORE"))].value == 0
    assert by[("tpumon_tensorcore_idle_seconds", ("0",))].value > 60
    assert by[("tpumon_hbm_bandwidth_utilization_ratio", ("0",))].value < 0.05
    clock.t = begin + p.stall_s - 1
    counts_late = sum(s.histogram.count for s in source.poll().series
                      if s.family == "tpumon_hlo_execution_seconds")
    clock.t = begin + p.stall_s + 120
    after = source.poll()
    assert min(c.duty_cycle for c in after.chips.values()) > 0.8
    counts_after = sum(s.histogram.count for s in after.series
                       if s.family == "tpumon_hlo_execution_seconds")
    assert counts_late - counts_before < 4 * 60 / p.step_time_s  # the minute before only
    assert counts_after > counts_late  # executing again


def mean_latency(reading, family="tpumon_dcn_transfer_latency_seconds"):
    hs = [s.histogram for s in reading.series if s.family == family]
    return sum(h.sum for h in hs) / sum(h.count for h in hs)


def test_slow_dcn_raises_this_hosts_dcn_latency_not_its_host_transfers(simulated):
    workload, clock, sim, source = simulated("slow-dcn", 0.0)
    at = workload.params.dcn_slow_after_s
    clock.t = at - 600
    source.poll()
    clock.t = at - 1
    base = source.poll()
    dcn_before, h2d_before = mean_latency(base), mean_latency(
        base, "tpumon_host_to_device_transfer_latency_seconds")
    assert 100e-6 < dcn_before < 2e-3  # hundreds of microseconds
    clock.t = at + 3600  # an hour of slow transfers outweighs the 40 minutes before
    late = source.poll()
    assert mean_latency(late) > 2 * dcn_before
    assert mean_latency(late, "tpumon_host_to_device_transfer_latency_seconds") == \
        pytest.approx(h2d_before, rel=0.3)


def test_tpu_info_reads_the_simulated_metrics_too(simulated):
    _, clock, sim, _ = simulated("healthy", 3600.0)
    addr = f"127.0.0.1:{sim.ports[0]}"
    util = tpu_info_metrics.get_runtime_hbm_utilization(addr)
    assert [d for d, _ in util] == [0, 1, 2, 3] and all(0 < u < 100 for _, u in util)
    clock.t += 600
    latencies = tpu_info_metrics.get_transfer_latency("buffer_transfer_latency", addr)
    assert {d.transfer_size for d in latencies} == {"1MiB", "16MiB"}
    assert all(100 < d.p50 < 20000 for d in latencies)  # microseconds


def tpumon(*args):
    from test_cli import run
    return run(*args)


@pytest.mark.slow
def test_status_metric_and_list_metrics_read_the_runtime_like_tpu_info(simulated):
    from test_cli import assert_one_line_error
    _, clock, sim, source = simulated("healthy", 3000.0)
    source.poll()  # the simulated runtime's counters start at this look
    clock.t = 3600.0
    port = str(sim.ports[0])
    listed = tpumon("status", "--direct", "--runtime-ports", port, "--list-metrics",
                    "--format", "json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["runtime_metric"]: r for r in json.loads(listed.stdout)["metrics"]}
    assert len(rows) == len(CATALOG) + 3
    assert rows[CATALOG[0].runtime_name]["tpumon_metric"] == CATALOG[0].family
    doc = json.loads(tpumon("status", "--direct", "--runtime-ports", port, "--metric",
                            "buffer_transfer_latency", "--format", "json").stdout)
    assert doc["tpumon_metric"] == "tpumon_dcn_transfer_latency_seconds"
    sizes = {s["buffer_size"]: s for s in doc["series"]}
    assert set(sizes) == {"1MiB", "16MiB"}
    small = sizes["1MiB"]
    assert small["count"] > 1000 and 1e-4 < small["p50"] <= small["p90"] <= small["p99.9"] < 0.1
    table = tpumon("status", "--direct", "--runtime-ports", port, "--metric",
                   "tpumon_hbm_bandwidth_utilization_ratio")
    assert table.returncode == 0 and " %" in table.stdout and "Chip" in table.stdout
    timing = tpumon("status", "--direct", "--runtime-ports", port, "--metric", "hlo_exec_timing")
    assert "p99.9" in timing.stdout and " ms" in timing.stdout
    assert_one_line_error(tpumon("status", "--direct", "--runtime-ports", port, "--metric",
                                 "no_such_metric"), "Error: --metric no_such_metric", "unknown")
    for core in ("hbm_usage", "duty_cycle_percent", "tpumon_hbm_used_bytes"):
        # listed by --list-metrics, shown by status itself: said so, not "unknown"
        assert core in listed.stdout
        assert_one_line_error(tpumon("status", "--direct", "--runtime-ports", port,
                                     "--metric", core), f"Error: --metric {core}",
                              "without --metric")
    # piped, the table keeps every name whole (rich cut them at 80 columns: 'hlo.execution.t…')
    piped = tpumon("status", "--direct", "--runtime-ports", port, "--list-metrics")
    assert piped.returncode == 0 and "…" not in piped.stdout
    for row in rows.values():
        assert row["runtime_metric"] in piped.stdout and row["tpumon_metric"] in piped.stdout
