"""Slot refinement: Rotor's plan at a budget, with the rounding slack won back.

Rotor's dynamic program (:mod:`solver.chain.rotor`; Beaumont et al., arXiv:1911.13214,
section 4) rounds every size **up** to units of ``budget / slots``, so each plan it returns
fits, but a plan whose simulated peak is the budget or a little below is rejected when
the sizes it holds at its peak lose more than the slack to rounding (on a 12-block GPT
with 500 slots: up to ~2% of the budget, benchmarks/RESULTS.md, issue 17).

:func:`refined_schedule` builds the table with the same unit and ``headroom`` more units
(``slots * (1 + headroom)``: the table costs that much more, O(L^3 M)), answers the budget
as before (the same rounded sizes), then reads the table's optimal times at the larger
capacities: each plan the rounded model fits in more units may still fit the real budget.
Those plans are costed with the simulator in a binary search for the largest capacity whose
plan fits (a plan needing more units is rarely smaller), which replaces the DP's answer if
faster. The answer at ``slots`` units is the one a table built for the budget gives, so
refinement never returns a slower plan.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InfeasibleBudget
from .chain import Chain
from .rotor import RotorTable, min_peak_schedule
from .schedule import Schedule
from .simulator import make_schedule

__all__ = ["refined_schedule", "HEADROOM", "MAX_CHECKS"]

HEADROOM = 0.05
"""Extra units, as a share of ``slots``, searched above the budget (5% more table)."""

MAX_CHECKS = 3
"""Most plans above the budget costed with the simulator (a binary search over them)."""

_PEAK_TOLERANCE = 1e-9  # as in solver.solve: sizes are summed in another order


def _table_top(unit: float, total: int) -> float:
    """A ``max_budget`` whose table of ``total`` slots has ``unit`` as its unit: exactly
    where a float of the two nearest ``unit * total`` gives it, else within a last-bit
    rounding (then only a size within that of a multiple of the unit rounds differently)."""
    top = unit * total
    for candidate in (top, float(np.nextafter(top, math.inf)), float(np.nextafter(top, 0.0))):
        if candidate / total == unit:
            return candidate
    return top


def refined_schedule(chain: Chain, budget: float, slots: int, *,
                     headroom: float = HEADROOM, checks: int = MAX_CHECKS) -> Schedule:
    """The fastest of Rotor's plans at ``budget`` and of its plans for up to
    ``headroom * slots`` more rounded units whose simulated peak fits ``budget``.

    Exact tables (integer sizes, ``slots >= budget``) round nothing and are answered as
    :meth:`RotorTable.schedule` does.

    Raises:
      InfeasibleBudget: ``budget`` is below the least peak of any persistent schedule.
    """
    unit = budget / slots
    extra = int(math.ceil(slots * headroom))
    if (chain.is_integral and slots >= budget) or extra < 1:
        return RotorTable(chain, budget, slots).schedule(budget)
    top = _table_top(unit, slots + extra)
    table = RotorTable(chain, top, slots + extra)
    if budget < table.min_budget:
        raise InfeasibleBudget(float(budget), table.min_budget, "rotor")

    def query(units: int) -> float:  # a budget the table reads as ``units`` units
        return top if units >= table.capacity else (units + 0.5) * unit

    plan = table.plan(query(slots))
    best = min_peak_schedule(chain) if plan is None else make_schedule(chain, plan, "rotor")
    times = [table.predicted_time(query(units)) for units in range(slots, table.capacity + 1)]
    # the least number of units at which each faster time appears, in increasing units
    levels = [slots + k for k, time in enumerate(times)
              if k and time < times[k - 1] and time < best.time]
    # binary search for the largest level whose plan fits (fitting is nearly monotone)
    low, high = -1, len(levels)
    for _ in range(checks):
        if high - low <= 1:
            break
        middle = (low + high) // 2
        candidate = make_schedule(chain, table.plan(query(levels[middle])), "rotor")
        if candidate.peak <= budget * (1 + _PEAK_TOLERANCE):
            low = middle
            if candidate.time < best.time:
                best = candidate
        else:
            high = middle
    return best
