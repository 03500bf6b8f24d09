"""A training process that reports its steps for a while, then dies one way.

    python dying.py WAY [--seconds 2]

WAY: jax-oom (``jnp.zeros((1 << 40,))``: XLA's out-of-memory error, raised for real),
torch-oom (``torch.zeros((1 << 38,), device=xla)`` then ``sync()``), mark-sharding-cpu
(SPMD: ``xs.mark_sharding`` on a model still on the CPU), thread (an uncaught exception in
a worker thread, then a normal exit), abort (SIGABRT from native code: libc's abort()),
exit3 (``os._exit(3)``), sleep (reports, then sleeps until killed: SIGKILL from outside).
The process's own excepthook and atexit handler print a line each, to show they still ran.
"""

import argparse
import atexit
import os
import sys
import threading
import time


TORCH_WAYS = ("torch-oom", "mark-sharding-cpu")


def install_users_hooks() -> None:
    """An excepthook (chained to the one installed before it: the reporter's) and an
    atexit handler of the user's own, each printing a line when it runs."""
    previous = sys.excepthook

    def users_hook(kind, value, tb):
        print("users excepthook ran", flush=True)
        previous(kind, value, tb)

    sys.excepthook = users_hook  # installed after the reporter's: chains to it
    atexit.register(lambda: print("users atexit ran", flush=True))


def report_steps(reporter, seconds: float) -> int:
    """Report a step every 10 ms for ``seconds``; the last step reported."""
    start, step = time.monotonic(), 0
    while time.monotonic() - start < seconds:  # the agent sees the job first
        step += 1
        reporter.step(step)
        time.sleep(0.01)
    return step


def load():
    """The worker thread's target (WAY thread): it raises."""
    raise ValueError("bad record 17 in shard 3")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("way")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if args.way in TORCH_WAYS:
        import torch
        import torch_xla
        import torch_xla.runtime as xr
        if args.way == "mark-sharding-cpu":
            xr.use_spmd()
        from tpumon.instrument import TorchXlaReporter
        reporter = TorchXlaReporter()
    else:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import jax.numpy as jnp
        from tpumon.instrument import JaxReporter
        reporter = JaxReporter()
    install_users_hooks()
    step = report_steps(reporter, args.seconds)
    print(f"dying at step {step}", flush=True)
    if args.way == "jax-oom":
        jnp.zeros((1 << 40,)).block_until_ready()
    elif args.way == "torch-oom":
        big = torch.zeros((1 << 38,), device=torch_xla.device())
        torch_xla.sync()
        print(big.sum())
    elif args.way == "mark-sharding-cpu":
        import numpy as np
        import torch_xla.distributed.spmd as xs
        mesh = xs.Mesh(np.arange(xr.global_runtime_device_count()),
                       (xr.global_runtime_device_count(), 1), ("data", "model"))
        model = torch.nn.Linear(64, 64)  # the bug: not moved to the XLA device first
        xs.mark_sharding(model.weight, mesh, ("data", "model"))
    elif args.way == "thread":
        worker = threading.Thread(target=load, name="loader")
        worker.start()
        worker.join()
    elif args.way == "abort":
        import ctypes
        ctypes.CDLL(None).abort()
    elif args.way == "exit3":
        os._exit(3)
    elif args.way == "sleep":
        time.sleep(600)
    else:
        raise SystemExit(f"unknown way {args.way}")


if __name__ == "__main__":
    main()
