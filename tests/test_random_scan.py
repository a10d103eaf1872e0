"""``remat_scan`` end to end on random scannable blocks (issue 17.5, branch ``fuzz``).

Each example draws one shape-preserving block of four kinds a user scans (a pre-norm GELU
MLP, a pre-norm causal attention block with ``jnp.einsum``, a ``tanh`` residual layer, a
bias-free matmul block), a width, batch and sequence length, a depth ``L`` (primes
included), an ``unroll`` (0, 2, ``"auto"``), a policy menu (the default, or ``()``: the
whole tape only), whether ``jax.vmap`` runs the stack over a batch, and a budget between
the least ``remat_scan`` names (``InfeasibleBudget.min_budget``) and the plain ``lax.scan``'s
measured memory; then checks what ``remat_scan`` promises: the value and gradients of
``lax.scan`` of the block over parameters stacked on axis 0; the program-order meter
(``jaxremat.activation_memory`` of the gradient, the sum of the outputs as the loss, as the
plan assumes) within the budget and equal to the plan's ``measured_peak``; and the least
budget it names planning and measuring within itself.

About 280 such scans on JAX 0.10.2 and 0.12 (benchmarks/RESULTS.md, "random scanned
blocks") found no plan over its budget and no exception but ``InfeasibleBudget``, whose
``min_budget`` always fitted; but two predictions below the measured peak, both fixed:
``jax.checkpoint`` per layer on the bias-free block (1.03-1.07: its fused recomputation and
backward hold more than the profile's ``bwd_tmp``), and scanned runs under ``jax.vmap``
(up to 1.16: their measured loop bodies were divided by the batch). Without ``vmap`` the
plans now measure 0.67-1.00 of their prediction, most exactly.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import solver
from jaxremat import activation_memory, remat_scan
from test_random_stacks import attention, mlp  # the same blocks, scanned here

KINDS = ("mlp", "attention", "tanh", "matmul")
LENGTHS = (2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 16, 17, 23, 24)


def tanh(p, x):
    return x + jnp.tanh(x @ p["w"] + p["b"])


def matmul(p, x):
    return x + jnp.maximum(x @ p["w"], 0) @ p["v"]


BLOCKS = {"mlp": mlp, "attention": attention, "tanh": tanh, "matmul": matmul}


def _params(rng: np.random.Generator, kind: str, L: int, width: int) -> dict:
    def weight(*shape):
        return jnp.asarray(rng.standard_normal((L,) + shape) * shape[0] ** -0.5, jnp.float32)

    if kind == "mlp":
        return {"g": jnp.ones((L, width)), "w1": weight(width, 4 * width),
                "b1": weight(4 * width), "w2": weight(4 * width, width)}
    if kind == "attention":
        return {"g": jnp.ones((L, width)), **{n: weight(width, width)
                                              for n in ("wq", "wk", "wv", "wo")}}
    if kind == "tanh":
        return {"w": weight(width, width), "b": weight(width)}
    return {"w": weight(width, 2 * width), "v": weight(2 * width, width)}


@st.composite
def specs(draw):
    """``(kind, L, width, batch, length, vmapped, seed, share)``: the block, depth, input
    shape (``vmapped``: a ``jax.vmap`` over a batch of 2-3 such inputs), seed of its values
    and a budget share."""
    return (draw(st.sampled_from(KINDS)), draw(st.sampled_from(LENGTHS)),
            draw(st.sampled_from((8, 16, 24, 32))), draw(st.integers(1, 4)),
            draw(st.sampled_from((4, 8, 16))), draw(st.sampled_from((0, 2, 3))),
            draw(st.integers(0, 2**16)), draw(st.floats(0, 1)))


def build(kind, L, width, batch, length, vmapped, seed):
    """The block, its stacked parameters, the input and the loss maker of a :func:`specs`
    draw: ``loss(f)`` is the sum of ``f(params, x)``'s output, under ``jax.vmap`` over the
    input's leading axis when ``vmapped``."""
    rng = np.random.default_rng(seed)
    params = _params(rng, kind, L, width)
    shape = ((vmapped,) if vmapped else ()) + (batch, length, width)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32)

    def loss(f):
        if vmapped:
            return lambda p, x: jnp.sum(jax.vmap(lambda xi: f(p, xi))(x))
        return lambda p, x: jnp.sum(f(p, x))
    return BLOCKS[kind], params, x, loss


