"""Host offload: whether a device can offload, how fast, and what an offloaded tape costs.

A checkpoint policy such as ``save_and_offload_only_these_names(...,
offload_dst="pinned_host")`` keeps some residuals of a layer in host memory: they leave the
device (the meter, :mod:`jaxremat.measure.meter`, counts device memory only) and are copied
to the host in the forward and back to the device before the backward reads them.

Cost model, after Beaumont, Eyraud-Dubois and Shilova, "Efficient Combination of
Rematerialization and Offloading for Training DNNs" (NeurIPS 2021): transfers run on their
own channel, concurrently with computation, and an operation's time is the larger of its
compute time and the transfers it must wait for. Per layer, with ``T = host bytes /
bandwidth`` (the same bandwidth both ways):

* the offload of the layer's residuals overlaps its forward: ``fwd = max(fwd, T)`` (and
  the same for the tape-only forward, which offloads the same residuals);
* the prefetch that brings them back overlaps the backward: ``bwd = max(bwd, T)``.

That is one layer of compute to hide each transfer behind: a conservative reading of the
paper's model, which lets a transfer overlap any later (offload) or earlier (prefetch)
operation. It fits the multi-option chain as it is (per-option ``fwd_time``,
``fwd_tape_time``, ``bwd_time`` and a device ``xbar_size`` without the offloaded bytes), so
the dynamic program is unchanged.

Under ``costs="measured"`` the timed forward and backward already hold whatever part of
the transfer XLA did not overlap; taking the maximum with ``T`` does not count it twice.
The bandwidth is measured once per device under ``costs="measured"`` (a timed
``jax.device_put`` of a :data:`PROBE_BYTES` array to the device's ``pinned_host`` memory,
best of a few runs, cached), and is the nominal :data:`NOMINAL_HOST_BANDWIDTH` under
``costs="static"`` or ``"flops"``. On CPU both are models: host and "device" are the same
memory there.

Measured on one H100 with JAX 0.11.2 (``benchmarks/offload.py``, ``benchmarks/RESULTS.md``,
2026-11-27): 36.8 GB/s device to ``pinned_host``; a GPT stack's plan that offloads
``dots_with_no_batch_dims`` residuals (chosen under an assumed 450 GB/s) compiled to 3.3x the
device temp memory of the same budget's plan without offload, with 176 MiB of host temp and a
2.4x slower step: the device tape this module assumes (offloaded bytes leave the device) is
not what XLA's GPU compiler produced there. Hence the options stay off the default menu.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp

from ..jax_compat import host_memory_kind

__all__ = ["NOMINAL_HOST_BANDWIDTH", "PROBE_BYTES", "host_bandwidth", "offload_key",
           "offload_times", "offload_unavailable"]

NOMINAL_HOST_BANDWIDTH = 25e9
"""Nominal device-host bandwidth of the static cost model, bytes/s: roughly what a PCIe 4.0
x16 link sustains one way (PCIe 5.0 about twice that; NVLink-C2C far more). Only its ratio
to :data:`jaxremat.sequence.layer.PEAK_FLOPS` matters to the solver."""

PROBE_BYTES = 64 << 20
"""Size of the array timed to measure the bandwidth (64 MiB)."""

_MEASURED: dict[tuple[str, int], float] = {}  # (platform, device id) -> bytes/s


def offload_unavailable(device: Any = None) -> str | None:
    """Why offload options cannot run on ``device`` (default ``jax.devices()[0]``), or
    ``None`` when it has a host memory space (:func:`jaxremat.jax_compat.host_memory_kind`)."""
    device = jax.devices()[0] if device is None else device
    if host_memory_kind(device) is not None:
        return None
    return (f"no 'pinned_host' memory on {device.platform} device {device.id} "
            "(Device.addressable_memories()): offload options need a host memory space")


def _measure(device: Any, repeats: int = 3) -> float:
    """Bytes/s of ``jax.device_put`` from ``device`` to its pinned host memory (best run)."""
    host = jax.sharding.SingleDeviceSharding(device, memory_kind=host_memory_kind(device))
    array = jax.device_put(jnp.ones((PROBE_BYTES // 4,), jnp.float32), device)
    jax.block_until_ready(jax.device_put(array, host))  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(jax.device_put(array, host))
        best = min(best, time.perf_counter() - start)
    return PROBE_BYTES / max(best, 1e-9)


def host_bandwidth(costs: str, device: Any = None) -> float:
    """Device-to-host bandwidth in bytes/s for the cost model ``costs``: measured once per
    device and cached under ``"measured"``, :data:`NOMINAL_HOST_BANDWIDTH` otherwise."""
    if costs != "measured":
        return NOMINAL_HOST_BANDWIDTH
    device = jax.devices()[0] if device is None else device
    key = (device.platform, device.id)
    if key not in _MEASURED:
        _MEASURED[key] = _measure(device)
    return _MEASURED[key]


def offload_key(costs: str) -> tuple:
    """What an offload option's profile depends on besides the layer: whether the device can
    offload, and the bandwidth (for caching profiles, :func:`jaxremat.sequence.profile.profile_cache`)."""
    reason = offload_unavailable()
    return (reason,) if reason else (None, host_bandwidth(costs))


def offload_times(fwd_time: float, fwd_tape_time: float, bwd_time: float, host_bytes: int,
                  bandwidth: float) -> tuple[float, float, float, float]:
    """``(fwd_time, fwd_tape_time, bwd_time, transfer)`` of an option that offloads
    ``host_bytes``: each transfer of ``transfer = host_bytes / bandwidth`` seconds overlaps
    the computation it goes with (module docstring)."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive bytes/s, got {bandwidth!r}.")
    transfer = host_bytes / bandwidth
    return (max(fwd_time, transfer), max(fwd_tape_time, transfer), max(bwd_time, transfer),
            transfer)
