"""What a ``jax.checkpoint`` policy keeps and recomputes on a layer, without tracing the layer
under it: the searched policies' measure (:mod:`jaxremat.sequence.searched`).

``jax.checkpoint(layer, policy=P)`` differentiates the layer's JVP program and splits it by
partial evaluation: the equations whose operands are all known (the primal computation) run
in the forward, and those the policy saves, or the inputs, are the residuals; the tangent
equations and everything the policy did not save that they read are staged to the backward,
where they are recomputed (JAX's ``remat_partial_eval``, after Griewank and Walther's
checkpointing of a program's linearization). Tracing ``jax.vjp`` of the checkpointed layer
repeats all of that, Python included, for every policy; here the JVP program is traced once
per layer (:func:`jvp_program`) and split per policy (:func:`policy_costs`,
:func:`jaxremat.jax_compat.checkpoint_split`), about 5 ms against 35 ms to linearize and
150 ms to trace the vjp and its pullback on a GPT-2 block.

The tape is counted as :func:`jaxremat.measure.trace.trace_layer` counts it, and the flops of
the split (forward, then recomputation and tangent) equal those of
:func:`jaxremat.measure.trace.trace_linearized`'s jaxprs, reduce-precision casts included
(``tests/test_policy_costs.py``); they differ from the pullback's by an amount the policy does
not change (the transposition's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import Jaxpr, Var

from ..jax_compat import checkpoint_split, close_jaxpr
from ..trees import cotangent_struct, tree_bytes
from .costs import count_jaxpr
from .liveness import device_nbytes
from .trace import mark_live

__all__ = ["JvpProgram", "jvp_program", "policy_costs"]


@dataclasses.dataclass(frozen=True)
class JvpProgram:
    """A layer's JVP program: ``jaxpr``'s inputs are its constants, ``p``'s and ``x``'s
    leaves (the first ``num_known``), then their tangents; its outputs ``y``'s leaves
    (``num_outputs``, ``output_bytes`` in all), then their tangents."""

    jaxpr: Jaxpr
    num_known: int
    num_outputs: int
    output_bytes: int


def jvp_program(layer: Callable, p: Any, x: Any) -> JvpProgram:
    """The :class:`JvpProgram` of ``layer`` at abstract ``p`` and ``x`` (``jax.jvp`` traced
    once; integer leaves get ``float0`` tangents)."""
    tangents = jax.tree.map(cotangent_struct, (p, x))
    closed, (output, _) = jax.make_jaxpr(
        lambda p, x, tp, tx: jax.jvp(layer, (p, x), (tp, tx)), return_shape=True)(
            p, x, *tangents)
    jaxpr = closed.jaxpr
    consts = len(jaxpr.constvars)
    if consts:  # constants become leading known inputs, as the checkpoint's body has none
        jaxpr = jaxpr.replace(constvars=[], invars=[*jaxpr.constvars, *jaxpr.invars])
    return JvpProgram(jaxpr, consts + len(jax.tree.leaves((p, x))),
                      len(jax.tree.leaves(output)), tree_bytes(output))


def _inexact(aval: Any) -> bool:
    """Whether a value is floating or complex (JAX casts only those residuals)."""
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and bool(jax.numpy.issubdtype(dtype, np.inexact))


def policy_costs(program: JvpProgram, policy: Callable) -> tuple[int, float] | None:
    """``(tape bytes, flops)`` of the layer under ``jax.checkpoint(..., policy=policy)``:
    the residuals the staged part reads, less the layer's inputs, constants and outputs,
    plus the output (as :func:`jaxremat.measure.trace.trace_layer`'s ``tape_bytes``); and
    the flops of the forward and the staged part with one reduce-precision cast per floating
    residual the forward computes (JAX inserts them, ``_insert_reduce_precision``). ``None``
    where JAX's partial evaluation is not available."""
    split = checkpoint_split(program.jaxpr, program.num_known, policy)
    if split is None:
        return None
    known, staged, num_res = split
    mark_live(known, staged)  # both free of dead code (checkpoint_split): counted as they are
    outputs = known.outvars[:len(known.outvars) - num_res]
    residuals = known.outvars[len(known.outvars) - num_res:]
    outside = set(known.invars) | set(v for v in outputs[:program.num_outputs]
                                      if isinstance(v, Var))
    read = {v for eqn in known.eqns for v in eqn.invars if isinstance(v, Var)}
    distinct = list(dict.fromkeys(v for v in residuals if isinstance(v, Var)))
    counted = [v for v in distinct if v not in outside]
    cast = sum(int(np.prod(v.aval.shape)) for v in distinct if v in read and _inexact(v.aval))
    tape = sum(device_nbytes(v.aval) for v in counted) + program.output_bytes
    flops = count_jaxpr(close_jaxpr(known))[0] + count_jaxpr(close_jaxpr(staged))[0]
    return tape, flops + cast
