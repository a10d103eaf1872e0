"""Train a Flax NNX network with inception-style branches using ``jaxremat.remat_graph``.

The blocks are not a chain of layers: each runs three convolution branches in parallel
and concatenates them, plus a residual connection. ``remat_graph`` plans on the dataflow
graph of the whole forward pass (Feng & Huang's least-memory checkpoints) and runs every
rebuilt segment under its own ``jax.checkpoint``. The model is used functionally
(``nnx.split`` / ``nnx.merge``) inside a plain ``optax`` training step under ``jax.jit``,
on a synthetic classification task; the script prints the plan, the activation memory with
and without remat (program order, ``jaxremat.activation_memory``) and the loss.

    python examples/inception_graph.py                 # small, < 1 minute on a CPU
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


class InceptionBlock(nnx.Module):
    """x + proj(concat(conv1x1(x), conv3x3(conv1x1(x)), conv5x5(x))), with ReLUs."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs):
        branch = channels // 2
        self.a = nnx.Conv(channels, branch, (1, 1), rngs=rngs)
        self.b1 = nnx.Conv(channels, branch, (1, 1), rngs=rngs)
        self.b2 = nnx.Conv(branch, branch, (3, 3), rngs=rngs)
        self.c = nnx.Conv(channels, branch, (5, 5), rngs=rngs)
        self.proj = nnx.Conv(3 * branch, channels, (1, 1), rngs=rngs)

    def __call__(self, x):
        a = nnx.relu(self.a(x))
        b = nnx.relu(self.b2(nnx.relu(self.b1(x))))
        c = nnx.relu(self.c(x))
        return x + self.proj(jnp.concatenate([a, b, c], axis=-1))


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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--large", action="store_true", help="GPU size")
    parser.add_argument("--budget", default=None,
                        help="activation budget for remat_graph, e.g. '60%%' or '4MiB' (default: least memory)")
    args = parser.parse_args(argv)
    channels, blocks, size, batch = (128, 8, 32, 128) if args.large else (16, 4, 16, 32)
    classes = 4

    model = InceptionNet(channels, blocks, classes, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)

    def forward(params, x):
        return nnx.merge(graphdef, params)(x)

    remat_forward = jaxremat.remat_graph(forward, args.budget)

    def loss_fn(params, x, y, run=remat_forward):
        logits = run(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    optimizer = optax.adamw(3e-3)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    x_all, y_all = synthetic_images(jax.random.PRNGKey(1), batch * 8, size, classes)
    plan = remat_forward.plan(params, x_all[:batch])
    print(f"jaxremat plan: {plan}")
    plain = jaxremat.activation_memory(lambda p, x, y: loss_fn(p, x, y, forward), params,
                                       x_all[:batch], y_all[:batch])
    remat = jaxremat.activation_memory(loss_fn, params, x_all[:batch], y_all[:batch])
    print(f"activation memory: plain {jaxremat.format_bytes(plain)}, "
          f"remat_graph {jaxremat.format_bytes(remat)} ({remat / plain:.2f}x)")
    losses, start = [], time.perf_counter()
    for i in range(args.steps):
        lo = (i % 8) * batch
        params, opt_state, loss = step(params, opt_state, x_all[lo:lo + batch], y_all[lo:lo + batch])
        losses.append(float(loss))
        if i % 10 == 0 or i == args.steps - 1:
            print(f"step {i:3d}  loss {losses[-1]:.3f}")
    print(f"{args.steps} steps in {time.perf_counter() - start:.1f} s")
    return {"losses": losses, "graph_plan": plan, "plain_memory": plain, "remat_memory": remat}


if __name__ == "__main__":
    main()
