"""Measured layer costs (``costs="measured"``): wall time of each layer on the device.

Each layer's forward (``jax.jit(layer)``), its tape-only forward
(:func:`jaxremat.measure.trace.tape_forward`) and its backward (the jitted pullback on the
residuals) are compiled and run on the default device on synthetic inputs of the right
shapes: a few warm-up runs, then the median of ``repeats`` timed runs, each ended by
``jax.block_until_ready``. Floating inputs are small normal values (no NaN/denormal slow
paths), integers and booleans zeros, PRNG keys valid keys.

On a GPU/TPU the transients also come from the compiled programs:
``Compiled.memory_analysis().temp_size_in_bytes`` of the vjp forward and of the pullback.
On CPU XLA undoes remat and its temporaries say nothing about the schedule (ALGORITHMS.md
section 7), so there the static program-order transients are kept. (``Device.memory_stats()``
reports a process-wide peak that cannot be reset per layer, so it is not used here; the
benchmark reads it around a whole training step.)

Timing on CPU is allowed (it ranks layers sensibly) but it is noisy and slow for big
models; on CPU ``costs="static"`` is the default for a reason.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from .trace import tape_forward

__all__ = ["Measured", "measure_layer", "synthetic_inputs", "median_time"]


@dataclasses.dataclass(frozen=True)
class Measured:
    """Measured costs of one layer: seconds, and transient bytes when the device reports
    meaningful ones (``None`` on CPU)."""

    fwd_time: float
    bwd_time: float
    fwd_tmp: int | None
    bwd_tmp: int | None
    fwd_tape_time: float = 0.0


def _synthetic_leaf(leaf: jax.ShapeDtypeStruct, key: jax.Array) -> jax.Array:
    dtype = leaf.dtype
    if dtype == jax.dtypes.float0:
        return np.zeros(leaf.shape, dtype=jax.dtypes.float0)
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        count = int(np.prod(leaf.shape, dtype=np.int64))
        impl = getattr(dtype, "_impl", None)  # the key implementation of this key dtype
        base = jax.random.key(0, impl=impl) if impl is not None else jax.random.key(0)
        return jax.random.split(base, max(count, 1))[:count].reshape(leaf.shape)
    if jax.dtypes.issubdtype(dtype, np.inexact):
        return (0.1 * jax.random.normal(key, leaf.shape, jnp.float32)).astype(dtype)
    return jnp.zeros(leaf.shape, dtype)


def synthetic_inputs(tree: Any, seed: int = 0) -> Any:
    """Concrete arrays of the shapes and dtypes of a pytree of ``ShapeDtypeStruct``."""
    leaves, treedef = jax.tree.flatten(tree)
    with jax.ensure_compile_time_eval():  # run now, even while an outer jit traces
        keys = jax.random.split(jax.random.key(seed), max(len(leaves), 1))
        made = [_synthetic_leaf(leaf, keys[i]) for i, leaf in enumerate(leaves)]
    return jax.tree.unflatten(treedef, made)


def median_time(compiled: Callable[..., Any], args: tuple, *, repeats: int = 7, warmup: int = 2) -> float:
    """Median wall time in seconds of ``compiled(*args)`` over ``repeats`` runs after
    ``warmup`` runs, each waited for with ``jax.block_until_ready``."""
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return float(statistics.median(times))


def _temp_bytes(compiled: Any) -> int | None:
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    return None if stats is None else int(getattr(stats, "temp_size_in_bytes", 0))


def measure_layer(layer: Callable, p: Any, x: Any, traced: Any, *, repeats: int = 7) -> Measured:
    """Time one layer's forward and backward (``traced``: :class:`jaxremat.measure.trace.TracedLayer`)."""
    p_in, x_in = synthetic_inputs((p, x), seed=1)
    res_in, ct_in = synthetic_inputs((list(traced.residuals), traced.cotangent), seed=2)
    with jax.ensure_compile_time_eval():
        fwd = jax.jit(layer).lower(p_in, x_in).compile()
        bwd = jax.jit(traced.pullback).lower(res_in, ct_in).compile()
        fwd_time = median_time(fwd, (p_in, x_in), repeats=repeats)
        tape = jax.jit(tape_forward(traced)).lower(p_in, x_in).compile()
        tape_time = median_time(tape, (p_in, x_in), repeats=repeats)
        bwd_time = median_time(bwd, (res_in, ct_in), repeats=repeats)
        fwd_tmp = bwd_tmp = None
        if jax.devices()[0].platform != "cpu":
            vjp_fwd = jax.jit(lambda p, x: jax.vjp(layer, p, x)).lower(p_in, x_in).compile()
            fwd_tmp, bwd_tmp = _temp_bytes(vjp_fwd), _temp_bytes(bwd)
            if fwd_tmp is None or bwd_tmp is None:
                fwd_tmp = bwd_tmp = None
    return Measured(fwd_time, bwd_time, fwd_tmp, bwd_tmp, tape_time)
