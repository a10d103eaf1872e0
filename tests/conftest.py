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

import os

# XLA's lowest optimisation level: the tests check JAX programs (values, gradients, jaxprs,
# Lowered.cost_analysis), not XLA's optimised code, and compiling takes about a quarter less
# CPU time (test_flax_nnx.py: 18.5 s instead of 24.6 s). Set before JAX starts a backend;
# an optimisation level in the caller's XLA_FLAGS wins.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()

import jax  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

import tiers  # noqa: E402

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


@pytest.fixture(autouse=True)
def _fresh_profile_cache():
    """Each test profiles afresh: some patch JAX or the cost model, which the module-wide
    profile cache (jaxremat.sequence.profile.profile_cache) would otherwise hide."""
    from jaxremat.sequence.profile import profile_cache

    profile_cache().clear()
    yield
