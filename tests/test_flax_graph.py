"""``jaxremat.flax.RematModule``: any NNX module with remat_graph's checkpoints. Gradients
(dropout on), BatchNorm statistics, RNG counters and parameters after training steps equal
the plain module's; the budget bounds measured memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxremat import activation_memory
from jaxremat.flax import RematModule

DIM, BATCH = 16, 16


class Branchy(nnx.Module):
    """Two branches, concatenated, then BatchNorm, Dropout and a residual connection."""

    def __init__(self, rngs: nnx.Rngs):
        self.a = nnx.Linear(DIM, DIM, rngs=rngs)
        self.b1 = nnx.Linear(DIM, DIM, rngs=rngs)
        self.b2 = nnx.Linear(DIM, DIM, rngs=rngs)
        self.proj = nnx.Linear(2 * DIM, DIM, use_bias=False, rngs=rngs)  # BatchNorm follows
        self.norm = nnx.BatchNorm(DIM, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs)

    def __call__(self, x):
        a = jnp.tanh(self.a(x))
        b = jnp.sin(self.b2(jnp.tanh(self.b1(x))))
        return x + self.dropout(self.norm(self.proj(jnp.concatenate([a, b], -1))))


class Net(nnx.Module):
    def __init__(self, depth: int = 4, seed: int = 0):
        rngs = nnx.Rngs(seed, dropout=seed + 100)
        self.blocks = nnx.List([Branchy(rngs) for _ in range(depth)])
        self.head = nnx.Linear(DIM, 4, rngs=rngs)

    def __call__(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(0), (BATCH, DIM))


def loss_fn(model, x):
    return jnp.mean(model(x) ** 2)


def run_steps(model, x, steps=3):
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(loss_fn)(model, x)
        optimizer.update(model, grads)
        return loss, grads

    losses, grads = [], []
    for _ in range(steps):
        loss, g = step(model, optimizer, x)
        losses.append(float(loss))
        grads.append(g)
    return losses, grads[0], nnx.state(model)


def leaves_close(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) > 0
    for u, v in zip(la, lb):
        if jnp.issubdtype(u.dtype, jax.dtypes.prng_key):
            u, v = jax.random.key_data(u), jax.random.key_data(v)
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-5, atol=1e-6)


def _memory(model, x):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return activation_memory(lambda p, x: loss_fn(nnx.merge(graphdef, p, rest, copy=True), x), params, x)


@pytest.fixture(scope="module")
def plain_run(x):
    """Three steps of the plain module (one compilation for every budget below)."""
    return run_steps(Net(), x)


@pytest.mark.parametrize("budget", [None, "70%"])
def test_training_equals_the_plain_module(x, plain_run, budget):
    model = RematModule(Net(), budget)
    plan = model.plan(x)
    assert plan.recompute > 0 and len(plan.regions) > 1
    losses, grads, state = run_steps(model, x)
    plain_losses, plain_grads, plain_state = plain_run
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    leaves_close(grads, plain_grads)
    # parameters, BatchNorm statistics, RNG keys and counters after the steps
    leaves_close(state["module"], plain_state)
    counts = [int(c) for c in jax.tree.leaves(nnx.state(model, nnx.RngCount))]
    assert counts == [3] * 4  # one draw per Dropout per step: the recomputation draws none


def test_budget_bounds_measured_memory(x):
    plain = _memory(Net(), x)
    least = _memory(RematModule(Net()), x)
    assert least < 0.6 * plain
    model = RematModule(Net(), (least + plain) // 2)
    plan = model.plan(x)
    assert plan.measured <= plan.budget == (least + plain) // 2
    assert least <= _memory(model, x) < plain


def test_eval_mode_is_planned_separately(x):
    model, plain = RematModule(Net()), Net()
    model.eval()
    plain.eval()
    np.testing.assert_allclose(model(x), plain(x), rtol=1e-5, atol=1e-6)
    eval_ops = len(model.plan(x).graph)
    model.train()
    assert len(model.plan(x).graph) > eval_ops  # batch statistics and dropout: training only
    counts = [int(c) for c in jax.tree.leaves(nnx.state(model, nnx.RngCount))]
    assert counts == [0] * 4  # no dropout draws in eval mode


def test_errors():
    with pytest.raises(TypeError, match="remat_graph"):
        RematModule(lambda x: x)
    with pytest.raises(ValueError):
        RematModule(Net(), "lots")
