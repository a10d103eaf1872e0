"""Programs traced with a symbolic batch size, instantiated at each later one (issue 18.4,
jaxremat.measure.symbolic, jaxremat.sequence.polymorphic): the instantiated programs are the
traced ones, the re-planned profile equals tracing it, field by field, without tracing the
shape-free options; and every case where it must trace instead."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from blocks import case
from jaxremat.measure import symbolic
from jaxremat.measure.symbolic import instantiate, same_program, shape_env, symbolic_input
from jaxremat.measure.trace import trace_layer, vjp_programs
from jaxremat.sequence import cache
from jaxremat.sequence import profile as profile_module
from jaxremat.sequence.derive import same_profile
from jaxremat.sequence.profile import profile_cache, profile_sequence
from jaxremat.trees import abstractify

BLOCKS = ("mlp", "attention", "marked attention", "conv")


def _abstract(name):
    layer, p, x = case(name)
    return layer, abstractify(p, "p"), abstractify(x, "x")


@pytest.mark.parametrize("name", BLOCKS)
@pytest.mark.parametrize("policy", [None, jax.checkpoint_policies.dots_saveable])
def test_instantiated_programs_are_the_traced_ones(name, policy):
    """The vjp programs traced on a symbolic batch and instantiated at batch 2, 3 and 8 are,
    equation by equation, those traced at that batch (forward and backward)."""
    layer, p, x = _abstract(name)
    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy, prevent_cse=True)
    found = symbolic_input(x)
    programs = vjp_programs(layer, p, found.x, 0)
    for batch in (2, 3, 8):
        concrete = jax.ShapeDtypeStruct((batch,) + x.shape[1:], x.dtype)
        env = shape_env(found, concrete)
        assert env == {symbolic.SYMBOL: batch}
        traced = trace_layer(layer, p, concrete, 0)
        assert same_program(instantiate(programs.forward, env), traced.forward)
        assert same_program(instantiate(programs.backward, env), traced.backward)


def test_same_program_tells_programs_apart():
    """Other shapes, another primitive or another constant make another program; NaN
    literals and a new trace of the same function do not."""
    x = jax.ShapeDtypeStruct((4, 3), jnp.float32)
    f = lambda x: jnp.where(x > 0, jnp.sin(x), jnp.nan)  # noqa: E731
    assert same_program(jax.make_jaxpr(f)(x), jax.make_jaxpr(f)(x))
    assert not same_program(jax.make_jaxpr(f)(x),
                            jax.make_jaxpr(f)(jax.ShapeDtypeStruct((5, 3), jnp.float32)))
    assert not same_program(jax.make_jaxpr(f)(x),
                            jax.make_jaxpr(lambda x: jnp.where(x > 0, jnp.cos(x), jnp.nan))(x))
    assert not same_program(jax.make_jaxpr(f)(x),
                            jax.make_jaxpr(lambda x: jnp.where(x > 0, jnp.sin(x), 0.0))(x))
    assert not same_program(jax.make_jaxpr(lambda x: x + x)(x),
                            jax.make_jaxpr(lambda x: x + jnp.ones_like(x))(x))


def test_shape_env_takes_only_new_symbolic_sizes():
    """A new leading size of every batched leaf (at least 2) is a batch size; another axis,
    a batch of one, or leaves that disagree are not; with a sequence, axis 1 of the leaves of
    rank 3 too."""
    x = {"h": jax.ShapeDtypeStruct((4, 3), jnp.float32),
         "m": jax.ShapeDtypeStruct((4,), jnp.int32), "w": jax.ShapeDtypeStruct((7,), jnp.float32)}
    found = symbolic_input(x)
    assert found.symbols == (("b", None), ("b",), (None,))
    new = lambda h, m, w: {"h": jax.ShapeDtypeStruct(h, jnp.float32),  # noqa: E731
                           "m": jax.ShapeDtypeStruct(m, jnp.int32),
                           "w": jax.ShapeDtypeStruct(w, jnp.float32)}
    assert shape_env(found, new((6, 3), (6,), (7,))) == {symbolic.SYMBOL: 6}
    assert shape_env(found, new((1, 3), (1,), (7,))) is None
    assert shape_env(found, new((6, 4), (6,), (7,))) is None
    assert shape_env(found, new((6, 3), (5,), (7,))) is None
    assert shape_env(found, new((6, 3), (6,), (8,))) is None
    assert symbolic_input(jax.ShapeDtypeStruct((1, 3), jnp.float32)) is None
    seq = symbolic_input((jax.ShapeDtypeStruct((4, 6, 3), jnp.float32),
                          jax.ShapeDtypeStruct((4, 6), jnp.int32)), sequence=True)
    assert seq.symbols == (("b", "t", None), ("b", None))
    new = lambda b, t, u: (jax.ShapeDtypeStruct((b, t, 3), jnp.float32),  # noqa: E731
                           jax.ShapeDtypeStruct((b, u), jnp.int32))
    assert shape_env(seq, new(2, 5, 6)) == {"b": 2, "t": 5}
    assert shape_env(seq, new(2, 1, 6)) is None
    assert shape_env(seq, new(2, 5, 5)) is None


def _profiles(layers, params, x, new, input_grad, instantiate_it, monkeypatch, policies=None):
    """From a cold cache: profile at ``x``, then at ``new``; the second profile and the
    options' vjp traces it ran."""
    profile_cache().clear()
    with monkeypatch.context() as patch:
        if not instantiate_it:
            patch.setattr(profile_module, "instantiating_tracer", lambda *args: None)
        profile_sequence(layers, params, x, input_grad=input_grad, policies=policies)
        traced = []
        original = vjp_programs

        def counting(*args, **kwargs):
            traced.append(args)
            return original(*args, **kwargs)

        patch.setattr("jaxremat.measure.trace.vjp_programs", counting)
        found = profile_sequence(layers, params, new, input_grad=input_grad, policies=policies)
    profile_cache().clear()
    return found, len(traced)


