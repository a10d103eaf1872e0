"""Checkpoint policies that keep matmul outputs ranked by recompute flops per byte (issue 17.6).

``dots_saveable`` keeps every ``dot_general`` and convolution output, ``nothing_saveable`` none
of them; between the two a layer's menu (:mod:`jaxremat.sequence.policies`) had only
``dots_with_no_batch_dims_saveable``. Which outputs are most worth keeping is a knapsack's
question, and its greedy answer orders items by value per weight (Dantzig, "Discrete-variable
extremum problems", Operations Research 5(2), 1957): a dot's output costs its bytes to keep and
``2 * K`` flops per output element to recompute, ``K`` being the product of its contracting
dimensions (a convolution's ``K`` is its input features per group times its kernel's spatial
size). Recompute flops per kept byte are therefore ``2 * K / itemsize``, the same for every
output of one contraction size, so "keep the dots whose ``K`` is at least a threshold" is the
greedy order's prefix: a transformer's MLP down-projection (``K = 4d``) first, then the
``q/k/v``, output and up-projections (``K = d``), the attention output (``K`` = the sequence
length) and last the scores (``K`` = the head dimension), which are large and cheap.

The menu entry ``"dots_ranked"`` expands per layer (as ``"names"`` does per marked name) into
:class:`RankedDots` policies "keep the outputs with ``K >= threshold``", the thresholds read
from the layer's jaxpr (:func:`layer_dots`, :func:`thresholds`). Only outputs the backward
may read count: ``jax.checkpoint`` saves a value only where the backward needs it, and a
matmul whose output reaches the layer's output through additions and reshapes alone (a
residual block's last projection) is never read, so its ``K`` would make an option equal to
a smaller one. The profile measures each option like any other: the DP, not this ranking,
decides what each one is worth. (The same ranking among the matmuls without batch
dimensions only planned exactly as this one on the GPT, ResNet and ViT of
``benchmarks/model_budget.py``, benchmarks/RESULTS.md "Issue 17.6": not offered.)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Iterator, Sequence

from jax.extend.core import Literal

from ..jax_compat import sub_jaxprs
from ..trees import aval_nbytes

__all__ = ["MAX_RANKED", "PASS_THROUGH", "RANKED", "Dot", "RankedDots", "contraction",
           "layer_dots", "menu_thresholds", "ranked_notes", "thresholds"]

RANKED = "dots_ranked"
"""The menu entry of this module."""

MAX_RANKED = 3
"""At most this many ranked options per layer (each costs a profile)."""

PASS_THROUGH = frozenset({
    "add", "add_any", "sub", "neg", "reshape", "transpose", "broadcast_in_dim", "squeeze",
    "expand_dims", "convert_element_type", "reduce_sum", "slice", "dynamic_slice", "split",
    "concatenate", "pad", "copy", "copy_p", "select_n", "rev", "gather", "reduce_precision"})
"""Primitives linear in their operands whose derivative reads none of them: a value that only
flows through these to the layer's output is never read by its backward."""


