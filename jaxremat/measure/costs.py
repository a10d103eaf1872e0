"""The flops and bytes of a function as JAX wrote it (before XLA optimises), on any backend.

``jax.jit(fn).lower(*args).cost_analysis()`` counts the program as JAX wrote it,
recomputation included (XLA has not yet had the chance to undo or fuse anything). The CPU
backend answers it; the GPU backend does not (JAX 0.11 on an H100 returns ``None``), which
made every static cost zero there. :func:`lowered_costs` therefore uses:

1. ``"lowered"``: the default lowering's ``cost_analysis()`` where the backend gives one;
2. ``"jaxpr"``: otherwise our own count on the jaxpr (:func:`jaxpr_costs`): ``dot_general``
   and convolutions by their multiply-adds, one flop per output element otherwise, and for
   bytes every equation's operands and results (XLA's unoptimised count is of this kind).
   On the H100 it was within 0.2% of the compiled program's flops for a dense layer's
   gradient (``benchmarks/gpu_logs/env.log``).

The count also stands in for lowering at a layer's later input shapes, scaled from the first
shape's lowering (:mod:`jaxremat.sequence.calibration`); :func:`count_terms` gives it term by
term, with what XLA's unoptimised analysis counts differently (data movement, transposes,
checkpoint barriers) counted XLA's way.

(Lowering for the CPU instead, ``Traced.lower(lowering_platforms=("cpu",))``, was tried: on
the GPU machine its ``cost_analysis()`` is ``None`` too.) :data:`LAST_SOURCE` says which
answered last (benchmarks print it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Var

from .dataflow import _body, equation_flops
from ..jax_compat import lowered_cost_analysis
from .jaxpr_facts import equation_copy_key, per_equation, per_jaxpr
from .meter import aval_nbytes
from .trace import live_jaxpr

__all__ = ["CountTerms", "count_jaxpr", "count_terms", "jaxpr_costs", "lowered_costs"]

LAST_SOURCE: str | None = None
"""Which way :func:`lowered_costs` answered last: "lowered" or "jaxpr"."""


def _abstract(leaf: Any) -> Any:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return leaf


# What XLA's unoptimised cost analysis counts differently from one flop per output element
# and every operand's and result's bytes, as lowered by JAX (checked on GPT-2, MLP and conv
# layers, tests/test_calibration.py): data movement costs no flops; JAX lowers a transpose
# with a layout that makes it a bitcast, which accesses no bytes (a GPT-2 block's
# weight-gradient transposes are 1.57 MB of its pullback's count, none of XLA's).
_NO_FLOPS = frozenset({
    "broadcast_in_dim", "iota", "reshape", "transpose", "squeeze", "expand_dims", "slice",
    "dynamic_slice", "dynamic_update_slice", "concatenate", "pad", "split", "copy", "copy_p",
    "rev", "select_and_gather_add",
})
_NO_BYTES = frozenset({"transpose"})

_LAYOUT = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose",
                     "copy", "copy_p"})
"""Equations that lay an array out anew (:attr:`CountTerms.operations`), with the reductions
of :data:`_REDUCTIONS` over dimensions of size 1 only (the transpose of a broadcast that
adds such dimensions), whose structure entries are marked with :data:`_AS_LAYOUT`."""
_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"})
_AS_LAYOUT = ":layout"
_BARRIER = "optimization_barrier"


def _terms(jaxpr: Jaxpr, skip: frozenset, flops: list, bytes_accessed: list,
           structure: list) -> None:
    """Append the count's terms in program order: per equation its flops, per operand and
    result its bytes; ``structure`` gets each equation's primitive name with its operands'
    and results' ranks and dtypes (call bodies are entered). Equations whose results are all
    in ``skip`` are left out."""
    eqns = jaxpr.eqns
    if skip:
        eqns = [eqn for eqn in eqns if not all(v in skip for v in eqn.outvars)]
    for eqn_flops, eqn_bytes, eqn_structure in per_equation(_eqn_terms, eqns, equation_copy_key):
        flops.extend(eqn_flops)
        bytes_accessed.extend(eqn_bytes)
        structure.extend(eqn_structure)


def _eqn_terms(eqn: Any) -> tuple[tuple, tuple, tuple]:
    """One equation's terms (:func:`_terms`): ``(flops, bytes, structure)``, a call's those
    of its body (with a checkpoint's barrier first). Computed once per equation inside a
    :func:`jaxremat.measure.jaxpr_facts.shared_equations` block: a layer's pieces are
    dead-code-eliminated variants of two jaxprs and share most equations."""
    body = _body(eqn)
    if body is not None:
        body_flops, body_bytes, body_structure = _body_terms(body)
        if eqn.params.get("differentiated") and eqn.params.get("prevent_cse"):
            # a checkpoint's recomputation: JAX lowers an optimization barrier over its
            # operands, whose bytes XLA counts (the weights' too)
            avals = [v.aval for v in eqn.invars if hasattr(v, "aval")]
            barrier = tuple([float(aval_nbytes(a)) for a in avals])
            return body_flops, barrier + body_bytes, (_entry(_BARRIER, avals),) + body_structure
        return body_flops, body_bytes, body_structure
    name = eqn.primitive.name
    avals = [v.aval for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")]
    if name in _REDUCTIONS and len(avals) == 2 and \
            getattr(avals[0], "size", -1) == getattr(avals[1], "size", -2):
        name += _AS_LAYOUT  # over dimensions of size 1 only
    structure = (_entry(name, avals),)
    flops = (0.0 if name in _NO_FLOPS else float(equation_flops(eqn)),)
    if name in _NO_BYTES:
        return flops, (0.0,) * len(avals), structure
    return flops, tuple([float(aval_nbytes(a)) for a in avals]), structure


def _entry(name: str, avals: list) -> tuple[str, tuple]:
    """A structure entry: the equation's name, its operands' and results' ranks and dtypes
    (one per bytes term it counts)."""
    return name, tuple([(len(getattr(a, "shape", ())), getattr(a, "dtype", None))
                        for a in avals])


@per_jaxpr
def _body_terms(body: Jaxpr) -> tuple[tuple, tuple, tuple]:
    """A call body's terms (:func:`_terms`, nothing skipped), counted once per body: the
    bodies of a layer's pieces are shared between them (the checkpointed forward inside
    the pullback, a derived pullback's calls)."""
    flops: list[float] = []
    bytes_accessed: list[float] = []
    structure: list[Any] = []
    _terms(body, frozenset(), flops, bytes_accessed, structure)
    return tuple(flops), tuple(bytes_accessed), tuple(structure)


@dataclasses.dataclass(frozen=True)
class CountTerms:
    """The terms of a jaxpr's count (:func:`count_terms`), in program order: ``flops`` one
    per equation, ``bytes`` one per operand and result; ``structure`` a hash of the
    equations' primitives and their operands' and results' ranks and dtypes (two traces of
    one function at two batch sizes have the same).

    ``operations`` hashes the names of the equations that do not only lay an array out anew
    (:data:`_LAYOUT`), in order, and ``flops_paired`` / ``bytes_paired`` mark their terms:
    two programs with the same ``operations`` and different ``structure`` differ in layout
    alone (``jnp.einsum`` squeezes a batch dimension of size 1 that is a ``dot_general``
    batch dimension at a larger size), and their marked terms pair up one to one."""

    flops: np.ndarray
    bytes: np.ndarray
    structure: int
    operations: int | None = None
    flops_paired: np.ndarray | None = None
    bytes_paired: np.ndarray | None = None

    @property
    def totals(self) -> tuple[float, float]:
        """``(flops, bytes accessed)``: :func:`count_jaxpr`."""
        return float(self.flops.sum()), float(self.bytes.sum())


def _operations(structure: list, num_flops: int, num_bytes: int
                ) -> tuple[int | None, np.ndarray, np.ndarray]:
    """``(operations, flops_paired, bytes_paired)`` of :class:`CountTerms` from the count's
    structure entries (``operations`` is ``None`` where the entries do not match the terms)."""
    flops_paired, bytes_paired, names = [], [], []
    for name, operands in structure:
        kept = not (name in _LAYOUT or name.endswith(_AS_LAYOUT))
        if kept:
            names.append(name)
        if name != _BARRIER:  # a barrier counts bytes, no flops
            flops_paired.append(kept)
        bytes_paired.extend([kept] * len(operands))
    masks = np.asarray(flops_paired, bool), np.asarray(bytes_paired, bool)
    for mask in masks:
        mask.flags.writeable = False
    if len(flops_paired) != num_flops or len(bytes_paired) != num_bytes:
        return None, *masks
    return hash(tuple(names)), *masks


@per_jaxpr
def _counted(jaxpr: Jaxpr) -> dict[int, CountTerms]:
    """The counts of a (dead-code-free) jaxpr by ``skip_outputs``, filled by
    :func:`count_terms`: a layer's profiles with and without the input's gradient count the
    same forward jaxprs (JAX's dead-code elimination returns the same jaxpr for the same
    program and outputs)."""
    return {}


def count_terms(closed: ClosedJaxpr, skip_outputs: int = 0) -> CountTerms:
    """The terms of :func:`count_jaxpr`'s count, one by one (:class:`CountTerms`; its arrays
    are read-only: a count is computed once per jaxpr and shared)."""
    live = live_jaxpr(closed)
    counted = _counted(live.jaxpr)
    found = counted.get(skip_outputs)
    if found is None:
        found = counted[skip_outputs] = _count(live.jaxpr, skip_outputs)
    return found


def _count(jaxpr: Jaxpr, skip_outputs: int) -> CountTerms:
    outvars = jaxpr.outvars
    skip = outvars[len(outvars) - skip_outputs:] if skip_outputs else ()
    flops: list[float] = []
    bytes_accessed: list[float] = []
    structure: list[Any] = []
    _terms(jaxpr, frozenset(v for v in skip if isinstance(v, Var)), flops, bytes_accessed,
           structure)
    flops_terms, bytes_terms = np.asarray(flops), np.asarray(bytes_accessed)
    flops_terms.flags.writeable = bytes_terms.flags.writeable = False
    return CountTerms(flops_terms, bytes_terms, hash((tuple(structure), len(bytes_accessed))),
                      *_operations(structure, len(flops), len(bytes_accessed)))


def jaxpr_costs(fn: Callable, *args: Any) -> dict[str, float]:
    """Flops and bytes accessed of ``fn(*args)`` counted on its jaxpr (module docstring, 3):
    ``{"flops": ..., "bytes accessed": ...}``. Dead code is removed first, as ``jit`` does;
    call bodies (``jit``, ``checkpoint``,
    ``custom_vjp``...) are counted once per call, so recomputation is included."""
    flops, bytes_accessed = count_jaxpr(jax.make_jaxpr(fn)(*jax.tree.map(_abstract, args)))
    return {"flops": flops, "bytes accessed": bytes_accessed}


def count_jaxpr(closed: ClosedJaxpr, skip_outputs: int = 0) -> tuple[float, float]:
    """``(flops, bytes accessed)`` of a closed jaxpr as :func:`jaxpr_costs` counts them, with
    dead code removed first (what ``jit`` lowers); the equations whose results are all among
    the last ``skip_outputs`` outputs are left out. Traces nothing."""
    return count_terms(closed, skip_outputs).totals


def lowered_costs(fn: Callable, *args: Any) -> dict[str, float]:
    """The cost analysis of ``jax.jit(fn)`` on ``args`` (arrays or ``jax.ShapeDtypeStruct``)
    before XLA optimises: a dict with at least ``"flops"`` and ``"bytes accessed"``, from
    XLA where the backend answers, else counted on the jaxpr (module docstring): on the GPU
    backend, and inside ``jax.shard_map``, which cannot lower a function on its own."""
    global LAST_SOURCE
    try:
        found = lowered_cost_analysis(jax.jit(fn).lower(*args))
    except ValueError:  # e.g. inside shard_map, where only an abstract mesh exists to lower on
        found = None
    LAST_SOURCE = "lowered"
    if found is None:
        found = jaxpr_costs(fn, *args)
        LAST_SOURCE = "jaxpr"
    found.setdefault("bytes accessed", 0.0)
    return found
