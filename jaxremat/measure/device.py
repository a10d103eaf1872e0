"""How much activation memory a training step may use on a device.

A training step holds, besides activations: the parameters, their gradients (same shapes),
and the optimizer state. What the device offers beyond that is the activation budget to hand
to :func:`jaxremat.remat_sequence` or the Flax wrappers:

    budget = fraction * bytes_limit - (params + grads + optimizer state)

``bytes_limit`` is what the XLA allocator may use on the device (``Device.memory_stats()``),
and ``fraction`` leaves head room for XLA's own workspace and fragmentation.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Mapping

import jax
import numpy as np

from solver.errors import format_bytes

__all__ = ["budget_from_device", "tree_device_bytes"]


def _leaf_device_bytes(leaf: Any) -> int:
    """Bytes one array leaf occupies on one device (a shard's size when it is sharded)."""
    shape = getattr(leaf, "shape", None)
    dtype = getattr(leaf, "dtype", None)
    if shape is None or dtype is None:
        return 0
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:  # extended dtypes, e.g. typed PRNG keys
        itemsize = getattr(dtype, "itemsize", 0) or 0
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None and hasattr(sharding, "shard_shape"):
        shape = sharding.shard_shape(tuple(shape))
    return int(math.prod(shape)) * int(itemsize)


def _as_tree(value: Any) -> Any:
    """The arrays of ``value``: NNX modules and optimizers are turned into their state."""
    try:
        from flax import nnx  # optional: only for NNX objects
    except ImportError:  # pragma: no cover - flax is a dependency
        return value
    if isinstance(value, nnx.Module) or isinstance(value, nnx.Variable):
        return nnx.state(value)
    return value


def tree_device_bytes(tree: Any, *, floating_only: bool = False) -> int:
    """Bytes that the array leaves of ``tree`` occupy on one device.

    Sharded arrays count one shard (their per-device size); replicated ones their full size.
    NNX modules and ``nnx.Optimizer`` objects are measured through ``nnx.state``.
    With ``floating_only``, only inexact (float / complex) leaves count: those are the ones
    that get gradients.
    """
    total = 0
    for leaf in jax.tree.leaves(_as_tree(tree)):
        if floating_only:
            dtype = getattr(leaf, "dtype", None)
            if dtype is None or not jax.numpy.issubdtype(dtype, jax.numpy.inexact):
                continue
        total += _leaf_device_bytes(leaf)
    return total


def _gradient_bytes(params: Any) -> int:
    """Bytes of the gradients of ``params``: its ``nnx.Param`` state for an NNX module (not
    batch statistics or RNG state), otherwise every floating-point leaf."""
    try:
        from flax import nnx
    except ImportError:  # pragma: no cover
        nnx = None
    if nnx is not None and isinstance(params, nnx.Module):
        return tree_device_bytes(nnx.state(params, nnx.Param))
    return tree_device_bytes(params, floating_only=True)


def budget_from_device(
    params: Any,
    opt_state: Any = None,
    *,
    fraction: float = 0.9,
    device: jax.Device | None = None,
    memory_stats: Mapping[str, Any] | None = None,
) -> int:
    """The activation budget (bytes) left on a device by a training step's other memory.

    Computes ``fraction * bytes_limit - (params + grads + opt_state)``: the parameters, one
    gradient per floating-point parameter leaf (per ``nnx.Param`` for an NNX module), and the
    optimizer state, each measured per device (a sharded array counts its shard).

    Args:
      params: the parameters (any pytree of arrays or ``jax.ShapeDtypeStruct``; an NNX
        module, whose whole state is counted).
      opt_state: the optimizer state: an optax state pytree, or an ``nnx.Optimizer`` (its
        state is counted; in Flax 0.12 it does not hold the model, pass that as ``params``).
      fraction: share of the device's ``bytes_limit`` the step may use, in (0, 1].
      device: the device; defaults to ``jax.devices()[0]``.
      memory_stats: the device's ``memory_stats()`` dict, to use instead of asking the
        device (for tests, or to plan for a device you are not on).

    Returns:
      The budget in bytes, an ``int > 0``.

    Raises:
      ValueError: the backend reports no memory limit (CPU: ``memory_stats()`` is None), so
        an explicit budget is needed; or the model and optimizer alone exceed the device.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be a number in (0, 1], such as 0.9; got {fraction!r}.")
    if memory_stats is None:
        device = jax.devices()[0] if device is None else device
        memory_stats = device.memory_stats()
        where = f"device {device} (platform {device.platform!r})"
    else:
        where = "the given memory_stats"
    limit = (memory_stats or {}).get("bytes_limit")
    if not limit:
        raise ValueError(
            f"{where} reports no memory limit (memory_stats() gives no 'bytes_limit'; on CPU "
            "it is None), so the budget cannot be derived from the device. Pass an explicit "
            "budget instead, e.g. budget='2GiB' or budget=2_000_000_000."
        )
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not 0 < limit < math.inf:
        raise ValueError(
            f"{where} reports bytes_limit={limit!r}, not a positive number of bytes. Pass an "
            "explicit budget instead, e.g. budget='2GiB'."
        )
    param_bytes = tree_device_bytes(params) if params is not None else 0
    grad_bytes = _gradient_bytes(params) if params is not None else 0
    opt_bytes = tree_device_bytes(opt_state) if opt_state is not None else 0
    fixed = param_bytes + grad_bytes + opt_bytes
    usable = int(fraction * float(limit))
    budget = usable - fixed
    if budget <= 0:
        raise ValueError(
            f"The model and optimizer alone exceed the device: parameters "
            f"{format_bytes(param_bytes)} + gradients {format_bytes(grad_bytes)} + optimizer "
            f"state {format_bytes(opt_bytes)} = {format_bytes(fixed)}, but only "
            f"{format_bytes(usable)} ({fraction:.0%} of bytes_limit {format_bytes(limit)}) is "
            "usable. Shard the parameters/optimizer state over more devices, use a smaller "
            "model or a lighter optimizer, or raise `fraction`."
        )
    return int(budget)
