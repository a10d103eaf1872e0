"""Profile a sequence of JAX layers into Rotor's heterogeneous chain (``solver.Chain``).

For each layer ``i`` (``layers[i](params[i], x[i]) -> x[i+1]``) this module measures the
quantities of ALGORITHMS.md section 1, following the JAX mapping of section 6:

* ``x_size[i]``: bytes of the layer's input pytree (``x_size[L]``: the last output).
* ``xbar_size[i]`` (the *tape*): the residuals ``jax.vjp`` keeps for the layer's backward,
  minus the parameters (live anyway), the closed-over constants and the input ``x[i]``
  (counted as ``x_size[i]``), plus the output ``x[i+1]`` when it is not itself a residual.
  Residuals the pullback never reads are left out (``jax.grad`` removes them as dead code).
  The residuals are the outputs of ``jax.make_jaxpr(lambda p, x: jax.vjp(layer, p, x))``
  after the primal outputs; a residual that *is* a parameter, the input or the output is the
  same jaxpr variable, which is how they are told apart.
* ``output_in_tape[i]``: whether the pullback reads the output ``x[i+1]`` (some output leaf
  is a read residual). When it does not, the simulator stores ``x[i+1]`` on its own, frees
  it with the next layer's backward and, recomputing the last layer of a segment, does not
  store it at all, as JAX does (``solver.Chain.output_in_tape``).
* ``fwd_tmp[i]`` / ``bwd_tmp[i]``: the transient bytes of the layer's forward (the vjp
  forward, which computes the residuals) and of its backward (the vjp's pullback), measured
  in program order with the meter of :func:`jaxremat.activation_memory`, with the same
  accounting as the full training step: parameters and constants are not counted,
  residuals and the incoming gradient are counted until their last use, the input
  gradient is counted, parameter gradients are not; in the backward the input ``x[i]``
  is not counted (the simulator holds it through ``B(i)``, as Rotor's model says; the
  ``"checkpoint"`` backend really does for a segment's first layer). The chain's
  transient is what the layer's program peak exceeds the simulator's own accounting by,
  never negative:
  ``fwd_tmp = peak(forward) - x_size[i] - xbar_size[i]`` (the forward ends holding its
  input and tape) and ``bwd_tmp = peak(backward) - inputs(backward) - x_size[i]``, where
  ``inputs(backward)`` are the counted residuals and ``g[i+1]``, which the simulator holds
  when ``B(i)`` starts, and ``x_size[i]`` is the new ``g[i]`` the simulator adds. A layer that
  frees its residuals while its backward runs thus gets ``bwd_tmp`` near zero, as it
  should: the simulator's ``B(i)`` peak is then what the meter sees.
* ``fwd_tape_time[i]``: the cost of the forward that builds only the tape
  (:func:`jaxremat.trace.tape_forward`: ``jax.vjp``'s forward cut down to the residuals the
  pullback reads), measured like ``fwd_time`` and capped by it. It is what recomputing the
  last layer of a segment costs: JAX does not compute that layer's output when its backward
  does not read it (``solver.Chain.fwd_tape_time``). For a residual MLP block it leaves out
  the second matmul, about half the forward.
* The derivative factors. The forward ``jax.grad`` runs for a layer that keeps its tape
  (``F_all``: ``jax.vjp``'s forward) computes, besides the plain forward, the factors the
  pullback reads (gelu's derivative, tanh's ``1 - y**2`` on JAX 0.11+); a forward that keeps
  nothing (``F_ck``, ``F_none``) does not. The chain has one forward time, so with static
  and flop costs the factors (vjp forward less plain forward) are charged to the backward,
  which runs exactly once after each ``F_all``, and taken out of the tape-only forward,
  which computes them too: ``fwd_time`` is the plain forward, ``bwd_time`` the pullback
  plus the factors, ``fwd_tape_time`` the tape-only forward less the factors. Every
  schedule's total is then the gradient's count (tests/test_profile.py); charged to the
  forward instead, each recomputation was overestimated by the factors (JAX 0.11+ moved
  tanh's ``1 - y**2`` from the pullback into the forward, so the error grew there).
* ``fwd_time[i]`` / ``bwd_time[i]``: with ``costs="static"``, a roofline estimate from
  ``jax.jit(...).lower(...).cost_analysis()`` (lowered for the CPU on backends that give
  none before compiling, e.g. GPU: :mod:`jaxremat.costs`): ``max(flops / PEAK_FLOPS,
  bytes_accessed / PEAK_BANDWIDTH)`` seconds, the backward lowered from the pullback on the
  residuals. With ``costs="flops"``, the flop term alone, ``flops / PEAK_FLOPS``: the
  bytes XLA counts before fusing are those of every unfused operation, so on layers of
  modest width (a GPT block of width 128) the roofline is bandwidth-bound and ranks plans
  by traffic that fusion removes; ``"flops"`` plans for the least recomputed flops instead.
  With ``costs="measured"``, the median wall time of the jitted forward and backward on the
  default device (see :mod:`jaxremat.timing`).

Where the chain and the meter differ (checked in tests/test_profile.py and
tests/test_sequence.py, shown by benchmarks/jax_memory.py). The chain follows Rotor's model,
so it is conservative where JAX frees memory earlier than the model says:

* ``B(i)`` holds the layer's input and tape until ``g[i]`` exists; JAX frees residuals as the
  backward goes. ``bwd_tmp`` measures the excess over the inputs, clamped at zero, so a
  layer whose residuals die before ``g[i]`` is made is overestimated by up to ``x_size[i]``.
* When neither layer ``i`` nor layer ``i+1`` reads ``x[i+1]`` in its backward (pre-norm
  residual blocks), JAX frees it after layer ``i+1``'s forward; the chain holds it until
  ``B(i+1)`` (the model's ``B`` reads its input).
* A pass-through leaf of a pytree activation (``(h, skip) -> (h', skip)``) is one buffer in
  JAX but is counted in both ``x[i]`` and ``x[i+1]``.
* Not modelled: the loss function's memory beyond the gradient of the sequence's output.
* Rotor's dynamic program plans with the ``output_in_tape`` flags (exactly as the
  simulator counts them), so memory an unread output would waste is used.

Options (issue 17; ALGORITHMS.md section 2, "Multi-option layers"): besides its whole tape
(option 0, everything above), each layer is profiled under the ``jax.checkpoint`` policies of
its menu (:mod:`jaxremat.policies`): ``jax.checkpoint(layer, policy=..., prevent_cse=True)``
is traced exactly as above, so an option's tape is what ``jax.vjp`` of the policy-applied
layer keeps and its pullback reads, its backward cost and transients include the
recomputation the policy implies (the pullback recomputes what was not saved), and its
tape-only forward computes only the saved values. Its forward is the layer's forward.
Options whose tapes are identical (counted residuals of the same shapes and dtypes, the same
output flag, and the same flops and transients) merge, keeping the first name; an option no smaller and no faster than the whole tape, or no better
than another option in any field, is dropped as dominated; a policy that fails on a layer (JAX rejects it) is dropped from that layer's
menu, with the reason kept in :attr:`LayerProfile.dropped`.

Everything except measured timing works from shapes alone (``jax.ShapeDtypeStruct``), so a
sequence can be profiled while an outer ``jax.jit`` / ``jax.grad`` / ``jax.vmap`` traces it.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Sequence

import jax

from solver import Chain
from solver.chain.options import LayerOptions

from .costs import lowered_costs
from .lru import LRU
from .policies import PolicyOption, check_policies, layer_menu, marked_names
from .trace import TracedLayer, tape_forward, tape_signature, trace_layer, transients
from .trees import abstractify, check_layers, check_params, signature, tree_bytes

__all__ = [
    "PEAK_FLOPS",
    "PEAK_BANDWIDTH",
    "LayerProfile",
    "OptionProfile",
    "Profile",
    "profile_cache",
    "profile_layers",
    "profile_sequence",
    "roofline_time",
]

PROFILE_CACHE_SIZE = 1024
"""Layer profiles kept across calls (:func:`profile_cache`)."""

_PROFILES = LRU(PROFILE_CACHE_SIZE)

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


@dataclasses.dataclass(frozen=True)
class LayerProfile:
    """What the profiler found for one layer (bytes and seconds).

    Attributes:
      index: the layer's position.
      input_bytes, output_bytes: bytes of ``x[i]`` and ``x[i+1]``.
      tape_bytes: ``xbar_size[i]`` (residuals kept for the backward, output included).
      fwd_tmp, bwd_tmp: transient bytes of the forward and of the backward.
      fwd_time, bwd_time: the chain's times (roofline or measured seconds).
      fwd_flops, bwd_flops: ``cost_analysis()`` flops of the plain forward and of the
        backward; the backward's include the derivative factors (module docstring).
      output_in_tape: whether the backward reads the layer's output (module docstring).
      fwd_tape_time, fwd_tape_flops: the same for the forward that builds only the tape
        (module docstring); ``fwd_tape_time <= fwd_time``.
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

    @property
    def option_names(self) -> tuple[str, ...]:
        """The names of options 0 (``"everything"``, the whole tape), 1, 2, ..."""
        return ("everything",) + tuple(o.name for o in self.options)

    def __post_init__(self) -> None:
        if self.fwd_tape_time is None:  # built by hand: the whole forward
            object.__setattr__(self, "fwd_tape_time", self.fwd_time)
        if self.fwd_tape_flops is None:
            object.__setattr__(self, "fwd_tape_flops", self.fwd_flops)


