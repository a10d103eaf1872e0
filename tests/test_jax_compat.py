"""``jaxremat.jax_compat``: one code base on JAX 0.10.1 to 0.12.x.

Each JAX internal jaxremat reads has a fallback, tested here by taking the internal away;
each version-specific jaxpr form is tested on the running version (CI runs the suite on
JAX 0.10 under Python 3.11 and on the newest JAX under Python 3.12).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxpr_as_fun

import jaxremat
import solver
from dense_chain import A, X, Y, layer, per_layer_checkpoint, plain, segments, weights
from jaxremat import activation_memory, jax_compat, profile_layers, remat_sequence
from jaxremat import trace_state
from jaxremat.trace_state import is_differentiated, vmap_batch_size


def test_close_jaxpr_binds_constants():
    c = jnp.arange(3.0)
    closed = jax.make_jaxpr(lambda x: x * c + 1.0)(jnp.ones(3))
    assert len(closed.consts) == 1
    again = jax_compat.close_jaxpr(closed.jaxpr, closed.consts)
    np.testing.assert_allclose(jaxpr_as_fun(again)(jnp.ones(3))[0], c + 1.0)
    bare = jax.make_jaxpr(lambda x: jnp.sin(x))(jnp.ones(3))
    np.testing.assert_allclose(jaxpr_as_fun(jax_compat.close_jaxpr(bare.jaxpr))(jnp.ones(3))[0],
                               np.sin(np.ones(3)), rtol=1e-6)


def test_dce_removes_unused_outputs_and_falls_back(monkeypatch):
    closed = jax.make_jaxpr(lambda x: (jnp.sin(x), jnp.cos(x)))(jnp.ones(3))
    kept = jax_compat.dce_jaxpr(closed, [True, False])
    assert [e.primitive.name for e in kept.jaxpr.eqns] == ["sin"]
    monkeypatch.setattr(jax_compat, "_dce", None)
    assert jax_compat.dce_jaxpr(closed, [True, False]) is closed
    # the profile then overestimates transients and tape-only forwards, but still works
    chain = profile_layers([layer] * 2, weights(2), X)
    assert chain.fwd_tape_time[0] <= chain.fwd_time[0]


def test_tracer_fallbacks(monkeypatch):
    seen = {}

    def probe(x):
        seen["batch"], seen["diff"] = vmap_batch_size(x), is_differentiated(x)
        return jnp.sum(x)

    jax.grad(lambda x: jnp.sum(jax.vmap(probe)(x)))(jnp.ones((5, 3)))
    assert seen == {"batch": 5, "diff": True}
    jax.vmap(probe)(jnp.ones((5, 3)))
    assert seen == {"batch": 5, "diff": False}
    monkeypatch.setattr(jax_compat, "AD_TRACERS", ())
    monkeypatch.setattr(jax_compat, "BATCH_TRACER", None)
    jax.vmap(probe)(jnp.ones((5, 3)))
    assert seen == {"batch": 1, "diff": True}  # the conservative answers



def test_vmap_levels_without_traces(monkeypatch):
    # An ensemble of 2 around a batch of 3: levels told apart by their traces multiply;
    # without the tracers' traces, by their depth: two leaves under one vmap are one level.
    seen = []

    def probe(w, x):
        seen.append((vmap_batch_size((w, x)), vmap_batch_size((x, 2 * x))))
        return jnp.sum(w * x)

    nested = lambda: jax.vmap(lambda w: jax.vmap(lambda x: probe(w, x))(jnp.ones((3, 4))))(  # noqa: E731
        jnp.ones((2, 4)))
    nested()
    monkeypatch.setattr(trace_state, "_trace_of", lambda tracer: None)
    nested()
    assert seen == [(6, 3), (3, 3)]  # the fallback reads the largest level's only


class _Lowered:
    def __init__(self, answer):
        self.answer = answer

    def cost_analysis(self):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer, expected", [
    ({"flops": 3, "bytes accessed": 8.0, "name": "x"}, {"flops": 3.0, "bytes accessed": 8.0}),
    ([{"flops": 2.0}], {"flops": 2.0}),
    (None, None), ([], None), ({}, None), ({"bytes accessed": 1.0}, None),
    (NotImplementedError("no cost analysis on this backend"), None),
])
def test_lowered_cost_analysis_forms(answer, expected):
    assert jax_compat.lowered_cost_analysis(_Lowered(answer)) == expected


def test_lowered_costs_fall_back_when_cost_analysis_raises(monkeypatch):
    from jax._src import stages

    from jaxremat.measure import costs

    def unavailable(self):
        raise NotImplementedError("cost analysis")

    monkeypatch.setattr(stages.Lowered, "cost_analysis", unavailable)
    found = costs.lowered_costs(lambda w, x: layer(w, x), weights(1)[0], X)
    assert costs.LAST_SOURCE == "jaxpr" and found["flops"] > 0


def test_calls_of_this_version_are_entered():
    # whatever this JAX calls a call (closed_call on 0.10, eval_jaxpr on 0.11+; custom_vjp
    # emits them), the meter enters it: the jaxpr walked sees no opaque call left
    calls = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if jax_compat.sub_jaxprs(eqn) and eqn.primitive.name not in ("scan", "while", "cond"):
                assert jax_compat.is_call(eqn), eqn.primitive.name
                calls.add(eqn.primitive.name)
            for sub in jax_compat.sub_jaxprs(eqn):
                walk(sub)

    for backend in ("checkpoint", "custom_vjp"):
        seq = remat_sequence([layer] * 4, "75%", backend=backend)
        walk(jax.make_jaxpr(jax.grad(lambda w, x: jnp.sum(seq(w, x))))(weights(4), X).jaxpr)
    assert calls


def _flag(name):
    if not hasattr(jax.config, name):
        pytest.skip(f"{name} does not exist in JAX {jax.__version__}")
    return name


@pytest.mark.parametrize("program, units", [
    (per_layer_checkpoint, lambda L: L + 3 + Y),
    (lambda ws, x: segments(ws, x, 2), lambda L: L // 2 + 2 + 2 + Y),
])
def test_remat3_checkpoints_measure_as_remat2(program, units):
    # jax_remat3 (JAX 0.11+, off by default) writes a checkpoint's recomputation as a
    # call_hi_primitive whose body is in its _prim: the meter enters it and measures what
    # it measures for today's remat2 (test_meter's derivations)
    flag = _flag("jax_remat3")
    L = 4
    before = activation_memory(program, weights(L), X)
    assert before == units(L) * A
    jax.config.update(flag, True)
    try:
        closed = jax.make_jaxpr(jax.grad(program))(weights(L), X)
        if jax_compat.JAX_VERSION >= (0, 11):  # the flag exists on 0.10 but changes nothing
            assert "call_hi_primitive" in {e.primitive.name for e in closed.jaxpr.eqns}
        assert activation_memory(program, weights(L), X) == before
        seq = remat_sequence([layer] * L, "75%")
        plan = seq.plan(weights(L), X)
        measured = activation_memory(lambda w, x: jnp.sum(seq(w, x)), weights(L), X)
        assert measured <= plan.predicted_peak
    finally:
        jax.config.update(flag, False)


def _least_memory_sequence(backend):
    try:
        remat_sequence([layer] * 4, 1, backend=backend).plan(weights(4), X)
    except solver.InfeasibleBudget as error:
        return remat_sequence([layer] * 4, int(error.min_budget), backend=backend)
    raise AssertionError("a budget of one byte was accepted")


def test_custom_vjp3_is_refused_naming_the_flag():
    # jax_custom_vjp3 (off by default) inlines a custom_vjp's rules under grad, but a
    # custom_vjp nested in another one's backward stays a call_hi_primitive whose program
    # is not in the jaxpr: the meter refuses it rather than guess
    flag = _flag("jax_custom_vjp3")
    seq = _least_memory_sequence("custom_vjp")  # nested segments
    loss = lambda w, x: jnp.sum(seq(w, x))  # noqa: E731
    expected = activation_memory(loss, weights(4), X)
    jax.config.update(flag, True)
    try:
        closed = jax.make_jaxpr(jax.grad(loss))(weights(4), X)
        hidden = "call_hi_primitive" in {e.primitive.name for e in closed.jaxpr.eqns}
        assert hidden or jax_compat.JAX_VERSION < (0, 10, 2)  # 0.10.2 and 0.12 both do it
        if hidden:
            with pytest.raises(NotImplementedError, match="jax_custom_vjp3"):
                activation_memory(loss, weights(4), X)
        else:
            assert activation_memory(loss, weights(4), X) == expected
        # the plan still applies: gradients equal the plain stack's
        grads = jax.grad(loss)(weights(4), X)
        reference = jax.grad(plain)(weights(4), X)
        for a, b in zip(grads, reference):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    finally:
        jax.config.update(flag, False)
    assert activation_memory(loss, weights(4), X) == expected


def test_version_is_read():
    assert jax_compat.JAX_VERSION[:2] >= (0, 10)
    assert jaxremat.jax_compat is jax_compat


def test_remat_graph_sees_through_remat3_checkpoints():
    # a function that checkpoints its own layers: under jax_remat3 each checkpoint is a
    # call_hi_primitive, which the graph builder treats as the call it is
    flag = _flag("jax_remat3")
    ws = weights(4)
    jax.config.update(flag, True)
    try:
        g = jaxremat.remat_graph(per_layer_checkpoint)
        np.testing.assert_allclose(g(ws, X), per_layer_checkpoint(ws, X), rtol=1e-6)
        for a, b in zip(jax.grad(g)(ws, X), jax.grad(per_layer_checkpoint)(ws, X)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        assert activation_memory(g, ws, X) <= activation_memory(per_layer_checkpoint, ws, X)
    finally:
        jax.config.update(flag, False)


def test_scan_constants_are_counted_on_this_version():
    """A ``scan``'s loop constants (``num_consts`` on JAX 0.10-0.11, ``ft_in`` on 0.12):
    two closed-over values, one carry, one scanned input."""
    def f(c, d, xs):
        return jax.lax.scan(lambda h, x: (h * c + x * d, None), c, xs)[0]

    closed = jax.make_jaxpr(f)(1.0, 2.0, jnp.ones(3))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert jax_compat.scan_num_consts(eqn) == len(eqn.invars) - 2 == 2
    bare = eqn.replace(params={k: v for k, v in eqn.params.items()
                               if k not in ("num_consts", "ft_in")})
    assert jax_compat.scan_num_consts(bare) == 0


def test_scan_carry_is_counted_on_this_version():
    """A ``scan``'s final carry (``num_carry`` on JAX 0.10-0.11, ``ft_out`` on 0.12): two
    carried values, two stacked outputs; the default where the params say neither."""
    def f(h, xs):
        return jax.lax.scan(lambda c, x: ((c[0] + x, c[1] + 1), (c[0] * x, c[1] * 2)), (h, 0), xs)

    closed = jax.make_jaxpr(f)(jnp.ones(2), jnp.ones((3, 2)))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert jax_compat.scan_num_carry(eqn, -1) == len(eqn.outvars) - 2 == 2
    bare = eqn.replace(params={k: v for k, v in eqn.params.items()
                               if k not in ("num_carry", "ft_out")})
    assert jax_compat.scan_num_carry(bare, -1) == -1
