"""Apply a solver plan to a sequence of JAX layers (ALGORITHMS.md section 6).

A plan (``solver.Plan``) is a tuple of ``solver.Layer(i)`` and
``solver.Checkpoint(start, stop, body)`` items covering the layers in order:

* ``Layer(i)``: call ``layers[i](params[i], x)`` plainly; under autodiff JAX keeps the
  layer's residuals (its tape): Rotor's ``F_all(i)`` then ``B(i)``.
* ``Layer(i, option=k)``, ``k >= 1`` (issue 17, :mod:`jaxremat.sequence.policies`): call
  ``jax.checkpoint(layers[i], policy=policies[i][k], prevent_cse=True)``; JAX keeps only
  the residuals the policy saves and recomputes the rest in the layer's backward.
* ``Checkpoint(start, stop, body)``: run layers ``start .. stop-1`` keeping only the input
  (``F_ck``/``F_none``); when the backward pass reaches the segment, recompute it following
  ``body`` (itself a plan, applied recursively) and run its backward. A checkpoint nested
  more than :data:`MAX_NESTING` deep (plans near the minimum budget nest as deep as the
  chain is long) is applied flat, with the same schedule, by
  :func:`jaxremat.sequence.flat_apply.flat_segment` in both backends.

Two backends realise a checkpoint:

* ``"checkpoint"``: ``jax.checkpoint(segment, prevent_cse=True)``. JAX saves the
  segment's inputs and, in the backward, recomputes the segment; the nested checkpoints of
  ``body`` decide what that recomputation keeps. ``prevent_cse=True`` keeps XLA from
  merging the recomputation with the forward.
* ``"custom_vjp"``: a ``jax.custom_vjp`` whose forward runs the segment without saving
  anything but its inputs, and whose backward runs ``jax.vjp`` of the segment (which applies
  ``body``, nested segments included) on the saved input. The input and the incoming
  gradient first pass through ``jax.lax.optimization_barrier`` so that XLA can neither hoist
  the recomputation into the forward pass nor merge it away.

A layer's option is always applied with ``jax.checkpoint`` and its policy, in both backends
(``custom_vjp`` has no policies of its own: a segment's backward runs ``jax.vjp`` of its
body, in which such a layer keeps what its policy saves, as under ``"checkpoint"``). The
Flax wrappers pass ``option_transform`` (the lifted ``nnx.remat`` / ``nn.remat`` with the
policy) instead.

The parameters of a segment are passed to it as arguments (never closed over), so their
gradients flow through both backends.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax

from solver import Checkpoint, Layer, validate_plan
from solver import Plan as SolverPlan

from .flat_apply import flat_segment, nesting_depth, vjp_params_only
from ..trace_state import is_differentiated

__all__ = ["BACKENDS", "MAX_NESTING", "apply_plan"]

BACKENDS = ("checkpoint", "custom_vjp")

MAX_NESTING = 16
"""Checkpoints nested deeper than this are applied flat (:mod:`jaxremat.sequence.flat_apply`): nested
``jax.checkpoint`` recurses in Python (here and in JAX's tracing) once per level."""


def _checkpoint_option(layer: Callable, policy: Callable) -> Callable:
    """The default ``option_transform``: ``jax.checkpoint`` with the option's policy."""
    return jax.checkpoint(layer, policy=policy, prevent_cse=True)


def _layer(item: Layer, layers: Sequence[Callable], options: tuple) -> Callable:
    """The function ``(params, x) -> y`` of ``item``: the plain layer, or its option."""
    option = getattr(item, "option", 0)
    if not option:
        return layers[item.index]
    policies, option_transform = options
    return option_transform(layers[item.index], policies[item.index][option])


def _run(plan: SolverPlan, layers: Sequence[Callable], params: Sequence[Any], x: Any,
         offset: int, backend: str | Callable, options: tuple) -> Any:
    """Apply ``plan`` to ``x``; ``params[k]`` belongs to layer ``offset + k``."""
    for item in plan:
        if isinstance(item, Layer):
            x = _layer(item, layers, options)(params[item.index - offset], x)
        else:
            segment_params = tuple(params[item.start - offset:item.stop - offset])
            x = _segment(item, layers, backend, options, is_differentiated(x))(segment_params, x)
    return x


def _segment(item: Checkpoint, layers: Sequence[Callable], backend: str | Callable,
             options: tuple, input_grad: bool = True) -> Callable:
    """The function ``(segment_params, x) -> y`` of one checkpointed segment."""
    if not callable(backend) and nesting_depth(item) > MAX_NESTING:
        return flat_segment(item, layers, functools.partial(_layer, layers=layers,
                                                            options=options),
                            input_grad=input_grad)
    body = functools.partial(_run, item.body, layers, offset=item.start, backend=backend,
                             options=options)
    if callable(backend):  # apply_plan's ``transform`` (e.g. Flax's lifted remat)
        return backend(body)
    if backend == "checkpoint":
        return jax.checkpoint(body, prevent_cse=True)
    return _custom_vjp_segment(body, input_grad)


def _custom_vjp_segment(body: Callable, input_grad: bool = True) -> Callable:
    """``body`` as a ``jax.custom_vjp`` that saves only its inputs and recomputes. Without
    ``input_grad`` (the sequence's input, not differentiated) the backward differentiates
    the parameters alone and returns no cotangent for ``x``, as ``jax.checkpoint`` does and
    as the plan assumes (``input_grad`` of :func:`jaxremat.profile_sequence`): the first
    layer keeps no residuals for ``g[0]`` and computes none."""

    @jax.custom_vjp
    def segment(segment_params: Any, x: Any) -> Any:
        return body(segment_params, x)

    def forward(segment_params: Any, x: Any) -> tuple[Any, Any]:
        return body(segment_params, x), (segment_params, x)

    def backward(saved: Any, cotangent: Any) -> Any:
        segment_params, x = saved
        # Tie the recomputation to the arrival of the cotangent: XLA may not move it into
        # the forward pass, nor share it with the forward (the barrier's outputs are new).
        x, cotangent = jax.lax.optimization_barrier((x, cotangent))
        vjp = jax.vjp if input_grad else vjp_params_only
        _, pullback = vjp(body, segment_params, x)
        return pullback(cotangent)

    segment.defvjp(forward, backward)
    return segment


def apply_plan(
    plan: SolverPlan,
    layers: Sequence[Callable],
    params: Sequence[Any],
    x: Any,
    *,
    backend: str = "checkpoint",
    transform: Callable[[Callable], Callable] | None = None,
    policies: Sequence[Sequence[Any]] | None = None,
    option_transform: Callable[[Callable, Any], Callable] | None = None,
) -> Any:
    """Run ``layers`` on ``x`` following ``plan``; the result equals running them in order.

    Args:
      plan: a ``solver.Plan`` covering ``len(layers)`` layers (e.g. ``schedule.plan``).
      layers: functions ``layers[i](params[i], x) -> y``.
      params: one pytree per layer.
      x: the input pytree.
      backend: ``"checkpoint"`` (nested ``jax.checkpoint``) or ``"custom_vjp"``.
      transform: instead of ``backend``, a function ``transform(body) -> segment`` that
        makes each checkpointed segment from its ``body(segment_params, x)`` (which applies
        the nested sub-plan); ``segment`` is called as ``segment(segment_params, x)``. The
        Flax wrappers pass the lifted ``nnx.remat`` / ``nn.remat`` here, so that module
        state updates propagate (:mod:`jaxremat.flax`).
      policies: ``policies[i][k]`` is the ``jax.checkpoint`` policy of option ``k`` of layer
        ``i`` (``[0]``, the whole tape, is unused); needed when the plan has a
        ``Layer(i, option=k)`` with ``k >= 1`` (e.g. :attr:`jaxremat.Plan.policies`).
      option_transform: ``option_transform(layer, policy) -> layer`` applies an option
        (default: ``jax.checkpoint(layer, policy=policy, prevent_cse=True)``, in both
        backends).

    Returns:
      The last layer's output. Its gradients (``jax.grad``/``jax.vjp``) equal those of the
      plain sequence; only what is stored and what is recomputed differs.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
    if len(params) != len(layers):
        raise ValueError(
            f"params has {len(params)} entries but there are {len(layers)} layers."
        )
    validate_plan(plan, 0, len(layers))
    _check_options(plan, policies, len(layers))
    if transform is not None:
        if not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}.")
        backend = transform
    options = (policies, option_transform or _checkpoint_option)
    return _run(plan, tuple(layers), tuple(params), x, 0, backend, options)


def _check_options(plan: SolverPlan, policies: Sequence[Sequence[Any]] | None,
                   length: int) -> None:
    """Raise ``ValueError`` unless every ``Layer(i, option=k)`` of ``plan`` has a policy."""
    pending = list(plan)
    while pending:
        item = pending.pop()
        if isinstance(item, Checkpoint):
            pending.extend(item.body)
            continue
        option = getattr(item, "option", 0)
        if not option:
            continue
        if policies is None or len(policies) != length:
            raise ValueError(
                f"The plan runs layer {item.index} with option {option} (a checkpoint policy); "
                f"pass policies=plan.policies (one sequence of policies per layer, {length} "
                "layers)."
            )
        if not 0 < option < len(policies[item.index]):
            raise ValueError(
                f"The plan runs layer {item.index} with option {option}, but that layer has "
                f"{len(policies[item.index])} options (0 = the whole tape)."
            )
