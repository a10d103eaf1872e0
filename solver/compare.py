"""Compare every method on one chain over a range of budgets, and print the table.

Used by ``benchmarks/schedules.py`` and by the demo (``python -m jaxremat demo``). The
overhead of a schedule is ``time / no-remat time - 1``: the extra compute that keeping less
memory costs (0% for storing every tape).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from .chain.baselines import baseline_schedule
from .chain.chain import Chain
from .chain.rotor import rotor_min_budget
from .chain.uniform import UNIFORM_PREFIX
from .errors import InfeasibleBudget, check_real, format_bytes
from .solve import METHODS, solve

__all__ = ["ComparisonRow", "budget_range", "compare_methods", "format_table"]


@dataclasses.dataclass(frozen=True)
class ComparisonRow:
    """Every method's time at one budget.

    Attributes:
      budget: the memory budget.
      methods: the methods compared, in column order.
      times: each method's schedule time, ``None`` where it does not fit the budget.
      peaks: each method's schedule peak, ``None`` where it does not fit.
      reference_time: the time of storing every tape (no rematerialization).
      reference_peak: the peak of storing every tape.
      rotor_source: for ``"rotor"``, which solver's schedule :func:`solver.solve` returned
        (it returns a baseline's schedule when that is faster, e.g. when rounding hurts).
    """

    budget: float
    methods: tuple[str, ...]
    times: tuple[float | None, ...]
    peaks: tuple[float | None, ...]
    reference_time: float
    reference_peak: float
    rotor_source: str | None = None

    def time(self, method: str) -> float | None:
        """``method``'s time, ``None`` if it does not fit."""
        return self.times[self.methods.index(method)]

    def overhead(self, method: str) -> float | None:
        """``time / reference_time - 1`` for ``method``, ``None`` if it does not fit."""
        time = self.time(method)
        if time is None:
            return None
        return time / self.reference_time - 1.0 if self.reference_time else 0.0


def budget_range(chain: Chain, count: int = 8) -> np.ndarray:
    """``count`` budgets evenly spaced from Rotor's smallest feasible budget to the peak of
    storing every tape (the largest budget worth asking for)."""
    top = baseline_schedule(chain, "none", math.inf).peak
    low = rotor_min_budget(chain)  # the min_budget of solve's InfeasibleBudget for "rotor"
    return np.linspace(low, max(low, top), count)


def compare_methods(
    chain: Chain,
    budgets: Sequence[float],
    *,
    methods: Sequence[str] = METHODS,
    slots: int = 500,
) -> list[ComparisonRow]:
    """Solve ``chain`` with each of ``methods`` at each budget (``slots`` for Rotor)."""
    reference = baseline_schedule(chain, "none", math.inf)
    rows = []
    budgets = [check_real(budget, "every budget", strict=True,
                          hint="Pass the memory available, in the chain's units.")
               for budget in budgets]
    for budget in budgets:
        times, peaks, source = [], [], None
        for method in methods:
            try:
                schedule = solve(chain, float(budget), method=method, slots=slots)
            except InfeasibleBudget:
                times.append(None)
                peaks.append(None)
                continue
            times.append(schedule.time)
            peaks.append(schedule.peak)
            if method == "rotor":
                source = schedule.method
        rows.append(ComparisonRow(
            budget=float(budget), methods=tuple(methods), times=tuple(times),
            peaks=tuple(peaks), reference_time=reference.time,
            reference_peak=reference.peak, rotor_source=source,
        ))
    return rows


def format_table(rows: Sequence[ComparisonRow], *, units: str = "bytes") -> str:
    """A text table: one line per budget, each method's time overhead in percent.

    ``—`` marks a method that does not fit the budget; ``*`` marks a Rotor cell whose
    schedule came from a baseline (solve returns the fastest of the DP and the baselines;
    the DP, on sizes rounded to budget/slots, can do no better than one), with a footnote
    saying so in words.
    ``units="bytes"`` prints budgets in KiB/MiB/GiB, anything else as plain numbers.
    """
    if not rows:
        return "(no budgets)"
    methods = rows[0].methods
    header = ["budget", "of no-remat peak"] + [f"{m}" for m in methods]
    lines = []
    for row in rows:
        budget = format_bytes(row.budget) if units == "bytes" else f"{row.budget:.6g}"
        cells = [budget, f"{100 * row.budget / row.reference_peak:.1f}%"]
        for method in methods:
            overhead = row.overhead(method)
            cell = "—" if overhead is None else f"{100 * overhead:+.1f}%"
            if method == "rotor" and overhead is not None and row.rotor_source != "rotor":
                cell += "*"
            cells.append(cell)
        lines.append(cells)
    widths = [max(len(r[c]) for r in [header] + lines) for c in range(len(header))]
    render = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [render(header), render(["-" * w for w in widths])] + [render(r) for r in lines]
    if any(r.rotor_source not in (None, "rotor") for r in rows):
        uniform = any((r.rotor_source or "").startswith(UNIFORM_PREFIX) for r in rows)
        out.append("* the dynamic program found nothing better than a baseline here, so rotor "
                   "uses that baseline's schedule (the one with the same overhead in the row)"
                   + (" or a uniform option plan (every layer under the option its source "
                      "names, rotor_source)" if uniform else ""))
    return "\n".join(out)
