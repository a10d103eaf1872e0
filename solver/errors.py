"""Errors raised by the solvers, and the argument checks that raise them."""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["InfeasibleBudget", "format_bytes", "check_real", "float_array"]


def float_array(values: object, description: str) -> np.ndarray:
    """``values`` as a float64 array, or ``ValueError("<description> must be a sequence of
    real numbers, got ...")`` instead of numpy's conversion error."""
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{description} must be a sequence of real numbers, got {values!r}.") from None


def check_real(value: object, name: str, *, minimum: float = 0.0, strict: bool = False,
               below: float | None = None, finite: bool = True, hint: str = "") -> float:
    """``value`` as a float, if it is a real number (not a bool) within the stated range.

    The range is ``value >= minimum`` (``> minimum`` with ``strict``), ``value < below``
    when given, and finite unless ``finite=False`` (then ``inf`` passes, NaN never does).

    Raises:
      ValueError: naming ``name``, the range and the value, followed by ``hint`` (what to
        pass instead).
    """
    number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
    ok = (
        number is not None
        and not math.isnan(number)
        and (math.isfinite(number) or not finite)
        and (number > minimum if strict else number >= minimum)
        and (below is None or number < below)
    )
    if not ok:
        bounds = f"{'>' if strict else '>='} {minimum:g}" + (f" and < {below:g}" if below is not None else "")
        kind = "a finite number" if finite else "a number"
        raise ValueError(f"{name} must be {kind} {bounds}, got {value!r}." + (f" {hint}" if hint else ""))
    return number


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
      exact: whether ``min_budget`` is proven least.

    ``hint`` (optional) is appended to the message: a cause the caller knows of, such as an
    empty batch, and what to do about it. ``other_methods=False`` drops the message's advice
    to choose another method, for callers that offer none (``remat_graph``).
    """

    def __init__(self, budget: float, min_budget: float, method: str, units: str = "",
                 exact: bool = True, hint: str = "", other_methods: bool = True) -> None:
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
            f"{'is' if exact else 'among those tried is'} {need}. Raise the budget to at least that"
            + (", or choose another method." if other_methods else ".")
            + (f" {hint}" if hint else "")
        )
