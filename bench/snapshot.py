"""Live-tensor snapshots and creation-site tracking: what they cost (issue 10).

Run with the frameworks' venv: ``.venv-frameworks/bin/python bench/snapshot.py``. Each
framework is measured in its own process (both on CPU):

1. ``snapshot()`` with ~100, ~1,000 and ~10,000 live tensors (arrays), median of
   repeats, with and without creation sites, and the number of objects
   ``gc.get_objects()`` walks at the time (torch_xla's snapshot is that walk).
2. Tracking's overhead on a small training loop: the median step time with tracking
   off and on, in alternating blocks of steps (drift in the loop's own speed falls on
   both alike), and the cost per torch function call. For torch_xla, also a do-nothing
   ``TorchFunctionMode``: what any such mode costs, before the tracker's own work. For
   JAX, "tracking" is jaxlib's traceback recording (its default), off vs on.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

SIZES = (100, 1000, 10000)
SHAPES = [(4,), (8, 8), (16,), (3, 5), (2, 2, 2), (), (32,), (1, 7), (64,), (5,)]


from timing import median_ms  # noqa: E402 - bench/ is on sys.path


def alternate(step, on, off, blocks: int = 16, per_block: int = 40) -> tuple[float, float]:
    """Median step time (s) with tracking off and on, blocks of steps alternating."""
    times = {True: [], False: []}
    for b in range(blocks):
        tracked = b % 2 == 1
        (on if tracked else off)()
        for i in range(per_block):
            t0 = time.perf_counter()
            step(i)
            times[tracked].append(time.perf_counter() - t0)
    off()
    return statistics.median(times[False]), statistics.median(times[True])


# -- torch_xla ---------------------------------------------------------------------------

def torch_xla_bench() -> None:
    import torch
    import torch_xla
    from torch.overrides import BaseTorchFunctionMode

    from tpumon.instrument import live_torch_xla

    device = torch_xla.device()
    tracker = live_torch_xla.SiteTracker()
    print("\n### torch_xla 2.9 (CPU): snapshot cost\n")
    print("| live XLA tensors | gc objects walked | snapshot | with sites | JSON |")
    print("|---|---|---|---|---|")
    kept: list = []
    for n in SIZES:
        tracker.start()  # the kept tensors get sites
        while len(kept) < n:
            kept.append(torch.zeros(SHAPES[len(kept) % len(SHAPES)], device=device))
        tracker.stop()
        torch_xla.sync()
        objects = len(gc.get_objects())
        repeats = 30 if n < 10000 else 10
        plain = median_ms(lambda: live_torch_xla.snapshot(1), repeats)
        sited = median_ms(lambda: live_torch_xla.snapshot(1, tracker), repeats)
        snap = live_torch_xla.snapshot(1, tracker)
        print(f"| {snap.total_count:,} | {objects:,} | {plain:.1f} ms | {sited:.1f} ms | "
              f"{len(snap.to_json()):,} B |")
    del kept

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(i: int) -> None:
        x = torch.randn(16, 32).to(device)
        y = torch.randn(16, 1).to(device)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        torch_xla.sync()

    for i in range(100):
        step(i)
    calls = count_torch_calls(step)
    bare = BaseTorchFunctionMode()
    off, on = alternate(step, tracker.start, tracker.stop)
    off2, empty = alternate(step, lambda: bare.__enter__(), lambda: _exit_if_on(bare))
    print("\n### torch_xla: site tracking on a small training loop (2-layer MLP, SGD, "
          f"{calls} torch function calls a step)\n")
    print("| | median step | overhead | per torch call |")
    print("|---|---|---|---|")
    print(f"| tracking off | {off * 1e3:.2f} ms | | |")
    print(f"| tracking on | {on * 1e3:.2f} ms | {(on / off - 1) * 100:+.1f}% | "
          f"{(on - off) / calls * 1e6:+.1f} us |")
    print(f"| (an empty TorchFunctionMode) | {empty * 1e3:.2f} ms | "
          f"{(empty / off2 - 1) * 100:+.1f}% | "
          f"{(empty - off2) / calls * 1e6:+.1f} us |")


def _exit_if_on(mode) -> None:
    import torch
    if torch._C._len_torch_function_stack():
        mode.__exit__(None, None, None)


def count_torch_calls(step) -> int:
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step(0)
    return Count.n


# -- JAX -----------------------------------------------------------------------------------

def jax_bench() -> None:
    import jax
    import jax.numpy as jnp
    import jaxlib._jax as jaxlib

    from tpumon.instrument import live_jax

    tracker = live_jax.SiteTracker()
    print(f"\n### JAX {jax.__version__} (CPU): snapshot cost\n")
    print("| live arrays | snapshot (no sites) | with sites | JSON |")
    print("|---|---|---|---|")
    kept: list = []
    for n in SIZES:
        while len(kept) < n:
            kept.append(jnp.zeros(SHAPES[len(kept) % len(SHAPES)]) + len(kept))
        repeats = 30 if n < 10000 else 10
        plain = median_ms(lambda: live_jax.snapshot(1), repeats)
        sited = median_ms(lambda: live_jax.snapshot(1, tracker), repeats)
        snap = live_jax.snapshot(1, tracker)
        print(f"| {snap.total_count:,} | {plain:.1f} ms | {sited:.1f} ms | "
              f"{len(snap.to_json()):,} B |")
    del kept

    @jax.jit
    def update(w, x, y):
        grad = jax.grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - 0.01 * grad, jnp.mean(grad)

    state = {"w": jnp.zeros((32, 1))}
    x, y = jnp.ones((16, 32)), jnp.ones((16, 1))

    def step(i: int) -> None:
        state["w"], loss = update(state["w"], x, y)
        (loss + 1).block_until_ready()  # a jitted call and an op-by-op one

    for i in range(200):
        step(i)
    off, on = alternate(step, lambda: jaxlib.set_tracebacks_enabled(True),
                        lambda: jaxlib.set_tracebacks_enabled(False), blocks=40, per_block=250)
    jaxlib.set_tracebacks_enabled(True)
    print("\n### JAX: jaxlib's traceback recording (what sites come from) on a small jitted "
          "loop\n")
    print("| | median step | overhead |")
    print("|---|---|---|")
    print(f"| recording off | {off * 1e6:.1f} us | |")
    print(f"| recording on (JAX's default) | {on * 1e6:.1f} us | {(on - off) * 1e6:+.1f} us "
          f"({(on / off - 1) * 100:+.1f}%) |")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        {"torch_xla": torch_xla_bench, "jax": jax_bench}[sys.argv[1]]()
    else:
        for framework in ("torch_xla", "jax"):
            done = subprocess.run([sys.executable, __file__, framework])
            if done.returncode:
                print(f"\n({framework}: not measured, exit status {done.returncode})")
