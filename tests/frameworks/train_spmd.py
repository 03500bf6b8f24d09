"""A PyTorch/XLA SPMD training loop on 4 CPU devices with the tpumon reporter: the pattern
of multi-host TPUv4 jobs, where each step's batch is moved to the device and sharded with
``xs.mark_sharding``, and (``--mark-function``) activations and parameters are annotated
with ``MarkShardingFunction`` inside the forward pass. Planted bugs: ``--leak`` keeps every
step's sharded activation (f32[16,64], one live tensor a step); ``--host-leak`` keeps a
host-side numpy copy of each step's batch (RSS grows, HBM would not).

    CPU_NUM_DEVICES=4 PJRT_DEVICE=CPU python train_spmd.py --steps 2000 [--leak]
"""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "4")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402
from torch_xla.distributed.spmd.xla_sharding import MarkShardingFunction  # noqa: E402

import loop_args  # noqa: E402
from tpumon.instrument import TorchXlaReporter  # noqa: E402


class Model(torch.nn.Module):
    def __init__(self, mesh: xs.Mesh, mark_function: bool) -> None:
        super().__init__()
        self.mesh, self.mark_function = mesh, mark_function
        self.first, self.second = torch.nn.Linear(32, 64), torch.nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mark_function:  # the seed's own pattern: parameters and activations
            weight = MarkShardingFunction.apply(self.first.weight, self.mesh, (None, None))
            h = torch.relu(torch.nn.functional.linear(x, weight, self.first.bias))
            h = MarkShardingFunction.apply(h, self.mesh, ("data", None))
        else:
            h = torch.relu(self.first(x))
        self.hidden = h
        return self.second(h)


def main() -> None:
    args = loop_args.parse()
    xr.use_spmd()
    devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(devices), (devices, 1), ("data", "model"))
    device = torch_xla.device()
    torch.manual_seed(0)
    model = Model(mesh, args.mark_function).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    reporter = TorchXlaReporter()
    kept, host_kept = [], []
    for step in loop_args.steps(args):
        cpu_batch = torch.randn(16, 32)
        x = cpu_batch.to(device)
        xs.mark_sharding(x, mesh, ("data", None))  # every step: the input, sharded
        y = torch.randn(16, 1).to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if args.leak:
            kept.append(model.hidden)  # the bug: an activation alive for the rest of the run
        if args.host_leak:
            host_kept.append(np.ones((64, 1024), dtype=np.float32))  # 256 KiB a step, host
        torch_xla.sync()
        reporter.step(step)
    print(f"sent={reporter.sent} dropped={reporter.dropped} last={reporter.last_sent_step}",
          flush=True)


if __name__ == "__main__":
    main()
