"""Apply a solver plan to a sequence of JAX layers (ALGORITHMS.md section 6).

A plan (``solver.Plan``) is a tuple of ``solver.Layer(i)`` and
``solver.Checkpoint(start, stop, body)`` items covering the layers in order:

* ``Layer(i)``: call ``layers[i](params[i], x)`` plainly; under autodiff JAX keeps the
  layer's residuals (its tape): Rotor's ``F_all(i)`` then ``B(i)``.
* ``Checkpoint(start, stop, body)``: run layers ``start .. stop-1`` keeping only the input
  (``F_ck``/``F_none``); when the backward pass reaches the segment, recompute it following
  ``body`` (itself a plan, applied recursively) and run its backward.

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

The parameters of a segment are passed to it as arguments (never closed over), so their
gradients flow through both backends.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax

from solver import Checkpoint, Layer, validate_plan
from solver import Plan as SolverPlan

__all__ = ["BACKENDS", "apply_plan"]

BACKENDS = ("checkpoint", "custom_vjp")


def _run(plan: SolverPlan, layers: Sequence[Callable], params: Sequence[Any], x: Any,
         offset: int, backend: str | Callable) -> Any:
    """Apply ``plan`` to ``x``; ``params[k]`` belongs to layer ``offset + k``."""
    for item in plan:
        if isinstance(item, Layer):
            x = layers[item.index](params[item.index - offset], x)
        else:
            segment_params = tuple(params[item.start - offset:item.stop - offset])
            x = _segment(item, layers, backend)(segment_params, x)
    return x


def _segment(item: Checkpoint, layers: Sequence[Callable], backend: str | Callable) -> Callable:
    """The function ``(segment_params, x) -> y`` of one checkpointed segment."""
    body = functools.partial(_run, item.body, layers, offset=item.start, backend=backend)
    if callable(backend):  # apply_plan's ``transform`` (e.g. Flax's lifted remat)
        return backend(body)
    if backend == "checkpoint":
        return jax.checkpoint(body, prevent_cse=True)
    return _custom_vjp_segment(body)


def _custom_vjp_segment(body: Callable) -> Callable:
    """``body`` as a ``jax.custom_vjp`` that saves only its inputs and recomputes."""

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
        _, pullback = jax.vjp(body, segment_params, x)
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
    if transform is not None:
        if not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}.")
        backend = transform
    return _run(plan, tuple(layers), tuple(params), x, 0, backend)
