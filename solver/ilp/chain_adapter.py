"""Checkmate's ILP on a tapeless chain, as simulator steps: ``solve(method="ilp")``.

A :class:`~solver.chain.chain.Chain` with ``xbar_size == x_size[1:]`` and zero ``fwd_tmp``
(and ``fwd_ck_tmp``) / ``bwd_tmp`` is exactly the model of :func:`TrainingGraph.from_chain
<solver.ilp.training_graph.TrainingGraph.from_chain>`: ids ``0 .. L`` are ``x[0] .. x[L]``, id
``L+1`` the loss vertex (size and cost 0), id ``L+2`` its backward ``B_loss`` (outputs
``g[L]``, cost 0) and id ``2L+3-k`` the backward of ``x[k]`` (Rotor's ``B(k-1)``, outputs
``g[k-1]``). :func:`ilp_chain_schedule` solves the ILP with ``backward_recompute=False``
and translates its program order (:attr:`IlpSolution.order <solver.ilp.solve.IlpSolution.order>`)
into the simulator's steps (:func:`solver.chain.exhaustive.replay`):

=====================  ==========================================================
ILP action             step
=====================  ==========================================================
compute ``x[k]``       ``F_all(k-1)``: stores ``tape[k-1]``, whose size is ``x_size[k]``
compute ``x[0]``       nothing: the simulator starts holding it (stage 0 only)
compute loss vertex    nothing (size 0, cost 0, no simulator value)
compute ``B_loss``     ``loss``: stores ``g[L]``
compute ``B_{x[k]}``   ``B(k-1)``: stores ``g[k-1]``, frees ``g[k]``, ``tape[k-1]`` and
                       ``x[0]`` when ``k = 1``
free ``x[0]``          ``("drop", ("x", 0))`` unless already freed
free ``x[k]``, k >= 1  ``("drop", ("tape", k-1))`` unless already freed
free ``B`` output      ``("drop", ("g", j))`` unless already freed; never ``g[0]``, the
                       result (the ILP frees everything after its last stage)
=====================  ==========================================================

**Why replay gives exactly the ILP's time and peak.** Every ``x[k]``, ``k >= 1``, lives
in ``tape[k-1]`` (never on its own), so the simulator's stored values and the ILP's
resident vertices are in one-to-one correspondence with equal sizes, the loss vertex
(size 0) aside. Each step's inputs are the ILP vertex's dependencies (``F_all(k-1)``
reads ``x[k-1]``; ``loss`` reads ``x[L]``; ``B(k-1)`` reads ``x[k-1]``, ``tape[k-1]`` =
``x[k]`` and ``g[k]``), resident by the ILP's dependency rows. Nothing is stored twice:
the reductions forbid recomputing a held value (``R + S <= 1``) and a stage computes a
vertex once. The simulator's own frees happen only after ``B(k-1)``, of ``g[k]``,
``x[k]`` and (``k = 1``) ``x[0]``; with backward vertices computed once the ILP frees
them right there too: ``g[k]``'s only reader is ``B_{x[k]}``, and after it nothing can
read ``x[j]``, ``j >= k`` (its readers are later forward vertices, whose recomputation
the usefulness cuts forbid once no backward vertex can read them, and backward vertices
already computed). So the stored set equals the ILP's resident set after every step.
The peak candidates of ``F_all``, ``loss`` and ``B`` are the memory right after storing
the output, before any free (temporaries are zero), which is how the ILP measures a
computation; the ILP's extra moment, computing the size-0 loss vertex, never exceeds
the previous computation's. Costs agree one to one (``loss`` and ``B_loss`` cost 0).

**What each class allows.** The ILP (any ``backward_recompute``) forbids what the
simulator allows: a stage's recomputations run in increasing index order before its
new vertex, so e.g. two segments cannot be recomputed top one first. With
``backward_recompute=True`` the ILP allows recomputing a gradient while holding its
inputs, which the simulator's ``B`` (it frees its inputs) cannot express; on small DAGs
this sometimes lowers the optimum, hence ``False`` here. Every Rotor (persistent)
schedule is in the ILP's class with the same time and no larger peak, so the ILP's time
is a lower bound on Rotor's, and every ILP schedule is a sequence of ops and drops, so
:func:`solver.exhaustive_search`'s time is a lower bound on the ILP's.
"""

from __future__ import annotations

import numpy as np

from ..chain.chain import Chain
from ..chain.exhaustive import Step, replay
from ..chain.schedule import OpKind, Schedule
from ..chain.simulator import MemoryState, apply_op, drop, initial_state
from ..errors import InfeasibleBudget
from .solve import IlpSolution, solve_ilp
from .training_graph import TrainingGraph

__all__ = ["check_no_options", "check_tapeless", "ilp_steps", "ilp_chain_schedule"]


