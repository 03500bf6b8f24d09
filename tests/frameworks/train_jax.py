"""A small JAX training loop on CPU with the tpumon reporter, and optionally a planted
leak (every step's loss array kept in a list) or recompilation (a new batch shape every
few steps).

    python train_jax.py --steps 300 [--leak | --recompile]
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import loop_args  # noqa: E402
from tpumon.instrument import JaxReporter  # noqa: E402


def loss_fn(params, x, y):
    w, b = params
    return jnp.mean((x @ w + b - y) ** 2)


@jax.jit
def train_step(params, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return [p - 0.01 * g for p, g in zip(params, grads, strict=True)], loss


def main() -> None:
    args = loop_args.parse()
    rng = np.random.default_rng(0)  # host-side data: only train_step compiles per shape
    params = [jnp.zeros((32, 1)), jnp.zeros((1,))]
    reporter = JaxReporter()
    kept = []
    for step in loop_args.steps(args):
        batch = 16 + step // 10 if args.recompile else 16  # a new shape every 10 steps
        x = rng.standard_normal((batch, 32), dtype=np.float32)
        y = rng.standard_normal((batch, 1), dtype=np.float32)
        params, loss = train_step(params, x, y)
        loss.block_until_ready()
        if args.leak:
            kept.append(loss)  # the bug: a device array alive for the rest of the run
        reporter.step(step)
    print(f"sent={reporter.sent} dropped={reporter.dropped} last={reporter.last_sent_step}",
          flush=True)


if __name__ == "__main__":
    main()
