"""A memory budget for :func:`jaxremat.remat_graph`, enforced on measured memory.

Feng & Huang's budgeted search (:func:`solver.checkpoint_search` with ``budget=``, CVPR 2021)
returns the checkpoint set of least recompute whose *model* memory fits. The model charges
every tensor of a rebuilt segment as held until the segment's backward, while JAX holds what
the backward reads; for the looser sets a budget allows, model and measurement differ by
0.8-2.9x on the models of ``benchmarks/graph_memory.py``. So a budget in model bytes would
promise nothing about the program. Here the budget bounds the measurement instead:

* the *model budget* ``b`` is only a knob that trades recompute for memory: the search at
  ``b`` gives a candidate set, and ``evaluate`` measures the program that set yields
  (program-order memory of its gradient, :func:`jaxremat.activation_memory`);
* the model budget ranges from the least model memory (``least``, measured ``m_least``) to
  keeping everything (the plain program, measured ``m_plain``). Within that bracket the
  boundary where the measurement crosses the user's budget is found by bisection (the
  measurement is a step function of ``b``: many sets that recompute a few cheap tensors
  measure what the plain program does, so interpolating between the ends stalls);
* the answer is the candidate of least recompute among those whose measurement fits. When
  even the least-memory set does not fit, the same steps probe the sets just above it (the
  least model memory is not always the least measured one: on the residual MLP of
  ``tests/test_remat_graph_budget.py`` a looser set measures 14 activations against 16).

Guarantee: the returned set's measured memory is at most the budget. Not guaranteed: that no
other set fits with less recompute. Each search is within 2 % of the model's least
recompute at its model budget, or stops at its work limit (``work_limit`` candidates,
:func:`solver.checkpoint_search`: deterministic, so the plan does not depend on the
machine's load) or at its share of the optional time limit, and the bisection
is a heuristic: it assumes measured memory grows with the model budget, which held on the
models of ``benchmarks/graph_memory.py`` for the least-memory execution, while with kept
tensors saved it only holds roughly.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import solver
from solver.graph.model import memory_of

__all__ = ["fit_budget"]

_STEPS = 6
_GAP = 0.02  # each budgeted search stops within 2 % of the least recompute of the model


def fit_budget(
    graph: solver.Graph,
    least: solver.CheckpointSet,
    least_measured: float,
    plain_measured: float,
    budget: float,
    evaluate: Callable[[solver.CheckpointSet], float],
    *,
    time_limit: float | None,
    work_limit: int | None = None,
    steps: int = _STEPS,
    search: Callable[..., solver.CheckpointSet] | None = None,
) -> tuple[solver.CheckpointSet | None, float]:
    """The checkpoint set of least recompute found whose measured memory fits ``budget``.

    Args:
      graph: the graph searched.
      least: its least-memory checkpoint set; ``least_measured`` its measured memory.
      plain_measured: the measured memory of the program without checkpoints.
      budget: the bound on measured memory, in the units of ``evaluate``.
      evaluate: measures the program a checkpoint set yields.
      time_limit: seconds allowed to all the budgeted searches together, shared out
        evenly among those left (``None``: no limit). A search that runs out returns the
        best set it found, which fits its model budget. It makes the plan depend on the
        machine's load; ``work_limit`` does not.
      work_limit: candidates each budgeted search may examine (``None``: no limit;
        :func:`solver.checkpoint_search`). One that runs out returns the best set it found.
      steps: the most budgeted searches to run.
      search: ``search(model_budget, time_limit, gap, work_limit)`` runs a budgeted search
        (default: :func:`solver.checkpoint_search` on ``graph``; :mod:`jaxremat.graph.memo`
        passes one that reuses earlier searches).

    Returns:
      ``(checkpoints, measured)``; ``checkpoints`` is ``None`` when the plain program fits
      (keep everything, checkpoint nothing).

    Raises:
      solver.InfeasibleBudget: no set tried fits; ``min_budget`` is the least measured
        memory among them and the plain program (``exact=False``: a smaller one may exist).
    """
    if budget >= plain_measured:
        return None, plain_measured
    everything = memory_of(graph, list(range(1, len(graph) - 1)))[0]
    fits = least_measured <= budget
    best, best_measured = (least, least_measured) if fits else (None, least_measured)
    low_b, high_b = least.peak, everything
    measured: dict[tuple, float] = {least.checkpoints: least_measured}
    deadline = None if time_limit is None else time.monotonic() + time_limit
    for step in range(steps):
        if high_b - low_b <= 1e-3 * (everything - least.peak):
            break
        model_budget = (low_b + high_b) / 2
        with warnings.catch_warnings():  # a timed-out search still returns a set that fits
            warnings.simplefilter("ignore", RuntimeWarning)
            left = None if deadline is None else max(0.0, deadline - time.monotonic()) / (steps - step)
            found = (search(model_budget, left, _GAP, work_limit) if search is not None else
                     solver.checkpoint_search(graph, budget=model_budget, time_limit=left,
                                              gap=_GAP, work_limit=work_limit))
        if found.checkpoints not in measured:
            measured[found.checkpoints] = evaluate(found)
        value = measured[found.checkpoints]
        if value <= budget:
            low_b = model_budget
            if best is None or (found.recompute, value) < (best.recompute, best_measured):
                best, best_measured = found, value
        else:
            high_b = model_budget
    if best is None:
        # the plain program is a candidate too: keeping everything may measure less than
        # every set tried (a set that recomputes cheap values can hold more than it saves)
        raise solver.InfeasibleBudget(budget, min(plain_measured, *measured.values()), "remat_graph",
                                      units="bytes", exact=False, other_methods=False)
    return best, best_measured
