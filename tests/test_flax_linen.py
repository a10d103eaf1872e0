"""Tests of jaxremat.flax.linen.RematSequential: gradients, batch_stats updates and dropout
masks equal the plain nn.Sequential's, and the plan is really applied."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import solver
from recomputed import count_primitive, expected_marks
import jaxremat.flax.nnx as jnnx
from jaxremat.flax.linen import RematSequential

DIM, BATCH, DEPTH = 24, 16, 5


class Block(nn.Module):
    """Dense -> BatchNorm -> tanh -> Dropout, residual; ``tanh`` marks each forward."""

    dim: int
    train: bool = True

    @nn.compact
    def __call__(self, x):
        h = nn.Dense(self.dim)(x)
        h = nn.BatchNorm(use_running_average=not self.train)(h)
        return x + nn.Dropout(0.25, deterministic=not self.train)(jnp.tanh(h))


def layers(train=True):
    return [Block(DIM, train=train) for _ in range(DEPTH)] + [nn.relu]


def make(budget=None, method="rotor", train=True):
    if budget is None:
        return nn.Sequential(layers(train))
    return RematSequential(layers=layers(train), budget=budget, method=method)


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(0), (BATCH, DIM))


@pytest.fixture(scope="module")
def variables(x):
    # Both models have the same variable tree (layers_0 ... layers_4), so one init serves.
    return make(None).init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, x)


def step(model, variables, x):
    """Loss, gradients and updated batch_stats of one training step (dropout on)."""

    def loss(params):
        y, updates = model.apply({"params": params, "batch_stats": variables["batch_stats"]},
                                 x, rngs={"dropout": jax.random.key(3)},
                                 mutable=["batch_stats"])
        return jnp.mean(y ** 2), updates

    (value, updates), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
        variables["params"])
    return value, grads, updates


def close(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb) and jax.tree.structure(a) == jax.tree.structure(b)
    for u, v in zip(la, lb):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=1e-6, atol=1e-6)


def test_same_variable_tree(x, variables):
    remat_vars = make("50%").init({"params": jax.random.key(1), "dropout": jax.random.key(2)}, x)
    close(remat_vars, variables)


@pytest.fixture(scope="module")
def plain_step(x, variables):
    """One training step of the plain nn.Sequential (one compilation for every budget)."""
    return step(make(None), variables, x)


@pytest.mark.parametrize("budget,method", [("40%", "rotor"), ("100%", "rotor"),
                                           ("100%", "every_layer")])
def test_step_equals_the_plain_model(x, variables, plain_step, budget, method):
    """Same loss, gradients (same dropout masks in forward and recomputation) and
    batch_stats updated once, as in the plain nn.Sequential."""
    model = make(budget, method)
    plan = model.apply(variables, x, method="plan", rngs={"dropout": jax.random.key(0)})
    if budget == "40%":  # recomputes (at 45% the searched options store each layer in part)
        assert max(plan.forward_counts) > 1
    loss, grads, updates = step(model, variables, x)
    plain_loss, plain_grads, plain_updates = plain_step
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    close(grads, plain_grads)
    close(updates, plain_updates)
    # The statistics moved (a training step), once: equal to one plain forward's update.
    assert not np.allclose(jax.tree.leaves(updates)[0], jax.tree.leaves(variables)[0])


@pytest.mark.parametrize("budget", ["40%", "100%"])
def test_the_schedule_is_applied(x, variables, budget):
    model = make(budget)
    plan = model.apply(variables, x, method="plan", rngs={"dropout": jax.random.key(0)})

    def loss(params):
        y, _ = model.apply({"params": params, "batch_stats": variables["batch_stats"]}, x,
                           rngs={"dropout": jax.random.key(3)}, mutable=["batch_stats"])
        return jnp.mean(y ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(variables["params"])
    expected = sum(plan.forward_counts[:DEPTH])
    assert count_primitive(jaxpr, "tanh") == expected_marks(plan, DEPTH)  # (its docstring)
    assert (expected > DEPTH) == (budget == "40%")


def test_eval_mode(x, variables):
    model, plain = make("45%", train=False), make(None, train=False)
    out = jax.jit(lambda v: model.apply(v, x))(variables)
    np.testing.assert_allclose(out, plain.apply(variables, x), rtol=1e-6, atol=1e-6)
    grads = jax.grad(lambda p: jnp.sum(model.apply(
        {"params": p, "batch_stats": variables["batch_stats"]}, x) ** 2))(variables["params"])
    plain_grads = jax.grad(lambda p: jnp.sum(plain.apply(
        {"params": p, "batch_stats": variables["batch_stats"]}, x) ** 2))(variables["params"])
    close(grads, plain_grads)


def test_profiled_once_per_signature(x, variables, monkeypatch):
    calls = []
    real = jnnx.profile_sequence
    monkeypatch.setattr(jnnx, "profile_sequence",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    small = x[:6]  # a signature no other test used
    for budget in ("60%", "80%"):
        model = make(budget)
        for _ in range(2):
            step(model, variables, small)
    assert len(calls) == 1


def test_errors(x, variables):
    with pytest.raises(ValueError, match="no budget"):
        RematSequential(layers=layers()).apply(variables, x, rngs={"dropout": jax.random.key(0)})
    with pytest.raises(solver.InfeasibleBudget, match="smallest budget"):
        make(100).apply(variables, x, rngs={"dropout": jax.random.key(0)},
                        mutable=["batch_stats"])
