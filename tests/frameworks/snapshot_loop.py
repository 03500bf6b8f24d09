"""A small training loop (PyTorch/XLA or JAX, on CPU) that takes two live-tensor snapshots
through its reporter, 50 steps apart, and prints them with what it checked around each
snapshot: live tensor counts, framework counters, whether a tensor it let go died.

    python snapshot_loop.py torch_xla|jax [--keep-loss] [--keep-big-every N] [--track]

--keep-loss keeps every step's loss (+1 f32[] per step); --keep-big-every N keeps a
f32[256,1024] every N steps; --track turns creation-site tracking on at step 20 (from the
step boundary, as the agent's request would) and off after the second snapshot.
Lines marked "# SITE:name" are where the kept tensors are created (the test reads them).
"""

import argparse
import json
import os
import sys
import weakref

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

FIRST, SECOND, TRACK_FROM = 50, 100, 20


def torch_xla_loop(args):
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    from tpumon.instrument import TorchXlaReporter

    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    reporter = TorchXlaReporter(socket="/nonexistent/tpumon.sock", track_sites=args.track)
    kept, out = [], {}

    def counters():
        names = met.counter_names()
        return {**{n: met.counter_value(n) for n in names},
                **{n: met.metric_data(n)[0] for n in met.metric_names()}}

    def live():
        return met.counter_value("CreateXlaTensor") - met.counter_value("DestroyXlaTensor")

    def checked_snapshot(step, label):
        gone = torch.ones(3, device=device) * step  # pending IR: a snapshot must not run it
        ref = weakref.ref(gone)
        xm.wait_device_ops()  # the step's execution ends (ExecuteTime) before, not during
        before, live_before = counters(), live()
        snap = reporter.take_snapshot(step)
        after, live_after = counters(), live()
        del gone
        out[label] = snap.to_json().decode()
        out[label + "_checks"] = {
            "changed": {k: (before.get(k), v) for k, v in after.items() if before.get(k) != v},
            "live": [live_before, live_after], "released": ref() is None,
            "mode_stack": torch._C._len_torch_function_stack(),
        }

    for step in range(1, SECOND + 1):
        x = torch.randn(16, 32).to(device)
        y = torch.randn(16, 1).to(device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)  # SITE:loss
        loss.backward()
        optimizer.step()
        if args.keep_loss:
            kept.append(loss)
        if args.keep_big_every and step % args.keep_big_every == 0:
            kept.append(torch.zeros(256, 1024, device=device))  # SITE:big
        torch_xla.sync()
        after_step(reporter, step, args, out, checked_snapshot)
    reporter.stop_tracking()
    out["mode_stack_after_stop"] = torch._C._len_torch_function_stack()
    return out


def jax_loop(args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tpumon.instrument import JaxReporter

    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.append(event) if "compile" in event else None)

    from train_jax import train_step  # the same small model as the agent tests' loop

    rng = np.random.default_rng(0)
    params = [jnp.zeros((32, 1)), jnp.zeros((1,))]
    reporter = JaxReporter(socket="/nonexistent/tpumon.sock", track_sites=args.track)
    kept, out = [], {}

    def checked_snapshot(step, label):
        gone = jnp.ones(3) * step
        ref = weakref.ref(gone)
        n_before, compiled = len(jax.live_arrays()), len(compiles)
        with jax.transfer_guard("disallow"):  # no copy to or from a device, implicit or not
            snap = reporter.take_snapshot(step)
        n_after = len(jax.live_arrays())
        del gone
        out[label] = snap.to_json().decode()
        out[label + "_checks"] = {"changed": len(compiles) - compiled, "live": [n_before, n_after],
                                  "released": ref() is None}

    for step in range(1, SECOND + 1):
        x = rng.standard_normal((16, 32), dtype=np.float32)
        y = rng.standard_normal((16, 1), dtype=np.float32)
        params, loss = train_step(params, x, y)  # SITE:loss
        loss.block_until_ready()
        if args.keep_loss:
            kept.append(loss)
        if args.keep_big_every and step % args.keep_big_every == 0:
            kept.append(jnp.zeros((256, 1024)))  # SITE:big
        after_step(reporter, step, args, out, checked_snapshot)
    reporter.stop_tracking()
    return out


def after_step(reporter, step, args, out, checked_snapshot):
    """The step boundary: report, start tracking at TRACK_FROM, snapshot at FIRST, SECOND."""
    reporter.step(step)
    if args.track and step == TRACK_FROM:
        out["started"] = reporter.start_tracking()
    if step in (FIRST, SECOND):
        checked_snapshot(step, "first" if step == FIRST else "second")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("framework", choices=["torch_xla", "jax"])
    parser.add_argument("--keep-loss", action="store_true")
    parser.add_argument("--keep-big-every", type=int, default=0)
    parser.add_argument("--track", action="store_true")
    args = parser.parse_args()
    out = (torch_xla_loop if args.framework == "torch_xla" else jax_loop)(args)
    sys.stdout.write("RESULT " + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
