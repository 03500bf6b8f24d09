"""Probes the real PyTorch/XLA and JAX (on CPU) for the facts tpumon's reporters rely on.

Run: PJRT_DEVICE=CPU .venv-frameworks/bin/python scripts/probe_frameworks.py [torch|jax]
(after scripts/frameworks-venv). Prints what it finds; it asserts nothing.

For each framework it runs a tiny training loop twice, once clean and once with a planted
leak (each step's loss is kept in a list), printing the framework's live-object count per
step, and then the memory/compile introspection the reporters could use.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time

STEPS = 30


def _median_us(fn, n: int = 1000) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


def _growth(series: list[int]) -> list[int]:
    return [b - a for a, b in zip(series, series[1:])]


def _last_growth_step(series: list) -> int | None:
    """1-based step after which the series no longer changes (None: never settles)."""
    last = None
    for i in range(1, len(series)):
        if series[i] != series[i - 1]:
            last = i + 1
    return last if last is None or last < len(series) else None


# --------------------------------------------------------------------------- torch_xla
def probe_torch() -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    print(f"== torch {torch.__version__}, torch_xla {torch_xla.__version__}, "
          f"PJRT_DEVICE={os.environ['PJRT_DEVICE']}")
    dev = torch_xla.device()
    print(f"device: {dev} ({xm.xla_device_hw(dev)})")

    def cv(name):
        return met.counter_value(name)

    def run(leak: bool) -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 4).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(8, 16).to(dev)
        y = torch.randn(8, 4).to(dev)
        torch_xla.sync()
        leaked = []
        lives, uncached, cached = [], [], []
        print(f"-- torch_xla loop, leak={leak}")
        print("step create destroy live uncached cached")
        for step in range(1, STEPS + 1):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if leak:
                leaked.append(loss)
            torch_xla.sync()
            c, d = cv("CreateXlaTensor"), cv("DestroyXlaTensor")
            live = (c or 0) - (d or 0)
            u, k = cv("UncachedCompile"), cv("CachedCompile")
            lives.append(live)
            uncached.append(u)
            cached.append(k)
            print(f"{step:4d} {c} {d} {live} {u} {k}")
        del leaked
        g = _growth(lives)
        print(f"live growth per step (steps 2..{STEPS}): {g}")
        print(f"live growth over last 20 steps: {lives[-1] - lives[-21]} "
              f"({(lives[-1] - lives[-21]) / 20:+.2f}/step)")
        print(f"UncachedCompile last changed at step: {_last_growth_step(uncached)}; "
              f"final uncached={uncached[-1]} cached={cached[-1]}")

    run(leak=False)
    run(leak=True)

    print("-- counter names known now:", sorted(met.counter_names())[:60])
    print("-- metric names known now:", sorted(met.metric_names())[:60])

    print("-- xm.get_memory_info on", dev)
    try:
        info = xm.get_memory_info(dev)
        print(f"returned: {info!r}")
    except Exception as e:  # noqa: BLE001 - we want to see whatever it raises
        print(f"raised {type(e).__module__}.{type(e).__qualname__}: {e}")

    us = _median_us(lambda: (cv("CreateXlaTensor"), cv("DestroyXlaTensor"),
                             cv("UncachedCompile"), cv("CachedCompile")))
    print(f"-- reading 4 counters: median {us:.2f} us per read of all 4 (1000 calls); "
          f"one counter_value: {_median_us(lambda: cv('CreateXlaTensor')):.2f} us")
    print(f"-- met.short_metrics_report(): "
          f"{_median_us(met.short_metrics_report, 200):.1f} us median (200 calls)")

    print("-- xm.add_step_closure")
    seen = []
    t = torch.ones(2, device=dev) * 3
    xm.add_step_closure(lambda v, tag: seen.append((tag, v.cpu().tolist())), args=(t, "sync"))
    print(f"before sync: {seen}")
    torch_xla.sync()
    print(f"after torch_xla.sync(): {seen}")
    xm.add_step_closure(lambda: seen.append("async"), run_async=True)
    xm.mark_step()
    xm.wait_device_ops()
    print(f"after xm.mark_step() + wait_device_ops with run_async=True: {seen}")


# --------------------------------------------------------------------------- JAX
def probe_jax() -> None:
    import jax
    import jax.numpy as jnp
    import jax.monitoring

    print(f"== jax {jax.__version__}, jaxlib {jax.lib.__version__}, "
          f"backend {jax.default_backend()}, devices {jax.devices()}")
    print(f"memory_stats(): {jax.devices()[0].memory_stats()!r}")

    events: list[str] = []
    durations: list[tuple[str, float]] = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, secs, **kw: durations.append((name, secs)))

    def loss_fn(w, b, x, y):
        return jnp.mean((x @ w + b - y) ** 2)

    @jax.jit
    def step_fn(w, b, x, y):
        loss, (gw, gb) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w, b, x, y)
        return w - 0.1 * gw, b - 0.1 * gb, loss

    def run(leak: bool) -> None:
        key = jax.random.PRNGKey(0)
        kx, kw = jax.random.split(key)
        x = jax.random.normal(kx, (32, 8))
        true_w = jax.random.normal(kw, (8, 1))
        y = x @ true_w
        w, b = jnp.zeros((8, 1)), jnp.zeros((1,))
        del key, kx, kw, true_w
        leaked = []
        lives, caches = [], []
        print(f"-- jax loop, leak={leak}")
        print("step live_arrays cache_size loss")
        for step in range(1, STEPS + 1):
            w, b, loss = step_fn(w, b, x, y)
            if leak:
                leaked.append(loss)
            val = float(loss)
            del loss
            live = len(jax.live_arrays())
            lives.append(live)
            caches.append(step_fn._cache_size())
            print(f"{step:4d} {live} {caches[-1]} {val:.4f}")
        print(f"live growth per step: {_growth(lives)}")
        print(f"live growth over last 20 steps: {lives[-1] - lives[-21]} "
              f"({(lives[-1] - lives[-21]) / 20:+.2f}/step)")
        del leaked

    n_ev = len(events)
    run(leak=False)
    run(leak=True)

    print("-- compile counting")
    print(f"step_fn._cache_size() = {step_fn._cache_size()}")
    # A new shape forces a recompile: cache size and events should move by one.
    before_cache, before_ev, before_dur = step_fn._cache_size(), len(events), len(durations)
    step_fn(jnp.zeros((4, 1)), jnp.zeros((1,)), jnp.ones((2, 4)), jnp.ones((2, 1)))
    print(f"after a new input shape: _cache_size {before_cache} -> {step_fn._cache_size()}")
    new_ev = events[before_ev:]
    new_dur = [n for n, _ in durations[before_dur:]]
    print(f"monitoring events during that call: {sorted(set(new_ev))}")
    print(f"monitoring duration events during that call: {sorted(set(new_dur))}")
    print(f"all event names seen: {sorted(set(events[n_ev:]))}")
    print(f"all duration names seen: {sorted(set(n for n, _ in durations))}")
    compile_names = [n for n, _ in durations if "backend_compile" in n]
    print(f"count of '/jax/core/compile/backend_compile_duration'-like events so far: "
          f"{len(compile_names)} ({sorted(set(compile_names))})")

    # jax_log_compiles: logs "Compiling <name> ..." at WARNING on the 'jax' loggers.
    class H(logging.Handler):
        def __init__(self):
            super().__init__()
            self.msgs = []

        def emit(self, r):
            self.msgs.append(f"{r.name}: {r.getMessage()[:100]}")

    h = H()
    logging.getLogger("jax").addHandler(h)
    jax.config.update("jax_log_compiles", True)
    step_fn(jnp.zeros((3, 1)), jnp.zeros((1,)), jnp.ones((2, 3)), jnp.ones((2, 1)))
    jax.config.update("jax_log_compiles", False)
    print(f"jax_log_compiles messages for one new-shape call: {h.msgs}")

    us = _median_us(lambda: len(jax.live_arrays()))
    print(f"-- len(jax.live_arrays()) cost: median {us:.2f} us (1000 calls, "
          f"{len(jax.live_arrays())} live)")
    print(f"-- step_fn._cache_size() cost: median {_median_us(step_fn._cache_size):.2f} us")
    print(f"-- memory_stats() cost: median "
          f"{_median_us(jax.devices()[0].memory_stats):.2f} us")


if __name__ == "__main__":
    which = sys.argv[1:] or ["torch", "jax"]
    if "torch" in which:
        probe_torch()
    if "jax" in which:
        probe_jax()
