"""Test-wide settings.

Matrix products in float32 at full precision: on a GPU, JAX's default lets XLA use TF32
(about 1e-3 relative error), and a rematerialized step fuses its products differently
from the plain one, so gradients would differ by more than the tests' float32 tolerances
for reasons that have nothing to do with the schedule (seen on an H100, JAX 0.11). On CPU
this changes nothing.
"""

import jax

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long tests (deselect with -m 'not slow')")


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_profile_cache():
    """Each test profiles afresh: some patch JAX or the cost model, which the module-wide
    profile cache (jaxremat.profile.profile_cache) would otherwise hide."""
    from jaxremat.profile import profile_cache

    profile_cache().clear()
    yield