@pytest.mark.parametrize("name", BLOCKS)
@pytest.mark.parametrize("input_grad", [True, False])
def test_a_new_batch_size_is_instantiated_and_equals_tracing(name, input_grad, monkeypatch):
    """Three equal blocks re-profiled at a batch of 3 (first at 8): no option is traced,
    and every layer's profile and the chain equal those of tracing it."""
    layer, p, x = case(name)
    _assert_instantiated(([layer] * 3, [p] * 3, x, x[:3], input_grad), monkeypatch)


def _assert_instantiated(args, monkeypatch, policies=None):
    """Re-profiled at ``args``' new shape, no option is traced, and every layer's profile and
    the chain equal those of tracing it."""
    found, count = _profiles(*args, True, monkeypatch, policies)
    traced, traced_count = _profiles(*args, False, monkeypatch, policies)
    assert count == 0 < traced_count
    assert all(same_profile(a, b) for a, b in zip(found.layers, traced.layers, strict=True))
    assert repr(found.chain) == repr(traced.chain)


def test_a_batch_of_one_is_traced(monkeypatch):
    """At a batch of one (JAX lays programs out differently) the options are traced."""
    layer, p, x = case("attention")
    found, count = _profiles([layer] * 2, [p] * 2, x, x[:1], True, True, monkeypatch)
    assert count > 0
    profile_cache().clear()
    fresh = profile_sequence([layer] * 2, [p] * 2, x[:1])
    assert all(a.tape_bytes == b.tape_bytes and a.bwd_tmp == b.bwd_tmp
               for a, b in zip(found.layers, fresh.layers, strict=True))


def test_a_layer_that_branches_on_the_batch_size_is_traced(monkeypatch):
    """A layer whose Python branches on the batch size traces one program symbolically;
    at a batch where the concrete branch differs its plain forward does not match, and the
    options are traced (the profile is the traced one)."""
    def layer(p, x):
        return jnp.tanh(x @ p) * (2.0 if x.shape[0] == 4 else 3.0)

    p = jnp.ones((5, 5)) / 5
    x = jnp.ones((8, 5))
    found, count = _profiles([layer] * 2, [p] * 2, x, x[:4], True, True, monkeypatch)
    assert count > 0
    same, count = _profiles([layer] * 2, [p] * 2, x, x[:6], True, True, monkeypatch)
    assert count == 0  # where the branch agrees, instantiated
    traced, _ = _profiles([layer] * 2, [p] * 2, x, x[:4], True, False, monkeypatch)
    assert all(same_profile(a, b) for a, b in zip(found.layers, traced.layers, strict=True))


def test_a_layer_needing_concrete_sizes_is_traced(monkeypatch):
    """A layer whose Python needs a concrete batch size cannot be traced symbolically: no
    programs are kept, and later shapes trace it."""
    def layer(p, x):
        return x @ p + jnp.arange(int(x.shape[0]), dtype=x.dtype)[:, None]

    p = jnp.ones((5, 5)) / 5
    found, count = _profiles([layer] * 2, [p] * 2, jnp.ones((8, 5)), jnp.ones((3, 5)), True, True,
                             monkeypatch)
    assert count > 0 and found.chain.length == 2