@dataclasses.dataclass(frozen=True)
class Profile:
    """A profiled sequence: the chain for the solver and the per-layer details."""

    chain: Chain
    layers: tuple[LayerProfile, ...]
    costs: str


def _flops_and_bytes(fn: Callable, *args: Any) -> tuple[float, float]:
    """``cost_analysis()`` flops and bytes accessed of ``jax.jit(fn)`` lowered on ``args``
    (for the CPU where the default backend gives none: :func:`jaxremat.costs.lowered_costs`)."""
    analysis = lowered_costs(fn, *args)
    return analysis["flops"], analysis.get("bytes accessed", 0.0)


def _measure(layer: Callable, p: Any, x: Any, traced: TracedLayer, costs: str,
             repeats: int) -> dict[str, Any]:
    """Times, flops and transients of one traced layer (module docstring)."""
    fwd_flops, fwd_bytes = _flops_and_bytes(layer, p, x)
    tape_flops, tape_bytes = _flops_and_bytes(tape_forward(traced), p, x)
    bwd_flops, bwd_bytes = _flops_and_bytes(traced.pullback, list(traced.residuals), traced.cotangent)
    # The derivative factors: what the vjp forward (F_all) computes beyond the plain forward
    # (F_ck, F_none). Charged to the backward, which only runs after an F_all, and taken
    # out of the tape-only forward, which computes them too (module docstring).
    vjp_flops, vjp_bytes = _flops_and_bytes(tape_forward(traced, with_output=True), p, x)
    factor_flops, factor_bytes = max(0.0, vjp_flops - fwd_flops), max(0.0, vjp_bytes - fwd_bytes)
    bwd_flops, bwd_bytes = bwd_flops + factor_flops, bwd_bytes + factor_bytes
    tape_flops = max(0.0, tape_flops - factor_flops)
    tape_bytes = max(0.0, tape_bytes - factor_bytes)
    fwd_tmp, bwd_tmp = transients(traced, len(jax.tree.leaves(p)), tree_bytes(x))
    if costs == "measured":
        from .timing import measure_layer  # local: only measured costs need it

        measured = measure_layer(layer, p, x, traced, repeats=repeats)
        fwd_time, bwd_time = measured.fwd_time, measured.bwd_time
        tape_time = measured.fwd_tape_time
        if measured.fwd_tmp is not None:
            fwd_tmp, bwd_tmp = measured.fwd_tmp, measured.bwd_tmp
    elif costs == "flops":
        fwd_time, bwd_time, tape_time = (f / PEAK_FLOPS for f in (fwd_flops, bwd_flops, tape_flops))
    else:
        fwd_time = roofline_time(fwd_flops, fwd_bytes)
        bwd_time = roofline_time(bwd_flops, bwd_bytes)
        tape_time = roofline_time(tape_flops, tape_bytes)
    return dict(
        tape_bytes=traced.tape_bytes, fwd_tmp=fwd_tmp, bwd_tmp=bwd_tmp, fwd_time=fwd_time,
        bwd_time=bwd_time, fwd_flops=fwd_flops, bwd_flops=bwd_flops,
        output_in_tape=traced.output_in_tape,
        # a part of the forward's work; timing noise or XLA's counts must not make it dearer
        fwd_tape_time=min(tape_time, fwd_time), fwd_tape_flops=min(tape_flops, fwd_flops),
    )


