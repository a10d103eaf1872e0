"""The measured numbers of one layer: its sizes, transients, flops and times.

:func:`layer_costs` measures one traced layer (its ``jax.vjp``, :mod:`jaxremat.measure.trace`)
the way :mod:`jaxremat.sequence.profile` describes; :class:`LayerProfile` and
:class:`OptionProfile` hold what it found, :class:`Profile` a whole sequence's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from solver import Chain
from solver.chain.options import full_forward_tmp

from jax.extend.core import ClosedJaxpr

from ..measure.trace import TracedLayer, plain_forward_tmp, tape_forward, tape_jaxpr, transients
from .calibration import FORWARD, CostMeter
from ..trees import tree_bytes

PEAK_FLOPS = 50e12
"""Nominal peak arithmetic rate of the static cost model, flop/s (a current datacenter GPU
in 16-bit precision sustains roughly this order). Only ratios matter to the solver."""

PEAK_BANDWIDTH = 1.5e12
"""Nominal memory bandwidth of the static cost model, bytes/s."""

COSTS = ("static", "flops", "measured")


def roofline_time(flops: float, bytes_accessed: float) -> float:
    """Roofline time estimate in seconds: ``max(flops / PEAK_FLOPS, bytes / PEAK_BANDWIDTH)``."""
    return max(float(flops) / PEAK_FLOPS, float(bytes_accessed) / PEAK_BANDWIDTH)


@dataclasses.dataclass(frozen=True)
class OptionProfile:
    """One option k >= 1 of a layer: its tape kept under a ``jax.checkpoint`` policy.

    Attributes:
      name: the option's name (``"dots"``, ``"names:attn_out"``, a callable's ``__name__``).
      policy: the policy, applied as ``jax.checkpoint(layer, policy=policy,
        prevent_cse=True)``.
      tape_bytes, fwd_tmp, bwd_tmp, fwd_time, fwd_tape_time, bwd_time, output_in_tape:
        as for :class:`LayerProfile`, with the policy applied (``bwd_time`` and ``bwd_tmp``
        include the recomputation).
      fwd_tape_flops, bwd_flops: ``cost_analysis()`` flops of the tape-only forward and of
        the backward.
      host_bytes: bytes the option keeps in host memory (an offload policy; not in
        ``tape_bytes``, which counts the device).
      transfer_time: seconds to copy them one way (``host_bytes`` / bandwidth); the times
        above include it as :func:`jaxremat.measure.offload.offload_times` overlaps it.
      input_read, output_read, tape_deps, bwd_tmp_freed, fwd_tape_tmp: as for
        :class:`LayerProfile`, with the policy applied.
    """

    name: str
    policy: Any
    tape_bytes: int
    fwd_tmp: int
    bwd_tmp: int
    fwd_time: float
    fwd_tape_time: float
    bwd_time: float
    fwd_tape_flops: float
    bwd_flops: float
    output_in_tape: bool
    host_bytes: int = 0
    transfer_time: float = 0.0
    input_read: tuple[bool, ...] = ()
    output_read: tuple[bool, ...] = ()
    tape_deps: tuple[bool, ...] = ()
    bwd_tmp_freed: int | None = None
    fwd_tape_tmp: int | None = None

    def __post_init__(self) -> None:
        if self.bwd_tmp_freed is None:  # built by hand: the input held through the backward
            object.__setattr__(self, "bwd_tmp_freed", self.bwd_tmp)


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """What the profiler found for one layer (bytes and seconds).

    Attributes:
      index: the layer's position.
      input_bytes, output_bytes: bytes of ``x[i]`` and ``x[i+1]``.
      tape_bytes: ``xbar_size[i]`` (residuals kept for the backward, output included).
      fwd_tmp, bwd_tmp: transient bytes of the forward and of the backward.
      bwd_tmp_freed: ``bwd_tmp`` when the backward frees the input leaves it reads at their
        last read (nothing after ``B(i)`` reads them), at most ``bwd_tmp`` and possibly
        negative (:mod:`jaxremat.sequence.profile`); ``None`` when built by hand: ``bwd_tmp``.
      fwd_tape_tmp: the transient of the forward that builds only the tape, above the input
        and the tape it stores (``solver.Chain.fwd_tape_tmp``); ``None`` when built by hand:
        the full forward's (the chain's default).
      fwd_ck_tmp: the transient of the plain forward (no tape: ``F_ck``, ``F_none``) above
        the input and the output (``solver.Chain.fwd_ck_tmp``,
        :func:`jaxremat.measure.trace.plain_forward_tmp`); ``None`` when built by hand or
        with device-measured transients: ``fwd_tmp`` (the chain's default).
      fwd_time, bwd_time: the chain's times (roofline or measured seconds).
      fwd_flops, bwd_flops: ``cost_analysis()`` flops of the plain forward and of the
        backward; the backward's include the derivative factors (module docstring).
      output_in_tape: whether the backward reads the layer's output (module docstring).
      fwd_tape_time, fwd_tape_flops: the same for the forward that builds only the tape
        (module docstring); ``fwd_tape_time <= fwd_time``.
      input_read, output_read: per leaf of the input / output, whether the backward reads it
        (``()``: not measured, every leaf counts as read). They give ``Chain.x_read_size``.
      tape_deps, output_deps: the leaves of the input that the tape-only forward reads, and
        per output leaf those computing it reads (``()``: not measured, all). They give
        ``Chain.x_rec_size`` (:func:`jaxremat.measure.trace.input_deps`).
      options: the layer's options k = 1, 2, ... (:class:`OptionProfile`), after merging.
      dropped: ``(option name, reason)`` for each option left off the layer's menu: JAX
        rejected its policy, its tape equals another option's, or the whole tape dominates it.
    """

    index: int
    input_bytes: int
    output_bytes: int
    tape_bytes: int
    fwd_tmp: int
    bwd_tmp: int
    fwd_time: float
    bwd_time: float
    fwd_flops: float
    bwd_flops: float
    output_in_tape: bool = True
    fwd_tape_time: float | None = None
    fwd_tape_flops: float | None = None
    options: tuple[OptionProfile, ...] = ()
    dropped: tuple[tuple[str, str], ...] = ()
    input_read: tuple[bool, ...] = ()
    output_read: tuple[bool, ...] = ()
    tape_deps: tuple[bool, ...] = ()
    output_deps: tuple[tuple[bool, ...], ...] = ()
    bwd_tmp_freed: int | None = None
    fwd_tape_tmp: int | None = None
    fwd_ck_tmp: int | None = None

    @property
    def option_names(self) -> tuple[str, ...]:
        """The names of options 0 (``"everything"``, the whole tape), 1, 2, ..."""
        return ("everything",) + tuple(o.name for o in self.options)

    def __post_init__(self) -> None:
        if self.fwd_tape_time is None:  # built by hand: the whole forward
            object.__setattr__(self, "fwd_tape_time", self.fwd_time)
        if self.fwd_tape_flops is None:
            object.__setattr__(self, "fwd_tape_flops", self.fwd_flops)
        if self.bwd_tmp_freed is None:  # built by hand: the input held through the backward
            object.__setattr__(self, "bwd_tmp_freed", self.bwd_tmp)


@dataclasses.dataclass(frozen=True)
class Profile:
    """A profiled sequence: the chain for the solver and the per-layer details."""

    chain: Chain
    layers: tuple[LayerProfile, ...]
    costs: str


def forward_costs(layer: Callable, p: Any, x: Any, meter: CostMeter | None = None,
                  jaxpr: ClosedJaxpr | None = None) -> tuple[float, float]:
    """``cost_analysis()`` flops and bytes accessed of the layer's plain forward (lowered for
    the CPU where the default backend gives none: :func:`jaxremat.measure.costs.lowered_costs`;
    scaled from a count on ``jaxpr``, ``jax.make_jaxpr(layer)(p, x)``, where ``meter`` has a
    calibration: :mod:`jaxremat.sequence.calibration`). Shared by
    the layer's options: ``jax.checkpoint(layer, policy=...)`` run without differentiation
    lowers to the layer's own operations (JAX inlines an undifferentiated ``remat`` and adds
    its optimisation barrier only when differentiated), so its counts are the same
    (tests/test_profile_options.py checks it)."""
    return (meter or CostMeter()).costs(FORWARD, layer, (p, x), jaxpr)


def layer_costs(layer: Callable, p: Any, x: Any, traced: TracedLayer, costs: str,
                repeats: int, forward: tuple[float, float] | None = None,
                meter: CostMeter | None = None, option: str = "everything") -> dict[str, Any]:
    """Times, flops and transients of one traced layer (module docstring); ``forward``: the
    plain forward's :func:`forward_costs` when known (a layer's options share it);
    ``meter``: where the static costs of the pieces come from
    (:mod:`jaxremat.sequence.calibration`; default: lowered), ``option`` names them there."""
    meter = meter or CostMeter()
    fwd_flops, fwd_bytes = forward if forward is not None else forward_costs(layer, p, x, meter)
    tape_flops, tape_bytes = meter.costs(f"{option}:tape", tape_forward(traced), (p, x),
                                         tape_jaxpr(traced))
    bwd_flops, bwd_bytes = meter.costs(
        f"{option}:backward", traced.pullback, (list(traced.residuals), traced.cotangent),
        traced.backward, skip_outputs=len(traced.backward.jaxpr.outvars) - len(jax.tree.leaves(p)))
    # The derivative factors: what the vjp forward (F_all) computes beyond the plain forward
    # (F_ck, F_none). Charged to the backward, which only runs after an F_all, and taken
    # out of the tape-only forward, which computes them too (module docstring).
    vjp_flops, vjp_bytes = meter.costs(f"{option}:vjp", tape_forward(traced, with_output=True),
                                       (p, x), tape_jaxpr(traced, with_output=True))
    factor_flops, factor_bytes = max(0.0, vjp_flops - fwd_flops), max(0.0, vjp_bytes - fwd_bytes)
    bwd_flops, bwd_bytes = bwd_flops + factor_flops, bwd_bytes + factor_bytes
    tape_flops = max(0.0, tape_flops - factor_flops)
    tape_bytes = max(0.0, tape_bytes - factor_bytes)
    fwd_tmp, bwd_tmp, bwd_tmp_freed, fwd_tape_tmp = transients(traced, len(jax.tree.leaves(p)),
                                                               tree_bytes(x))
    # the plain forward does not depend on the policy: measured for the layer, not its options
    ck_tmp = {"fwd_ck_tmp": plain_forward_tmp(traced)} if option == "everything" else {}
    if costs == "measured":
        from ..measure.timing import measure_layer  # local: only measured costs need it

        measured = measure_layer(layer, p, x, traced, repeats=repeats)
        fwd_time, bwd_time = measured.fwd_time, measured.bwd_time
        tape_time = measured.fwd_tape_time
        if measured.fwd_tmp is not None:  # the device's figures: the full forward, x held
            fwd_tmp, bwd_tmp = measured.fwd_tmp, measured.bwd_tmp
            bwd_tmp_freed = bwd_tmp
            fwd_tape_tmp = full_forward_tmp(fwd_tmp, bool(traced.output_in_tape),
                                            tree_bytes(traced.output))
            ck_tmp = {"fwd_ck_tmp": None} if ck_tmp else {}
    elif costs == "flops":
        fwd_time, bwd_time, tape_time = (f / PEAK_FLOPS for f in (fwd_flops, bwd_flops, tape_flops))
    else:
        fwd_time = roofline_time(fwd_flops, fwd_bytes)
        bwd_time = roofline_time(bwd_flops, bwd_bytes)
        tape_time = roofline_time(tape_flops, tape_bytes)
    return dict(
        tape_bytes=traced.tape_bytes, fwd_tmp=fwd_tmp, bwd_tmp=bwd_tmp,
        bwd_tmp_freed=bwd_tmp_freed, fwd_tape_tmp=fwd_tape_tmp, fwd_time=fwd_time,
        bwd_time=bwd_time, fwd_flops=fwd_flops, bwd_flops=bwd_flops,
        output_in_tape=traced.output_in_tape,
        input_read=traced.input_read, output_read=traced.output_read,
        tape_deps=traced.tape_deps, output_deps=traced.output_deps,
        # a part of the forward's work; timing noise or XLA's counts must not make it dearer
        fwd_tape_time=min(tape_time, fwd_time), fwd_tape_flops=min(tape_flops, fwd_flops),
        **ck_tmp,
    )