def plain(block):
    return lambda p, x: jax.lax.scan(lambda h, q: (block(q, h), None), x, p)[0]


def least_budget(block, params, x, loss, menu, unroll) -> int:
    """``min_budget`` of the ``InfeasibleBudget`` a budget of one byte raises."""
    with pytest.raises(solver.InfeasibleBudget) as error:
        jax.eval_shape(loss(remat_scan(block, 1, policies=menu, unroll=unroll)), params, x)
    return int(math.ceil(error.value.min_budget))


def the_plan(f):
    """The one plan ``f`` made (a plan per input signature; one signature here)."""
    plans = list(f._cache.values())
    assert len(plans) == 1, plans
    return plans[0]


def check(spec, menu, unroll):
    """Run one example; return its figures (measured / budget, measured / the plan's
    predicted and measured peaks, the least budget's measured / that budget)."""
    *shape, share = spec
    block, params, x, loss = build(*shape)
    least = least_budget(block, params, x, loss, menu, unroll)
    # the least budget named plans, and what it plans measures within it
    f = remat_scan(block, least, policies=menu, unroll=unroll)
    at_least = activation_memory(loss(f), params, x)
    assert at_least <= least, (at_least, least, the_plan(f).member)
    full = activation_memory(loss(plain(block)), params, x)
    budget = int(least + share * max(0, full - least))
    f = remat_scan(block, budget, policies=menu, unroll=unroll)
    measured = activation_memory(loss(f), params, x)
    plan = the_plan(f)
    assert measured <= budget, (measured, budget, plan.member)
    if not shape[5]:  # under vmap the plan measures one example, times the batch
        assert measured == plan.measured_peak, (measured, plan.measured_peak)

    got = jax.value_and_grad(loss(f), argnums=(0, 1))(params, x)
    want = jax.value_and_grad(loss(plain(block)), argnums=(0, 1))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())))
    return {"budget": measured / budget, "predicted": measured / plan.predicted_peak,
            "plan_measured": measured / plan.measured_peak, "least": at_least / least,
            "member": str(plan.member), "option": plan.option_name, "bytes": measured}


def test_checkpoint_per_layer_counts_what_its_fused_body_holds():
    """``jax.checkpoint`` per layer on the bias-free block ``x + relu(x @ w) @ v``: each
    backward loop body recomputes the layer and runs its backward at once, holding
    ``relu``'s selects and zeros beside the hidden, more than the profile's ``bwd_tmp``.
    The random scans found it measured above its prediction (1.03-1.07; 2368 B against
    2240 B here on JAX 0.10.2, 2432 B against 2304 B on 0.12) before ``loop_margin`` took
    the loops' terms measured on the checkpointed layer."""
    block, params, x, loss = build("matmul", 6, 8, 1, 4, 0, 1)
    f = remat_scan(block, 10**9, method="every_layer")
    assert activation_memory(loss(f), params, x) == f.plan(params, x).predicted_peak


def test_scanned_runs_under_vmap_count_each_examples_activations():
    """Under ``jax.vmap`` the plan is made per example on ``budget / batch``: the loop
    terms measured on one example's scan of the layer (stacked rows, loop bodies) are that
    example's, not the batch's. Dividing them by the batch too, a ``tanh`` stack of 24 in
    segments of 2 (scanned runs) under a ``vmap`` of 3 measured 1.158 of its prediction
    (25344 B against 21888 B), found by the random scans; now exactly it."""
    figures = check(("tanh", 24, 8, 3, 4, 3, 10841, 0.0825), (), 0)
    assert figures["member"] == "segments of 2 layers", figures
    assert figures["predicted"] <= 1.0, figures


@pytest.mark.slow  # about 4 s an example
@settings(max_examples=12, deadline=None)
@given(specs(), st.sampled_from([None, ()]), st.sampled_from([0, 2, "auto"]))
def test_random_scans_fit_their_budget_and_keep_their_gradients(spec, menu, unroll):
    check(spec, menu, unroll)