def _profile_option(layer: Callable, p: Any, x: Any, index: int, option: PolicyOption,
                    base: LayerProfile, costs: str, repeats: int,
                    input_grad: bool) -> tuple[OptionProfile, tuple]:
    """Profile ``layer`` under ``option``'s policy; also return its tape's signature."""
    saved = jax.checkpoint(layer, policy=option.policy, prevent_cse=True)
    traced = trace_layer(saved, p, x, index, input_grad=input_grad)
    found = _measure(saved, p, x, traced, costs, repeats)
    found = OptionProfile(
        name=option.name, policy=option.policy, tape_bytes=found["tape_bytes"],
        fwd_tmp=found["fwd_tmp"], bwd_tmp=found["bwd_tmp"], fwd_time=base.fwd_time,
        fwd_tape_time=min(found["fwd_tape_time"], base.fwd_time),
        bwd_time=max(found["bwd_time"], _backward_floor(base, found["bwd_flops"], costs)),
        fwd_tape_flops=min(found["fwd_tape_flops"], base.fwd_flops),
        bwd_flops=max(found["bwd_flops"], base.bwd_flops), output_in_tape=found["output_in_tape"],
    )
    # equal shapes alone do not make equal tapes (tanh(x @ w) vs x @ w): the costs must agree too
    key = (tape_signature(traced), found.bwd_flops, found.fwd_tape_flops, found.fwd_tmp,
           found.bwd_tmp)
    return found, key


