"""What a ``lax.scan`` of stored layers holds beyond the chain's accounting, op by op.

Rotor's chain (:func:`solver.apply_op`) counts, for a run of ``n`` layers storing their
tapes, one tape (``xbar_size``, the layer's output in it) per ``F_all`` done and the layer's
``fwd_tmp`` (``bwd_tmp`` in a ``B``). The program-order meter
(:mod:`jaxremat.measure.meter`) counts such a run, a ``lax.scan``, as its outputs
(allocated before its body runs) plus one iteration of its body, the same at every
iteration: in the forward loop the ``n`` stacked residual rows and the final carry, in
the backward loop the same rows (read to its end), the final carry and, where they are
not the program's outputs, the ``n`` layers' gradient rows; beside them the loop
constants computed outside the loops (a causal mask's broadcasts). The sizes are measured
on the layer (:class:`ScanBody`, :func:`jaxremat.scan.held.scan_body`); the difference to
the chain's candidate at each op is what :func:`jaxremat.scan.family.loop_margin` adds
there (benchmarks/RESULTS.md, "Scanned stacks (CPU), session 18"). Reference for the
chain: Beaumont et al., Rotor (arXiv:1911.13214).
"""

from __future__ import annotations

import dataclasses

from solver import Chain
from solver.chain.options import layer_costs

__all__ = ["PerOption", "per_option", "ScanBody", "run_forward_excess", "run_backward_excess",
           "segments_margin", "checkpointed_loops_peak"]

PerOption = float | tuple[float, ...]
"""A size :func:`jaxremat.scan.family.loop_margin` takes for every option alike, or one
per option (index: the option; :func:`jaxremat.scan.held.margin_bytes` gives them so)."""


def per_option(value: PerOption, option: int) -> float:
    """``value`` for ``option``: the one value, or the option's entry."""
    return float(value[option]) if isinstance(value, (tuple, list)) else float(value)


@dataclasses.dataclass(frozen=True)
class ScanBody:
    """What the gradient of a ``lax.scan`` of one layer holds beside the chain, in bytes
    (:func:`jaxremat.scan.held.scan_body` measures it):

    * ``invariants``: the loop constants computed outside the loops, each value once;
      ``backward_invariants``: those of them the backward loop reads;
    * ``rows``: one layer's stacked residual rows in the forward loop's outputs;
    * ``body``: the meter's peak of the forward loop's body (its outputs, the rows and the
      new carry, live from the equation producing each to its end);
    * ``backward``: that of the backward loop's body with its parameter gradients not
      counted (the program's outputs), ``backward_grads`` with them counted.
    """

    invariants: float
    backward_invariants: float
    rows: float
    body: float
    backward: float
    backward_grads: float

    def per_example(self, batch: int) -> ScanBody:
        """Per example under a ``jax.vmap`` of ``batch`` over the activations, the
        parameters shared (the budget's unit there): the loop invariants and the parameter
        gradients are the batch's, divided by it; the rows and bodies were measured on one
        example and stay (dividing them too under-counted the batch's activations: a
        ``tanh`` stack of 24 in segments of 2 measured 1.16 of its prediction under a
        ``vmap`` of 3; tests/test_random_scan.py)."""
        return dataclasses.replace(
            self, invariants=self.invariants / batch,
            backward_invariants=self.backward_invariants / batch,
            backward_grads=self.backward + (self.backward_grads - self.backward) / batch)


def checkpointed_loops_peak(length: int, x: float, body: ScanBody) -> float:
    """The meter's peak in ``jax.checkpoint`` per layer in one ``lax.scan`` of ``length``
    layers, from ``body`` measured on a scan of the checkpointed layer
    (:func:`jaxremat.scan.held.scan_body`): in either loop the ``length`` stacked inputs
    (``rows``), the final carry allocated before the body and the carry in (``x`` each),
    and the body's peak with the loop constants it reads. Where a layer's recomputation and
    backward, fused in one body, hold more than the profile's ``bwd_tmp`` (the bias-free
    ``x + relu(x @ w) @ v``: ``relu``'s selects and zeros), the chain's phases missed it by
    up to a third of an activation per hidden unit (1.03-1.07 of the prediction,
    tests/test_random_scan.py)."""
    return length * body.rows + 2 * x + max(body.body + body.invariants,
                                            body.backward + body.backward_invariants)


