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
from the layer's jaxpr (:func:`layer_dots`, :func:`thresholds`); ``"dots_ranked_no_batch"``
does the same among the dots ``dots_with_no_batch_dims_saveable`` keeps (``dot_general``
without batch dimensions). The profile measures each option like any other: the DP, not this
ranking, decides what each one is worth.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Iterator, Sequence

from ..jax_compat import sub_jaxprs
from ..trees import aval_nbytes

__all__ = ["MAX_RANKED", "RANKED_POLICIES", "Dot", "RankedDots", "contraction", "layer_dots",
           "ranked_notes", "thresholds"]

RANKED_POLICIES = {"dots_ranked": False, "dots_ranked_no_batch": True}
"""The menu entries of this module, each with whether it ranks only dots without batch
dimensions."""

MAX_RANKED = 3
"""At most this many ranked options per layer and entry (each costs a profile)."""


def contraction(prim: Any, *avals: Any, **params: Any) -> tuple[int, bool] | None:
    """``(K, batched)`` of a ``dot_general`` or ``conv_general_dilated`` equation, from its
    operands' abstract values and its parameters (what a ``jax.checkpoint`` policy is
    called with); ``None`` for any other primitive.

    ``K`` is the number of multiply-adds per output element: the product of the lhs's
    contracting dimensions for a ``dot_general``; for a convolution the kernel's input
    features (per group) times its spatial size (``rhs_spec`` of its ``dimension_numbers``).
    ``batched``: the ``dot_general`` has batch dimensions, or it is a convolution (neither is
    kept by ``dots_with_no_batch_dims_saveable``)."""
    name = getattr(prim, "name", None)
    if name == "dot_general":
        (lhs_contract, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
        shape = avals[0].shape
        return math.prod(int(shape[d]) for d in lhs_contract), bool(lhs_batch or rhs_batch)
    if name == "conv_general_dilated":
        rhs_spec = params["dimension_numbers"].rhs_spec  # (out features, in features, spatial...)
        shape = avals[1].shape
        return math.prod(int(shape[d]) for d in rhs_spec[1:]), True
    return None


@dataclasses.dataclass(frozen=True)
class RankedDots:
    """The ``jax.checkpoint`` policy keeping the outputs of ``dot_general`` and convolution
    equations whose contraction ``K`` (:func:`contraction`) is at least ``threshold``; with
    ``no_batch``, only ``dot_general`` equations without batch dimensions. Frozen: equal
    policies compare and hash equal, as ``jax.checkpoint`` needs of a static argument."""

    threshold: int
    no_batch: bool = False

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> bool:
        found = contraction(prim, *avals, **params)
        if found is None:
            return False
        size, batched = found
        return size >= self.threshold and not (self.no_batch and batched)


@dataclasses.dataclass(frozen=True)
class Dot:
    """One matmul or convolution of a layer: its contraction ``K``, its output's bytes, and
    whether it is batched (:func:`contraction`)."""

    size: int
    nbytes: int
    batched: bool


def _equations(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the programs nested in it (calls, checkpoints,
    custom derivatives, loops), depth first."""
    for eqn in jaxpr.eqns:
        yield eqn
        for inner in sub_jaxprs(eqn):
            yield from _equations(inner)


def layer_dots(jaxpr: Any) -> tuple[Dot, ...]:
    """The matmuls and convolutions of a layer's ``jax.make_jaxpr`` (nested ones too), in
    program order."""
    dots = []
    for eqn in _equations(jaxpr):
        found = contraction(eqn.primitive, *(v.aval for v in eqn.invars), **eqn.params)
        if found is not None:
            dots.append(Dot(found[0], sum(aval_nbytes(v.aval) for v in eqn.outvars), found[1]))
    return tuple(dots)


def _ranked(dots: Sequence[Dot], no_batch: bool) -> list[Dot]:
    return [d for d in dots if not (no_batch and d.batched)]


def thresholds(dots: Sequence[Dot], no_batch: bool = False, keep_all: bool = True,
               most: int = MAX_RANKED) -> tuple[int, ...]:
    """The contraction thresholds of a layer's ranked options, largest first.

    The candidates are the distinct ``K`` of ``dots`` (those without batch dimensions when
    ``no_batch``); without ``keep_all`` the smallest is left out (it keeps every such dot:
    ``"dots"`` or ``"dots_no_batch"`` on the same menu already is that option). Of more
    than ``most`` candidates, the ``most`` whose kept bytes split the dots' bytes most
    evenly: the largest step between consecutive levels (nothing kept, each threshold's
    kept bytes, all kept) is least, ties broken by the sum of squared steps, then by
    larger thresholds."""
    ranked = _ranked(dots, no_batch)
    sizes = sorted({d.size for d in ranked}, reverse=True)
    if not keep_all:
        sizes = sizes[:-1]
    if len(sizes) <= most:
        return tuple(sizes)
    total = sum(d.nbytes for d in ranked)
    kept = {k: sum(d.nbytes for d in ranked if d.size >= k) for k in sizes}

    def unevenness(chosen: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
        levels = [0] + [kept[k] for k in chosen] + [total]
        steps = [b - a for a, b in zip(levels, levels[1:])]
        return max(steps), sum(s * s for s in steps), tuple(-k for k in chosen)

    return min(itertools.combinations(sizes, most), key=unevenness)


def ranked_notes(menu: Sequence[Any], dots: Sequence[Dot]) -> tuple[tuple[str, str], ...]:
    """``(entry, reason)`` for each ranked entry of ``menu`` that gives a layer with ``dots``
    no option (kept in the layer's ``dropped``, so that the plan says why)."""
    notes = []
    for entry, no_batch in RANKED_POLICIES.items():
        if entry not in menu:
            continue
        plain = "dots_no_batch" if no_batch else "dots"
        ranked = _ranked(dots, no_batch)
        if not ranked:
            kind = "dot_general without batch dimensions" if no_batch else \
                "dot_general or conv_general_dilated"
            notes.append((entry, f"no {kind} in the layer"))
        elif not thresholds(dots, no_batch, keep_all=plain not in menu):
            notes.append((entry, f"one contraction size ({ranked[0].size}) in the layer: "
                                 f"the option is {plain!r}"))
    return tuple(notes)