def _backward_floor(base: LayerProfile, bwd_flops: float, costs: str) -> float:
    """The least backward time an option may have: the whole tape's backward, and with
    measured costs that time scaled by the option's flops (its backward is the whole tape's
    plus recomputation; timed on a busy CPU it often measures no dearer, and the plan would
    take the smaller tape for free)."""
    if costs != "measured" or base.bwd_flops <= 0:
        return base.bwd_time
    return base.bwd_time * max(1.0, bwd_flops / base.bwd_flops)


def _layer_options(layer: Callable, p: Any, x: Any, base: LayerProfile, traced: TracedLayer,
                   menu: tuple, costs: str, repeats: int,
                   input_grad: bool) -> tuple[tuple[OptionProfile, ...], tuple]:
    """The layer's options k >= 1 after merging, and ``(name, reason)`` of those dropped."""
    options: list[OptionProfile] = []
    dropped: list[tuple[str, str]] = []
    seen = {(tape_signature(traced), base.bwd_flops, base.fwd_tape_flops, base.fwd_tmp,
             base.bwd_tmp): "everything"}
    for option in layer_menu(menu, marked_names(layer, p, x))[1:]:
        try:
            found, key = _profile_option(layer, p, x, base.index, option, base, costs, repeats,
                                         input_grad)
        except Exception as error:  # noqa: BLE001 - JAX rejected the policy on this layer
            cause = error.__cause__ or error  # trace_layer names the layer; the plan does
            dropped.append((option.name, f"rejected: {type(cause).__name__}: {cause}"[:300]))
            continue
        if key in seen:
            dropped.append((option.name, f"same tape as {seen[key]!r}"))
        elif found.tape_bytes >= base.tape_bytes and found.bwd_time >= base.bwd_time:
            dropped.append((option.name, "no smaller and no faster than the whole tape"))
        else:
            seen[key] = option.name
            options.append(found)
    kept = [o for o in options if not any(_dominates(other, o) for other in options)]
    dropped += [(o.name, "dominated by " + repr(next(d.name for d in options if _dominates(d, o))))
                for o in options if o not in kept]
    return tuple(kept), tuple(dropped)


