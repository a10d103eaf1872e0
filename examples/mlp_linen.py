"""Train a deep Flax Linen MLP whose layers rematerialize under a memory budget.

``jaxremat.flax.linen.RematSequential(layers=[...], budget=...)`` replaces
``nn.Sequential``: each layer here is a residual block (Dense, LayerNorm, GELU, Dropout).
Training uses plain ``optax`` (``adamw``; ``lamb`` at the large size) and ``model.apply(..., rngs={"dropout": key})``
on a synthetic regression task (targets from a fixed random two-layer network), and prints
the plan and the loss (``optax.lamb`` at the large size: see ``main``).

    python examples/mlp_linen.py               # small, < 1 minute on a CPU
    python examples/mlp_linen.py --budget 40%  # 40% of the no-remat activation memory
    python examples/mlp_linen.py --large       # GPU size
"""

from __future__ import annotations

import argparse
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxremat.flax.linen import RematSequential


class ResidualMLPBlock(nn.Module):
    """x + Dropout(GELU(Dense(LayerNorm(x))))."""

    width: int
    dropout: float = 0.1
    train: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.Dense(self.width)(nn.LayerNorm()(x))
        h = nn.Dense(x.shape[-1])(nn.gelu(h))
        return x + nn.Dropout(self.dropout, deterministic=not self.train)(h)


def mlp(dim: int, hidden: int, depth: int, outputs: int, budget, train: bool = True):
    """A RematSequential: input projection, ``depth`` residual blocks, a final LayerNorm
    (without it the residual stream of a deep stack grows and Adam diverges at the large
    size, with or without remat) and the output projection."""
    layers = [nn.Dense(dim)]
    layers += [ResidualMLPBlock(hidden, train=train) for _ in range(depth)]
    layers += [nn.LayerNorm(), nn.Dense(outputs)]
    return RematSequential(layers=layers, budget=budget)


def synthetic_regression(key: jax.Array, n: int, features: int, outputs: int):
    """Inputs and targets of a fixed random tanh network."""
    k_x, k_w1, k_w2 = jax.random.split(key, 3)
    x = jax.random.normal(k_x, (n, features))
    w1 = jax.random.normal(k_w1, (features, 64)) / jnp.sqrt(features)
    w2 = jax.random.normal(k_w2, (64, outputs)) / 8.0
    return x, jnp.tanh(x @ w1) @ w2


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="GPU-sized model and batch")
    parser.add_argument("--budget", default="50%",
                        help="bytes ('256MiB') or a share of the no-remat memory ('50%%')")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)

    if args.large:
        features, dim, hidden, depth, batch, steps = 256, 1024, 4096, 24, 1024, 100
    else:
        features, dim, hidden, depth, batch, steps = 16, 64, 256, 8, 64, 60
    steps = args.steps or steps

    x, y = synthetic_regression(jax.random.key(0), 8 * batch, features, 4)
    model = mlp(dim, hidden, depth, 4, args.budget)
    variables = model.init({"params": jax.random.key(1), "dropout": jax.random.key(2)},
                           x[:batch])
    params = variables["params"]
    plan = model.apply(variables, x[:batch], method="plan",
                       rngs={"dropout": jax.random.key(0)})
    print(plan)

    # At the large size Adam's first steps (every weight moves by about the learning rate)
    # throw the deep residual stack far off, with or without remat (the losses match a plain
    # nn.Sequential step for step); LAMB's per-layer trust ratio keeps them in scale.
    tx = optax.lamb(1e-3) if args.large else optax.adamw(1e-3)
    opt_state = tx.init(params)

    def loss_fn(params, xb, yb, key):
        pred = model.apply({"params": params}, xb, rngs={"dropout": key})
        return jnp.mean((pred - yb) ** 2)

    @jax.jit
    def train_step(params, opt_state, xb, yb, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses, start, key = [], time.perf_counter(), jax.random.key(3)
    for step in range(steps):
        key, sub = jax.random.split(key)
        lo = (step * batch) % len(x)
        params, opt_state, loss = train_step(params, opt_state, x[lo:lo + batch],
                                             y[lo:lo + batch], sub)
        losses.append(float(loss))
        if step % 10 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {losses[-1]:.5f}")
    print(f"{steps} steps in {time.perf_counter() - start:.1f} s "
          f"(first includes compilation); loss {losses[0]:.5f} -> {losses[-1]:.5f}")
    return {"initial_loss": losses[0], "final_loss": losses[-1], "losses": losses,
            "budget": plan.budget, "predicted_peak": plan.predicted_peak,
            "no_remat_peak": plan.no_remat_peak, "plan": plan}


if __name__ == "__main__":
    main()