def check_no_options(chain: Chain) -> None:
    """Raise ``NotImplementedError`` if a layer of ``chain`` offers more than one option.

    The ILP's training graph computes each vertex one way, so it cannot choose among a
    layer's checkpoint-policy options (:mod:`solver.chain.options`); Rotor's DP does.
    """
    counts = chain.num_options
    if (counts > 1).any():
        i = int(np.flatnonzero(counts > 1)[0])
        raise NotImplementedError(
            f"method='ilp' does not model per-layer options, and layer {i} offers "
            f"{int(counts[i])}: use method='rotor' (exact among persistent schedules, options "
            "included), or chain.with_options(None) for the ILP on the whole tapes only."
        )


def check_tapeless(chain: Chain) -> None:
    """Raise ``ValueError`` unless ``chain`` is in the ILP's model (no tapes, no temporaries)."""
    reasons = []
    if (chain.xbar_size != chain.x_size[1:]).any():
        reasons.append("tapes larger than the layer outputs (xbar_size != x_size[1:])")
    if chain.fwd_tmp.any() or chain.ck_tmp.any() or chain.bwd_tmp.any():
        reasons.append("nonzero fwd_tmp / fwd_ck_tmp / bwd_tmp")
    if not chain.output_in_tape.all():
        reasons.append("backwards that do not read their outputs (output_in_tape false)")
    if (chain.fwd_tape_time != chain.fwd_time).any():
        reasons.append("tape-only forwards cheaper than the forwards (fwd_tape_time)")
    if chain.option_x_own_free.any():  # at least x_free
        reasons.append("inputs that backwards read in part (x_read_size < x_size)")
    if reasons:
        raise ValueError(
            f"method='ilp' needs a tapeless chain, but this one has {' and '.join(reasons)}: "
            "the ILP models no tapes, temporaries or tape-only forwards; use method='rotor'."
        )


def ilp_steps(chain: Chain, solution: IlpSolution) -> tuple[Step, ...]:
    """The simulator steps of an ILP solution on ``TrainingGraph.from_chain(chain)``.

    The translation table and the proof that :func:`~solver.chain.exhaustive.replay` costs them
    at the ILP's objective and peak are in the module docstring.
    """
    L = chain.length
    loss_vertex, loss_backward = L + 1, L + 2
    state: MemoryState = initial_state(chain)
    steps: list[Step] = []
    for action, v in solution.order:
        if v == loss_vertex or (action == "compute" and v == 0) or (action, v) == ("free", 2 * L + 2):
            continue  # no simulator value; x[0] is there from the start; g[0] is the result
        if action == "compute":
            if v <= L:
                op = (OpKind.F_ALL, v - 1)
            elif v == loss_backward:
                op = (OpKind.LOSS, L)
            else:
                op = (OpKind.B, 2 * L + 2 - v)
            state = apply_op(chain, state, op)[0]
            steps.append(op)
            continue
        if v == 0:
            value = ("x", 0)
        elif v <= L:
            value = ("tape", v - 1)
        else:
            value = ("g", L if v == loss_backward else 2 * L + 3 - v - 1)
        name, k = value
        if getattr(state, name) >> k & 1:  # not already freed by the simulator's B
            state = drop(chain, state, value)
            steps.append(("drop", value))
    return tuple(steps)


def ilp_chain_schedule(chain: Chain, budget: float, *, time_limit: float) -> Schedule:
    """The ILP's least-time schedule of a tapeless ``chain`` within ``budget``, replayed.

    Its ``ops`` are the steps of :func:`ilp_steps` (ops and drops), its ``time`` and
    ``peak`` those of :func:`~solver.chain.exhaustive.replay`, and ``plan`` is ``None``: the
    schedule is generally not persistent. ``method`` is ``"ilp"``, or says that the time
    limit stopped HiGHS before it proved optimality.

    Raises:
      NotImplementedError: a layer offers several options (:func:`check_no_options`).
      ValueError: ``chain`` has tapes or temporaries (:func:`check_tapeless`).
      InfeasibleBudget: no schedule of the class fits (``min_budget`` is the ILP's).
      RuntimeError: the time limit passed before HiGHS found any schedule.
    """
    check_no_options(chain)
    check_tapeless(chain)
    try:
        solution = solve_ilp(
            TrainingGraph.from_chain(chain), budget, time_limit=time_limit,
            backward_recompute=False,
        )
    except InfeasibleBudget as error:
        raise InfeasibleBudget(budget, error.min_budget, "ilp") from None
    steps = ilp_steps(chain, solution)
    time, peak = replay(chain, steps)
    scale = max(1.0, abs(solution.objective), solution.peak)
    if abs(time - solution.objective) > 1e-9 * scale or abs(peak - solution.peak) > 1e-9 * scale:
        raise AssertionError(
            f"Internal error: the ILP's schedule (time {solution.objective!r}, peak "
            f"{solution.peak!r}) replays at time {time!r}, peak {peak!r}. Please report "
            "this chain."
        )
    method = "ilp" if solution.optimal else "ilp (time limit: not proven optimal)"
    return Schedule(ops=steps, time=time, peak=peak, plan=None, method=method)
