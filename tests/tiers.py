"""The two test tiers, and hypothesis sweeps sized by tier.

``python -m pytest`` runs the default tier: every test not marked ``slow``, each hypothesis
sweep at its quick size. ``python -m pytest -m slow`` runs the slow tier: the examples and
benchmarks end to end, subprocess runs, large instances, and every sweep again at its full
size. CI runs both, so every check runs in one of them (tests/conftest.py picks the tier).

Not a test module: tests import it (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from typing import Callable

import pytest
from hypothesis import settings

SLOW = False  # set by tests/conftest.py before the test modules are imported


def sweep(full: int, quick: int, **kwargs) -> Callable:
    """Hypothesis settings for a sweep of ``full`` examples in the slow tier and ``quick``
    in the default tier (no deadline: the examples' times vary with the machine's load).

    The test is marked ``sweep``; in the slow tier conftest marks it ``slow`` as well, so
    that ``-m slow`` runs it at full size.
    """
    if not 0 < quick <= full:
        raise ValueError(f"sweep needs 0 < quick <= full, got quick={quick}, full={full}")

    def decorate(test: Callable) -> Callable:
        sized = settings(max_examples=full if SLOW else quick, deadline=None, **kwargs)(test)
        return pytest.mark.sweep(sized)

    return decorate
