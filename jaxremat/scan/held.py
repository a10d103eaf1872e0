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

from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Literal

from ..jax_compat import scan_num_carry, scan_num_consts
from ..measure.liveness import KEPT, OUTSIDE, UNCOUNTED, Walker
from ..trees import aval_nbytes
from .loops import ScanBody

__all__ = ["body_in", "held_gradient_bytes", "held_in", "loop_invariant_bytes", "pullback_program",
           "scan_body", "scan_program", "stored_layer"]


def pullback_program(layer: Callable, params: Any, x: Any) -> ClosedJaxpr:
    """The program of ``layer``'s pullback (``jax.vjp``'s, on ``params`` and ``x``, abstract
    or concrete; its residuals are constants of the trace)."""
    found: dict[str, Any] = {}

    def forward(p: Any, h: Any) -> Any:
        out, pullback = jax.vjp(layer, p, h)
        found["jaxpr"] = jax.make_jaxpr(pullback)(out)
        return out

    jax.eval_shape(forward, params, x)
    return found["jaxpr"]


def held_in(pullback: ClosedJaxpr, grads: int) -> int:
    """:func:`held_gradient_bytes` of a layer whose :func:`pullback_program` is ``pullback``
    and whose parameters have ``grads`` leaves."""
    jaxpr = pullback.jaxpr
    inputs = (OUTSIDE,) * len(jaxpr.invars)
    rest = (UNCOUNTED,) * (len(jaxpr.outvars) - grads)
    held = Walker().peak(jaxpr, inputs, (KEPT,) * grads + rest).nbytes
    return max(0, held - Walker().peak(jaxpr, inputs, (UNCOUNTED,) * len(jaxpr.outvars)).nbytes)


def held_gradient_bytes(layer: Callable, params: Any, x: Any) -> int:
    """Bytes of ``layer``'s parameter gradients live at its backward's peak: the meter's
    peak of the pullback (``jax.vjp``'s, on ``params`` and ``x``, abstract or concrete) with
    the parameter gradients counted from the equation producing each to the end, less the
    peak without them. Residuals and the incoming gradient are the pullback's constants and
    inputs and not counted either way (in a loop body they are slices of the stacked tapes,
    views the meter does not count), nor is the input's gradient (the loop's new carry)."""
    return held_in(pullback_program(layer, params, x), len(jax.tree.leaves(params)))


def scan_program(layer: Callable, params: Any, x: Any) -> ClosedJaxpr:
    """The program of the gradient of a ``lax.scan`` of two of ``layer`` (one layer's
    ``params`` stacked twice, input ``x``; abstract or concrete): the forward loop, then the
    backward loop (:func:`scan_body` reads it)."""
    stacked = jax.tree.map(lambda p: jax.ShapeDtypeStruct((2,) + tuple(p.shape), p.dtype),
                           params)

    def scanned(p: Any, h: Any) -> Any:
        return jax.lax.scan(lambda carry, row: (layer(row, carry), None), h, p)[0]

    def gradient(p: Any, h: Any) -> Any:  # the forward loop, then the backward loop
        out, pullback = jax.vjp(scanned, p, h)
        return pullback(out)

    return jax.make_jaxpr(gradient)(stacked, x)


def body_in(program: ClosedJaxpr, x: Any) -> ScanBody:
    """:func:`scan_body` of the layer whose :func:`scan_program` at input ``x`` is
    ``program``."""
    jaxpr = program.jaxpr
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


def scan_body(layer: Callable, params: Any, x: Any) -> ScanBody:
    """:class:`jaxremat.scan.loops.ScanBody` of the gradient of a ``lax.scan`` of two of
    ``layer`` (one layer's ``params`` stacked twice, input ``x``; abstract or concrete),
    from one trace (:func:`scan_program`): the constants of its loops, the forward loop (the
    first ``scan``; its outputs are the carry, then the stacked residuals) and the backward
    loop (the last)."""
    return body_in(scan_program(layer, params, x), x)


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
