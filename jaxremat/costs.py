"""XLA's cost analysis of a function before optimisation, on any backend.

``jax.jit(fn).lower(*args).cost_analysis()`` counts the flops and bytes of the program as
JAX wrote it, recomputation included (XLA has not yet had the chance to undo or fuse
anything). The CPU backend answers it; the GPU backend does not (JAX 0.11 on an H100 returns
``None``), which would make every static cost zero there. So when the default backend gives
no answer, the same function is lowered for the CPU, whose HLO cost analysis counts the same
operations: the numbers are properties of the program, not of the device.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

__all__ = ["lowered_costs"]


def _as_dict(analysis: Any) -> dict[str, float] | None:
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per computation
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    return {key: float(value) for key, value in analysis.items() if isinstance(value, (int, float))}


def _abstract(leaf: Any) -> Any:
    """Shape and dtype only: arrays committed to a GPU must not pin the CPU lowering."""
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return leaf


def _on_cpu(fn: Callable, args: tuple) -> Any:
    traced = jax.jit(fn).trace(*jax.tree.map(_abstract, args))
    return traced.lower(lowering_platforms=("cpu",)).cost_analysis()


def lowered_costs(fn: Callable, *args: Any) -> dict[str, float]:
    """``cost_analysis()`` of ``jax.jit(fn)`` lowered on ``args`` (arrays or
    ``jax.ShapeDtypeStruct``), before XLA optimises: a dict with at least ``"flops"`` (and
    ``"bytes accessed"`` where XLA reports it).

    Lowered for the default backend; where that backend has no pre-compilation cost
    analysis (GPU), lowered for the CPU instead (module docstring).

    Raises:
      RuntimeError: neither lowering gives a cost analysis (the message says which JAX).
    """
    found = _as_dict(jax.jit(fn).lower(*args).cost_analysis())
    if found is None:
        try:
            found = _as_dict(_on_cpu(fn, args))
        except (TypeError, ValueError, RuntimeError):  # no CPU lowering in this JAX
            found = None
    if found is None:
        raise RuntimeError(
            f"XLA gives no cost analysis for this function on backend "
            f"{jax.default_backend()!r}, nor when lowered for the CPU (JAX {jax.__version__}). "
            "Use costs='measured' to time the layers on the device instead."
        )
    return found
