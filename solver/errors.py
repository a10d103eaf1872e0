"""Errors raised by the solvers."""

from __future__ import annotations

__all__ = ["InfeasibleBudget", "format_bytes"]


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``: sizes in binary units for messages and tables."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class InfeasibleBudget(ValueError):
    """No schedule of the requested method fits the budget.

    Attributes:
      budget: the budget that was asked for.
      min_budget: the smallest budget for which the method finds a schedule (with
        ``exact=False``: the smallest one known to work, which a search did not prove least).
      method: the solver method.
    """

    def __init__(self, budget: float, min_budget: float, method: str, units: str = "",
                 exact: bool = True) -> None:
        self.budget = budget
        self.min_budget = min_budget
        self.method = method
        self.exact = exact
        if units == "bytes":
            need = f"{min_budget:.0f} bytes ({format_bytes(min_budget)})"
            have = f"{budget:.0f} bytes ({format_bytes(budget)})"
        else:
            need, have = f"{min_budget:.6g}", f"{budget:.6g}"
        super().__init__(
            f"No {method!r} schedule fits a budget of {have}; the smallest budget that works "
            f"{'is' if exact else 'among those tried is'} {need}. Raise the budget to at least that, or choose another method."
        )
