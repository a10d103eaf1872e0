"""What a scanned layer's loop bodies hold beside the chain's accounting, measured on the layer.

The program-order meter (:mod:`jaxremat.measure.meter`) allocates a loop's outputs before
its body runs and counts the body's own values beside them, and a loop's constants for as
long as the loop runs. Two things a nested-scan plan's loops hold therefore escape the
layer's profile (:mod:`jaxremat.sequence.profile`), and
:func:`jaxremat.scan.family.loop_margin` adds them:

* :func:`held_gradient_bytes`: a backward loop's body outputs its layer's parameter
  gradients, live from the equation producing each to the body's end, where ``bwd_tmp``
  counts no parameter gradient. On a GPT-2 block, at the backward's peak, the MLP output
  projection's weight and bias gradients; on a residual MLP block without an output bias,
  its output weight's gradient.
* :func:`loop_invariant_bytes`: values the layer computes from constants alone (a causal
  mask's broadcasts, ``-inf`` and zeros for ``jnp.where`` and its transpose), which JAX
  computes once outside a scan of the layer and its loops read as constants: held through
  the loops, where the profile counts them only while the layer runs. On the GPT-2
  block of ``benchmarks/scan_depth.py``: 4.5 activations with the whole tape.

And, on the loops of the same trace (:func:`scan_body`), what a scan of stored layers
holds where the chain counts one tape per layer: its stacked residual rows (less than the
profile's tape where the scan hoists a value, as the GPT-2 block's mask, or where the tape
holds the layer's output, which a scan carries instead of stacking) and its loop bodies'
peaks, by which :func:`jaxremat.scan.family.loop_margin` counts the scans of stored runs
(:mod:`jaxremat.scan.loops`; benchmarks/RESULTS.md, "Scanned stacks (CPU), session 18").
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import Literal

from ..jax_compat import scan_num_carry, scan_num_consts
from ..measure.liveness import KEPT, OUTSIDE, UNCOUNTED, Walker
from ..trees import aval_nbytes
from .loops import ScanBody

__all__ = ["held_gradient_bytes", "loop_invariant_bytes", "scan_body", "stored_layer",
           "margin_bytes"]


def held_gradient_bytes(layer: Callable, params: Any, x: Any) -> int:
    """Bytes of ``layer``'s parameter gradients live at its backward's peak: the meter's
    peak of the pullback (``jax.vjp``'s, on ``params`` and ``x``, abstract or concrete) with
    the parameter gradients counted from the equation producing each to the end, less the
    peak without them. Residuals and the incoming gradient are the pullback's constants and
    inputs and not counted either way (in a loop body they are slices of the stacked tapes,
    views the meter does not count), nor is the input's gradient (the loop's new carry)."""
    found: dict[str, Any] = {}

    def forward(p: Any, h: Any) -> Any:
        out, pullback = jax.vjp(layer, p, h)
        found["jaxpr"] = jax.make_jaxpr(pullback)(out)  # residuals: constants of the trace
        return out

    jax.eval_shape(forward, params, x)
    jaxpr = found["jaxpr"].jaxpr
    grads = len(jax.tree.leaves(params))
    inputs = (OUTSIDE,) * len(jaxpr.invars)
    rest = (UNCOUNTED,) * (len(jaxpr.outvars) - grads)
    held = Walker().peak(jaxpr, inputs, (KEPT,) * grads + rest).nbytes
    return max(0, held - Walker().peak(jaxpr, inputs, (UNCOUNTED,) * len(jaxpr.outvars)).nbytes)


def scan_body(layer: Callable, params: Any, x: Any) -> ScanBody:
    """:class:`jaxremat.scan.loops.ScanBody` of the gradient of a ``lax.scan`` of two of
    ``layer`` (one layer's ``params`` stacked twice, input ``x``; abstract or concrete),
    from one trace: the constants of its loops, the forward loop (the first ``scan``; its
    outputs are the carry, then the stacked residuals) and the backward loop (the last)."""
    stacked = jax.tree.map(lambda p: jax.ShapeDtypeStruct((2,) + tuple(p.shape), p.dtype),
                           params)

    def scanned(p: Any, h: Any) -> Any:
        return jax.lax.scan(lambda carry, row: (layer(row, carry), None), h, p)[0]

    def gradient(p: Any, h: Any) -> Any:  # the forward loop, then the backward loop
        out, pullback = jax.vjp(scanned, p, h)
        return pullback(out)

    jaxpr = jax.make_jaxpr(gradient)(stacked, x).jaxpr
    produced = {v for eqn in jaxpr.eqns for v in eqn.outvars}
    loops = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "scan"]

    def hoisted(eqns: list[Any]) -> int:  # each value once
        return sum({v: aval_nbytes(v.aval) for eqn in eqns
                    for v in eqn.invars[:scan_num_consts(eqn)]
                    if not isinstance(v, Literal) and v in produced}.values())

    def peak(loop: Any, outputs: tuple[int, ...]) -> int:  # a loop body: inputs outside
        body = loop.params["jaxpr"].jaxpr
        return Walker().peak(body, (OUTSIDE,) * len(body.invars), outputs).nbytes

    forward, backward = loops[0], loops[-1]
    # each loop's outputs: its carry (x's leaves forward; the cotangents of x's inexact
    # leaves backward: an integer leaf has none), then the stacked rows
    leaves = jax.tree.leaves(x)
    carry = scan_num_carry(forward, len(leaves))
    rows = sum(aval_nbytes(v.aval) for v in forward.outvars[carry:]) // 2
    carry = scan_num_carry(backward, sum(jax.dtypes.issubdtype(leaf.dtype, np.inexact)
                                         for leaf in leaves))
    grads = len(backward.outvars) - carry  # after the carry: the parameters' gradient rows
    return ScanBody(hoisted(loops), hoisted([backward]), rows,
                    peak(forward, (KEPT,) * len(forward.outvars)),
                    peak(backward, (KEPT,) * carry + (UNCOUNTED,) * grads),
                    peak(backward, (KEPT,) * len(backward.outvars)))


def loop_invariant_bytes(layer: Callable, params: Any, x: Any) -> int:
    """Bytes of the values the gradient of a ``lax.scan`` of two of ``layer`` (one layer's
    ``params`` stacked twice, input ``x``; abstract or concrete) computes outside its loops
    and passes them as loop constants: what JAX hoists out of the layer (computed from
    constants alone), each value once (:func:`scan_body`)."""
    return scan_body(layer, params, x).invariants


def stored_layer(layer: Callable, policy: Callable | None) -> Callable:
    """``layer`` as a layer that stores its tape runs it: whole (``policy`` ``None``) or under
    ``jax.checkpoint`` with ``policy`` (a chain option; no CSE across scan iterations, so
    ``prevent_cse`` is not needed: jax.checkpoint docs)."""
    return layer if policy is None else jax.checkpoint(layer, policy=policy, prevent_cse=False)


def margin_bytes(layer: Callable, params: Any, x: Any,
                 policies: tuple[Callable | None, ...]) -> dict[str, Any]:
    """The keyword arguments :func:`jaxremat.scan.family.loop_margin` takes for ``layer``
    (one layer's ``params``, input ``x``; :mod:`jaxremat.scan.held`): ``param_bytes``; per
    option (``policies``, as :func:`jaxremat.scan.plan.option_policies` gives them), the
    parameter gradients its backward holds at its peak (``grad_bytes``; 0 for the whole
    tape, which loop_margin does not read), the loop invariants a scan of it hoists
    (``invariant_bytes``) and what such a scan holds (``scan_bodies``:
    :class:`jaxremat.scan.loops.ScanBody`), and a scan of it under ``jax.checkpoint``
    (``checkpoint_bodies``)."""
    stored = [stored_layer(layer, policy) for policy in policies]
    bodies = tuple(scan_body(f, params, x) for f in stored)
    return {"param_bytes": sum(math.prod(s.shape) * s.dtype.itemsize
                               for s in jax.tree.leaves(params)),
            "grad_bytes": (0,) + tuple(held_gradient_bytes(f, params, x) for f in stored[1:]),
            "invariant_bytes": tuple(b.invariants for b in bodies), "scan_bodies": bodies,
            "checkpoint_bodies": tuple(scan_body(jax.checkpoint(f, prevent_cse=False), params, x)
                                       for f in stored)}
