"""``solve``: the one entry point from a chain and a memory budget to a schedule.

``METHODS`` lists the methods whose schedules carry a nested plan (what the JAX frontend
applies). ``"ilp"`` (Checkmate's ILP, :mod:`solver.ilp.chain_adapter`) is accepted by
:func:`solve` too, but is not in ``METHODS``: its schedules are not persistent
(``plan is None``), an optimality oracle rather than something to apply.
"""

from __future__ import annotations

import math
import numbers

from .chain.baselines import BASELINE_METHODS, baseline_schedule
from .chain.chain import Chain
from .chain.rotor import RotorTable
from .chain.schedule import Schedule
from .errors import InfeasibleBudget
from .ilp.chain_adapter import ilp_chain_schedule

__all__ = ["solve", "METHODS"]

METHODS = ("rotor",) + tuple(BASELINE_METHODS)
ORACLE_METHODS = ("ilp",)  # accepted by solve, but their schedules have no plan

# Relative slack when checking a schedule's simulated peak against the budget: sizes are
# summed in a different order by the DP and by the simulator.
_PEAK_TOLERANCE = 1e-9


def _check_arguments(chain: Chain, budget: float, method: str, slots: int) -> float:
    if not isinstance(chain, Chain):
        raise TypeError(f"solve expects a solver.Chain, got {type(chain).__name__}.")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ValueError(f"budget must be a positive number, got {budget!r}.")
    budget = float(budget)
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(
            f"budget must be finite and > 0 (same units as the chain's sizes), got {budget!r}. "
            f"Pass the memory available for activations, e.g. in bytes."
        )
    if isinstance(slots, bool) or not isinstance(slots, numbers.Integral) or slots < 1:
        raise ValueError(
            f"slots must be an integer >= 1 (Rotor uses 500), got {slots!r}. More slots "
            f"round sizes more finely, at a cost linear in slots."
        )
    if method not in METHODS + ORACLE_METHODS:
        raise ValueError(f"Unknown method {method!r}; choose one of {METHODS + ORACLE_METHODS}.")
    return budget


def solve(
    chain: Chain,
    budget: float,
    *,
    method: str = "rotor",
    slots: int = 500,
    time_limit: float = 60.0,
) -> Schedule:
    """The fastest schedule of ``chain`` whose peak memory fits ``budget``.

    Args:
      chain: the costs of the layers.
      budget: the memory available, in the unit of the chain's sizes, ``x[0]`` included.
      method: ``"rotor"`` (Rotor's dynamic program, ALGORITHMS.md section 2) or a baseline
        (``"none"``, ``"every_layer"``, ``"sqrt"``, ``"revolve"``; see
        :mod:`solver.chain.baselines`).
        or ``"ilp"``: Checkmate's ILP (:mod:`solver.ilp.chain_adapter`), the least time over
        non-persistent schedules of its class, for tapeless chains only
        (``xbar_size == x_size[1:]``, no temporaries) and a few dozen layers. Its
        schedule has ``plan=None`` and drops in ``ops`` (cost it with
        :func:`solver.chain.exhaustive.replay`); its time is a lower bound on ``"rotor"``'s.
      slots: Rotor's memory discretisation: sizes are rounded up to units of
        ``budget / slots``. Integer sizes with ``slots >= budget`` are solved exactly.
      time_limit: seconds HiGHS may spend for ``"ilp"`` (ignored otherwise); past it the
        best schedule found is returned and its ``method`` says it is not proven optimal.

    With per-layer options (``Chain.options``), ``"rotor"`` picks the best option for every
    ``Layer`` of its plan; the baselines run option 0 (the whole tape).

    For ``"rotor"`` the DP's schedule (or, if rounding makes the DP infeasible although the
    budget suffices, the exact minimum-peak schedule) is compared with every baseline that
    fits, and the fastest is returned (ties: lower peak, then Rotor), so Rotor is never worse
    than a baseline. Its ``method`` names the solver whose schedule won.

    Returns:
      A :class:`Schedule` whose simulated peak is ``<= budget``.

    Raises:
      InfeasibleBudget: no schedule of ``method`` fits; ``.min_budget`` is the least budget
        that works.
      ValueError: invalid ``budget``, ``slots`` or ``method``, or ``"ilp"`` on a chain with
        tapes or temporaries.
      NotImplementedError: ``"ilp"`` on a chain whose layers offer several options
        (``Chain.options``); ``"rotor"`` chooses among them, the baselines use option 0.
      RuntimeError: ``"ilp"`` found no schedule within ``time_limit``.
    """
    budget = _check_arguments(chain, budget, method, slots)
    if method == "ilp":
        schedule = ilp_chain_schedule(chain, budget, time_limit=time_limit)
    elif method != "rotor":
        schedule = baseline_schedule(chain, method, budget)
    else:
        table = RotorTable(chain, budget, int(slots))
        candidates = []
        try:
            candidates.append(table.schedule(budget))
        except InfeasibleBudget:
            pass
        for name in BASELINE_METHODS:
            try:
                candidates.append(baseline_schedule(chain, name, budget))
            except InfeasibleBudget:
                pass
        if not candidates:
            raise InfeasibleBudget(budget, table.min_budget, "rotor")
        schedule = min(candidates, key=lambda s: (s.time, s.peak))
    if schedule.peak > budget * (1 + _PEAK_TOLERANCE):
        raise AssertionError(
            f"Internal error: the {schedule.method!r} schedule peaks at {schedule.peak!r} "
            f"over the budget {budget!r}. Please report this chain."
        )
    return schedule
