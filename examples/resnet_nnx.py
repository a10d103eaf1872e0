"""Train a ResNet-style CNN (Flax NNX) under an activation-memory budget.

The network is a ``jaxremat.flax.RematSequential`` -- a drop-in for ``nnx.Sequential`` --
of a stem, residual blocks (conv, BatchNorm, ReLU, skip connection) and a classifier head.
It trains with ``optax.adamw`` on synthetic CIFAR-sized data (32x32x3, 10 classes: each
class is a fixed random pattern plus noise, so the loss can go down), prints the plan (which
activations are stored and which recomputed) and the loss.

    python examples/resnet_nnx.py                 # small, < 1 minute on a CPU
    python examples/resnet_nnx.py --budget 40%    # 40% of the no-remat activation memory
    python examples/resnet_nnx.py --budget 4MiB   # an absolute budget
    python examples/resnet_nnx.py --large         # GPU size; budget from the device

BatchNorm's running statistics are updated once per step exactly as without remat, and the
gradients equal the plain model's (tests/test_flax_nnx.py checks both).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxremat
from jaxremat.flax import RematSequential, remat_blocks


class Stem(nnx.Module):
    """3x3 convolution, BatchNorm, ReLU."""

    def __init__(self, channels: int, *, rngs: nnx.Rngs):
        self.conv = nnx.Conv(3, channels, (3, 3), use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(channels, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return nnx.relu(self.norm(self.conv(x)))


class ResidualBlock(nnx.Module):
    """Two 3x3 conv+BatchNorm with a skip connection (1x1 projection when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=stride, use_bias=False, rngs=rngs)
        self.norm1 = nnx.BatchNorm(cout, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), use_bias=False, rngs=rngs)
        self.norm2 = nnx.BatchNorm(cout, rngs=rngs)
        self.project = (
            nnx.Conv(cin, cout, (1, 1), strides=stride, use_bias=False, rngs=rngs)
            if stride != 1 or cin != cout else None
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.relu(self.norm1(self.conv1(x)))
        y = self.norm2(self.conv2(y))
        skip = x if self.project is None else self.project(x)
        return nnx.relu(y + skip)


class Head(nnx.Module):
    """Global average pooling and a linear classifier."""

    def __init__(self, channels: int, classes: int, *, rngs: nnx.Rngs):
        self.linear = nnx.Linear(channels, classes, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear(x.mean(axis=(1, 2)))


def resnet(widths, blocks_per_stage, classes, budget, *, rngs: nnx.Rngs) -> RematSequential:
    """A ResNet-style network as one RematSequential (stem, stages, head)."""
    layers = [Stem(widths[0], rngs=rngs)]
    cin = widths[0]
    for stage, cout in enumerate(widths):
        for block in range(blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(ResidualBlock(cin, cout, stride, rngs=rngs))
            cin = cout
    layers.append(Head(cin, classes, rngs=rngs))
    return RematSequential(*layers, budget=budget)


@remat_blocks("blocks", budget="60%")
class ResNet(nnx.Module):
    """The same network as a model class: stem and head around ``self.blocks``, which
    ``remat_blocks`` runs under a budget for the whole training step (its default
    ``scope="model"``: stem, blocks, head and loss, measured). ``resnet`` above budgets the
    network alone, as one RematSequential."""

    def __init__(self, widths, blocks_per_stage, classes, *, rngs: nnx.Rngs):
        self.stem = Stem(widths[0], rngs=rngs)
        blocks, cin = [], widths[0]
        for stage, cout in enumerate(widths):
            for block in range(blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                blocks.append(ResidualBlock(cin, cout, stride, rngs=rngs))
                cin = cout
        self.blocks = nnx.List(blocks)
        self.head = Head(cin, classes, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        return self.head(self.run_blocks(self.stem(images)))


def synthetic_cifar(seed: int, n: int, classes: int = 10):
    """``n`` 32x32x3 images: a fixed random pattern per class plus noise; integer labels."""
    rng = np.random.default_rng(seed)
    patterns = rng.normal(size=(classes, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, classes, size=n)
    images = patterns[labels] + 0.5 * rng.normal(size=(n, 32, 32, 3)).astype(np.float32)
    return jnp.asarray(images), jnp.asarray(labels)


def loss_fn(model: RematSequential, images: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@nnx.jit
def train_step(model, optimizer, images, labels):
    loss, grads = nnx.value_and_grad(loss_fn)(model, images, labels)
    optimizer.update(model, grads)
    return loss


def choose_budget(model: RematSequential, optimizer, spec: str | None):
    """The activation budget: ``spec`` as given (``"64MiB"``, or ``"50%"`` of the memory
    without remat); without one, what the device leaves (GPU) or 60% of no-remat (CPU)."""
    if spec is not None:
        return spec
    try:
        return jaxremat.budget_from_device(model, optimizer)
    except ValueError:  # CPU: the device reports no memory limit
        return "60%"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="GPU-sized model and batch")
    parser.add_argument("--budget", default=None,
                        help="bytes ('64MiB') or a share of the no-remat memory ('40%%')")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--plot", default=None, help="write the plan's PNG here")
    args = parser.parse_args(argv)

    if args.large:
        widths, blocks, batch, steps = (64, 128, 256, 512), 3, 256, 50
    else:
        widths, blocks, batch, steps = (8, 16, 32), 2, 16, 25
    steps = args.steps or steps

    images, labels = synthetic_cifar(0, 8 * batch)
    # XLA's CPU compiler takes seconds per 4-d shape for JAX's default ("partitionable")
    # threefry random bits; the conv kernels' initialisation is quick without it.
    with jax.threefry_partitionable(jax.default_backend() != "cpu"):
        model = resnet(widths, blocks, 10, "100%", rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3, weight_decay=1e-4), wrt=nnx.Param)
    model.budget = choose_budget(model, optimizer, args.budget)
    plan = model.plan(images[:batch])
    print(plan)
    if args.plot:
        print("plot:", plan.plot(args.plot))

    losses, start = [], time.perf_counter()
    for step in range(steps):
        lo = (step * batch) % len(images)
        loss = float(train_step(model, optimizer, images[lo:lo + batch], labels[lo:lo + batch]))
        losses.append(loss)
        if step % 5 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss:.4f}")
    print(f"{steps} steps in {time.perf_counter() - start:.1f} s "
          f"(first includes compilation); loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return {"initial_loss": losses[0], "final_loss": losses[-1], "losses": losses,
            "budget": plan.budget, "predicted_peak": plan.predicted_peak,
            "no_remat_peak": plan.no_remat_peak, "plan": plan}


if __name__ == "__main__":
    main()
