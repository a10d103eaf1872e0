"""Test-wide settings.

Matrix products in float32 at full precision: on a GPU, JAX's default lets XLA use TF32
(about 1e-3 relative error), and a rematerialized step fuses its products differently
from the plain one, so gradients would differ by more than the tests' float32 tolerances
for reasons that have nothing to do with the schedule (seen on an H100, JAX 0.11). On CPU
this changes nothing.

Two tiers (tests/tiers.py): pyproject's ``addopts`` deselects ``slow`` by default; a mark
expression that names ``slow`` other than as ``not slow`` (``-m slow``, ``-m "slow or
sweep"``) selects the slow tier: the hypothesis profile ``slow`` is loaded, and the sweeps
run at full size and are marked ``slow``.
"""

import jax
import pytest
from hypothesis import settings

import tiers

jax.config.update("jax_default_matmul_precision", "highest")

settings.register_profile("default", deadline=None)
settings.register_profile("slow", deadline=None, print_blob=True)


def _slow_tier(config) -> bool:
    """Whether the mark expression selects the slow tier (names ``slow``, not negated)."""
    words = (config.option.markexpr or "").replace("(", " ").replace(")", " ").split()
    return any(w == "slow" and (i == 0 or words[i - 1] != "not") for i, w in enumerate(words))


def pytest_configure(config):
    tiers.SLOW = _slow_tier(config)
    settings.load_profile("slow" if tiers.SLOW else "default")


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    if tiers.SLOW:
        for item in items:
            if item.get_closest_marker("sweep"):
                item.add_marker("slow")
