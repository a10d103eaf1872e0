"""Deep unrolled stacks and planning time (issue 18, deliverables 3 and 4).

Near its minimum budget Rotor's plan nests checkpoints as deep as the chain is long; those
are applied flat (:mod:`jaxremat.sequence.flat_apply`). Memory is measured with the program-order
meter :func:`jaxremat.activation_memory` (on CPU XLA undoes remat).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import solver
from jaxremat import activation_memory, remat_sequence
from jaxremat.sequence.apply import MAX_NESTING, apply_plan
from jaxremat.sequence.flat_apply import nesting_depth
from threads import call_together


def tanh_layer(w, x):
    return jnp.tanh(x @ w)


def small_stack(length, batch=4, width=8, seed=0):
    rng = np.random.default_rng(seed)
    params = [jnp.asarray(rng.standard_normal((width, width)) / width**0.5, jnp.float32)
              for _ in range(length)]
    x = jnp.asarray(rng.standard_normal((batch, width)), jnp.float32)
    return [tanh_layer] * length, params, x


def plain(params, x):
    return functools.reduce(lambda h, w: tanh_layer(w, h), params, x)


def min_budget(layers, params, x):
    """The smallest budget ``remat_sequence`` names itself (from a 1-byte budget)."""
    with pytest.raises(solver.InfeasibleBudget) as info:
        remat_sequence(layers, 1, policies=()).plan(params, x)
    return info.value.min_budget


def _check_deep(length):
    layers, params, x = small_stack(length)
    budget = min_budget(layers, params, x)
    seq = remat_sequence(layers, budget, policies=())
    plan = seq.plan(params, x)
    assert nesting_depth(plan.schedule.plan[0]) > MAX_NESTING  # deep enough to matter
    # a plain sum: its gradient is the one array g[L] the chain counts (the model leaves
    # out what a loss needs beyond that: jaxremat.remat_sequence's docstring)
    loss = lambda p, h: jnp.sum(seq(p, h))
    plain_loss = lambda p, h: jnp.sum(plain(p, h))
    got = jax.grad(loss, argnums=(0, 1))(params, x)
    want = jax.grad(plain_loss, argnums=(0, 1))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert activation_memory(loss, params, x) <= budget
    assert plan.predicted_peak <= budget


def test_deep_stack_at_minimum_budget():
    """80 layers at the minimum budget: a plan nested ~80 deep runs (nested jax.checkpoint
    raised RecursionError: it still does here with MAX_NESTING = 10**6), gradients equal,
    measured memory within it. 500 layers in the slow tier."""
    _check_deep(80)


@pytest.mark.slow
def test_500_layers_at_minimum_budget():
    _check_deep(500)


@pytest.mark.parametrize("backend", ["checkpoint", "custom_vjp"])
def test_flat_equals_nested_on_meter(backend, monkeypatch):
    """A flat-applied checkpoint measures what nested checkpoints measure (same schedule),
    with equal gradients: the plan of 12 layers at its minimum budget, applied once nested
    (MAX_NESTING large) and once flat (MAX_NESTING = 0)."""
    layers, params, x = small_stack(12)
    plan = remat_sequence(layers, min_budget(layers, params, x), policies=()).plan(params, x)
    tree = plan.schedule.plan
    assert nesting_depth(tree[0]) > 2
    loss = lambda p, h: jnp.sum(apply_plan(tree, layers, p, h, backend=backend))
    import jaxremat.sequence.apply as apply_module

    monkeypatch.setattr(apply_module, "MAX_NESTING", 10**6)
    nested = activation_memory(loss, params, x), jax.grad(loss, argnums=(0, 1))(params, x)
    monkeypatch.setattr(apply_module, "MAX_NESTING", 0)
    flat = activation_memory(loss, params, x), jax.grad(loss, argnums=(0, 1))(params, x)
    assert flat[0] <= nested[0]
    assert flat[0] <= plan.predicted_peak
    for a, b in zip(jax.tree.leaves(flat[1]), jax.tree.leaves(nested[1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_nesting_depth():
    C, L = solver.Checkpoint, solver.Layer
    assert nesting_depth(L(0)) == 0
    item = C(0, 2, (L(0), L(1)))
    assert nesting_depth(item) == 1
    for k in range(3, 3000):  # iterative: no recursion limit
        item = C(0, k, (item, L(k - 1)))
    assert nesting_depth(item) == 2998


def _count_profiles(monkeypatch):
    """Count the layers actually profiled (cache misses)."""
    import jaxremat.sequence.profile as profile_module

    calls = []
    original = profile_module._profile_one

    def counting(*args, **kwargs):
        calls.append(args[3])  # the layer's index
        return original(*args, **kwargs)

    monkeypatch.setattr(profile_module, "_profile_one", counting)
    return calls


def test_identical_blocks_profiled_once_across_sequences(monkeypatch):
    """Twelve identical blocks: one profile for the first layer (its input is not
    differentiated) and one for the others; a new sequence of the same layers profiles
    nothing, a new batch size profiles the others again, the first layer's derived from
    theirs (jaxremat.sequence.derive: no profile of its own)."""
    calls = _count_profiles(monkeypatch)
    layers, params, x = small_stack(12)
    first = remat_sequence(layers, "50%", policies=()).plan(params, x)
    assert len(calls) == 2
    again = remat_sequence(layers, "50%", policies=()).plan(params, x)
    assert len(calls) == 2
    assert again.chain == first.chain
    remat_sequence(layers, "50%", policies=()).plan(params, jnp.ones((7, 8)))
    assert len(calls) == 3


def test_profile_cache_tells_a_new_function_from_a_reused_id(monkeypatch):
    """The cache holds a weak reference: a new layer never gets a dead layer's profile."""
    from jaxremat.sequence.profile import profile_cache, profile_sequence

    calls = _count_profiles(monkeypatch)
    _, params, x = small_stack(1)
    for _ in range(3):  # each lambda is new (ids may be reused once the last one dies)
        profile_sequence([lambda w, h: jnp.sin(h @ w)], params, x, policies=())
    assert len(calls) == 3
    for key, (ref, profile, output) in profile_cache()._data.items():
        if key[0] == "calibration":  # the lowered and counted costs of a layer's pieces
            continue
        assert isinstance(profile.fwd_time, float) and profile.index == 0
        assert all(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(output))


def test_plan_cache_thread_safe_and_bounded(monkeypatch):
    """Four threads call with the same shapes: one profile, one plan; the plan cache keeps
    at most PLAN_CACHE_SIZE signatures (least recently used out)."""
    import jaxremat.sequence.remat as sequence_module

    calls = _count_profiles(monkeypatch)
    layers, params, x = small_stack(6)
    seq = remat_sequence(layers, "50%", policies=())
    plans = call_together(lambda: seq.plan(params, x))
    assert seq.profile_count == 1 and len(calls) == 2  # first layer + the others
    assert all(plan is plans[0] for plan in plans)

    monkeypatch.setattr(sequence_module, "PLAN_CACHE_SIZE", 2)
    small = remat_sequence(layers, "90%", policies=())
    for batch in (2, 3, 4, 2):
        small.plan(params, jnp.ones((batch, 8)))
    assert len(small.cached_plans) == 2
    assert small.profile_count == 4  # batch 2 was evicted by 4, then planned again
