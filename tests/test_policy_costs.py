"""The searched policies' measure (:mod:`jaxremat.measure.policy_costs`): a layer's JVP program
split per policy as ``jax.checkpoint`` splits it gives the tape ``jax.vjp`` keeps and the
linearized flops, exactly, without tracing the layer under each policy; the flops differ from
the traced pullback's by one amount per layer; without JAX's partial evaluation the search
traces and finds the same options."""

from __future__ import annotations

import blocks
import jax
import jax.numpy as jnp
import pytest

from jaxremat import jax_compat
from jaxremat.measure.costs import count_jaxpr
from jaxremat.measure import policy_costs as policy_costs_module
from jaxremat.measure.policy_costs import jvp_program, policy_costs
from jaxremat.measure.trace import trace_layer, trace_linearized
from jaxremat.sequence import searched
from jaxremat.sequence.searched import SearchedPolicy, candidates, search
from jaxremat.trees import tree_bytes


def _policies(layer, p, x):
    """Each base alone, each of the first candidates over it, and a union of them."""
    jaxpr = jax.make_jaxpr(layer)(p, x)
    found = []
    for base in searched.BASES:
        keys = candidates(jaxpr, tree_bytes(x), base)[:4]
        found += [SearchedPolicy(frozenset(), base), SearchedPolicy(frozenset(keys), base)]
        found += [SearchedPolicy(frozenset({key}), base) for key in keys]
    return found


def _traced(layer, p, x, policy):
    checked = jax.checkpoint(layer, policy=policy, prevent_cse=True)
    forward, linear, tape = trace_linearized(checked, p, x)
    vjp = trace_layer(checked, p, x, 0)
    return ((tape, count_jaxpr(forward)[0] + count_jaxpr(linear)[0]),
            (vjp.tape_bytes, count_jaxpr(vjp.forward)[0] + count_jaxpr(vjp.backward)[0]))


@jax.custom_vjp
def _sin_clipped_grad(h):
    return jnp.sin(h)


_sin_clipped_grad.defvjp(lambda h: (jnp.sin(h), jnp.cos(h)),
                         lambda cos, g: (jnp.clip(g * cos, -1.0, 1.0),))


def _nested(p, x):
    """A custom_vjp, a cond, a scan and a checkpoint inside the layer."""
    h = _sin_clipped_grad(jnp.tanh(x @ p["w"]))
    h = jax.lax.cond(h.sum() > 0, lambda h: h * 2.0, jnp.exp, h)
    h, _ = jax.lax.scan(lambda c, _: (jnp.tanh(c @ p["u"]) + c, None), h, None, length=3)
    return jax.checkpoint(lambda h: jnp.sin(h) @ p["u"])(h)


def _case(name):
    if name == "nested":
        return _nested, {"w": jnp.ones((16, 16)) / 16, "u": jnp.ones((16, 16)) / 16}, jnp.ones(
            (8, 16))
    return blocks.case(name)


@pytest.mark.parametrize("name", ["attention", "mlp", "conv", "nested"])
def test_the_split_is_the_linearization_and_the_pullback_up_to_one_amount(name):
    layer, p, x = _case(name)
    program = jvp_program(layer, p, x)
    offsets = set()
    for policy in _policies(layer, p, x):
        linearized, pulled = _traced(layer, p, x, policy)
        assert policy_costs(program, policy) == linearized
        assert pulled[0] == linearized[0]
        offsets.add(pulled[1] - linearized[1])
    assert len(offsets) == 1


def test_constants_and_integer_inputs_are_known_inputs():
    table = jnp.linspace(0.5, 1.5, 16)  # closed over: a constant of the program

    def layer(p, x):
        h, index = x
        return jnp.tanh(h @ p) * table[index][:, None], index

    p = jnp.ones((16, 16)) / 16
    x = (jnp.ones((8, 16)), jnp.arange(8) % 16)
    program = jvp_program(layer, p, x)
    for policy in (SearchedPolicy(frozenset(), "nothing"), SearchedPolicy(frozenset(), "dots")):
        assert policy_costs(program, policy) == _traced(layer, p, x, policy)[0]


def _refuse(*args):
    raise NotImplementedError("a program the split refuses")


@pytest.mark.parametrize("missing", ["partial evaluation", "split refused"])
def test_without_the_split_the_search_traces_the_same_options(monkeypatch, missing):
    layer, p, x = blocks.case("attention")
    jaxpr = jax.make_jaxpr(layer)(p, x)
    split = [search(layer, p, x, jaxpr, tree_bytes(x), base) for base in searched.BASES]
    if missing == "partial evaluation":
        monkeypatch.setattr(jax_compat, "_pe_custom", None)
        assert policy_costs(jvp_program(layer, p, x), SearchedPolicy(frozenset())) is None
    else:
        monkeypatch.setattr(policy_costs_module, "checkpoint_split", _refuse)
    monkeypatch.setattr(searched, "_CHOSEN", searched.LRU(4))  # search again, traced
    traced = [search(layer, p, x, jaxpr, tree_bytes(x), base) for base in searched.BASES]
    assert traced == split and any(traced)


@pytest.mark.parametrize("name", ["attention", "mlp", "conv", "nested"])
def test_the_copies_a_split_makes_of_an_equation_are_counted_once(name, monkeypatch):
    """Inside ``shared_equations`` an equation's count terms are computed once for it and
    the copies each policy's split makes of it (``jaxpr_facts.equation_copy_key``), at most
    half as often as once per equation object, and the costs are the traced ones."""
    from jaxremat.measure import costs as costs_module
    from jaxremat.measure.jaxpr_facts import shared_equations

    layer, p, x = _case(name)
    policies = _policies(layer, p, x)
    computed = []
    original = costs_module._eqn_terms
    monkeypatch.setattr(costs_module, "_eqn_terms",
                        lambda eqn: computed.append(eqn) or original(eqn))
    counted = []
    for copies in (True, False):
        if not copies:  # once per equation object
            monkeypatch.setattr(costs_module, "equation_copy_key", lambda eqn: None)
        computed.clear()
        program = jvp_program(layer, p, x)  # a new program: its splits and counts are new
        with shared_equations():
            shared = [policy_costs(program, policy) for policy in policies]
        counted.append(len(computed))
        assert shared == [_traced(layer, p, x, policy)[0] for policy in policies]
    assert 2 * counted[0] <= counted[1], counted
