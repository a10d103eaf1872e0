"""A layer's checkpoint-policy options, profiled and merged.

Options (issue 17; ALGORITHMS.md section 2, "Multi-option layers"): besides its whole tape
(option 0, everything above), each layer is profiled under the ``jax.checkpoint`` policies of
its menu (:mod:`jaxremat.sequence.policies`): ``jax.checkpoint(layer, policy=..., prevent_cse=True)``
is traced exactly as above, so an option's tape is what ``jax.vjp`` of the policy-applied
layer keeps and its pullback reads, its backward cost and transients include the
recomputation the policy implies (the pullback recomputes what was not saved), and its
tape-only forward computes only the saved values. Its forward is the layer's forward.
Options whose tapes are identical (counted residuals of the same shapes and dtypes, the same
output flag, and the same flops and transients) merge, keeping the first name; an option no smaller and no faster than the whole tape, or no better
than another option in any field, is dropped as dominated; a policy that fails on a layer (JAX rejects it) is dropped from that layer's
menu, with the reason kept in :attr:`LayerProfile.dropped`.

Offload options (``"offload_dots_no_batch"``, ``"offload_names:..."``) keep some residuals
in host memory: their tape counts device bytes only (the host residuals' bytes are
:attr:`OptionProfile.host_bytes`), and their forward, tape-only forward and backward times
include the transfers as :func:`jaxremat.measure.offload.offload_times` models them
(Beaumont et al., NeurIPS 2021). Where the device has no host memory space they are dropped
from every layer's menu, with the reason.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from solver import Chain
from solver.chain.options import LayerOptions

from ..measure import offload
from ..measure.trace import TracedLayer, tape_signature, trace_layer
from .calibration import CostMeter, Uncalibrated
from .layer import LayerProfile, OptionProfile, layer_costs
from .policies import PolicyOption, menu_for

_SAME = "same tape as "
_DOMINATED = "dominated by "
_WHOLE = "no smaller and no faster than the whole tape"

Tracer = Callable[[Callable, Any, Any, int, bool, PolicyOption], TracedLayer]
"""``tracer(layer, p, x, index, input_grad, option)``: the :class:`TracedLayer` of ``layer``,
the layer under ``option``'s policy (:data:`jaxremat.sequence.policies.WHOLE_TAPE` for the
layer itself); :func:`trace` by default."""


def trace(layer: Callable, p: Any, x: Any, index: int, input_grad: bool, option: PolicyOption
          ) -> TracedLayer:
    """The default :data:`Tracer`: :func:`jaxremat.measure.trace.trace_layer`."""
    del option
    return trace_layer(layer, p, x, index, input_grad=input_grad)


def option_aliases(dropped: Sequence[tuple[str, str]]) -> dict[str, str]:
    """``{dropped option name: name of the kept option that stands for it}`` from a layer's
    ``LayerProfile.dropped``: the option it merged into, the option that dominates it, or
    ``"everything"`` (the whole tape) for one no better than the whole tape. Rejected
    policies have no stand-in. :func:`solver.chain.uniform.uniform_plans` builds each
    uniform policy's plan with them."""
    aliases = {}
    for name, reason in dropped:
        for prefix in (_SAME, _DOMINATED):
            if reason.startswith(prefix):
                aliases[name] = reason[len(prefix):].strip("'")
        if reason == _WHOLE:
            aliases[name] = "everything"
    return aliases


def _profile_option(layer: Callable, p: Any, x: Any, index: int, option: PolicyOption,
                    base: LayerProfile, costs: str, repeats: int, input_grad: bool,
                    forward: tuple[float, float] | None = None, meter: CostMeter | None = None,
                    tracer: Tracer = trace) -> tuple[OptionProfile, tuple]:
    """Profile ``layer`` under ``option``'s policy; also return its tape's signature.
    ``forward``: the layer's plain forward costs (:func:`jaxremat.sequence.layer.forward_costs`,
    the same with the policy applied), lowered once for all options; ``meter``: the static
    costs' source (:mod:`jaxremat.sequence.calibration`); ``tracer``: how it is traced."""
    saved = jax.checkpoint(layer, policy=option.policy, prevent_cse=True)
    traced = tracer(saved, p, x, index, input_grad, option)
    found = layer_costs(saved, p, x, traced, costs, repeats, forward=forward, meter=meter,
                        option=option.name)
    found = OptionProfile(
        name=option.name, policy=option.policy, tape_bytes=found["tape_bytes"],
        fwd_tmp=found["fwd_tmp"], bwd_tmp=found["bwd_tmp"],
        bwd_tmp_freed=found["bwd_tmp_freed"], fwd_tape_tmp=found["fwd_tape_tmp"],
        fwd_time=base.fwd_time,
        fwd_tape_time=min(found["fwd_tape_time"], base.fwd_time),
        bwd_time=max(found["bwd_time"], _backward_floor(base, found["bwd_flops"], costs)),
        fwd_tape_flops=min(found["fwd_tape_flops"], base.fwd_flops),
        bwd_flops=max(found["bwd_flops"], base.bwd_flops), output_in_tape=found["output_in_tape"],
        input_read=found["input_read"], output_read=found["output_read"],
        tape_deps=found["tape_deps"],
    )
    if traced.host_bytes:
        fwd, tape, bwd, transfer = offload.offload_times(
            found.fwd_time, found.fwd_tape_time, found.bwd_time, traced.host_bytes,
            offload.host_bandwidth(costs))
        found = dataclasses.replace(found, fwd_time=fwd, fwd_tape_time=tape, bwd_time=bwd,
                                    host_bytes=traced.host_bytes, transfer_time=transfer)
    # equal shapes alone do not make equal tapes (tanh(x @ w) vs x @ w): the costs must agree too
    key = (tape_signature(traced), found.bwd_flops, found.fwd_tape_flops, found.fwd_tmp,
           found.bwd_tmp, found.bwd_tmp_freed, found.fwd_tape_tmp)
    return found, key


