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
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from jax.extend.core import Literal

from ..jax_compat import scan_num_consts
from ..measure.liveness import KEPT, OUTSIDE, UNCOUNTED, Walker
from ..trees import aval_nbytes

__all__ = ["held_gradient_bytes", "loop_invariant_bytes"]


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


def loop_invariant_bytes(layer: Callable, params: Any, x: Any) -> int:
    """Bytes of the values the gradient of a ``lax.scan`` of two of ``layer`` (one layer's
    ``params`` stacked twice, input ``x``; abstract or concrete) computes outside its loops
    and passes them as loop constants: what JAX hoists out of the layer (computed from
    constants alone), each value once."""
    stacked = jax.tree.map(lambda p: jax.ShapeDtypeStruct((2,) + tuple(p.shape), p.dtype),
                           params)

    def scanned(p: Any, h: Any) -> Any:
        return jax.lax.scan(lambda carry, row: (layer(row, carry), None), h, p)[0]

    def gradient(p: Any, h: Any) -> Any:  # the forward loop, then the backward loop
        out, pullback = jax.vjp(scanned, p, h)
        return pullback(out)

    jaxpr = jax.make_jaxpr(gradient)(stacked, x).jaxpr
    produced = {v for eqn in jaxpr.eqns for v in eqn.outvars}
    hoisted = {v: aval_nbytes(v.aval) for eqn in jaxpr.eqns if eqn.primitive.name == "scan"
               for v in eqn.invars[:scan_num_consts(eqn)]
               if not isinstance(v, Literal) and v in produced}
    return sum(hoisted.values())
