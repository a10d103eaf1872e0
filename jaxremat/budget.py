"""Memory budgets: parse what a user writes ("1.5GiB", 800e6, "512 KiB") into bytes.

Units (case-insensitive; a trailing ``b``/``B`` always means *bytes*, never bits):

==========================  ======================================
``B``, ``byte``, ``bytes``  1 (the default when no unit is given)
``KiB`` ``MiB`` ``GiB``     1024, 1024**2, 1024**3 (IEC binary)
``TiB``                     1024**4
``Ki`` ``Mi`` ``Gi`` ``Ti``  the same binary units without the ``B``
``K`` ``M`` ``G`` ``T``     binary too: 1024**k (as ``docker --memory 2g`` and
                            ``java -Xmx2G`` read them, and as :func:`format_bytes`
                            prints)
``KB`` ``MB`` ``GB`` ``TB``  1000, 1000**2, 1000**3, 1000**4 (SI decimal)
==========================  ======================================

The number may be an integer, a decimal or use an exponent (``"2e9"``, ``"1.5GiB"``) and may
group digits with underscores (``"1_000_000"``); whitespace between number and unit is
allowed. The result is rounded down to whole bytes and must be at least one byte.

Where a sequence is known (``remat_sequence``, ``remat_graph``, the Flax wrappers), a budget
may also be a share of the memory the sequence needs without rematerialization: ``"40%"``
(:func:`resolve_budget`). A share above 100% (``"150%"``) is accepted: more than the plain
function needs, so nothing is recomputed, and the printed plan says so. A share of 0% or
less, or one that is not a number (``"lots%"``), is an error.

:func:`format_bytes` (re-exported from :mod:`solver.errors`) goes the other way.
"""

from __future__ import annotations

import decimal
import fractions
import math
import numbers
import re
from typing import Sequence

import numpy as np

from solver.errors import format_bytes

__all__ = ["parse_budget", "resolve_budget", "check_budget", "format_bytes", "is_share",
           "empty_input_hint"]