def test_kept_programs_are_bounded_and_cleared_with_the_profiles():
    """The programs cache is the bounded LRU that ``profile_cache().clear()`` clears."""
    layer, p, x = case("mlp")
    profile_cache().clear()
    profile_sequence([layer], [p], x)
    assert len(cache.PROGRAMS) == 1
    assert cache.PROGRAMS.maxsize <= 64
    profile_cache().clear()
    assert len(cache.PROGRAMS) == 0


@pytest.mark.parametrize("name", BLOCKS)
def test_the_first_shape_instantiated_equals_tracing(name, monkeypatch):
    """At the first shape the options are instantiated from symbolic traces: only the whole
    tape is also traced concretely (the check), and the profile and chain equal those of
    tracing every option."""
    layer, p, x = case(name)
    calls = []
    original = trace_layer

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    profile_cache().clear()
    with monkeypatch.context() as patch:
        patch.setattr("jaxremat.sequence.options.trace_layer", counting)
        found = profile_sequence([layer] * 2, [p] * 2, x)
    assert len(calls) == 1  # one profile: equal blocks, the input differentiated
    assert len(found.layers[0].options) + len(found.layers[0].dropped) >= 2
    profile_cache().clear()
    with monkeypatch.context() as patch:
        patch.setattr(profile_module, "recording_symbolic", lambda *args: (args[-1], lambda: None))
        traced = profile_sequence([layer] * 2, [p] * 2, x)
    profile_cache().clear()
    assert all(same_profile(a, b) for a, b in zip(found.layers, traced.layers, strict=True))
    assert repr(found.chain) == repr(traced.chain)


@pytest.mark.parametrize("name", BLOCKS)
def test_a_new_sequence_length_is_instantiated_and_equals_tracing(name, monkeypatch):
    """Axis 1 of a rank-3 input (a sequence; a conv block's image height) is symbolic too:
    re-profiled at a shorter one and a new batch at once, no option is traced, and the
    profile and chain equal tracing them."""
    layer, p, x = case(name)
    _assert_instantiated(([layer] * 2, [p] * 2, x, x[:5, :4], True), monkeypatch)


def test_a_layer_with_a_fixed_sequence_length_keeps_the_symbolic_batch(monkeypatch):
    """A layer adding a positional table of the sequence's length does not trace with a
    symbolic sequence: the batch alone is symbolic (a new batch instantiated), and a new
    sequence length fails in the layer itself, as it would without jaxremat."""
    def layer(p, x):
        return jnp.tanh(x @ p["w"] + p["pos"])

    p = {"w": jnp.ones((4, 4)) / 4, "pos": jnp.zeros((6, 4))}
    x = jnp.ones((3, 6, 4))
    found, count = _profiles([layer] * 2, [p] * 2, x, x[:2], True, True, monkeypatch)
    assert count == 0 and found.chain.length == 2


@pytest.mark.parametrize("name", ["mlp", "marked attention"])
def test_searched_options_are_instantiated_at_a_new_batch_size(name, monkeypatch):
    """With ``"dots_plus"``, the searched policies (keyed by shapes) are moved to the symbolic
    program's equations (``searched.moved_policy``): at a new batch size no option is traced
    and the profile equals tracing it."""
    layer, p, x = case(name)
    menu = ("dots", "dots_no_batch", "names", "dots_plus")
    _assert_instantiated(([layer] * 2, [p] * 2, x, x[:3], True), monkeypatch, menu)
    profile_cache().clear()
    names = [o.name for o in profile_sequence([layer], [p], x, policies=menu).layers[0].options]
    profile_cache().clear()
    assert any(n.endswith(("_plus", "_plus:wide")) for n in names)  # searched ones were kept


def test_moved_policy_keeps_the_same_equations_or_none():
    """A searched policy moved to the symbolic program keeps the equations at the same
    positions; to a program of another structure it does not move."""
    from jaxremat.sequence.searched import SearchedPolicy, equation_key, moved_policy

    f = lambda x: jnp.sin(jnp.exp(x) @ jnp.ones((3, 3))) * 2  # noqa: E731
    x = jax.ShapeDtypeStruct((4, 3), jnp.float32)
    concrete = jax.make_jaxpr(f)(x)
    found = symbolic_input(x)
    program = jax.make_jaxpr(f)(found.x)
    exp = next(e for e in concrete.jaxpr.eqns if e.primitive.name == "exp")
    policy = SearchedPolicy(frozenset({equation_key(exp.primitive, [v.aval for v in exp.invars])}),
                            "nothing")
    moved = moved_policy(policy, concrete, program)
    (key,) = moved.keys
    assert key[0] == "exp" and str(key[1][0][0][0]) == symbolic.SYMBOL
    assert moved_policy(policy, concrete, jax.make_jaxpr(lambda x: jnp.exp(x))(found.x)) is None
