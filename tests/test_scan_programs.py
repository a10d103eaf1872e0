"""remat_scan's programs instantiated from symbolic traces (jaxremat.scan.programs, issue
18.4): what the loop margins and the members' memory measure on them equals what they
measure on programs traced at the shape, a new batch size or sequence length traces none of
them, and a layer whose Python branches on a size is traced."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import pytest

import jaxremat
from jaxremat.scan import margins, programs
from jaxremat.scan.members import NestedScan
from jaxremat.scan.plan import option_policies
from jaxremat.scan.realize import measured_memory

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
MEMBERS = [NestedScan(), NestedScan((1,)), NestedScan((2,), 1), NestedScan((3,), 2),
           NestedScan((4, 2), 1)]


def _gpt():
    sys.path.insert(0, BENCHMARKS)
    try:
        from scan_depth import gpt_stack
    finally:
        sys.path.remove(BENCHMARKS)
    return gpt_stack(6, 32, 4, 4, 16)


def _mlp():
    keys = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(keys[0], (6, 16, 32)) / 4,
              "w2": jax.random.normal(keys[1], (6, 32, 16)) / 4, "b": jnp.zeros((6, 32))}
    layer = lambda p, h: h + jnp.tanh(h @ p["w1"] + p["b"]) @ p["w2"]  # noqa: E731
    return layer, params, jax.random.normal(keys[2], (4, 8, 16))


def _abstract(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


def _one(params):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), params)


@pytest.mark.parametrize("make", [_mlp, pytest.param(_gpt, marks=pytest.mark.slow)],
                         ids=["mlp", "gpt"])  # the GPT-2 block: 8-19 s
def test_instantiated_programs_measure_what_traced_ones_do(make, monkeypatch):
    """At the first shape, half the batch and half the sequence: every option's margin sizes
    and the memory of members of one and two levels under each option equal those measured
    on programs traced at that shape; after the first shape nothing is traced."""
    layer, params, x = make()
    plan = jaxremat.remat_scan(layer, "50%").plan(params, x)
    policies, names = option_policies(plan.layer), plan.layer.option_names
    assert len(names) > 1 and all(map(jaxremat.sequence.policies.shape_free, names))
    traced = []
    original = margins.scan_program
    monkeypatch.setattr(margins, "scan_program", lambda *a: traced.append(1) or original(*a))
    for h in (x, x[:2], x[:, : x.shape[1] // 2]):
        one, ax = _one(params), _abstract(h)
        traced.clear()
        found = margins.margin_bytes(layer, one, ax, policies, names)
        assert not traced
        assert found == margins.margin_bytes(layer, one, ax, policies)
        for member in MEMBERS:
            member = NestedScan(member.sizes, min(member.option, len(names) - 1))
            args = (layer, _abstract(params), ax, 6, policies, 2, member)
            assert measured_memory(*args, names=names) == measured_memory(*args), member


def test_a_layer_that_branches_on_the_batch_size_is_traced():
    """The symbolic batch takes the other branch than batch 4 (``b == 4`` is false for a
    symbol): the forward check fails there and the programs are traced; at batch 2 and 3,
    where the branches agree, they are instantiated. Measured alike either way (the two
    branches hold different residuals: without the check, batch 4 measured the other's)."""
    def layer(p, h):
        y = h @ p["w"]
        return h + (jnp.tanh(y) if h.shape[0] == 4 else jnp.sin(y) * jnp.cos(h))

    params = {"w": jax.random.normal(jax.random.key(1), (5, 8, 8)) / 3}
    x = jax.random.normal(jax.random.key(2), (4, 8))
    policies, names = (None, jax.checkpoint_policies.dots_saveable), ("everything", "dots")
    for batch in (4, 2, 3):
        ax = _abstract(x[:batch])
        entry, _ = programs.symbolic_programs(layer, _one(params), ax, "probe", lambda h, p: ())
        assert (entry is None) == (batch == 4)
        assert margins.margin_bytes(layer, _one(params), ax, policies, names) == \
            margins.margin_bytes(layer, _one(params), ax, policies)
        for member in MEMBERS[:3]:
            args = (layer, _abstract(params), ax, 5, policies, 0, member)
            assert measured_memory(*args, names=names) == measured_memory(*args)


def test_a_new_batch_size_replans_without_tracing_the_scan(monkeypatch):
    """remat_scan at a new batch size: its margins and the members it measures come from
    the programs of the first shape (no ``lax.scan`` of the layer traced for them), and
    the plan's measured peak is the meter's on the program it runs."""
    layer, params, x = _gpt()
    f = jaxremat.remat_scan(layer, "30%")
    f.plan(params, x)
    made = []
    original = programs._symbolic
    monkeypatch.setattr(programs, "_symbolic", lambda *a: made.append(1) or original(*a))
    traced = []
    scan = margins.scan_program
    monkeypatch.setattr(margins, "scan_program", lambda *a: traced.append(1) or scan(*a))
    plan = f.plan(params, x[:2])
    assert not made and not traced
    loss = lambda p, h: jnp.sum(f(p, h))  # noqa: E731
    assert plan.measured_peak == jaxremat.activation_memory(loss, params, x[:2]) <= plan.budget


def test_cleared_with_the_profile_cache():
    """``profile_cache().clear()`` forgets remat_scan's programs, checks and margins too
    (after redefining a layer's behaviour through global state, as for the profiles)."""
    from jaxremat.sequence import cache
    from jaxremat.sequence.profile import profile_cache

    layer, params, x = _mlp()
    jaxremat.remat_scan(layer, "50%").plan(params, x)
    stores = (cache.SCAN_MARGINS, cache.SCAN_PROGRAMS, cache.SCAN_CHECKS)
    assert all(len(store) for store in stores)
    profile_cache().clear()
    assert not any(len(store) for store in stores)


@pytest.mark.slow  # 10-15 s: the search, and every option's programs traced to compare
def test_searched_options_are_instantiated_where_their_keys_move(monkeypatch):
    """With the searched options on the menu (``"dots_plus"``, policies keyed by shapes), a
    new batch size moves every searched policy to the symbolic programs' equations and
    instantiates them; at the head width (sequence 8 of 4 heads of 8) two matmuls' keys
    collide, the policies do not move, and the programs are traced. Measured alike either
    way."""
    layer, params, x = _gpt()
    menu = ("dots", "dots_no_batch", "names", "dots_plus")
    plan = jaxremat.remat_scan(layer, "50%", policies=menu).plan(params, x)
    assert any("_plus" in name for name in plan.layer.option_names)
    traced = []
    original = margins.scan_program
    monkeypatch.setattr(margins, "scan_program", lambda *a: traced.append(1) or original(*a))
    for h, moves in ((x[:2], True), (x[:, :8], False)):
        replan = jaxremat.remat_scan(layer, "50%", policies=menu).plan(params, h)
        policies, names = option_policies(replan.layer), replan.layer.option_names
        one, ax = _one(params), _abstract(h)
        traced.clear()
        found = margins.margin_bytes(layer, one, ax, policies, names)
        assert bool(traced) != moves  # instantiated where the policies move
        assert found == margins.margin_bytes(layer, one, ax, policies)
        entry, _ = programs.symbolic_programs(layer, one, ax, ("margins", names),
                                              lambda *a: (), policies, names)
        assert (entry is not None) == moves
        for member in MEMBERS:
            member = NestedScan(member.sizes, len(names) - 1)
            args = (layer, _abstract(params), ax, 6, policies, 2, member)
            assert measured_memory(*args, names=names) == measured_memory(*args), member
