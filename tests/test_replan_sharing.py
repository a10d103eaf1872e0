"""Work a layer's profile shares between its pieces (issue 18.4, branch replan5): the
per-equation facts and count terms computed once per equation inside a
``shared_equations`` block, and no second dead-code pass over a piece that came out of one.
Each must give exactly the numbers computed without it."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from blocks import case
from jaxremat import program_memory
from jaxremat.measure import costs, jaxpr_facts
from jaxremat.measure.meter import inputs_read
from jaxremat.measure.trace import (_dead_code_removed, live_jaxpr, tape_jaxpr, trace_layer,
                                    without_input_grad)


def _pieces(name: str, policy) -> dict:
    """A block's pieces as the profiler measures them (fresh jaxpr objects on each call):
    the vjp forward, its tape-only and vjp-forward variants, the pullback and the pullback
    without the input's gradient."""
    layer, params, x = case(name)
    if policy is not None:
        layer = jax.checkpoint(layer, policy=policy, prevent_cse=True)
    traced = trace_layer(layer, params, x, 0)
    derived = without_input_grad(traced, len(jax.tree.leaves(params)), 1)
    return {"forward": traced.forward, "tape": tape_jaxpr(traced),
            "vjp": tape_jaxpr(traced, with_output=True), "backward": traced.backward,
            "derived backward": derived.backward}


def _numbers(closed) -> tuple:
    """What the meter and the count say about one piece."""
    terms = costs.count_terms(closed)
    return (program_memory(closed), program_memory(closed, exclude_inputs=False,
                                                   count_outputs=True),
            tuple(inputs_read(closed)), terms.structure, tuple(terms.flops), tuple(terms.bytes))


@pytest.mark.parametrize("name, policy", [
    ("mlp", None), ("attention", jax.checkpoint_policies.dots_saveable),
    ("marked attention", jax.checkpoint_policies.save_only_these_names("scores"))])
def test_shared_equations_change_no_number(name, policy):
    """Inside a block the pieces share their equations' facts and terms (each computed once
    per equation) and every number equals the one computed outside any block."""
    alone = {k: _numbers(v) for k, v in _pieces(name, policy).items()}
    raw = jaxpr_facts._eqn_facts
    with jaxpr_facts.shared_equations():
        pieces = _pieces(name, policy)
        with jaxpr_facts.shared_equations():  # nested: the same memo
            shared = {k: _numbers(v) for k, v in pieces.items()}
        by_function, seen = jaxpr_facts._SHARED.memo
        memo = by_function[raw]  # the facts, memoised per equation
        equations = {id(e) for piece in pieces.values() for e in piece.jaxpr.eqns}
        assert equations <= set(memo)
        assert equations <= {id(e) for e in seen}  # held: their ids stay theirs
    assert jaxpr_facts._SHARED.memo is None  # dropped with the outermost block
    assert shared == alone


def test_per_equation_memo_counts_each_equation_once():
    """Two dead-code-eliminated variants of one forward: their common equations' values are
    computed once inside a block, once per variant outside."""
    calls = []

    def name_of(eqn):
        calls.append(eqn)
        return eqn.primitive.name

    closed = _pieces("mlp", None)["forward"]
    outputs = len(closed.jaxpr.outvars)
    a = _dead_code_removed(closed, [True] + [False] * (outputs - 1)).jaxpr
    b = _dead_code_removed(closed, [True] * outputs).jaxpr
    common = {id(e) for e in a.eqns} & {id(e) for e in b.eqns}
    assert common
    outside = [jaxpr_facts.per_equation(name_of, j.eqns) for j in (a, b)]
    assert len(calls) == len(a.eqns) + len(b.eqns)
    calls.clear()
    with jaxpr_facts.shared_equations():
        inside = [jaxpr_facts.per_equation(name_of, j.eqns) for j in (a, b)]
    assert inside == outside == [[e.primitive.name for e in j.eqns] for j in (a, b)]
    assert len(calls) == len({id(e) for e in (*a.eqns, *b.eqns)}) < len(a.eqns) + len(b.eqns)


def test_shared_equations_is_per_thread():
    """Another thread does not see (or fill) this thread's memo."""
    seen = []
    with jaxpr_facts.shared_equations():
        thread = threading.Thread(target=lambda: seen.append(
            getattr(jaxpr_facts._SHARED, "memo", None)))
        thread.start()
        thread.join()
        assert jaxpr_facts._SHARED.memo is not None
    assert seen == [None]


@pytest.mark.parametrize("name, policy", [
    ("mlp", None), ("attention", jax.checkpoint_policies.dots_with_no_batch_dims_saveable)])
def test_live_jaxpr_skips_only_dead_code_free_pieces(name, policy):
    """``live_jaxpr`` returns a dead-code elimination's result unchanged, and counting it
    gives the terms of counting it after a second elimination (it keeps every equation);
    a traced jaxpr still has its dead code removed."""
    pieces = _pieces(name, policy)
    for key in ("tape", "vjp", "derived backward"):
        piece = pieces[key]
        assert live_jaxpr(piece) is piece
        again = _dead_code_removed(piece, [True] * len(piece.jaxpr.outvars))
        assert [e.primitive.name for e in again.jaxpr.eqns] == [
            e.primitive.name for e in piece.jaxpr.eqns]
        direct, after = costs.count_terms(piece), costs._count(again.jaxpr, 0)
        assert direct.structure == after.structure
        np.testing.assert_array_equal(direct.flops, after.flops)
        np.testing.assert_array_equal(direct.bytes, after.bytes)

    def dead(x):
        unused = jnp.sin(x) * 2.0  # noqa: F841 - dead code in the traced jaxpr
        return jnp.cos(x)

    closed = jax.make_jaxpr(dead)(jnp.ones(3))
    assert len(closed.jaxpr.eqns) == 3
    assert [e.primitive.name for e in live_jaxpr(closed).jaxpr.eqns] == ["cos"]
    assert costs.count_terms(closed).totals == (3.0, 24.0)


@pytest.mark.parametrize("trace", ["trace_layer", "trace_linearized"])
def test_tracing_a_layer_keeps_none_of_its_programs(trace):
    """A layer traced at a new shape leaves none of its programs alive once its trace is
    dropped. ``jax.vjp``'s function returned from the traced function made its linear
    jaxpr part of the output structure, which ``jit``'s caches keep: 11,000 objects per
    re-plan of 12 GPT-2 blocks (``trace._traced_with_function``)."""
    import gc

    from jax import lax
    from jax.extend.core import Jaxpr

    from jaxremat.measure import trace as trace_module

    size = 11

    def layer(p, x):
        return lax.tanh(lax.dot_general(x, p, (((1,), (0,)), ((), ()))))

    def alive() -> set[int]:  # programs holding the layer's product at this shape
        gc.collect()
        return {id(o) for o in gc.get_objects() if isinstance(o, Jaxpr) and any(
            e.primitive.name == "dot_general" and size in getattr(e.outvars[0].aval, "shape", ())
            for e in o.eqns)}

    p = jax.ShapeDtypeStruct((size, size), jnp.float32)
    x = jax.ShapeDtypeStruct((2, size), jnp.float32)
    before = alive()  # other tests in this process may have left such programs
    found = getattr(trace_module, trace)(layer, p, x, 0) if trace == "trace_layer" else \
        trace_module.trace_linearized(layer, p, x)
    assert alive() - before
    del found
    assert not alive() - before
