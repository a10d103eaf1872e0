"""A layer's profile without the input's gradient derived from the one with it at a new
input shape (issue 18.4, jaxremat.sequence.derive): equal, field by field, to tracing it, the
plans equal, no ``input_grad=False`` trace at the new shape; and the fallbacks to tracing."""

from __future__ import annotations

import os
import sys

import jax.numpy as jnp
import pytest

from blocks import case
from jaxremat import remat_sequence
from jaxremat.measure import trace as trace_module
from jaxremat.sequence import derive, options
from jaxremat.sequence.derive import same_profile
from jaxremat.sequence import profile as profile_module
from jaxremat.sequence.profile import profile_cache, profile_sequence

def _params(name):
    """``blocks.case``, the attention with its scores marked (a names option)."""
    return case("marked attention" if name == "attention" else name)


def _replan(layers, params, x, new, derive_it, monkeypatch):
    """From a cold cache: plan at ``x``, then at ``new``; the profile and plan rows at ``new``
    and how many ``input_grad=False`` traces the second plan ran."""
    profile_cache().clear()
    with monkeypatch.context() as patch:
        if not derive_it:  # traced: neither derived nor instantiated (jaxremat.sequence.polymorphic)
            patch.setattr(profile_module, "_derived_profile", lambda *args: None)
            patch.setattr(profile_module, "instantiating_tracer", lambda *args: None)
        remat_sequence(layers, "50%").plan(params, x)
        traced = []
        original = trace_module.trace_layer

        def counting(*args, input_grad=True, **kwargs):
            traced.append(input_grad)
            return original(*args, input_grad=input_grad, **kwargs)

        for module in (options, derive):
            patch.setattr(module, "trace_layer", counting)
        rows = remat_sequence(layers, "50%").plan(params, new).rows()
        found = profile_sequence(layers, params, new, input_grad=False)
    profile_cache().clear()
    return found, rows, traced.count(False)


def _assert_same(layers, params, x, new, monkeypatch):
    derived, rows, untraced = _replan(layers, params, x, new, True, monkeypatch)
    traced, traced_rows, count = _replan(layers, params, x, new, False, monkeypatch)
    assert count > 0
    assert all(same_profile(a, b) for a, b in zip(derived.layers, traced.layers, strict=True))
    assert repr(derived.chain) == repr(traced.chain)
    assert rows == traced_rows
    return untraced


@pytest.mark.parametrize("name,axis", [("mlp", 0), ("attention", 0), ("attention", 1)])
def test_derived_profile_equals_tracing_at_a_new_shape(name, axis, monkeypatch):
    """A 3-block stack whose input is not differentiated, re-planned at half the batch (or
    the sequence): the first layer's profile is derived (no trace without the input's
    gradient) and equals tracing it, field by field, as do the chain and the plan."""
    layer, p, x = _params(name)
    new = x[:4] if axis == 0 else x[:, :4]
    assert _assert_same([layer] * 3, [p] * 3, x, new, monkeypatch) == 0


def test_a_derivation_that_disagrees_is_not_used(monkeypatch):
    """Where the derived profile differs from the traced one at the first shape (here: a
    derivation that keeps the input's gradient), the layer is not marked and later shapes
    trace it, with the traced profile."""
    monkeypatch.setattr(derive, "without_input_grad", lambda traced, *args: traced)
    layer, p, x = _params("mlp")
    assert _assert_same([layer] * 3, [p] * 3, x, x[:4], monkeypatch) > 0


def test_a_shape_that_changes_the_program_is_traced(monkeypatch):
    """A layer whose equations depend on the batch size: at the new shape its derived
    pieces are not in the calibration, so it is traced (costs lowered, as before)."""
    def branchy(p, x):
        h = x @ p["w1"] @ p["w2"]
        return x + (jnp.tanh(h) if x.shape[0] > 4 else jnp.sin(h) * 2)

    _, p, x = _params("mlp")
    tried = []
    original = profile_module._derived_profile
    monkeypatch.setattr(profile_module, "_derived_profile",
                        lambda *args: tried.append(original(*args)) or tried[-1])
    assert _assert_same([branchy] * 3, [p] * 3, x, x[:4], monkeypatch) > 0
    assert tried == [None]  # marked at the first shape, then given up at the new one


BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


@pytest.mark.slow
@pytest.mark.parametrize("name,axis", [("gpt_blocks", 0), ("gpt_blocks", 1), ("gpt", 0),
                                       ("gpt", 1), ("mlp", 0), ("conv", 0)])
def test_benchmark_layers_replan_as_traced(name, axis, monkeypatch):
    """benchmarks/policies.py's models at half the batch (or sequence): the same profile,
    chain and plan as tracing every layer; derived on the stacks of equal blocks."""
    sys.path.insert(0, BENCHMARKS)
    try:
        from policies import BUILDERS
    finally:
        sys.path.remove(BENCHMARKS)
    layers, params, x = BUILDERS[name]()
    new = x[: x.shape[0] // 2] if axis == 0 else x[:, : x.shape[1] // 2]
    untraced = _assert_same(layers, params, x, new, monkeypatch)
    assert (untraced > 0) == (name == "conv")  # conv's stem is no block: traced
