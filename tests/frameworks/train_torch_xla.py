"""A small PyTorch/XLA training loop on CPU with the tpumon reporter, and optionally a
planted leak (every step's loss kept in a list: one more live XLA tensor per step, the
classic slow accumulation) or recompilation (a new batch shape every 10 steps).

    PJRT_DEVICE=CPU python train_torch_xla.py --steps 300 [--leak | --recompile]
"""

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch_xla  # noqa: E402

import loop_args  # noqa: E402
from tpumon.instrument import TorchXlaReporter  # noqa: E402


def main() -> None:
    args = loop_args.parse()
    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    reporter = TorchXlaReporter()
    kept = []
    for step in loop_args.steps(args):
        batch = 16 + step // 10 if args.recompile else 16  # a new shape every 10 steps
        x = torch.randn(batch, 32).to(device)
        y = torch.randn(batch, 1).to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if args.leak:
            kept.append(loss)  # the bug: a device tensor alive for the rest of the run
        torch_xla.sync()
        reporter.step(step)
    print(f"sent={reporter.sent} dropped={reporter.dropped} last={reporter.last_sent_step}",
          flush=True)


if __name__ == "__main__":
    main()
