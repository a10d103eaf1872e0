"""Pytree helpers shared by the frontend: abstract signatures, byte counts, input checks.

The profiler and :class:`jaxremat.RematSequence` both work from *abstract* values
(``jax.ShapeDtypeStruct``) so that a sequence can be profiled while JAX traces it, inside
``jax.jit``, ``jax.grad`` or ``jax.vmap``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import numpy as np

__all__ = [
    "abstractify",
    "aval_nbytes",
    "leaf_bytes",
    "tree_bytes",
    "signature",
    "check_layers",
    "check_params",
    "cotangent_struct",
]


def aval_nbytes(aval: Any) -> int:
    """Bytes of one value of abstract value ``aval``: ``size * dtype.itemsize``.

    Tokens and other shapeless avals take 0 bytes, so does ``float0``; a typed PRNG key
    array takes its key data's bytes (its key dtype's ``itemsize`` is the key data size).
    """
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    itemsize = dtype.itemsize
    if not itemsize:  # float0 (its itemsize is 0; a cheaper test than comparing dtypes)
        return 0
    try:
        size = int(math.prod(shape))
    except (TypeError, jax.errors.InconclusiveDimensionOperation) as error:  # symbolic dims
        raise TypeError(
            f"Cannot measure a value of shape {shape}: the memory meter needs concrete "
            f"shapes. Trace the program with concrete input shapes (no shape polymorphism)."
        ) from error
    return size * int(itemsize)


def leaf_bytes(leaf: Any) -> int:
    """Bytes of one array-like leaf, counted as :mod:`jaxremat.measure.meter` counts them.

    ``size * dtype.itemsize``; PRNG keys count their key data, ``float0`` counts zero.
    """
    return aval_nbytes(leaf)


def tree_bytes(tree: Any) -> int:
    """Total bytes of the array leaves of a pytree (see :func:`leaf_bytes`)."""
    return sum(leaf_bytes(leaf) for leaf in jax.tree.leaves(tree))


def _abstract_leaf(leaf: Any, where: str) -> jax.ShapeDtypeStruct:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic)) or isinstance(leaf, jax.core.Tracer):
        weak = bool(getattr(jax.typeof(leaf), "weak_type", False)) if not isinstance(
            leaf, (np.ndarray, np.generic)) else False
        # as JAX reads it: float64 numpy inputs are float32 unless jax_enable_x64 is set
        dtype = jax.dtypes.canonicalize_dtype(leaf.dtype, allow_extended_dtype=True)
        return jax.ShapeDtypeStruct(np.shape(leaf), dtype, weak_type=weak)
    raise TypeError(
        f"{where} has a leaf of type {type(leaf).__name__} ({leaf!r:.60}); every leaf must be "
        f"an array (jax.Array, numpy array or jax.ShapeDtypeStruct). Convert Python scalars "
        f"with jnp.asarray, or close over non-array configuration in the layer function."
    )


def abstractify(tree: Any, where: str) -> Any:
    """The pytree with each leaf replaced by its ``jax.ShapeDtypeStruct``.

    Raises ``TypeError`` naming ``where`` (e.g. ``"params[3]"``) for a non-array leaf.
    """
    return jax.tree.map(lambda leaf: _abstract_leaf(leaf, where), tree)


def signature(tree: Any) -> tuple:
    """A hashable key of a pytree's structure, shapes, dtypes and weak types (the cache
    key of plans and traced graphs: a weakly typed input promotes differently)."""
    leaves, treedef = jax.tree.flatten(tree)
    return (treedef, tuple((tuple(np.shape(leaf)), str(leaf.dtype), bool(getattr(leaf, "weak_type", False)))
                           for leaf in leaves))


def leaf_shapes(tree: Any) -> list[tuple[int, ...]]:
    """The shapes of a pytree's leaves (to tell an empty batch in error messages)."""
    return [tuple(np.shape(leaf)) for leaf in jax.tree.leaves(tree)]


def cotangent_struct(leaf: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
    """The cotangent type of a value: itself if inexact, ``float0`` otherwise (ints, keys)."""
    if jax.dtypes.issubdtype(leaf.dtype, np.inexact):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return jax.ShapeDtypeStruct(leaf.shape, jax.dtypes.float0)


def check_layers(layers: Sequence[Callable]) -> tuple[Callable, ...]:
    """The layers as a tuple, after checking there is at least one and each is callable."""
    if callable(layers) or isinstance(layers, (str, bytes)):
        raise TypeError(
            "layers must be a sequence of functions layers[i](params_i, x) -> y, got a single "
            f"{type(layers).__name__}; wrap it in a list."
        )
    try:
        layers = tuple(layers)
    except TypeError:
        raise TypeError(
            f"layers must be a sequence of functions, got {type(layers).__name__}."
        ) from None
    if not layers:
        raise ValueError("layers is empty: a sequence needs at least one layer.")
    for i, layer in enumerate(layers):
        if not callable(layer):
            raise TypeError(
                f"layers[{i}] is a {type(layer).__name__}, not a function; each layer must be "
                f"callable as layers[{i}](params[{i}], x)."
            )
    return layers


def check_params(params: Any, length: int) -> tuple:
    """``params`` as a tuple of one pytree per layer, after checking its length."""
    if isinstance(params, dict) or not isinstance(params, Sequence) or isinstance(params, str):
        raise TypeError(
            f"params must be a sequence (list or tuple) with one pytree per layer, got "
            f"{type(params).__name__}."
        )
    if len(params) != length:
        raise ValueError(
            f"params has {len(params)} entries but there are {length} layers; pass one pytree "
            f"per layer (use None or () for a layer without parameters)."
        )
    return tuple(params)
