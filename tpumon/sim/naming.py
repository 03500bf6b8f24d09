"""How a simulated TPU VM names itself: the slice's accelerator type and the tpu-env
entries tpumon reads, as a real TPU VM's metadata has them.

Apart from tpumon.sim.pod (which runs simulated slices) so that an agent under --simulate
names its simulated host without importing the simulator's server and workloads, which
run in the simulator's own process (about 1 MiB of the agent's RSS, docs/benchmarks.md).
"""

from __future__ import annotations

DEFAULT_SLICE = "tpumon-sim"

#: TPU generation -> (accelerator type prefix, TensorCores per chip counted in its name)
_ACCELERATOR_NAMES = {"v4": ("v4", 2), "v5p": ("v5p", 2), "v5e": ("v5litepod", 1),
                      "v6e": ("v6e", 1)}


def accelerator_type(chip_type: str, chips_per_host: int, hosts: int) -> str:
    """Cloud TPU's name for the slice: v4 and v5p count TensorCores (4 v4 VMs of 4 chips
    are a v4-32), v5e and v6e count chips (v5litepod-16)."""
    prefix, cores = _ACCELERATOR_NAMES[chip_type]
    return f"{prefix}-{chips_per_host * hosts * cores}"


def worker_hostname(slice_name: str, worker: int | str) -> str:
    """A simulated slice's worker as a TPU VM names itself (t1v-n-SLICE-w-3): the agent
    attached to it, the simulated fleet and ``sim --write-trace --hosts`` all name it so,
    and analyze tells the hosts of one slice apart by the ``-w-N`` suffix."""
    return f"t1v-n-{slice_name}-w-{worker}"


def tpu_env(slice_name: str, worker: int, accelerator: str, ports: list[int]) -> dict[str, str]:
    """The tpu-env entries tpumon reads, as a TPU VM's metadata has them."""
    return {"ACCELERATOR_TYPE": accelerator, "NODE_ID": slice_name, "WORKER_ID": str(worker),
            "TPU_RUNTIME_METRICS_PORTS": ",".join(map(str, ports))}
