"""A nested-scan member realized as JAX code (issue 18.1): the levels ``sizes`` as
``lax.scan`` over ``jax.checkpoint`` segments, remainders split off, the layers that store
their tapes under the member's policy; and its program-order memory
(:func:`measured_memory`), the meter :class:`jaxremat.scan.remat.RematScan` checks every
plan with."""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr

from ..measure.meter import activation_memory, program_memory
from ..sequence.cache import SCAN_MARGINS, cached, remember
from ..trees import signature
from .held import stored_layer as _stored
from .members import UNROLL, NestedScan, pieces, reshaped, runs
from .programs import programs_at

__all__ = ["measured_memory", "run_member", "scan_layers", "split_layers"]


def split_layers(params: Any, lengths: list[int]) -> list[Any]:
    """``params`` cut on axis 0 into consecutive parts of ``lengths`` layers, with one
    ``lax.split`` per leaf (its transpose is one concatenation of the gradients)."""
    leaves, treedef = jax.tree.flatten(params)
    cut = [jax.lax.split(leaf, lengths, axis=0) if len(lengths) > 1 else [leaf] for leaf in leaves]
    return [jax.tree.unflatten(treedef, [parts[j] for parts in cut]) for j in range(len(lengths))]


def scan_layers(layer: Callable, params: Any, x: Any, unroll: int = 0) -> Any:
    """``layer`` over ``params`` stacked on axis 0: one ``lax.scan``, or for a run of at
    most ``unroll`` layers the layers one after the other."""
    if unroll:
        length = jax.tree.leaves(params)[0].shape[0]
        if length <= unroll:
            for i in range(length):
                x = layer(jax.tree.map(lambda leaf, i=i: leaf[i], params), x)
            return x
    return jax.lax.scan(lambda h, p: (layer(p, h), None), x, params)[0]


def run_member(layer: Callable, sizes: tuple[int, ...], params: Any, x: Any, length: int,
         policy: Callable | None = None, top: bool = True, unroll: int = UNROLL) -> Any:
    """Apply ``length`` layers (``params`` stacked on axis 0) under the levels ``sizes``,
    the layers that store their tapes under ``policy``, inner runs of at most ``unroll``
    layers unrolled (:data:`jaxremat.scan.members.UNROLL`); the same recursion as
    :func:`jaxremat.scan.members.skeleton`. A top level whose size divides ``length`` is one
    scan over the parameters reshaped to ``(length / k, k, ...)``: no copy (a leading-axis
    reshape is a bitcast), one loop."""
    while sizes and sizes[0] >= length:
        sizes = sizes[1:]
    if not sizes:
        return scan_layers(_stored(layer, policy), params, x, unroll=0 if top else unroll)
    if top and reshaped(length, sizes):
        size = sizes[0]
        if size == 1:  # jax.checkpoint per layer in one scan: the segment is the layer
            segment = jax.checkpoint(_stored(layer, policy), prevent_cse=False)
            return scan_layers(segment, params, x)
        count = length // size
        rows = jax.tree.map(lambda leaf: leaf.reshape((count, size) + leaf.shape[1:]), params)
        body = functools.partial(_segment, layer, sizes[1:], size, policy, unroll)
        return scan_layers(jax.checkpoint(body, prevent_cse=False), rows, x)
    parts = pieces(length, sizes[0])
    groups = runs(parts[:-1])
    chunks = split_layers(params, [size * count for size, count in groups] + [parts[-1]])
    for (size, count), chunk in zip(groups, chunks):
        body = functools.partial(_segment, layer, sizes[1:], size, policy, unroll)
        if count == 1:
            x = jax.checkpoint(body, prevent_cse=True)(chunk, x)
        else:  # no CSE across scan iterations: prevent_cse is not needed (jax.checkpoint docs)
            segment = jax.checkpoint(body, prevent_cse=False)
            rows = jax.tree.map(lambda leaf: leaf.reshape((count, size) + leaf.shape[1:]), chunk)
            x = jax.lax.scan(lambda h, p: (segment(p, h), None), x, rows)[0]
    return run_member(layer, sizes[1:], chunks[-1], x, parts[-1], policy, top=False, unroll=unroll)


def _segment(layer: Callable, sizes: tuple[int, ...], length: int, policy: Callable | None,
             unroll: int, params: Any, x: Any) -> Any:
    return run_member(layer, sizes, params, x, length, policy, top=False, unroll=unroll)


def _member_loss(layer: Callable, member: NestedScan, length: int, policy: Callable | None,
                 unroll: int) -> Callable:
    """The sum of the (inexact) output leaves of ``member``'s program, a loss."""
    def loss(p: Any, h: Any) -> Any:
        out = run_member(layer, member.sizes, p, h, length, policy, unroll=unroll)
        return sum(jnp.sum(jnp.real(leaf)).astype(jnp.float32) for leaf in jax.tree.leaves(out)
                   if jnp.issubdtype(leaf.dtype, jnp.inexact))
    return loss


def measured_memory(layer: Callable, params: Any, x: Any, length: int,
                    policies: tuple[Callable | None, ...], unroll: int, member: NestedScan,
                    names: tuple[str, ...] | None = None) -> int:
    """:func:`jaxremat.activation_memory` of ``member``'s program on abstract inputs, the
    sum of the (inexact) output leaves as the loss. With the options' ``names``, the
    gradient's program is instantiated from one traced with symbolic sizes where the
    member's policy allows it (:func:`jaxremat.scan.programs.programs_at`)."""
    option = member.option
    if names is None:
        return activation_memory(_member_loss(layer, member, length, policies[option], unroll),
                                 params, x)
    key = ("measured", id(layer), signature(params), signature(x), member, unroll, length,
           names, policies[option])
    found = cached(key, layer, SCAN_MARGINS)
    if found is not None:  # a new budget at the same shape
        return found[0]

    def make(h: Any, policy: tuple) -> tuple[ClosedJaxpr]:
        loss = _member_loss(layer, member, length, policy[0], unroll)
        return (jax.make_jaxpr(jax.grad(loss, allow_int=True))(params, h),)

    one = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), params)
    program, = programs_at(layer, one, x, ("member", member, unroll, length, names), make,
                           (policies[option],), (names[option],))
    measured = program_memory(program, exclude_inputs=range(len(jax.tree.leaves(params))),
                              count_outputs=False)
    remember(key, layer, measured, None, SCAN_MARGINS)
    return measured