_MAX_EXPONENT = 60  # keeps "1e999999999" from building a gigantic integer
_BINARY = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_DECIMAL = {"k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_MAX_BYTES = 10**_MAX_EXPONENT * _BINARY["t"]  # float-safe; far beyond any device

_EXAMPLES = (
    "valid budgets look like 2_000_000_000 (bytes), 1.5e9, '1.5GiB', '800MB', '512 KiB', "
    "'2e9', '1_000_000' or '4G' (binary units KiB/MiB/GiB/TiB and K/M/G/T = 1024**k; "
    "decimal units KB/MB/GB/TB = 1000**k)"
)

# A number (digits may be grouped by single underscores) then an optional unit.
_NUMBER = r"(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:e[+-]?\d+)?"
_PATTERN = re.compile(
    rf"^\s*(?P<sign>[+-]?)(?P<number>{_NUMBER})\s*(?P<unit>[a-z]*)\s*$", re.IGNORECASE
)


def _unit_multiplier(unit: str) -> int | None:
    """Bytes per ``unit`` (already lower-cased), or ``None`` if the unit is unknown."""
    if unit in ("", "b", "byte", "bytes"):
        return 1
    prefix, rest = unit[0], unit[1:]
    if prefix not in _BINARY:
        return None
    if rest in ("", "i", "ib"):
        return _BINARY[prefix]
    if rest == "b":
        return _DECIMAL[prefix]
    return None


def _checked(value: fractions.Fraction, shown: object) -> int:
    """Round ``value`` down to bytes; reject anything below one byte or absurdly large."""
    if value > _MAX_BYTES:
        raise ValueError(
            f"Memory budget {shown!r} is out of any sensible range (more than "
            f"1e{_MAX_EXPONENT} of the largest unit); {_EXAMPLES}."
        )
    result = math.floor(value)
    if result < 1:
        if value > 0:
            reason = "is less than one byte"
        elif value == 0:
            reason = "is zero"
        else:
            reason = "is negative"
        raise ValueError(f"Memory budget {shown!r} {reason}; {_EXAMPLES}.")
    return int(result)


def parse_budget(budget: int | float | str) -> int:
    """The memory budget ``budget`` in bytes, rounded down.

    Args:
      budget: a positive number of bytes (``int``, ``float`` or a numpy scalar; floats are
        rounded down) or a string such as ``"1.5GiB"``, ``"800MB"``, ``"512 KiB"``,
        ``"2e9"`` or ``"1_000_000"``; see the module docstring for the units.

    Returns:
      The budget as a Python ``int`` of at least one byte.

    Raises:
      TypeError: ``budget`` is a bool or not a number or string.
      ValueError: the string cannot be parsed, or the value is zero, negative, below one
        byte, NaN or infinite. The message repeats the bad value and shows valid examples.
    """
    if isinstance(budget, (bool, np.bool_)):
        raise TypeError(f"Memory budget {budget!r} is a bool, not a size; {_EXAMPLES}.")
    if isinstance(budget, numbers.Integral):
        return _checked(fractions.Fraction(int(budget)), budget)
    if isinstance(budget, numbers.Real):
        value = float(budget)
        if not math.isfinite(value):
            raise ValueError(f"Memory budget {budget!r} is not finite; {_EXAMPLES}.")
        return _checked(fractions.Fraction(value), budget)
    if isinstance(budget, str):
        match = _PATTERN.match(budget)
        if match is None:
            raise ValueError(f"Cannot parse the memory budget {budget!r}; {_EXAMPLES}.")
        multiplier = _unit_multiplier(match["unit"].lower())
        if multiplier is None:
            raise ValueError(
                f"Unknown unit {match['unit']!r} in the memory budget {budget!r}; {_EXAMPLES}."
            )
        digits = decimal.Decimal(match["sign"] + match["number"].replace("_", ""))
        if digits and not -_MAX_EXPONENT <= digits.adjusted() <= _MAX_EXPONENT:
            raise ValueError(
                f"Memory budget {budget!r} is out of any sensible range (more than "
                f"1e{_MAX_EXPONENT} or less than 1e-{_MAX_EXPONENT}); {_EXAMPLES}."
            )
        return _checked(fractions.Fraction(digits) * multiplier, budget)
    raise TypeError(
        f"A memory budget must be a number of bytes or a string, got {budget!r} of type "
        f"{type(budget).__name__}; {_EXAMPLES}."
    )


def _share(budget: object) -> float | None:
    """``0.4`` for ``"40%"``; ``None`` when ``budget`` is not a percentage string."""
    if not is_share(budget):
        return None
    try:
        share = float(budget.strip()[:-1]) / 100.0
    except ValueError:
        share = math.nan
    if not 0.0 < share < math.inf:
        raise ValueError(
            f"Memory budget {budget!r}: a relative budget is a positive percentage of the "
            f"memory needed without rematerialization, e.g. '40%'; or give bytes: {_EXAMPLES}."
        )
    return share


def is_share(budget: object) -> bool:
    """Whether ``budget`` is a share of the no-remat memory such as ``"40%"``."""
    return isinstance(budget, str) and budget.strip().endswith("%")


def empty_input_hint(budget: object, shapes: Sequence[Sequence[int]]) -> str:
    """What to tell a user whose share budget (``"40%"``) did not fit because the input is
    empty (a zero-size batch, one of ``shapes`` has a 0 dimension); ``""`` otherwise.

    On an empty batch the no-remat memory is only what does not grow with the batch
    (scalars, constants), so a share of it is a few bytes that no plan fits."""
    empty = [tuple(shape) for shape in shapes if 0 in tuple(shape)]
    if not (is_share(budget) and empty):
        return ""
    return (
        f"The input is empty (an array of shape {empty[0]}: a batch of zero examples), so "
        f"{budget!r} is a share of almost nothing: on an empty batch the no-remat memory is "
        "only what does not grow with the batch. Pass a batch with at least one example, or "
        "give the budget in bytes (e.g. '512MiB')."
    )


def check_budget(budget: object) -> int | str:
    """Validate ``budget`` before any profiling: return it as bytes, or unchanged if it is a
    percentage such as ``"40%"``; raise the error :func:`resolve_budget` would raise."""
    if budget is None:
        raise ValueError(
            "Got no budget: pass budget=... (bytes, a string such as '512MiB', or a share "
            "of the no-remat memory such as '40%'), e.g. from "
            "jaxremat.budget_from_device(params, opt_state)."
        )
    if _share(budget) is None:
        return parse_budget(budget)  # type: ignore[arg-type]
    return budget  # type: ignore[return-value]


def resolve_budget(budget: int | float | str, no_remat_bytes: float) -> int:
    """The budget in bytes: :func:`parse_budget`'s, or for ``"40%"`` that share of
    ``no_remat_bytes`` (the predicted peak of the sequence storing every tape), rounded down,
    at least one byte. A share above 100% gives more than ``no_remat_bytes``: the plan then
    stores everything (:attr:`jaxremat.Plan.exceeds_no_remat`)."""
    check_budget(budget)
    share = _share(budget)
    if share is None:
        return parse_budget(budget)
    if isinstance(no_remat_bytes, bool) or not isinstance(no_remat_bytes, numbers.Real) or not (
            0 < no_remat_bytes < math.inf):
        raise ValueError(
            f"A share budget such as {budget!r} needs the no-remat memory as a positive finite "
            f"number of bytes, got {no_remat_bytes!r}."
        )
    return max(1, int(share * no_remat_bytes))