def _dominates(a: OptionProfile, b: OptionProfile) -> bool:
    """Whether option ``a`` is no worse than ``b`` in every field of the chain and better in
    one (then no plan needs ``b``)."""
    fields = ("tape_bytes", "fwd_tape_time", "bwd_time", "fwd_tmp", "bwd_tmp")
    no_worse = all(getattr(a, f) <= getattr(b, f) for f in fields)
    return (no_worse and a.output_in_tape == b.output_in_tape
            and any(getattr(a, f) < getattr(b, f) for f in fields))


def _profile_one(
    layer: Callable, p: Any, x: Any, index: int, costs: str, repeats: int, input_grad: bool,
    menu: tuple = (),
) -> tuple[LayerProfile, Any]:
    traced = trace_layer(layer, p, x, index, input_grad=input_grad)
    profile = LayerProfile(index=index, input_bytes=tree_bytes(x),
                           output_bytes=tree_bytes(traced.output),
                           **_measure(layer, p, x, traced, costs, repeats))
    if menu:
        options, dropped = _layer_options(layer, p, x, profile, traced, menu, costs, repeats,
                                          input_grad)
        profile = dataclasses.replace(profile, options=options, dropped=dropped)
    return profile, traced.output


def profile_cache() -> LRU:
    """The module-wide cache of layer profiles (bounded LRU, thread-safe).

    Keyed by the layer function's identity and the abstract signature of its parameters and
    input (pytree structures, shapes, dtypes), whether its input is differentiated, the
    cost model and the policy menu. An entry holds only numbers and shapes: the
    :class:`LayerProfile` (with index 0), the output's ``ShapeDtypeStruct`` tree, and a weak
    reference to the layer that tells a reused ``id`` from the same function (no traced
    program, no closure over arrays). Identical blocks, and the same layers in a new
    :class:`jaxremat.RematSequence`, are profiled once. ``profile_cache().clear()`` forgets
    them (e.g. after redefining a layer's behaviour through global state).
    """
    return _PROFILES


def _cache_key(layer: Callable, p: Any, x: Any, input_grad: bool, costs: str, menu: tuple,
               repeats: int) -> tuple:
    menu_key = tuple(m if isinstance(m, str) else ("callable", id(m)) for m in menu)
    return (id(layer), signature(p), signature(x), input_grad, costs, menu_key,
            repeats if costs == "measured" else 0)


def _cached(key: tuple, layer: Callable) -> tuple[LayerProfile, Any] | None:
    found = _PROFILES.get(key)
    if found is None or found[0]() is not layer:  # a dead function's id, reused
        return None
    return found[1], found[2]


def _remember(key: tuple, layer: Callable, profile: LayerProfile, output: Any) -> None:
    try:
        ref = weakref.ref(layer)
    except TypeError:  # no weak references (e.g. some builtins): do not keep it across calls
        return
    _PROFILES.put(key, (ref, dataclasses.replace(profile, index=0), output))


def with_options(chain: Chain, profiles: Sequence[LayerProfile]) -> Chain:
    """``chain`` with the layers' options (``Chain.options``); unchanged when none has any."""
    if not any(p.options for p in profiles):
        return chain

    extra = [[dict(xbar_size=o.tape_bytes, fwd_time=o.fwd_time, fwd_tape_time=o.fwd_tape_time,
                   bwd_time=o.bwd_time, fwd_tmp=o.fwd_tmp, bwd_tmp=o.bwd_tmp,
                   output_in_tape=o.output_in_tape, name=o.name) for o in p.options]
             for p in profiles]
    return chain.with_options(LayerOptions.from_columns(chain, extra))


