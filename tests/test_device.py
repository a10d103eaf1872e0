"""Tests of jaxremat.measure.device.budget_from_device (arithmetic with injected memory stats)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxremat.measure.device import budget_from_device, tree_device_bytes


def test_arithmetic_params_grads_and_adam_state():
    params = {"w": jnp.zeros((100, 50), jnp.float32), "b": jnp.zeros((50,), jnp.bfloat16)}
    param_bytes = 100 * 50 * 4 + 50 * 2
    opt_state = optax.adam(1e-3).init(params)
    # adam: mu and nu like params, plus an int32 count.
    opt_bytes = 2 * param_bytes + 4
    assert tree_device_bytes(opt_state) == opt_bytes
    limit = 10**6
    got = budget_from_device(params, opt_state, fraction=0.8, memory_stats={"bytes_limit": limit})
    assert got == int(0.8 * limit) - (param_bytes + param_bytes + opt_bytes)


def test_integer_leaves_get_no_gradient():
    params = {"w": np.zeros((10,), np.float32), "steps": np.zeros((10,), np.int32)}
    got = budget_from_device(params, None, fraction=1.0, memory_stats={"bytes_limit": 1000})
    assert got == 1000 - (80 + 40)


def test_abstract_shapes_are_enough():
    params = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    got = budget_from_device(params, None, memory_stats={"bytes_limit": 2**20})
    assert got == int(0.9 * 2**20) - 2 * 256 * 256 * 4


def test_nnx_model_and_optimizer():
    model = nnx.Sequential(nnx.Linear(8, 16, rngs=nnx.Rngs(0)), nnx.BatchNorm(16, rngs=nnx.Rngs(0)))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)
    linear = 8 * 16 * 4 + 16 * 4
    bn_params = 2 * 16 * 4  # scale, bias
    bn_stats = 2 * 16 * 4  # mean, var: state but no gradient
    momentum = linear + bn_params
    step = 4  # optimizer step counter (uint32)
    got = budget_from_device(model, optimizer, fraction=1.0, memory_stats={"bytes_limit": 10**5})
    fixed = (linear + bn_params + bn_stats) + (linear + bn_params) + momentum + step
    assert got == 10**5 - fixed


def test_cpu_reports_no_limit_and_asks_for_a_budget():
    cpu = jax.devices("cpu")[0]
    assert cpu.memory_stats() is None
    with pytest.raises(ValueError, match="explicit budget"):
        budget_from_device({"w": jnp.zeros(3)}, device=cpu)
    with pytest.raises(ValueError, match="no memory limit"):
        budget_from_device({"w": jnp.zeros(3)}, memory_stats={"bytes_in_use": 5})


def test_model_larger_than_device():
    params = {"w": jnp.zeros((1000,), jnp.float32)}
    with pytest.raises(ValueError, match="exceed the device") as info:
        budget_from_device(params, optax.adam(1e-3).init(params), memory_stats={"bytes_limit": 8000})
    assert "KiB" in str(info.value)  # sizes in human units


def test_bad_fraction():
    with pytest.raises(ValueError, match="fraction"):
        budget_from_device({}, fraction=1.5, memory_stats={"bytes_limit": 100})


def test_exported_at_top_level():
    import jaxremat

    assert jaxremat.budget_from_device is budget_from_device
