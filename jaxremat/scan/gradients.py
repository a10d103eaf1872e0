"""The parameter gradients a layer's backward holds at its peak, inside a loop body.

A scan over stored layers runs each layer's backward as the body of its backward loop,
whose outputs are the layer's parameter gradients (one row of the stacked gradients). The
program-order meter (:mod:`jaxremat.measure.meter`: a loop body's outputs are live from the
equation producing them to the body's end, beside the stacked rows allocated before the
body) then counts, at the body's peak, the gradients the backward has produced so far. The
chain's profile does not (``bwd_tmp`` counts no parameter gradient,
:mod:`jaxremat.sequence.profile`): :func:`held_gradient_bytes` is that difference,
measured on the layer's pullback, which :func:`jaxremat.scan.family.loop_margin` adds
under a policy. On a GPT-2 block it is the last projection's weight and bias gradients
(the backward's peak comes after both); on a residual MLP block without an output bias,
its output weight's gradient.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from ..measure.liveness import KEPT, OUTSIDE, UNCOUNTED, Walker

__all__ = ["held_gradient_bytes"]


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
