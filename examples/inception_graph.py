"""Train a Flax NNX network with inception-style branches using ``jaxremat.flax.RematModule``.

The blocks are not a chain of layers: each runs three convolution branches in parallel,
concatenates them, projects and normalises (BatchNorm), plus a residual connection.
``RematModule`` wraps the whole network: ``jaxremat.remat_graph`` plans on the dataflow graph
of its forward pass (Feng & Huang's checkpoints) and runs every rebuilt segment under its own
``jax.checkpoint``; BatchNorm statistics are updated once per step, as without remat. The
model trains with ``nnx.Optimizer`` (``optax.adamw``) under ``nnx.jit`` on a synthetic
classification task; the script prints the plan, the activation memory with and without
remat (program order, ``jaxremat.activation_memory``) and the loss.

    python examples/inception_graph.py                 # least memory, < 1 minute on a CPU
    python examples/inception_graph.py --budget 60%    # least recompute within 60% of the memory
    python examples/inception_graph.py --large         # GPU size
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxremat
from jaxremat.flax import RematModule


class InceptionBlock(nnx.Module):
    """x + norm(proj(concat(conv1x1(x), conv3x3(conv1x1(x)), conv5x5(x)))), with ReLUs."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs):
        branch = channels // 2
        self.a = nnx.Conv(channels, branch, (1, 1), rngs=rngs)
        self.b1 = nnx.Conv(channels, branch, (1, 1), rngs=rngs)
        self.b2 = nnx.Conv(branch, branch, (3, 3), rngs=rngs)
        self.c = nnx.Conv(channels, branch, (5, 5), rngs=rngs)
        self.proj = nnx.Conv(3 * branch, channels, (1, 1), use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(channels, rngs=rngs)

    def __call__(self, x):
        a = nnx.relu(self.a(x))
        b = nnx.relu(self.b2(nnx.relu(self.b1(x))))
        c = nnx.relu(self.c(x))
        return x + self.norm(self.proj(jnp.concatenate([a, b, c], axis=-1)))


class InceptionNet(nnx.Module):
    def __init__(self, channels: int, blocks: int, classes: int, *, rngs: nnx.Rngs):
        self.stem = nnx.Conv(3, channels, (3, 3), rngs=rngs)
        self.blocks = nnx.List([InceptionBlock(channels, rngs=rngs) for _ in range(blocks)])
        self.head = nnx.Linear(channels, classes, rngs=rngs)

    def __call__(self, x):
        h = nnx.relu(self.stem(x))
        for block in self.blocks:
            h = nnx.relu(block(h))
        return self.head(jnp.mean(h, axis=(1, 2)))


def synthetic_images(key: jax.Array, n: int, size: int, classes: int):
    """Noisy images with a random colour cast, labelled by a fixed linear map of the cast."""
    kx, kc, kw = jax.random.split(key, 3)
    cast = jax.random.normal(kc, (n, 1, 1, 3))
    x = cast + 0.5 * jax.random.normal(kx, (n, size, size, 3))
    w = jax.random.normal(kw, (3, classes))
    return x, jnp.argmax(cast.reshape(n, 3) @ w, axis=-1)


def activation_memory(model: nnx.Module, loss_fn, *args) -> int:
    """``jaxremat.activation_memory`` of ``loss_fn(model, *args)`` over the model's parameters."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return jaxremat.activation_memory(
        lambda p, *a: loss_fn(nnx.merge(graphdef, p, rest, copy=True), *a), params, *args)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--large", action="store_true", help="GPU size")
    parser.add_argument("--budget", default=None,
                        help="activation budget for remat_graph, e.g. '60%%' or '4MiB' (default: least memory)")
    args = parser.parse_args(argv)
    channels, blocks, size, batch = (128, 8, 32, 128) if args.large else (16, 4, 16, 32)
    classes = 4

    model = RematModule(InceptionNet(channels, blocks, classes, rngs=nnx.Rngs(0)), args.budget)
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)

    def loss_fn(model, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    @nnx.jit
    def step(model, optimizer, x, y):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

    x_all, y_all = synthetic_images(jax.random.PRNGKey(1), batch * 8, size, classes)
    plan = model.plan(x_all[:batch])
    print(f"jaxremat plan: {plan}")
    plain, remat = (activation_memory(m, loss_fn, x_all[:batch], y_all[:batch]) for m in (model.module, model))
    print(f"activation memory: plain {jaxremat.format_bytes(plain)}, "
          f"remat_graph {jaxremat.format_bytes(remat)} ({remat / plain:.2f}x)")
    losses, start = [], time.perf_counter()
    for i in range(args.steps):
        lo = (i % 8) * batch
        loss = step(model, optimizer, x_all[lo:lo + batch], y_all[lo:lo + batch])
        losses.append(float(loss))
        if i % 10 == 0 or i == args.steps - 1:
            print(f"step {i:3d}  loss {losses[-1]:.3f}")
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s")
    return {"losses": losses, "graph_plan": plan, "plain_memory": plain, "remat_memory": remat}


if __name__ == "__main__":
    main()
