"""``"dots_plus"``: ``dots_saveable`` and the values that make it cheaper, found by measurement
(issue 17.6).

``dots_saveable`` keeps every matmul's output, but a layer's backward rarely reads a matmul's
raw output: it reads what the matmul's epilogue made of it (the bias added, the softmax's
``exp`` of the attention scores, the residual sum), so under ``dots_saveable`` the backward
recomputes those epilogues from the kept outputs. Allowing the policy to keep the epilogue's
value instead lets ``jax.checkpoint`` keep a tensor of the same size that the backward reads
directly: the same tape, less recomputation. Values of a few bytes per row (a LayerNorm's
mean and variance, an attention mask) cost next to nothing to keep and save their chains.
Which values pay is a layer's own question, so this module answers it by measurement, as
Rockmate derives a block's options from its own graph (Zhao et al., "Rockmate: an Efficient,
Fast, Automatic and Generic Tool for Re-materialization in PyTorch", ICML 2023):

The search runs three times per layer, over each *base* (:data:`BASES`):
``dots_saveable``, ``dots_with_no_batch_dims_saveable`` and ``nothing_saveable``. Over the
last it fills the gap between keeping a layer's input and keeping its matmuls, where a
tight budget lands (what MaxText's hand-written ``save_qkv_proj`` or
``save_dot_except_mlp`` aim at): which matmul outputs and epilogues save the most
recomputation per byte is measured, not assumed.

1. The candidates are the layer's equations (nested ones too; no call or layout change,
   :data:`LAYOUT`; over a dots base no matmul or convolution either, over ``"nothing"``
   those first), grouped by what a policy sees of them, their primitive and operand
   shapes and dtypes (:func:`equation_key`), that either produce as many elements as some
   matmul's output (an epilogue's value) or at most 1/8 of the layer's input bytes (a
   statistic).
2. Each candidate is measured on its own beside the base: the tape bytes and the flops of
   the vjp's forward and pullback (counted on their jaxprs,
   :func:`jaxremat.measure.costs.count_jaxpr`) of ``jax.checkpoint(layer, policy)``.
3. Those that lower the flops are added greedily, those that cost no tape bytes first and
   then by flops saved per byte, each kept only if the measured union still lowers the
   flops and its tape stays within the limit at hand: the narrowest first, then each
   wider one, where the candidates too wide for the last are tried again (a knapsack's
   greedy per capacity, the unions nested). The options are the unions reached within
   each limit: over a dots base 1/16 and 1/4 above its tape (:data:`SLACKS`), over
   ``"nothing"`` 1/3, 2/3 and all of the way from its tape to
   ``dots_with_no_batch_dims_saveable``'s (:data:`LEAN_SHARES`).

The options (:class:`SearchedPolicy`; named ``"dots_plus"``, ``"dots_no_batch_plus"`` and
``"nothing_plus"`` after their base, with the suffix of their limit, :data:`SUFFIXES`) are
then measured by the profile like any other option, and the DP decides what each is worth.
Each candidate and step is measured without tracing the layer under the policy: its JVP
program is traced once and split as ``jax.checkpoint`` splits it
(:mod:`jaxremat.measure.policy_costs`; about 5 ms a split on a GPT-2 block, 0.1-0.5 s per base,
against 1-2 s when each was a traced ``jax.vjp``). A later shape of the same program (the
same primitives and dtypes outside layout changes: a batch of one, whose batch axis
``jnp.einsum`` squeezes, too) maps the chosen equations to its own shapes without searching
again. Each option it adds is profiled like any other, at every new shape: the default menu
takes the widest union per base (``"searched"``, :func:`jaxremat.sequence.policies.layer_menu`:
three options at most),
``"dots_plus"`` every union (seven at most). With only the widest, the whole-step plans of
the GPT and ViT examples at 30% and 50% of the plain step cost 1.123/1.017 and 1.124/1.032
of its flops, against 1.119/1.017 and 1.118/1.031 with all seven (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr

from ..jax_compat import sub_jaxprs
from ..lru import LRU
from ..measure.costs import count_jaxpr
from ..measure.policy_costs import JvpProgram, jvp_program, policy_costs
from ..measure.trace import trace_linearized
from ..trees import aval_nbytes
from .ranked import contraction

__all__ = ["BASES", "LAYOUT", "LEAN_SHARES", "SEARCHED", "SLACKS", "SUFFIXES", "SearchedPolicy",
           "WIDEST", "candidates", "equation_key", "moved_policy", "search"]

SEARCHED = "dots_plus"
"""The menu entry of every searched option (up to seven a layer)."""

WIDEST = "searched"
"""The menu entry of the widest searched option per base (up to three a layer; on the
default menu)."""

BASES = ("dots", "dots_no_batch", "nothing")
"""What a searched policy keeps besides its keys: every matmul output (``dots_saveable``),
those without batch dimensions (``dots_with_no_batch_dims_saveable``) or nothing."""

SLACKS = (1 / 16, 1 / 4)
"""Over a dots base, a layer gets the greedy union whose tape exceeds the base policy's by at
most each of these shares (one option per distinct union)."""

LEAN_SHARES = (1 / 3, 2 / 3, 1)
"""Over ``"nothing"``, a layer gets the greedy union whose tape lies at most each of these
shares of the way from the layer's input to ``dots_with_no_batch_dims_saveable``'s tape."""

SUFFIXES = ("", ":wide", ":wider")
"""An option's name is its base's entry and the suffix of the first limit its union was
reached at (``"nothing_plus:wide"``)."""

LAYOUT = frozenset({"reshape", "transpose", "broadcast_in_dim", "squeeze", "expand_dims",
                    "convert_element_type", "copy", "copy_p"})
"""Primitives left out of the candidates: their output is their operand laid out anew, so
keeping it rather than the operand saves no recomputation worth a trace (on a GPT-2 block,
the MLP, attention and convolution blocks of the tests, leaving them out gave the same
options, with a quarter fewer traces)."""

_STATISTIC = 1 / 8  # candidates this small (of the layer's input bytes) whatever their shape
_CHOSEN = LRU(256)  # (program structure, base) -> the chosen equations' positions

Key = tuple[str, tuple[tuple[tuple[int, ...], str], ...]]


def equation_key(prim: Any, avals: Any) -> Key:
    """What a ``jax.checkpoint`` policy can tell an equation by: its primitive's name and its
    operands' shapes and dtypes."""
    return (getattr(prim, "name", str(prim)),
            tuple((tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", ""))) for a in avals))


def _key_of(eqn: Any) -> Key:
    """:func:`equation_key` of a jaxpr equation."""
    return equation_key(eqn.primitive, [v.aval for v in eqn.invars])


@dataclasses.dataclass(frozen=True)
class SearchedPolicy:
    """The ``jax.checkpoint`` policy keeping what its ``base`` keeps (:data:`BASES`) and the
    outputs of the equations with an :func:`equation_key` in ``keys``. Frozen: equal policies
    compare and hash equal, as ``jax.checkpoint`` needs of a static argument."""

    keys: frozenset
    base: str = "dots"

    def __post_init__(self) -> None:
        if self.base not in BASES:
            raise ValueError(f"SearchedPolicy.base must be one of {BASES}, got {self.base!r}.")

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> bool:
        if self.base != "nothing":
            found = contraction(prim, *avals, **params)
            if found is not None and not (self.base == "dots_no_batch" and found[1]):
                return True
        return equation_key(prim, avals) in self.keys


def _equations(jaxpr: Jaxpr) -> Iterator[Any]:
    """The equations of ``jaxpr`` and of its nested programs, in program order."""
    for eqn in jaxpr.eqns:
        yield eqn
        for inner in sub_jaxprs(eqn):
            yield from _equations(getattr(inner, "jaxpr", inner))


def _core(jaxpr: Jaxpr) -> list[Any]:
    """The equations of ``jaxpr`` (nested ones too, :func:`_equations`) that are not a layout
    change (:data:`LAYOUT`): those a search may choose, in program order."""
    return [e for e in _equations(jaxpr) if e.primitive.name not in LAYOUT]


def _structure(core: list[Any]) -> tuple:
    """The program without its sizes and layout: each equation of :func:`_core` by its
    primitive and its operands' dtypes. A later batch size of the same layer has the same
    structure, a batch of one too, where ``jnp.einsum`` squeezes the batch axis (the ranks
    and the reshapes around the contraction change, not the equations between them)."""
    return tuple((e.primitive.name, tuple(str(getattr(v.aval, "dtype", "")) for v in e.invars))
                 for e in core)


def moved_policy(policy: SearchedPolicy, jaxpr: ClosedJaxpr | Jaxpr, other: ClosedJaxpr | Jaxpr
                 ) -> SearchedPolicy | None:
    """``policy``, which keeps equations of ``jaxpr`` by key, keeping the same equations (by
    position) of ``other``, the same program at other sizes (symbolic ones:
    :mod:`jaxremat.sequence.polymorphic`); ``None`` where the programs differ in structure or
    the keys tell the equations apart differently in the two (two equations sharing a key in
    one and not in the other), so that no policy keeps the same ones in both."""
    eqns, others = _core(getattr(jaxpr, "jaxpr", jaxpr)), _core(getattr(other, "jaxpr", other))
    if _structure(eqns) != _structure(others):
        return None
    kept = {i for i, e in enumerate(eqns) if _key_of(e) in policy.keys}
    moved = SearchedPolicy(frozenset(_key_of(others[i]) for i in kept), policy.base)
    if {i for i, e in enumerate(others) if _key_of(e) in moved.keys} != kept:
        return None
    return moved


def candidates(jaxpr: ClosedJaxpr | Jaxpr, input_bytes: int, base: str = "dots"
               ) -> tuple[Key, ...]:
    """The keys worth trying beside ``base`` (module docstring, step 1), once each, in
    program order; over ``"nothing"`` the matmuls' own keys come first."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    eqns = list(_equations(jaxpr))
    dot_sizes = set()
    found: dict[Key, None] = {}
    for eqn in eqns:
        if contraction(eqn.primitive, *(v.aval for v in eqn.invars), **eqn.params) is not None:
            dot_sizes.add(int(getattr(eqn.outvars[0].aval, "size", 0)))
            if base == "nothing":
                found.setdefault(_key_of(eqn), None)
    for eqn in eqns:
        if sub_jaxprs(eqn) or len(eqn.outvars) != 1 or eqn.primitive.name in LAYOUT:
            continue
        avals = [v.aval for v in eqn.invars]
        if contraction(eqn.primitive, *avals, **eqn.params) is not None:
            continue
        out = eqn.outvars[0].aval
        if (int(getattr(out, "size", -1)) in dot_sizes
                or aval_nbytes(out) <= _STATISTIC * input_bytes):
            found.setdefault(_key_of(eqn), None)
    return tuple(found)


def _measure(layer: Callable, p: Any, x: Any, policy: SearchedPolicy,
             program: JvpProgram | None = None) -> tuple[int, float]:
    """``(tape bytes, flops)`` of the layer under ``policy``: the tape the vjp keeps and the
    flops of the linearized forward and tangent, which differ from the vjp's forward and
    pullback by an amount the policy does not change, so that the search's comparisons and
    flops saved are the pullback's. Split from the layer's JVP ``program`` where given and
    JAX's partial evaluation is available (:func:`jaxremat.measure.policy_costs.policy_costs`),
    else traced (:func:`jaxremat.measure.trace.trace_linearized`); the two agree."""
    try:
        found = policy_costs(program, policy) if program is not None else None
    except Exception:  # noqa: BLE001 - a program the split refuses is traced below
        found = None
    if found is not None:
        return found
    forward, linear, tape = trace_linearized(
        jax.checkpoint(layer, policy=policy, prevent_cse=True), p, x)
    return tape, count_jaxpr(forward)[0] + count_jaxpr(linear)[0]


Measure = Callable[[SearchedPolicy], tuple[int, float]]
"""``measure(policy) -> (tape bytes, flops)`` of one layer (:func:`_measure`)."""


def _jvp_program(layer: Callable, p: Any, x: Any) -> JvpProgram | None:
    """The layer's JVP program for :func:`_measure`, ``None`` where tracing it fails (the
    search then traces each policy, and fails there with JAX's error if it must)."""
    try:
        return jvp_program(layer, p, x)
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def _limits(measure: Measure, base: str, tape: int) -> list[float]:
    """The tape bytes each option of ``base`` may reach (module docstring, step 3): over a
    dots base :data:`SLACKS` above its tape; over ``"nothing"`` :data:`LEAN_SHARES` of the way
    from its tape to ``dots_with_no_batch_dims_saveable``'s (none where that is no larger)."""
    if base != "nothing":
        return [tape * (1 + slack) for slack in SLACKS]
    top = measure(SearchedPolicy(frozenset(), "dots_no_batch"))[0]
    return [tape + share * (top - tape) for share in LEAN_SHARES] if top > tape else []


def _greedy(measure: Measure, keys: tuple[Key, ...], base: str
            ) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``(limit, positions in keys)`` of the unions the greedy search keeps (module
    docstring): the union reached within each of :func:`_limits`, narrowest first, distinct
    ones only, each with the first limit it was reached at."""
    tape, flops = measure(SearchedPolicy(frozenset(), base))
    limits = _limits(measure, base, tape)
    if not limits:
        return ()
    gains = []
    for position, key in enumerate(keys):
        one_tape, one_flops = measure(SearchedPolicy(frozenset({key}), base))
        if one_flops < flops and one_tape <= limits[-1]:
            extra = one_tape - tape
            gains.append((extra > 0, -(flops - one_flops) / max(extra, 1), position))
    pending = [position for _, _, position in sorted(gains)]
    chosen: list[int] = []
    least = flops
    found: dict[tuple[int, ...], int] = {}
    for level, limit in enumerate(limits):
        too_wide = []  # tried again under the next, wider limit
        for position in pending:
            trial = frozenset(keys[k] for k in chosen + [position])
            trial_tape, trial_flops = measure(SearchedPolicy(trial, base))
            if trial_tape > limit:
                too_wide.append(position)
            elif trial_flops < least:
                chosen.append(position)
                least = trial_flops
        pending = too_wide
        if chosen:
            found.setdefault(tuple(sorted(chosen)), level)
    return tuple((level, union) for union, level in found.items())


def search(layer: Callable, p: Any, x: Any, jaxpr: ClosedJaxpr, input_bytes: int,
           base: str = "dots") -> tuple[tuple[str, SearchedPolicy], ...]:
    """``(suffix, policy)`` for the searched policies of ``layer(p, x)`` over ``base``
    (:data:`BASES`, :data:`SUFFIXES`; module docstring); ``jaxpr``:
    ``jax.make_jaxpr(layer)(p, x)``. Empty when no candidate lowers the flops within the
    limits.

    The choice is remembered per program structure as the positions of the chosen
    equations, so a later shape (whose candidates may differ: which sizes coincide with a
    matmul's depends on the shapes) takes the same equations at its own shapes."""
    if base not in BASES:
        raise ValueError(f"search's base must be one of {BASES}, got {base!r}.")
    eqns = _core(getattr(jaxpr, "jaxpr", jaxpr))
    memo_key = (_structure(eqns), base)
    chosen = _CHOSEN.get(memo_key)
    if chosen is None:
        keys = candidates(jaxpr, input_bytes, base)
        program = _jvp_program(layer, p, x) if keys else None
        measure = lambda policy: _measure(layer, p, x, policy, program)  # noqa: E731
        unions = _greedy(measure, keys, base) if keys else ()
        chosen = tuple((level, tuple(i for i, e in enumerate(eqns) if not sub_jaxprs(e)
                                     and _key_of(e) in {keys[k] for k in union}))
                       for level, union in unions)
        _CHOSEN.put(memo_key, chosen)
    return tuple((SUFFIXES[level], SearchedPolicy(frozenset(_key_of(eqns[i]) for i in union), base))
                 for level, union in chosen)
