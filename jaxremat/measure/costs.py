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

(Lowering for the CPU instead, ``Traced.lower(lowering_platforms=("cpu",))``, was tried: on
the GPU machine its ``cost_analysis()`` is ``None`` too.) :data:`LAST_SOURCE` says which
answered last (benchmarks print it).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax.extend.core import Jaxpr, Var

from .dataflow import _body, equation_flops
from ..jax_compat import lowered_cost_analysis
from .meter import aval_nbytes
from .trace import _dead_code_removed

__all__ = ["jaxpr_costs", "lowered_costs"]

LAST_SOURCE: str | None = None
"""Which way :func:`lowered_costs` answered last: "lowered" or "jaxpr"."""


def _abstract(leaf: Any) -> Any:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return leaf


def _count(jaxpr: Jaxpr) -> tuple[float, float]:
    flops = bytes_accessed = 0.0
    for eqn in jaxpr.eqns:
        body = _body(eqn)
        if body is not None:
            inner = _count(body)
            flops, bytes_accessed = flops + inner[0], bytes_accessed + inner[1]
            continue
        flops += equation_flops(eqn)
        bytes_accessed += sum(aval_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars)
                              if isinstance(v, Var) or hasattr(v, "aval"))
    return flops, bytes_accessed


def jaxpr_costs(fn: Callable, *args: Any) -> dict[str, float]:
    """Flops and bytes accessed of ``fn(*args)`` counted on its jaxpr (module docstring, 3):
    ``{"flops": ..., "bytes accessed": ...}``. Dead code is removed first, as ``jit`` does;
    call bodies (``jit``, ``checkpoint``,
    ``custom_vjp``...) are counted once per call, so recomputation is included."""
    closed = jax.make_jaxpr(fn)(*jax.tree.map(_abstract, args))
    # what jit lowers: dead code (a gradient's unused primal outputs) is not computed
    live = _dead_code_removed(closed, [True] * len(closed.jaxpr.outvars))
    flops, bytes_accessed = _count(live.jaxpr)
    return {"flops": flops, "bytes accessed": bytes_accessed}


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