def contraction(prim: Any, *avals: Any, **params: Any) -> tuple[int, bool] | None:
    """``(K, batched)`` of a ``dot_general`` or ``conv_general_dilated`` equation, from its
    operands' abstract values and its parameters (what a ``jax.checkpoint`` policy is
    called with); ``None`` for any other primitive.

    ``K`` is the number of multiply-adds per output element: the product of the lhs's
    contracting dimensions for a ``dot_general``; for a convolution the kernel's input
    features (per group) times its spatial size (``rhs_spec`` of its ``dimension_numbers``).
    ``batched``: the ``dot_general`` has batch dimensions, or it is a convolution (neither is
    kept by ``dots_with_no_batch_dims_saveable``). ``K`` is symbolic where a contracted
    dimension is (:mod:`jaxremat.sequence.polymorphic`; a searched policy reads only
    ``batched``)."""
    name = getattr(prim, "name", None)
    if name == "dot_general":
        (lhs_contract, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
        shape = avals[0].shape
        return math.prod(shape[d] for d in lhs_contract), bool(lhs_batch or rhs_batch)
    if name == "conv_general_dilated":
        rhs_spec = params["dimension_numbers"].rhs_spec  # (out features, in features, spatial...)
        shape = avals[1].shape
        return math.prod(shape[d] for d in rhs_spec[1:]), True
    return None


@dataclasses.dataclass(frozen=True)
class RankedDots:
    """The ``jax.checkpoint`` policy keeping the outputs of ``dot_general`` and convolution
    equations whose contraction ``K`` (:func:`contraction`) is at least ``threshold``.
    Frozen: equal policies compare and hash equal, as ``jax.checkpoint`` needs of a static
    argument."""

    threshold: int

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> bool:
        found = contraction(prim, *avals, **params)
        return found is not None and found[0] >= self.threshold


@dataclasses.dataclass(frozen=True)
class Dot:
    """One matmul or convolution of a layer: its contraction ``K``, its output's bytes,
    whether it is batched (:func:`contraction`), and whether the layer's backward may read
    its output (or a value computed from it by :data:`PASS_THROUGH` primitives alone)."""

    size: int
    nbytes: int
    batched: bool
    read: bool = True


def _consumers(jaxpr: Any) -> dict[Any, list[Any]]:
    """The equations of ``jaxpr`` (one level) that take each variable as an operand."""
    found: dict[Any, list[Any]] = {}
    for eqn in jaxpr.eqns:
        for var in eqn.invars:
            if not isinstance(var, Literal):
                found.setdefault(var, []).append(eqn)
    return found


def _read(var: Any, consumers: dict[Any, list[Any]], outputs: set, top: bool) -> bool:
    """Whether the backward may read ``var`` or a value computed from it through
    :data:`PASS_THROUGH` primitives: some such value meets another primitive, a call (its
    body is not followed), or, inside a nested program (``top`` false), its outputs."""
    pending, seen = [var], {var}
    while pending:
        var = pending.pop()
        if not top and var in outputs:
            return True
        for eqn in consumers.get(var, ()):
            if eqn.primitive.name not in PASS_THROUGH or sub_jaxprs(eqn):
                return True
            fresh = [v for v in eqn.outvars if v not in seen]
            seen.update(fresh)
            pending.extend(fresh)
    return False


def _dots(jaxpr: Any, top: bool) -> Iterator[Dot]:
    consumers = _consumers(jaxpr)
    outputs = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for eqn in jaxpr.eqns:
        found = contraction(eqn.primitive, *(v.aval for v in eqn.invars), **eqn.params)
        if found is not None:
            (out,) = eqn.outvars
            yield Dot(found[0], aval_nbytes(out.aval), found[1],
                      _read(out, consumers, outputs, top))
        for inner in sub_jaxprs(eqn):
            yield from _dots(inner, top=False)


def layer_dots(jaxpr: Any) -> tuple[Dot, ...]:
    """The matmuls and convolutions of a layer's ``jax.make_jaxpr`` (nested ones too, their
    outputs taken as read where they leave the nested program), in program order."""
    return tuple(_dots(getattr(jaxpr, "jaxpr", jaxpr), top=True))


def thresholds(dots: Sequence[Dot], keep_all: bool = True, most: int = MAX_RANKED,
               not_as_no_batch: bool = False) -> tuple[int, ...]:
    """The contraction thresholds of a layer's ranked options, largest first.

    The candidates are the distinct ``K`` of the read ``dots``; without ``keep_all`` the
    smallest is left out (it keeps every read dot: ``"dots"`` on the same menu already is
    that option); with ``not_as_no_batch``, so is one keeping exactly the read dots without
    batch dimensions (``"dots_no_batch"`` on the same menu). Of more than ``most``
    candidates, the ``most`` whose kept bytes split the dots' bytes most evenly: the largest
    step between consecutive levels (nothing kept, each threshold's kept bytes, all kept) is
    least, ties broken by the sum of squared steps, then by larger thresholds."""
    ranked = [d for d in dots if d.read]
    sizes = sorted({d.size for d in ranked}, reverse=True)
    if not keep_all:
        sizes = sizes[:-1]
    if not_as_no_batch:
        unbatched = [not d.batched for d in ranked]
        sizes = [k for k in sizes if [d.size >= k for d in ranked] != unbatched]
    if len(sizes) <= most:
        return tuple(sizes)
    total = sum(d.nbytes for d in ranked)
    kept = {k: sum(d.nbytes for d in ranked if d.size >= k) for k in sizes}

    def unevenness(chosen: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
        levels = [0] + [kept[k] for k in chosen] + [total]
        steps = [b - a for a, b in zip(levels, levels[1:])]
        return max(steps), sum(s * s for s in steps), tuple(-k for k in chosen)

    return min(itertools.combinations(sizes, most), key=unevenness)


def menu_thresholds(menu: Sequence[Any], dots: Sequence[Dot]) -> tuple[int, ...]:
    """The thresholds (:func:`thresholds`) of a layer with ``dots`` on ``menu``: those that
    are not already ``"dots"`` or ``"dots_no_batch"`` on it."""
    return thresholds(dots, keep_all="dots" not in menu,
                      not_as_no_batch="dots_no_batch" in menu)


def ranked_notes(menu: Sequence[Any], dots: Sequence[Dot]) -> tuple[tuple[str, str], ...]:
    """``(RANKED, reason)`` where ``menu`` has the ranked entry but it gives a layer with
    ``dots`` no option (kept in the layer's ``dropped``, so that the plan says why)."""
    if RANKED not in menu:
        return ()
    read = sorted({d.size for d in dots if d.read}, reverse=True)
    if not read:
        return ((RANKED, "no dot_general or conv_general_dilated whose output the backward "
                         "reads in the layer"),)
    if not menu_thresholds(menu, dots):
        return ((RANKED, f"contraction sizes {', '.join(map(str, read))} in the layer: every "
                         "ranked option is 'dots' or 'dots_no_batch'"),)
    return ()
