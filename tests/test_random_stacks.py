"""``remat_sequence`` end to end on random heterogeneous stacks (issue 17.5).

Each example draws a stack of 3-7 layers from four kinds a user writes (a widening or
narrowing two-matmul ``tanh`` layer, a pre-norm GELU MLP block, a pre-norm causal attention
block with ``jnp.einsum``, a ``relu**2`` residual layer), a batch, a sequence length, a
budget between the least one that fits and no remat, a policy menu and a backend; then checks
what the plan promises: its predicted peak within the budget, the program-order meter
(``jaxremat.activation_memory``, sum of the outputs as the loss, as the plan assumes) never
above the prediction and at most 20% below it (CI drew a three-layer stack at 0.874: the chain
keeps a checkpointed layer's output that JAX frees, the looseness described in session 18's
closing note), and the gradients of the plain stack.

A run of 155 such stacks (``sum(out ** 2)`` as the loss in the first 40) found two plans
measured above their prediction: a loss holding one more output-sized value than the
sum's (documented: the chain does not model the loss), and the ``custom_vjp`` backend
differentiating a first segment's input that nothing differentiates (fixed,
``tests/test_apply.py``). The others measured 0.963-1.000 of their prediction, 128 of them
exactly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import solver
from jaxremat import activation_memory, remat_sequence

KINDS = ("dense", "mlp", "attention", "relu2")


def _norm(x, p):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["g"]


def dense(p, x):
    return jnp.tanh(jnp.tanh(x @ p["w1"]) @ p["w2"] + p["b"])


def mlp(p, x):
    return x + jax.nn.gelu(_norm(x, p) @ p["w1"] + p["b1"]) @ p["w2"]


def attention(p, x):
    h = _norm(x, p)
    q, k, v = (h @ p[name] for name in ("wq", "wk", "wv"))
    scores = jnp.einsum("...td,...sd->...ts", q, k) / math.sqrt(q.shape[-1])
    causal = jnp.tril(jnp.ones(scores.shape[-2:], bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    return x + jnp.einsum("...ts,...sd->...td", weights, v) @ p["wo"]


def relu2(p, x):
    return jnp.maximum(x @ p["w"], 0) ** 2 + x


FUNCTIONS = {"dense": dense, "mlp": mlp, "attention": attention, "relu2": relu2}


def _params(rng: np.random.Generator, kind: str, width: int, out: int) -> dict:
    def weight(*shape):
        return jnp.asarray(rng.standard_normal(shape) * shape[0] ** -0.5, jnp.float32)

    if kind == "dense":
        return {"w1": weight(width, 3 * width), "w2": weight(3 * width, out), "b": weight(out)}
    if kind == "mlp":
        return {"g": jnp.ones(width), "w1": weight(width, 4 * width), "b1": weight(4 * width),
                "w2": weight(4 * width, width)}
    if kind == "attention":
        return {"g": jnp.ones(width), **{n: weight(width, width) for n in ("wq", "wk", "wv", "wo")}}
    return {"w": weight(width, width)}


@st.composite
def specs(draw):
    """``(kinds, widths, batch, length, seed, share)``: a random stack (its layers' kinds and
    the width after each), its input's shape, the seed of its values and a budget share."""
    kinds = tuple(draw(st.lists(st.sampled_from(KINDS), min_size=3, max_size=7)))
    widths = [draw(st.sampled_from((8, 16, 24)))]
    for kind in kinds:
        widths.append(draw(st.sampled_from((8, 16, 24))) if kind == "dense" else widths[-1])
    return (kinds, tuple(widths), draw(st.sampled_from((1, 2, 3))),
            draw(st.sampled_from((4, 8))), draw(st.integers(0, 2**16)), draw(st.floats(0, 1)))


def build(kinds, widths, batch, length, seed):
    """The layers, parameters and input of a :func:`specs` stack."""
    rng = np.random.default_rng(seed)
    params = [_params(rng, k, a, b) for k, a, b in zip(kinds, widths, widths[1:])]
    x = jnp.asarray(rng.standard_normal((batch, length, widths[0])), jnp.float32)
    return [FUNCTIONS[k] for k in kinds], params, x


def _budget(layers, params, x, share, menu, backend="checkpoint") -> int:
    """``share`` of the way from the least budget that fits ``backend``'s plans to no remat
    (``custom_vjp`` recomputes whole forwards: its least budget may be larger)."""
    try:
        remat_sequence(layers, 1, policies=menu, backend=backend).plan(params, x)
    except solver.InfeasibleBudget as error:
        least = error.min_budget
    full = remat_sequence(layers, 10**15, method="none", policies=menu).plan(params, x)
    return int(least + share * (full.predicted_peak - least)) + 1


@pytest.mark.slow  # about 4 s an example
@settings(max_examples=12, deadline=None)
@given(specs(), st.sampled_from([None, ()]), st.sampled_from(["checkpoint", "custom_vjp"]))
def test_random_stacks_fit_their_prediction_and_keep_their_gradients(spec, menu, backend):
    *shape, share = spec
    layers, params, x = build(*shape)
    budget = _budget(layers, params, x, share, menu, backend)
    seq = remat_sequence(layers, budget, policies=menu, backend=backend)
    plan = seq.plan(params, x)
    assert plan.predicted_peak <= budget
    measured = activation_memory(lambda p, x: jnp.sum(seq(p, x)), params, x)
    assert 0.8 * plan.predicted_peak <= measured <= plan.predicted_peak, (
        measured, plan.predicted_peak, plan.schedule.plan)

    def plain(p, x):
        for layer, q in zip(layers, p):
            x = layer(q, x)
        return jnp.sum(x)

    got = jax.grad(lambda p, x: jnp.sum(seq(p, x)))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(jax.grad(plain)(params, x))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())))
