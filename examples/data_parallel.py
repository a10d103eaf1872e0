"""Data-parallel training of a rematerialized NNX model with ``jax.sharding``.

The batch is split over all devices of a 1-d ``Mesh`` (``NamedSharding(mesh,
P("data"))``), the parameters and optimizer state are replicated (``P()``), and the train
step is an ordinary ``nnx.jit`` function: XLA inserts the gradient all-reduce. The model is a
``jaxremat.flax.RematSequential`` of residual MLP blocks.

The example checks that the sharded, rematerialized step computes the same loss as an
unsharded one on the same model and batch, then trains and prints the loss going down.

On a CPU it creates 8 host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``,
set below before JAX is imported). On GPUs it uses the devices there are.

The budget: jaxremat profiles the global (logical) shapes, so the budget covers the whole
batch. Each device holds ``1/n`` of the activations, so pass ``n`` times the per-device
budget (here: ``--budget`` is per device and multiplied by the device count).

    python examples/data_parallel.py            # 8 CPU devices, < 1 minute
    python examples/data_parallel.py --large    # GPU sizes
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jaxremat  # noqa: E402
from jaxremat.flax import RematSequential  # noqa: E402


class Block(nnx.Module):
    """x + Linear(GELU(Linear(LayerNorm(x))))."""

    def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.up = nnx.Linear(dim, hidden, rngs=rngs)
        self.down = nnx.Linear(hidden, dim, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.down(nnx.gelu(self.up(self.norm(x))))


def make_model(features, dim, hidden, depth, outputs, budget, seed=0) -> RematSequential:
    rngs = nnx.Rngs(seed)
    layers = [nnx.Linear(features, dim, rngs=rngs)]
    layers += [Block(dim, hidden, rngs=rngs) for _ in range(depth)]
    layers += [nnx.Linear(dim, outputs, rngs=rngs)]
    return RematSequential(*layers, budget=budget)


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def eval_loss(model, x, y):
    return loss_fn(model, x, y)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="GPU-sized model and batch")
    parser.add_argument("--budget", default=None,
                        help="per-device budget in bytes ('64MiB'); default: 50%% of no-remat")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)

    devices = np.array(jax.devices())
    n = len(devices)
    if args.large:
        features, dim, hidden, depth, per_device, steps = 256, 1024, 4096, 16, 128, 50
    else:
        features, dim, hidden, depth, per_device, steps = 16, 32, 128, 6, 8, 30
    steps = args.steps or steps
    batch = per_device * n

    mesh = Mesh(devices, ("data",))
    data_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    key_x, key_w = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_x, (4 * batch, features))
    y = jnp.sin(x @ jax.random.normal(key_w, (features, 4)))

    # Global shapes: the budget covers the whole batch (n devices' worth).
    budget = "50%" if args.budget is None else n * jaxremat.parse_budget(args.budget)

    plain = make_model(features, dim, hidden, depth, 4, budget)
    sharded = make_model(features, dim, hidden, depth, 4, budget)
    # Replicate the parameters (and, below, the optimizer state) over the mesh.
    nnx.update(sharded, jax.device_put(nnx.state(sharded), replicated))
    optimizer = nnx.Optimizer(sharded, optax.adamw(3e-3), wrt=nnx.Param)
    nnx.update(optimizer, jax.device_put(nnx.state(optimizer), replicated))

    xb, yb = x[:batch], y[:batch]
    xs, ys = jax.device_put(xb, data_sharding), jax.device_put(yb, data_sharding)
    print(f"{n} devices ({devices[0].platform}); batch {batch} split as "
          f"{xs.sharding.shard_shape(xs.shape)} per device")
    print(sharded.plan(xs))

    # Same model, same batch: sharded + rematerialized vs. one device.
    loss_single = float(eval_loss(plain, xb, yb))
    loss_sharded = float(eval_loss(sharded, xs, ys))
    grads_single = nnx.jit(nnx.grad(loss_fn))(plain, xb, yb)
    grads_sharded = nnx.jit(nnx.grad(loss_fn))(sharded, xs, ys)
    grad_gap = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree.leaves(grads_single), jax.tree.leaves(grads_sharded)))
    print(f"loss unsharded {loss_single:.6f}   sharded {loss_sharded:.6f}   "
          f"max |grad difference| {grad_gap:.2e}")
    assert np.isclose(loss_single, loss_sharded, rtol=1e-5, atol=1e-6), (loss_single, loss_sharded)
    assert grad_gap < 1e-4, grad_gap

    losses, start = [], time.perf_counter()
    for step in range(steps):
        lo = (step * batch) % len(x)
        xs = jax.device_put(x[lo:lo + batch], data_sharding)
        ys = jax.device_put(y[lo:lo + batch], data_sharding)
        losses.append(float(train_step(sharded, optimizer, xs, ys)))
        if step % 5 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.5f}")
    print(f"{steps} steps in {time.perf_counter() - start:.1f} s; "
          f"loss {losses[0]:.5f} -> {losses[-1]:.5f}")
    return {"devices": n, "loss_unsharded": loss_single, "loss_sharded": loss_sharded,
            "grad_gap": grad_gap, "initial_loss": losses[0], "final_loss": losses[-1],
            "losses": losses}


if __name__ == "__main__":
    import json

    result = main()
    print("result:", json.dumps({k: v for k, v in result.items() if k != "losses"}))
