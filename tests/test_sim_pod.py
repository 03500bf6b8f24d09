"""The simulated slice (`tpumon sim --hosts N`): every host its own loopback address,
runtime and metadata server; agents attached to it label their series with the slice,
worker and accelerator type through the ordinary metadata code; the one-VM simulation
fills those labels too."""

from __future__ import annotations

import re
import subprocess

import pytest

from tools import TPUMON, AgentProcess, clean_env, wait_for
from tpumon.common.identity import fetch_metadata_attribute, fetch_tpu_env, parse_worker_endpoints
from tpumon.sim.pod import (SliceSpec, accelerator_type, host_address, host_scenario,
                            start_slice)
from tpumon.sim.workload import V4_HBM_TOTAL_BYTES
from tpumon.sources.chips import inventory_for
from tpumon.sources.tpu_runtime import TpuRuntimeSource


def test_accelerator_type_names_as_cloud_tpu_does():
    assert accelerator_type("v4", 4, 1) == "v4-8"
    assert accelerator_type("v4", 4, 4) == "v4-32"
    assert accelerator_type("v4", 4, 8) == "v4-64"
    assert accelerator_type("v5p", 4, 2) == "v5p-16"
    assert accelerator_type("v5e", 4, 4) == "v5litepod-16"
    assert accelerator_type("v6e", 8, 1) == "v6e-8"


def test_slice_scenarios_say_which_worker_runs_what():
    assert [host_scenario("slice-leak", k, 4) for k in range(4)] == ["linear-leak"] * 4
    assert [host_scenario("worker-leak", k, 4) for k in range(4)] == \
        ["healthy", "healthy", "healthy", "linear-leak"]
    assert [host_scenario("host-restart", k, 3) for k in range(3)] == \
        ["job-restart", "healthy", "healthy"]
    assert host_scenario("chip0-leak", 2, 4) == "chip0-leak"  # a host scenario: everywhere
    with pytest.raises(ValueError, match="unknown scenario 'nope'"):
        host_scenario("nope", 0, 1)


def test_host_addresses_stay_on_loopback():
    assert [host_address("127.0.0.1", k) for k in range(3)] == \
        ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    with pytest.raises(ValueError, match="not a loopback address"):
        host_address("10.0.0.1", 1)


def test_worker_network_endpoints_parse_as_on_a_tpu_vm():
    assert parse_worker_endpoints("x:y:10.0.0.11,x:y:10.0.0.12") == ["10.0.0.11", "10.0.0.12"]
    assert parse_worker_endpoints("") == []
    assert parse_worker_endpoints("garbage, a:b:10.0.0.3 ") == ["10.0.0.3"]


def test_every_simulated_host_has_its_identity_runtime_and_peers():
    spec = SliceSpec("worker-leak", hosts=3, chips=2, chip_type="v4",
                     hbm_total_bytes=V4_HBM_TOTAL_BYTES, acceleration=60.0, max_lag=90.0,
                     seed=1, slice_name="my-tpu")
    hosts = start_slice(spec, [0])
    try:
        for host in hosts:
            env = {"GCE_METADATA_HOST": host.metadata.address}
            tpu_env = fetch_tpu_env(2.0, env)
            assert tpu_env == {"ACCELERATOR_TYPE": "v4-12", "NODE_ID": "my-tpu",
                               "WORKER_ID": str(host.worker),
                               "TPU_RUNTIME_METRICS_PORTS": str(host.ports[0])}
            endpoints = fetch_metadata_attribute("worker-network-endpoints", 2.0, env)
            assert parse_worker_endpoints(endpoints) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
            assert host.metadata.address.startswith(f"{host.address}:")
            # The runtime answers on the host's own address, for its own chips.
            source = TpuRuntimeSource(host.address, host.ports, 2.0, inventory_for("v4", 2))
            try:
                reading = wait_for(source.poll, timeout=20)
            finally:
                source.close()
            assert sorted(reading.chips) == ["0", "1"]
        assert [h.scenario for h in hosts] == ["healthy", "healthy", "linear-leak"]
        assert [h.simulator.samples.workload.leak_bytes_per_step_by_chip[0] > 0
                for h in hosts] == [False, False, True]
        # one SPMD program steps at one pace on every host (each drew its own, and one
        # 1.3x slower than the rest fired TPUMonHostStepTimeOutlier in make demo-pod)
        paces = {h.simulator.samples.workload.params.step_time_s for h in hosts}
        assert len(paces) == 1, paces
    finally:
        for host in hosts:
            host.stop()


@pytest.mark.e2e
def test_agents_attached_to_a_simulated_slice_carry_its_labels(tmp_path):
    sim = subprocess.Popen([*TPUMON, "sim", "--hosts", "2", "--slice", "my-tpu", "--port", "0",
                            "--scenario", "slice-leak", "--acceleration", "60"],
                           stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        lines = [sim.stdout.readline() for _ in range(3)]  # two hosts, then ready
        assert lines[2].startswith("TPUMON_SIM_READY"), lines
        metadata = re.search(r"worker=1 address=127.0.0.2 ports=\d+ metadata=(\S+) "
                             r"scenario=linear-leak", lines[1]).group(1)
        labels = hbm_series_labels(AgentProcess(tmp_path, None, "--sim-host", metadata), "3")
        assert labels == ('accelerator_type="v4-16",chip="3",host="t1v-n-my-tpu-w-1",'
                          'slice="my-tpu",worker="1"')
    finally:
        sim.terminate()
        sim.wait(10)


def hbm_series_labels(agent: AgentProcess, chip: str) -> str:
    """The labels of the agent's tpumon_hbm_used_bytes series of ``chip``; stops it."""
    try:
        return wait_for(lambda: re.search(rf'tpumon_hbm_used_bytes{{(.*chip="{chip}".*)}}',
                                          agent.get("/metrics")), 30).group(1)
    finally:
        agent.stop()


@pytest.mark.e2e
def test_attaching_to_nothing_is_one_clear_error(tmp_path):
    from tools import free_port

    result = subprocess.run([*TPUMON, "agent", "--simulate", "--sim-host",
                             f"127.0.0.1:{free_port()}", "--listen-address", "127.0.0.1:0"],
                            capture_output=True, text=True, env=clean_env(), timeout=60)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "no simulated host's metadata there" in result.stderr.strip().splitlines()[-1]


@pytest.mark.e2e
def test_the_one_vm_simulation_fills_slice_worker_and_accelerator(tmp_path):
    labels = hbm_series_labels(AgentProcess(tmp_path, None), "0")
    assert re.fullmatch(r'accelerator_type="v4-8",chip="0",host="[^"]+",slice="tpumon-sim",'
                        r'worker="0"', labels), labels
