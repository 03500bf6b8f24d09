"""A simulated multi-host slice: N simulated TPU VMs on loopback, one workload each.

Host ``k`` (worker k) gets its own loopback address (127.0.0.1 + k: all of 127/8 is
loopback on Linux, so every simulated VM can serve the same ports, as real workers do),
its own simulated runtime on those ports, and its own metadata server whose ``tpu-env``
names the slice, the worker and the accelerator type and whose
``worker-network-endpoints`` lists every worker, as on a Cloud TPU VM. An agent attached
to it (``tpumon agent --simulate --sim-host ADDRESS``) takes its identity and runtime
ports from there through the ordinary metadata code.

Slice scenarios say which host runs which workload; any single-host scenario name runs
on every host.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Callable

from tpumon.common.config import Config, ConfigError
from tpumon.sim.metadata import MetadataServer, render_tpu_env
from tpumon.sim.naming import DEFAULT_SLICE, accelerator_type, tpu_env
from tpumon.sim.server import SimClock, Simulator
from tpumon.sim.workload import SCENARIOS, Workload

#: name -> (description, the scenario of worker k of n)
SLICE_SCENARIOS: dict[str, tuple[str, Callable[[int, int], str]]] = {
    "slice-leak": ("Every chip of every host leaks (a leak in the SPMD program itself).",
                   lambda k, n: "linear-leak"),
    "worker-leak": ("Only the last worker's chips leak (one host's input pipeline, say); "
                    "the others are healthy.",
                    lambda k, n: "linear-leak" if k == n - 1 else "healthy"),
    "host-restart": ("Worker 0's job dies and restarts from a checkpoint; the others are "
                     "healthy.", lambda k, n: "job-restart" if k == 0 else "healthy"),
}

def known_scenarios() -> list[str]:
    return [*SCENARIOS, *SLICE_SCENARIOS]


def check_scenario(config: Config) -> None:
    """ConfigError, naming where ``simulator.scenario`` came from, unless the simulator
    has that scenario: checked where a simulation starts and by ``tpumon config check``."""
    value, known = config["simulator.scenario"], known_scenarios()
    if value not in known:
        raise ConfigError(f"{config.origins['simulator.scenario']}: simulator.scenario must "
                          f"be one of {', '.join(known)} (got {value!r})")


def host_scenario(scenario: str, worker: int, hosts: int) -> str:
    """The workload scenario that worker ``worker`` of ``hosts`` runs."""
    if scenario in SLICE_SCENARIOS:
        return SLICE_SCENARIOS[scenario][1](worker, hosts)
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(known_scenarios())}")
    return scenario


def host_address(base: str, worker: int) -> str:
    """Worker k's loopback address: the base address plus k."""
    address = ipaddress.IPv4Address(base) + worker
    if not address.is_loopback:
        raise ValueError(f"{base} + {worker} is not a loopback address")
    return str(address)


def worker_network_endpoints(addresses: list[str]) -> str:
    """The metadata attribute listing the slice's workers, worker 0 first."""
    return ",".join(f"{k}:sim:{address}" for k, address in enumerate(addresses))


@dataclass
class SimulatedHost:
    """One VM of the simulated slice."""

    worker: int
    address: str
    scenario: str
    simulator: Simulator
    metadata: MetadataServer | None = None

    @property
    def ports(self) -> list[int]:
        return self.simulator.ports

    def stop(self) -> None:
        self.simulator.stop()
        if self.metadata is not None:
            self.metadata.close()


@dataclass(frozen=True)
class SliceSpec:
    """What to simulate: the slice's shape, its workload and its pace."""

    scenario: str
    hosts: int
    chips: int
    chip_type: str
    hbm_total_bytes: int
    acceleration: float
    max_lag: float
    seed: int
    slice_name: str = DEFAULT_SLICE
    base_address: str = "127.0.0.1"


def start_slice(spec: SliceSpec, ports: list[int]) -> list[SimulatedHost]:
    """Start every host's runtime and metadata server; stops what started if one fails.
    Each host has its own clock (its own agent is its reader) and seed (seed + worker);
    all step at worker 0's pace, as the hosts of one SPMD program do."""
    accelerator = accelerator_type(spec.chip_type, spec.chips, spec.hosts)
    addresses = [host_address(spec.base_address, k) for k in range(spec.hosts)]
    hosts: list[SimulatedHost] = []
    pace: dict[str, tuple[float, float]] = {}  # worker 0's step time, once drawn
    try:
        for k, address in enumerate(addresses):
            clock = SimClock(spec.acceleration, max_lag=spec.max_lag)
            scenario = host_scenario(spec.scenario, k, spec.hosts)
            # one SPMD program: every host steps at worker 0's pace (a host drawing its own
            # runs up to 1.3x slower than the rest and fires TPUMonHostStepTimeOutlier)
            workload = Workload(scenario, chips=spec.chips, hbm_total_bytes=spec.hbm_total_bytes,
                                seed=spec.seed + k, start_time=clock.now(), **pace)
            step_time = workload.params.step_time_s
            pace = pace or {"step_time_s": (step_time, step_time)}
            host = SimulatedHost(k, address, scenario,
                                 Simulator(workload, clock, address, list(ports), spec.chips))
            hosts.append(host)
            host.simulator.start()
        endpoints = worker_network_endpoints(addresses)
        for host in hosts:
            env = tpu_env(spec.slice_name, host.worker, accelerator, host.ports)
            host.metadata = MetadataServer({"tpu-env": render_tpu_env(env),
                                            "worker-network-endpoints": endpoints,
                                            "accelerator-type": accelerator,
                                            "agent-worker-number": str(host.worker)},
                                           host=host.address)
    except BaseException:
        for host in hosts:
            host.stop()
        raise
    return hosts
