"""What JAX transformations wrap a value while it is traced: ``vmap`` batch sizes, autodiff.

The solver plans per example when a sequence is traced under ``jax.vmap`` (its activations
grow with the batch), and only keeps the input's gradient when the input is differentiated.
Both facts are read from the tracers wrapping the input, through JAX internals
(``BatchTracer.val``/``batch_dim``/``_trace``, ``JVPTracer.primal``); if a JAX refactor moves
them, the functions fall back to "no batch" and "differentiated" (the conservative answers).
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import jax

__all__ = ["vmap_batch_size", "vmap_levels", "is_differentiated"]

from . import jax_compat


def _tracer_chain(leaf: Any) -> Iterator[Any]:
    """The tracers wrapped inside ``leaf``: through batching tracers to their value and
    through autodiff tracers to their primal (JAX internals: ``.val``, ``.primal``)."""
    value = leaf
    for _ in range(64):  # tracer nesting is shallow; bound the walk anyway
        if not isinstance(value, jax.core.Tracer):
            return
        yield value
        if jax_compat.BATCH_TRACER is not None and isinstance(value, jax_compat.BATCH_TRACER):
            value = value.val
        elif hasattr(value, "primal"):
            value = value.primal
        else:
            return


def _trace_of(tracer: Any) -> Any:
    """The trace ``tracer`` belongs to (JAX internal ``._trace``), or ``None``."""
    return getattr(tracer, "_trace", None)


def vmap_levels(tree: Any) -> tuple[tuple[int, tuple[bool, ...]], ...]:
    """The ``jax.vmap`` levels batching the leaves of ``tree``, outermost first: per level,
    its batch size and which leaves (in ``jax.tree.leaves`` order) it batches.

    Levels are told apart by the trace a batching tracer belongs to (JAX internal:
    ``._trace``; without it, by the tracer's depth in its leaf's chain, the largest size at
    a depth taken). A vmap over an ensemble around a vmap over the batch batches the
    parameters at one level and the input at another: the batch is their product, though no
    leaf is batched by both.
    """
    levels: dict[Any, list] = {}  # level -> [size, leaves]
    order: list[Any] = []  # levels, outermost first where a leaf's chain tells
    for k, leaf in enumerate(jax.tree.leaves(tree)):
        chain = []
        for depth, tracer in enumerate(_tracer_chain(leaf)):
            if (jax_compat.BATCH_TRACER is not None and isinstance(tracer, jax_compat.BATCH_TRACER)
                    and isinstance(tracer.batch_dim, int)):
                trace = _trace_of(tracer)
                key = ("depth", depth) if trace is None else id(trace)
                level = levels.setdefault(key, [1, set()])
                level[0] = max(level[0], int(tracer.val.shape[tracer.batch_dim]))
                level[1].add(k)
                chain.append(key)
        for key in reversed(chain):  # the chain runs from the innermost level out
            if key not in order:
                order.append(key)
    count = len(jax.tree.leaves(tree))
    return tuple((levels[key][0], tuple(k in levels[key][1] for k in range(count)))
                 for key in order)


def vmap_batch_size(tree: Any) -> int:
    """The product of the ``jax.vmap`` batch sizes of the levels batching the leaves of
    ``tree`` (1 if none; :func:`vmap_levels`)."""
    return math.prod(size for size, _ in vmap_levels(tree))


def _any_autodiff_tracer(tree: Any) -> bool:
    """Whether some leaf of ``tree`` wraps an autodiff tracer."""
    return any(
        isinstance(tracer, jax_compat.AD_TRACERS)
        for leaf in jax.tree.leaves(tree)
        for tracer in _tracer_chain(leaf)
    )


def is_differentiated(tree: Any) -> bool:
    """Whether some leaf of ``tree`` is being differentiated (wraps an autodiff tracer), so
    that the backward pass needs the gradient of the sequence's input. ``True`` when the
    tracer types cannot be seen (the conservative answer)."""
    return _any_autodiff_tracer(tree) if jax_compat.AD_TRACERS else True
