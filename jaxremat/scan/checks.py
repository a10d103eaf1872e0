"""Input checks of :func:`jaxremat.remat_scan` (issue 18.6): the stacked parameters' common
leading axis, a layer whose output matches its input (what ``lax.scan`` carries), a carry
with a gradient; and :func:`program_size`, the number of equations XLA compiles."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr

__all__ = ["check_differentiable", "check_scannable", "describe", "program_size", "scan_length"]


def program_size(jaxpr: ClosedJaxpr | Jaxpr) -> int:
    """Number of equations of ``jaxpr``, those of its sub-programs (scan and checkpoint
    bodies, calls, branches) included: the size of the program XLA compiles."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, (ClosedJaxpr, Jaxpr)):
                    total += program_size(sub)
    return total


def scan_length(stacked_params: Any) -> int:
    """The common leading axis of the leaves, or an error naming the leaf that differs."""
    leaves = jax.tree_util.tree_flatten_with_path(stacked_params)[0]
    if not leaves:
        raise ValueError(
            "stacked_params has no array leaves: remat_scan reads the number of layers from "
            "their leading axis. Give the layer at least one stacked parameter, or use "
            "jaxremat.remat_sequence with one function per layer."
        )
    lengths = []
    for path, leaf in leaves:
        shape = np.shape(leaf)
        if not shape:
            raise ValueError(
                f"stacked_params{jax.tree_util.keystr(path)} is a scalar; every leaf stacks "
                f"the layers' parameters on axis 0 (shape (L, ...))."
            )
        lengths.append((jax.tree_util.keystr(path), int(shape[0])))
    first_path, length = lengths[0]
    for path, other in lengths[1:]:
        if other != length:
            raise ValueError(
                f"stacked_params leaves disagree on the number of layers (axis 0): "
                f"stacked_params{first_path} has {length}, stacked_params{path} has {other}. "
                f"Stack every parameter of the L layers on axis 0."
            )
    if length == 0:
        raise ValueError(
            f"stacked_params stacks no layers: stacked_params{first_path} has shape "
            f"{tuple(np.shape(leaves[0][1]))}, L = 0 on axis 0. Stack at least one layer's "
            f"parameters (shape (L, ...) with L >= 1)."
        )
    return length


def describe(tree: Any) -> str:
    return str(jax.tree.map(lambda s: f"{s.dtype}{list(s.shape)}", tree))


def check_scannable(layer: Callable, params: Any, x: Any) -> int:
    """Raise unless ``layer(params, x)`` has the structure, shapes and dtypes of ``x``;
    return the number of equations of its jaxpr (:func:`program_size`)."""
    try:
        jaxpr, out = jax.make_jaxpr(layer, return_shape=True)(params, x)
    except Exception as error:
        raise ValueError(
            f"remat_scan could not trace layer(params[0], x) on parameters {describe(params)} "
            f"(one layer's: stacked_params without its axis 0) and input {describe(x)}: "
            f"{type(error).__name__}: {error}. Check that every leaf of stacked_params stacks "
            f"the L layers' parameters on axis 0 (shape (L, ...))."
        ) from error
    same = jax.tree.structure(out) == jax.tree.structure(x) and all(
        a.shape == b.shape and a.dtype == b.dtype
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(x)))
    if not same:
        raise ValueError(
            f"remat_scan needs a layer whose output has the structure, shapes and dtypes of "
            f"its input (lax.scan carries it from layer to layer), but layer(params[0], x) maps "
            f"{describe(x)} to {describe(out)}. For layers that change shapes use "
            f"jaxremat.remat_sequence([layer_0, layer_1, ...], budget) with one function and "
            f"one parameter pytree per layer. (params[0] is stacked_params without its axis 0, "
            f"{describe(params)}: check that every leaf stacks the L layers' parameters on "
            f"axis 0.)"
        )
    return program_size(jaxpr)


def check_differentiable(x: Any) -> None:
    """Raise unless the carry ``x`` has a floating-point (or complex) leaf: a carry of
    integers and booleans only carries no gradient, so there is nothing to rematerialize."""
    if not any(jnp.issubdtype(leaf.dtype, jnp.inexact) for leaf in jax.tree.leaves(x)):
        raise ValueError(
            f"remat_scan: the scan input x ({describe(x)}) has no floating-point leaf, so no "
            f"gradient flows through the layers and there is nothing to rematerialize. Run the "
            f"plain scan, jax.lax.scan(lambda h, p: (layer(p, h), None), x, stacked_params)[0], "
            f"or carry the floating-point activations the layers differentiate in x."
        )