def _backward_floor(base: LayerProfile, bwd_flops: float, costs: str) -> float:
    """The least backward time an option may have: the whole tape's backward, and with
    measured costs that time scaled by the option's flops (its backward is the whole tape's
    plus recomputation; timed on a busy CPU it often measures no dearer, and the plan would
    take the smaller tape for free)."""
    if costs != "measured" or base.bwd_flops <= 0:
        return base.bwd_time
    return base.bwd_time * max(1.0, bwd_flops / base.bwd_flops)


def layer_options(layer: Callable, p: Any, x: Any, base: LayerProfile, traced: TracedLayer,
                   menu: tuple, costs: str, repeats: int, input_grad: bool,
                   forward: tuple[float, float] | None = None, meter: CostMeter | None = None,
                   tracer: Tracer = trace, plain: Any = None,
                   ) -> tuple[tuple[OptionProfile, ...], tuple]:
    """The layer's options k >= 1 after merging, and ``(name, reason)`` of those dropped;
    ``forward``: the layer's plain forward costs, if already lowered; ``meter``: the static
    costs' source (:mod:`jaxremat.sequence.calibration`); ``tracer``: how each option is
    traced (:data:`Tracer`); ``plain``: ``jax.make_jaxpr(layer)(p, x)`` where already traced
    (read for the names the layer marks)."""
    options: list[OptionProfile] = []
    menu_options, notes = menu_for(menu, layer, p, x, plain)
    dropped: list[tuple[str, str]] = list(notes)
    seen = {(tape_signature(traced), base.bwd_flops, base.fwd_tape_flops, base.fwd_tmp,
             base.bwd_tmp, base.bwd_tmp_freed, base.fwd_tape_tmp): "everything"}
    no_host = None
    for option in menu_options[1:]:
        if option.offload and (no_host := no_host or offload.offload_unavailable()):
            dropped.append((option.name, no_host))
            continue
        try:
            found, key = _profile_option(layer, p, x, base.index, option, base, costs, repeats,
                                         input_grad, forward, meter, tracer)
        except Uncalibrated:  # the profile is redone by tracing (jaxremat.sequence.profile)
            raise
        except Exception as error:  # noqa: BLE001 - JAX rejected the policy on this layer
            cause = error.__cause__ or error  # trace_layer names the layer; the plan does
            dropped.append((option.name, f"rejected: {type(cause).__name__}: {cause}"[:300]))
            continue
        if key in seen:
            dropped.append((option.name, f"{_SAME}{seen[key]!r}"))
        elif found.tape_bytes >= base.tape_bytes and found.bwd_time >= base.bwd_time:
            dropped.append((option.name, _WHOLE))
        else:
            seen[key] = option.name
            options.append(found)
    kept = [o for o in options if not any(_dominates(other, o) for other in options)]
    dropped += [(o.name, _DOMINATED + repr(next(d.name for d in options if _dominates(d, o))))
                for o in options if o not in kept]
    return tuple(kept), tuple(dropped)


def _dominates(a: OptionProfile, b: OptionProfile) -> bool:
    """Whether option ``a`` is no worse than ``b`` in every field of the chain and better in
    one (then no plan needs ``b``)."""
    fields = ["tape_bytes", "fwd_time", "fwd_tape_time", "bwd_time", "fwd_tmp", "bwd_tmp",
              "bwd_tmp_freed"]
    if a.fwd_tape_tmp is not None and b.fwd_tape_tmp is not None:
        fields.append("fwd_tape_tmp")
    no_worse = all(getattr(a, f) <= getattr(b, f) for f in fields)
    return (no_worse and a.output_in_tape == b.output_in_tape
            and any(getattr(a, f) < getattr(b, f) for f in fields))


def with_options(chain: Chain, profiles: Sequence[LayerProfile],
                 reads: Sequence[Sequence[float]] | None = None,
                 freed: Sequence[bool] | None = None,
                 own: Sequence[Sequence[float]] | None = None) -> Chain:
    """``chain`` with the layers' options (``Chain.options``); unchanged when none has any.
    ``reads[i][k]``: option ``k``'s ``x_read_size`` (default: the chain's); ``own[i][k]``:
    its ``x_own_read_size`` (default: the chain's, at most ``reads``); ``freed[i]``:
    whether layer ``i``'s options take ``bwd_tmp_freed`` (:func:`jaxremat.sequence.held.inputs_freed`;
    default none)."""
    if not any(p.options for p in profiles):
        return chain
    freed = freed or [False] * len(profiles)

    extra = [[dict(xbar_size=o.tape_bytes, fwd_time=o.fwd_time, fwd_tape_time=o.fwd_tape_time,
                   bwd_time=o.bwd_time, fwd_tmp=o.fwd_tmp,
                   bwd_tmp=o.bwd_tmp_freed if freed[i] else o.bwd_tmp,
                   **({} if o.fwd_tape_tmp is None or chain.fwd_tape_tmp is None
                      else {"fwd_tape_tmp": o.fwd_tape_tmp}),
                   output_in_tape=o.output_in_tape, name=o.name,
                   x_read_size=chain.x_read_size[i] if reads is None else reads[i][k + 1],
                   **({} if own is None else {"x_own_read_size": own[i][k + 1]}))
              for k, o in enumerate(p.options)]
             for i, p in enumerate(profiles)]
    return chain.with_options(LayerOptions.from_columns(chain, extra))