def run_forward_excess(chain: Chain, option: int, n: int, i: int,
                       body: ScanBody | None = None) -> float:
    """Bytes a ``lax.scan`` of ``n`` stored layers (``option``) holds at its ``i``-th
    ``F_all`` (from 0) beyond the chain's candidate there: its ``n`` stacked residual rows
    and final carry, and its body's peak (``body``), where the chain counts ``i + 1``
    tapes and ``fwd_tmp``. Without ``body`` (a row one tape, the body one tape beside
    ``fwd_tmp``): ``n - i`` tapes and the carry."""
    cost = layer_costs(chain, 0, option)
    rows = cost.xbar_size if body is None else body.rows
    peak = cost.xbar_size + cost.fwd_tmp if body is None else body.body
    return n * rows + float(chain.x_size[0]) + peak - (i + 1) * cost.xbar_size - cost.fwd_tmp


def run_backward_excess(chain: Chain, option: int, n: int, i: int, param_bytes: float,
                        body: ScanBody | None = None, gradients: bool = True) -> float:
    """Bytes the backward ``lax.scan`` of ``n`` stored layers (``option``) holds at its
    ``i``-th layer's ``B`` (from 0; they run from ``n - 1`` down) beyond the chain's
    candidate there: the ``n`` stacked residual rows, the final carry, the body's peak and,
    with ``gradients`` (they are not the program's outputs), the ``n`` layers' gradient
    rows (``param_bytes`` each) and the body's gradients, where the chain counts ``i + 1``
    tapes, the outgoing gradient and ``bwd_tmp``. Without ``body`` (a row one tape, the
    body one tape beside ``bwd_tmp``): ``n - i`` tapes, the gradient rows and the carry."""
    cost = layer_costs(chain, 0, option)
    if body is None:
        rows, peak = cost.xbar_size, cost.xbar_size + cost.bwd_tmp
    else:
        rows, peak = body.rows, body.backward_grads if gradients else body.backward
    return (n * rows + (n * param_bytes if gradients else 0.0) + float(chain.x_size[0]) + peak
            - (i + 1) * cost.xbar_size - cost.bwd_tmp)


def segments_margin(chain: Chain, option: int, n: int, whole: float,
                    phases: tuple[float, float, float] | None, body: ScanBody) -> float:
    """:func:`jaxremat.scan.family.loop_margin` of one reshaped level of segments of ``n``
    stored layers, each a ``lax.scan``, by phase (``phases``:
    :func:`jaxremat.scan.simulate.phase_peaks`): in the recomputations, the inner forward
    loop by :func:`run_forward_excess`, beside every loop invariant; in the backward, the
    inner backward loop by :func:`run_backward_excess` (its gradients the outer loop's
    stacked outputs, the program's), beside the backward loop's invariants; each at the
    run's last layer (where the chain peaks in a segment: the loop holds the same at every
    layer) and beside the outer loop's carry; the top forward on ``whole`` (the whole-peak
    terms). ``phases`` ``None``: a lower bound without simulating, what the phase the chain
    peaks in adds at least."""
    x = float(chain.x_size[0])
    recompute = run_forward_excess(chain, option, n, n - 1, body) + body.invariants + x
    back = (run_backward_excess(chain, option, n, n - 1, 0.0, body, gradients=False)
            + body.backward_invariants + x)
    if phases is None:
        return min(whole, recompute, back)
    forward_peak, recompute_peak, backward_peak = phases
    return (max(forward_peak + whole, recompute_peak + recompute, backward_peak + back)
            - max(phases))
