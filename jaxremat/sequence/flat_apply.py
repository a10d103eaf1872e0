"""Apply a deeply nested checkpoint flat: one ``jax.custom_vjp`` driven by an explicit stack.

Near its minimum budget Rotor's plan nests checkpoints as deep as the chain is long:
``Checkpoint(0, k, [Checkpoint(0, k-1, [...]), Layer(k-1)])`` recomputes layers ``0 .. j``
from the saved input before the backward of layer ``j`` (ALGORITHMS.md section 1). Applied
as nested ``jax.checkpoint`` (:mod:`jaxremat.sequence.apply`), every level is a new JAX trace inside
the previous one, and JAX's tracing recurses through each. Measured (issue 18) on
``f = jax.checkpoint(lambda ps, x: layer(ps[-1], inner(ps[:-1], x)))`` nested ``k`` deep,
``jax.jit(jax.grad(...)).lower``, with ``sys.setrecursionlimit(10**6)`` in a thread with a
512 MiB stack: Python 3.12 + JAX 0.12 raises ``RecursionError`` at ``k = 200`` and ``500``
(CPython 3.12's C recursion limit, which the setting does not raise); Python 3.11 + JAX 0.10
had not finished tracing ``k = 500`` after 300 s. Raising the limit is therefore no fix.

:func:`flat_segment` realises such a checkpoint with the same schedule and no nesting, at any
depth. The segment is one ``jax.custom_vjp``:

* forward: run the segment's layers plainly, saving only its input (``F_ck``, ``F_none``);
* backward: interpret the checkpoint's body with a Python stack, exactly in the order of
  ``solver.plan_to_ops``: a body runs forward -- ``Layer(i)`` as ``jax.vjp`` of the layer
  (``F_all``: its pullback holds the tape; ``Layer(i, k)`` under the option's policy),
  ``Checkpoint`` by keeping its input and running its layers plainly -- then backward in
  reverse: a pullback for a ``Layer`` (``B(i)``), and the nested body, pushed on the stack,
  for a ``Checkpoint``.

What is live at each point of the backward program is then what Rotor's simulator holds:
the checkpointed inputs of the pending segments, the tapes of the pending layers, and the
running gradient; the meter (:func:`jaxremat.activation_memory`, program order) checks it in
tests/test_deep.py. As for the ``custom_vjp`` backend, the saved input and the incoming
gradient first pass through ``jax.lax.optimization_barrier`` so that XLA cannot hoist the
recomputation into the forward pass.

Limits: the Flax wrappers' lifted ``remat`` (module state updates) has no flat form; their
plans keep nesting (:func:`jaxremat.sequence.apply.apply_plan`). A ``custom_vjp`` under ``jax.vmap``
batches its backward whole (see :class:`jaxremat.RematSequence`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax

from solver import Checkpoint, Layer

__all__ = ["flat_segment", "nesting_depth", "vjp_params_only"]


def nesting_depth(item: Any) -> int:
    """How many checkpoints nest in ``item`` (a ``Layer``: 0, a flat ``Checkpoint``: 1).

    Iterative: plans thousands of levels deep are fine.
    """
    deepest, pending = 0, [(item, 0)]
    while pending:
        node, depth = pending.pop()
        if isinstance(node, Checkpoint):
            deepest = max(deepest, depth + 1)
            pending.extend((child, depth + 1) for child in node.body)
    return deepest


def _run_plain(layers: Sequence[Callable], params: Sequence[Any], x: Any, start: int,
               stop: int, offset: int) -> Any:
    """Layers ``start .. stop-1`` in order, nothing kept for a backward."""
    for i in range(start, stop):
        x = layers[i](params[i - offset], x)
    return x


def vjp_params_only(fn: Callable, p: Any, x: Any) -> tuple[Any, Callable]:
    """``jax.vjp`` of ``fn`` with respect to ``p`` alone; the pullback gives ``(dp, None)``."""
    y, pullback = jax.vjp(lambda q: fn(q, x), p)
    return y, lambda cotangent: (pullback(cotangent)[0], None)


def _forward(body: Sequence[Any], layers: Sequence[Callable], params: Sequence[Any], x: Any,
             offset: int, layer_fn: Callable[[Layer], Callable],
             input_grad: bool) -> list[tuple[Any, Any]]:
    """Run ``body`` forward from ``x``; return, per item, what its backward needs: the
    ``jax.vjp`` pullback of a ``Layer``, the input of a ``Checkpoint``. Without
    ``input_grad``, the segment's first layer computes no gradient for its input."""
    kept = []
    for item in body:
        if isinstance(item, Layer):
            fn, p = layer_fn(item), params[item.index - offset]
            if item.index == offset and not input_grad:
                x, pullback = vjp_params_only(fn, p, x)
            else:
                x, pullback = jax.vjp(fn, p, x)
            kept.append((item, pullback))
        else:
            kept.append((item, x))
            x = _run_plain(layers, params, x, item.start, item.stop, offset)
    return kept


def flat_segment(item: Checkpoint, layers: Sequence[Callable],
                 layer_fn: Callable[[Layer], Callable], *, input_grad: bool = True) -> Callable:
    """``(segment_params, x) -> y`` of checkpoint ``item``, applied without nesting.

    Args:
      item: the checkpoint; its body may nest to any depth.
      layers: all the sequence's layer functions, ``layers[i](params_i, x)``.
      layer_fn: the function ``(params_i, x) -> y`` of a ``Layer`` item (the plain layer,
        or the layer under its option's policy).
      input_grad: whether the segment's input is differentiated; when not, the backward
        computes no gradient for it (returns a zero cotangent), as ``jax.checkpoint`` would
        not, and as the plan assumes (``input_grad`` of :func:`jaxremat.profile_sequence`).

    The result and its gradients equal running the layers in order; the backward follows
    the body's schedule (module docstring).
    """
    offset, stop = item.start, item.stop

    @jax.custom_vjp
    def segment(segment_params: Any, x: Any) -> Any:
        return _run_plain(layers, segment_params, x, offset, stop, offset)

    def forward(segment_params: Any, x: Any) -> tuple[Any, Any]:
        return _run_plain(layers, segment_params, x, offset, stop, offset), (segment_params, x)

    def backward(saved: Any, cotangent: Any) -> tuple[Any, Any]:
        segment_params, x = saved
        x, cotangent = jax.lax.optimization_barrier((x, cotangent))
        grads: list[Any] = [None] * (stop - offset)
        # tasks: ("body", items, input) to run forward, or ("back", item, kept) to run back
        stack: list[tuple[str, Any, Any]] = [("body", item.body, x)]
        while stack:
            task, node, value = stack.pop()
            if task == "body":
                # pushed in order, popped in reverse: the backward order
                stack.extend(("back", it, kept) for it, kept in
                             _forward(node, layers, segment_params, value, offset, layer_fn,
                                      input_grad))
            elif isinstance(node, Layer):
                grads[node.index - offset], cotangent = value(cotangent)
            else:
                stack.append(("body", node.body, value))
        return tuple(grads), cotangent

    segment.defvjp(forward, backward)
    return segment
