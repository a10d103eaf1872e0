"""What JAX transformations wrap a value while it is traced: ``vmap`` batch sizes, autodiff.

The solver plans per example when a sequence is traced under ``jax.vmap`` (its activations
grow with the batch), and only keeps the input's gradient when the input is differentiated.
Both facts are read from the tracers wrapping the input, through JAX internals
(``BatchTracer.val``/``batch_dim``, ``JVPTracer.primal``); if a JAX refactor moves them, the
functions fall back to "no batch" and "differentiated" (the conservative answers).
"""

from __future__ import annotations

from typing import Any, Iterator

import jax

__all__ = ["vmap_batch_size", "is_differentiated"]

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


def vmap_batch_size(tree: Any) -> int:
    """The product of the ``jax.vmap`` batch sizes of the leaves of ``tree`` (1 if none).

    Multiplies the sizes of the batched dimensions of the batching tracers wrapped in each
    leaf (:func:`_tracer_chain`); the largest product over the leaves.
    """
    best = 1
    for leaf in jax.tree.leaves(tree):
        size = 1
        for tracer in _tracer_chain(leaf):
            if jax_compat.BATCH_TRACER is not None and isinstance(tracer, jax_compat.BATCH_TRACER):
                if isinstance(tracer.batch_dim, int):
                    size *= int(tracer.val.shape[tracer.batch_dim])
        best = max(best, size)
    return best


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