def profile_sequence(
    layers: Sequence[Callable],
    params: Sequence[Any],
    x: Any,
    *,
    costs: str = "static",
    progress: bool | None = None,
    repeats: int = 7,
    input_grad: bool = True,
    policies: Any = None,
) -> Profile:
    """Profile ``layers`` on ``params`` and ``x`` into a :class:`Profile` (module docstring).

    Args:
      layers: functions ``layers[i](params[i], x) -> y``.
      params: one pytree per layer; arrays, tracers or ``jax.ShapeDtypeStruct`` leaves.
      x: the sequence's input, same kinds of leaves.
      costs: ``"static"`` (roofline from ``cost_analysis``, works from shapes, also at trace
        time), ``"flops"`` (its flop term alone, module docstring) or ``"measured"`` (time
        each layer's jitted forward and backward on the default device; on a GPU also take
        transients from ``memory_analysis``).
      progress: show a progress bar (tqdm); ``None``: only for more than 20 layers or with
        measured costs.
      repeats: timed runs per measurement (median taken), measured costs only.
      input_grad: whether the gradient of ``x`` is needed. When it is not (``jax.grad``
        with respect to the parameters only), the first layer's backward computes no
        ``g[0]``, and its tape and transients are profiled that way.
      policies: the menu of checkpoint policies each layer may also be saved with
        (:mod:`jaxremat.policies`): ``None`` for the default menu (``"dots"``,
        ``"dots_no_batch"``, ``"names"``), a sequence of names and callables, or ``()`` for
        the whole tape only (no options).

    Layers that are the same function object on the same shapes are profiled once, also
    across calls (:func:`profile_cache`).
    """
    layers = check_layers(layers)
    params = check_params(params, len(layers))
    if costs not in COSTS:
        raise ValueError(f"costs must be one of {COSTS}, got {costs!r}.")
    menu = check_policies(policies)
    abstract_params = [abstractify(p, f"params[{i}]") for i, p in enumerate(params)]
    current = abstractify(x, "the sequence input x")
    if progress is None:
        progress = len(layers) > 20 or costs == "measured"
    indices: Any = range(len(layers))
    if progress:
        from tqdm.auto import tqdm

        indices = tqdm(indices, desc="profiling layers", total=len(layers), leave=False)
    memo: dict[tuple, tuple[LayerProfile, Any]] = {}  # also layers without weak references
    profiles: list[LayerProfile] = []
    for i in indices:
        needs_input_grad = input_grad or i > 0
        key = _cache_key(layers[i], abstract_params[i], current, needs_input_grad, costs, menu,
                         repeats)
        hit = memo.get(key) or _cached(key, layers[i])
        if hit is None:
            hit = _profile_one(layers[i], abstract_params[i], current, i, costs, repeats,
                               needs_input_grad, menu)
            _remember(key, layers[i], *hit)
        memo[key] = hit
        found, output = hit
        found = dataclasses.replace(found, index=i)
        profiles.append(found)
        current = output
    chain = Chain(
        fwd_time=[p.fwd_time for p in profiles],
        bwd_time=[p.bwd_time for p in profiles],
        x_size=[p.input_bytes for p in profiles] + [profiles[-1].output_bytes],
        xbar_size=[p.tape_bytes for p in profiles],
        fwd_tmp=[p.fwd_tmp for p in profiles],
        bwd_tmp=[p.bwd_tmp for p in profiles],
        output_in_tape=[p.output_in_tape for p in profiles],
        fwd_tape_time=[p.fwd_tape_time for p in profiles],
    )
    return Profile(chain=with_options(chain, profiles), layers=tuple(profiles), costs=costs)


def profile_layers(
    layers: Sequence[Callable],
    params: Sequence[Any],
    x: Any,
    *,
    costs: str = "static",
    progress: bool | None = None,
    input_grad: bool = True,
    policies: Any = None,
) -> Chain:
    """Rotor's chain (``solver.Chain``, sizes in bytes, times in seconds) of a layer sequence.

    ``layers[i](params[i], x[i]) -> x[i+1]``; ``params`` has one pytree per layer; leaves may
    be arrays, tracers or ``jax.ShapeDtypeStruct``. See the module docstring for how each
    field is measured, and :func:`profile_sequence` for the arguments and per-layer details.

    Raises:
      TypeError: a layer is not callable, or a leaf is not an array.
      ValueError: ``params`` and ``layers`` differ in length, ``costs`` is unknown, or a
        layer cannot be traced on its input (the message names the layer).
    """
    return profile_sequence(
        layers, params, x, costs=costs, progress=progress, input_grad=input_grad,
        policies=policies,
    ).chain
