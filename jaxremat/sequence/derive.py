"""A layer's profile without its input's gradient, derived from the one with it (issue 18.4).

The first layer of a sequence whose input is not differentiated is profiled with
``input_grad=False`` (:func:`jaxremat.measure.trace.trace_layer`); in a stack of equal blocks
the others are the same function with ``input_grad=True``, so each new input shape traced
both: six ``jax.vjp`` traces and pullbacks for a block with two policy options, where the
second three only leave the input's gradient out. Dead code elimination of that gradient
from the first three (:func:`jaxremat.measure.trace.without_input_grad`) gives the tape,
transients and counts of the second without tracing, where it agrees with tracing it:
:mod:`jaxremat.sequence.profile` compares the two profiles field by field, and the two counts
term by term, at the first shape where both were traced, and derives at later shapes only
for a layer that passed (with costs only from the calibration, else it traces).

The tracers here plug into :func:`jaxremat.sequence.options.layer_options`
(:data:`jaxremat.sequence.options.Tracer`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..measure.trace import TracedLayer, trace_layer, without_input_grad
from .layer import LayerProfile
from .options import Tracer, trace
from .policies import PolicyOption

__all__ = ["deriving_tracer", "recording_tracer", "same_profile"]


def recording_tracer(recorded: dict[str, Any], inner: Tracer = trace) -> Tracer:
    """A tracer that traces with ``inner`` and keeps each option's :class:`TracedLayer` (or
    the exception its trace raised) in ``recorded`` by option name."""

    def tracer(layer: Callable, p: Any, x: Any, index: int, input_grad: bool,
               option: PolicyOption) -> TracedLayer:
        try:
            found = inner(layer, p, x, index, input_grad, option)
        except Exception as error:  # noqa: BLE001 - kept, then raised as before
            recorded[option.name] = error
            raise
        recorded[option.name] = found
        return found

    return tracer


def deriving_tracer(recorded: dict[str, Any], num_params: int, num_x: int) -> Tracer:
    """A tracer for ``input_grad=False`` that derives each option from its recorded
    ``input_grad=True`` trace (:func:`recording_tracer`), and traces the options that have
    none (their trace failed: the error is then the one of tracing without the gradient)."""

    def tracer(layer: Callable, p: Any, x: Any, index: int, input_grad: bool,
               option: PolicyOption) -> TracedLayer:
        found = recorded.get(option.name)
        if input_grad or not isinstance(found, TracedLayer):
            return trace_layer(layer, p, x, index, input_grad=input_grad)
        return without_input_grad(found, num_params, num_x)

    return tracer


def same_profile(a: LayerProfile, b: LayerProfile) -> bool:
    """Whether two profiles of a layer are equal in every field, the options' policies
    compared by name (a ``"names:..."`` option's policy is a new function each time)."""
    def plain(profile: LayerProfile) -> LayerProfile:
        return dataclasses.replace(profile, options=tuple(
            dataclasses.replace(o, policy=None) for o in profile.options))

    return plain(a) == plain(b)
