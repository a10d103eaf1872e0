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

With per-layer options, a plan found at more units may miss the budget by a few bytes that
a sibling option would give back (a searched policy keeping 0.2% more than
``dots_saveable`` for less recomputation: the table prefers it at every capacity above the
budget, and the rounded sizes reject the plan of ``dots_saveable`` at the budget itself).
:func:`shrink_options` repairs such a plan: it swaps the options of its stored layers for
smaller ones, those costing the least time per byte first, until the plan fits, a knapsack's
greedy order (Dantzig, Operations Research 5(2), 1957) checked with the simulator. A layer
steps down the lower hull of its options' (bytes saved, time added), so one swapped already
may be swapped again for a larger saving (the multiple-choice knapsack's greedy, Sinha and
Zoltners, Operations Research 27(3), 1979): plans over by the sum of many layers' largest
savings are repaired too.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InfeasibleBudget
from .chain import Chain
from .rotor import RotorTable, min_peak_schedule
from .schedule import Layer, Plan, Schedule
from .simulator import make_schedule

__all__ = ["refined_schedule", "shrink_options", "HEADROOM", "MAX_CHECKS"]

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
    if chain.options is not None and high < len(levels):
        # the least capacity whose plan was seen not to fit, or the table's largest
        repaired = shrink_options(chain, table.plan(query(levels[high])), budget)
        if repaired is not None and repaired.time < best.time:
            best = repaired
    return best


def _hull_steps(swaps: list[tuple[float, float, int]]) -> list[tuple[float, float, int]]:
    """The swaps ``(bytes saved, time added, option)`` of one layer on the lower convex hull
    of ``(saved, added)`` from ``(0, 0)`` (the least time for each saving, in increasing
    time per byte from one to the next), as cumulative points in increasing saving."""
    hull: list[tuple[float, float, int]] = []
    for saved, added, other in sorted(swaps, key=lambda s: (s[0], s[1])):
        if hull and saved == hull[-1][0]:
            continue  # the same saving for more time
        while hull and added <= hull[-1][1]:  # saves more for no more time
            hull.pop()
        while hull:
            s0, a0 = (hull[-2][0], hull[-2][1]) if len(hull) > 1 else (0.0, 0.0)
            s1, a1 = hull[-1][0], hull[-1][1]
            # the last point lies on or above the chord from its predecessor to this one
            if (a1 - a0) * (saved - s0) >= (added - a0) * (s1 - s0):
                hull.pop()
            else:
                break
        hull.append((saved, added, other))
    return hull


def shrink_options(chain: Chain, plan: Plan, budget: float, *, checks: int = MAX_CHECKS
                   ) -> Schedule | None:
    """``plan`` with the options of some stored layers (its top-level :class:`Layer` items)
    swapped for options of smaller tapes until its simulated peak fits ``budget``, or None.

    A swap saves what it takes off the layer's tape, held through the later layers'
    backward (the plan's last item: its tape and backward transients, held through its own);
    the swaps that save what the plan exceeds the budget by are chosen as a greedy
    least-time cover, and the ``checks`` cheapest covers are simulated (a tape saved need not
    lie at the peak).
    """
    table = chain.options
    schedule = make_schedule(chain, plan, "rotor")
    over = schedule.peak - budget * (1 + _PEAK_TOLERANCE)
    if table is None or over <= 0:
        return schedule if over <= 0 else None
    times = table.fwd_time + table.bwd_time
    steps, options = [], {}
    for position, item in enumerate(plan):
        if not isinstance(item, Layer):
            continue
        i, k = item.index, item.option
        last = position == len(plan) - 1
        swaps = []
        for other in np.flatnonzero(table.valid[i]):
            # a tape is held through the later layers' backward; the last item's only
            # through its own, with its backward transients
            saved = table.xbar_size[i, k] - table.xbar_size[i, other]
            if last:
                saved += table.bwd_tmp[i, k] - table.bwd_tmp[i, other]
            if saved > 0:
                swaps.append((float(saved), max(times[i, other] - times[i, k], 0.0), int(other)))
        options[position] = swaps
        hull = _hull_steps(swaps)
        for j, (saved, added, other) in enumerate(hull):  # by the step's own time per byte
            s0, a0 = hull[j - 1][:2] if j else (0.0, 0.0)
            steps.append(((added - a0) / (saved - s0), position, other, saved, added))
    # a least-cost cover of ``over`` bytes, greedily (Chvatal, "A greedy heuristic for the
    # set-covering problem", Math. Oper. Res. 4(3), 1979): the steps along each layer's
    # hull in increasing cost per byte, a layer's later step replacing its earlier swap
    # (Sinha and Zoltners' greedy for the multiple-choice knapsack, Oper. Res. 27(3), 1979),
    # each step that covers the rest at once a candidate end
    covers, taken, cost, rest = [], {}, 0.0, over
    for _, position, other, saved, added in sorted(steps):
        before = taken.get(position, (None, 0.0, 0.0))  # (option, saved, added) so far
        saved, added = saved - before[1], added - before[2]  # from this layer's swap so far
        if saved <= 0:
            continue
        if saved >= rest:  # the cheapest swap of this layer that covers the rest
            added, other = min((a, o) for s, a, o in options[position] if s - before[1] >= rest)
            covers.append((cost + added - before[2],
                           {**{j: o for j, (o, _, _) in taken.items()}, position: other}))
            continue
        taken[position] = (other, before[1] + saved, before[2] + added)
        cost, rest = cost + added, rest - saved
    for _, swapped in sorted(covers, key=lambda c: c[0])[:checks]:
        items = tuple(Layer(item.index, swapped[j]) if j in swapped else item
                      for j, item in enumerate(plan))
        candidate = make_schedule(chain, items, "rotor")
        if candidate.peak <= budget * (1 + _PEAK_TOLERANCE):
            return candidate
    return None
