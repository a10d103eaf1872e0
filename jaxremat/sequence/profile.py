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
* ``x_read_size[i]`` (per option too): the bytes of the leaves of ``x[i]`` that the pullback
  of layer ``i`` reads (an input leaf that is itself a read residual, as for the output),
  with the leaves of ``x[i]`` that layer ``i-1``'s pullback reads as its output. JAX frees the
  other leaves once the forward has run (no pullback reads them): for a pre-norm block
  (``x + f(norm(x))``) nothing of ``x`` (the norm keeps ``x - mean``), for a pytree
  activation the leaves only the output needs (``skip``). ``jax.checkpoint`` policies that
  recompute from the input read all of it, so each option has its own; where layer ``i-1``
  reads its output, every option of layer ``i`` gets the largest (``solver.Chain`` asks it).
  The simulator then frees the rest of ``x[i]`` after ``F_all(i)`` (``solver.Chain.x_read_size``).
  ``x_own_read_size[i]`` (per option): the leaves the pullback of layer ``i`` alone reads.
  A copy of ``x[i]`` stored on its own (layer ``i-1`` checkpointed, whose backward reads
  its recomputed output, or its output outside its tape) is cut to it
  (``solver.Chain.x_own_read_size``).
* ``x_rec_size[i]``: the bytes of the leaves of ``x[i]`` a recomputation from layer ``i``
  reads: those the tape-only forwards of layer ``i``'s options read and those computing
  the leaves of ``x[i+1]`` the next layer's recomputation reads (per output leaf, from the
  vjp forward's jaxpr after dead-code elimination, :func:`jaxremat.measure.trace.input_deps`),
  found backwards from the last layer, with the leaves ``B(i-1)`` reads and at least every
  ``x_read_size``. ``F_ck(i)`` cuts a checkpoint to it (``solver.Chain.x_rec_size``).
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
  The input is held through the backward only where something after ``B(i)`` reads it:
  ``B(i-1)``, when some option of layer ``i-1`` reads its output, or the caller, for
  ``x[0]``. Elsewhere JAX frees the input's leaves at their last read in the pullback,
  often before ``g[i]`` is whole (a ``dots_saveable`` block reads its input to recompute,
  then never again), so the chain takes ``bwd_tmp_freed``: the same difference with the
  read input leaves counted as the pullback's inputs, in ``inputs(backward)`` too, and so
  negative where the pullback peaks before ``g[i]`` exists, down to
  ``-min(x_size[i], x_size[i+1])`` (``solver.Chain.bwd_tmp``; :func:`jaxremat.sequence.held.inputs_freed`
  decides per layer). ``remat_scan`` holds every input (``free_inputs=False``).
  ``fwd_tape_tmp[i]``: the same for the forward that builds only the tape
  (:func:`jaxremat.measure.trace.tape_forward`), what ``jax.checkpoint`` runs to recompute
  a segment's last layer while ``g[i+1]`` is held: its peak above the input and the tape it
  stores (``solver.Chain.fwd_tape_tmp``; the ``custom_vjp`` backend runs the whole forward
  there and plans with ``Chain.with_full_forwards``).
  ``fwd_ck_tmp[i]``: the same for the plain forward, which keeps no tape (``F_ck``,
  ``F_none``: ``jax.checkpoint``'s forward, and the ``custom_vjp`` backend's): its peak above
  the input, held, and the output (:func:`jaxremat.measure.trace.plain_forward_tmp`,
  ``solver.Chain.fwd_ck_tmp``). ``fwd_tmp`` counts above the whole tape, most of which
  is not yet made at that forward's peak, so charged to ``F_ck`` it fell short where the
  plain forward holds more beside ``x[i] + x[i+1]``: ``x + LayerNorm(x)`` checkpointed
  measured 512 B against 416 B predicted (tests/test_edge_inputs.py).
* ``fwd_tape_time[i]``: the cost of the forward that builds only the tape
  (:func:`jaxremat.measure.trace.tape_forward`: ``jax.vjp``'s forward cut down to the residuals the
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
  none before compiling, e.g. GPU: :mod:`jaxremat.measure.costs`): ``max(flops / PEAK_FLOPS,
  bytes_accessed / PEAK_BANDWIDTH)`` seconds, the backward lowered from the pullback on the
  residuals (at a later input shape of the same layer: counted on the jaxpr and scaled from
  the first shape's lowering, :mod:`jaxremat.sequence.calibration`). With ``costs="flops"``, the flop term alone, ``flops / PEAK_FLOPS``: the
  bytes XLA counts before fusing are those of every unfused operation, so on layers of
  modest width (a GPT block of width 128) the roofline is bandwidth-bound and ranks plans
  by traffic that fusion removes; ``"flops"`` plans for the least recomputed flops instead.
  With ``costs="measured"``, the median wall time of the jitted forward and backward on the
  default device (see :mod:`jaxremat.measure.timing`).

Where the chain and the meter differ (checked in tests/test_profile.py and
tests/test_sequence.py, shown by benchmarks/jax_memory.py). The chain follows Rotor's model,
so it is conservative where JAX frees memory earlier than the model says:

* Fixed by ``bwd_tmp_freed``: ``B(i)`` held the layer's input and tape until ``g[i]``
  exists, where JAX frees them as the backward goes; ``bwd_tmp``, clamped at zero,
  overestimated a layer whose residuals die before ``g[i]`` is made by up to
  ``x_size[i]``. Uniform ``dots_saveable`` / ``dots_with_no_batch_dims_saveable`` plans of
  the GPT, MLP and GPT-2-block stacks of ``benchmarks/policies.py`` went from 0.988-0.993
  of the prediction to 1.000 with it (``benchmarks/prediction.py``). Where the input stays
  (above), the clamped ``bwd_tmp`` remains.
* Fixed by ``x_read_size``: when neither layer ``i`` nor layer ``i+1`` reads ``x[i+1]`` in
  its backward (pre-norm residual blocks), JAX frees it after layer ``i+1``'s forward; the
  chain held it until ``B(i+1)``. The GPT and MLP stacks of ``benchmarks/jax_memory.py`` went
  from 0.955-0.98 of the prediction to 1.000 with it (benchmarks/RESULTS.md, issue 17.5).
* Fixed by ``x_own_read_size``: a checkpointed layer whose backward reads its output
  (``tanh``) made the chain hold the next layer's input, the forward's copy, until that
  layer's backward, where its own backward reads its recomputed copy: JAX frees the
  forward's after the next layer's forward when that layer's backward does not read its
  input (a pre-norm block). 15 of 100 random stacks (``tests/test_random_stacks.py``, each
  backend) measured 0.955-0.995 of their prediction; with it, all 200 plans 1.000.
* Fixed by ``x_rec_size``: a checkpoint ``x[i]`` was held whole until its segment is
  recomputed; JAX keeps only the leaves the recomputation reads (a pytree leaf that only
  the outputs need, ``skip`` of a ``{h, skip}`` stack). ``benchmarks/holdout_stack.py`` went
  from 0.82-0.97 of the prediction to 1.000 with it (issue 17.5).
* Inside a recomputation the chain stores every ``x[k]`` whole, where JAX computes only
  the leaves later recomputations read: nested plans are overestimated by those leaves.
* A pass-through leaf of a pytree activation (``(h, skip) -> (h', skip)``) is one buffer in
  JAX but is counted in both ``x[i]`` and ``x[i+1]``.
* Not modelled: the loss function's memory beyond the gradient of the sequence's output.
* Rotor's dynamic program plans with the ``output_in_tape`` flags (exactly as the
  simulator counts them), so memory an unread output would waste is used.

Options (issue 17): each layer is also profiled under the ``jax.checkpoint`` policies of
its menu; :mod:`jaxremat.sequence.options` says how.

Everything except measured timing works from shapes alone (``jax.ShapeDtypeStruct``), so a
sequence can be profiled while an outer ``jax.jit`` / ``jax.grad`` / ``jax.vmap`` traces it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from solver import Chain

from ..collector import paused
from ..measure.jaxpr_facts import shared_equations
from ..measure.trace import trace_once
from ..trees import abstractify, check_layers, check_params, leaf_bytes, tree_bytes
from .layer import (COSTS, PEAK_BANDWIDTH, PEAK_FLOPS, LayerProfile, OptionProfile, Profile,
                    forward_costs, layer_costs, roofline_time)
from .calibration import CostMeter, Uncalibrated, lowering_memo, meter_for
from .held import inputs_freed, own_read_sizes, read_sizes, rec_sizes
from .derive import deriving_tracer, recording_tracer, same_profile
from .options import Tracer, layer_options, trace, with_options
from .cache import (cache_key, cached, calibration_key, derived_key,
                    profile_cache, remember, symbolic_key, with_input_grad)
from .polymorphic import instantiating_tracer, recording_symbolic
from .policies import WHOLE_TAPE, check_policies, unbatched_menu

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


def _profile_one(
    layer: Callable, p: Any, x: Any, index: int, costs: str, repeats: int, input_grad: bool,
    menu: tuple = (), meter: CostMeter | None = None, tracer: Tracer = trace,
    memo: dict | None = None,
) -> tuple[LayerProfile, Any]:
    """Profile one layer by tracing it (:func:`_layer_profile`); a profile derived from
    another's traces calls :func:`_layer_profile` directly (it traces nothing)."""
    return _layer_profile(layer, p, x, index, costs, repeats, input_grad, menu, meter, tracer,
                          memo)


def _layer_profile(
    layer: Callable, p: Any, x: Any, index: int, costs: str, repeats: int, input_grad: bool,
    menu: tuple = (), meter: CostMeter | None = None, tracer: Tracer = trace,
    memo: dict | None = None,
) -> tuple[LayerProfile, Any]:
    """Profile one layer; ``meter`` gives the static costs of its pieces, scaled from an
    earlier shape's calibration where it has one (:mod:`jaxremat.sequence.calibration`).
    At such a shape the layer is traced once (:func:`jaxremat.measure.trace.trace_once`) and
    its options' vjps are built from that jaxpr; at the first shape every trace is of the
    layer itself (a jaxpr's replay differs in how scalar constants are held, which moves
    backward costs by a few bytes and may flip ties between equal plans). ``tracer``
    traces the layer and its options (:mod:`jaxremat.sequence.derive`). ``memo`` keeps the
    layer traced once between the two profiles of one layer at one shape (with and without
    the input's gradient, the second derived): the layer's Python runs once for both."""
    meter = meter or meter_for(None, costs)
    plain = None
    if meter.reference is not None:  # a new shape: the user's Python runs once
        once = None if memo is None else memo.get("trace_once")
        if once is None:
            once = trace_once(layer, p, x, index)
            if memo is not None:
                memo["trace_once"] = once
        layer, plain = once
    traced = tracer(layer, p, x, index, input_grad, WHOLE_TAPE)
    if plain is None and meter.scale:  # the first shape: traced from the layer itself
        plain = jax.make_jaxpr(layer)(p, x)
        if memo is not None:  # read by the symbolic traces of searched options (polymorphic.py)
            memo["plain"] = plain
    forward = forward_costs(layer, p, x, meter, plain)  # once, for the layer and its options
    profile = LayerProfile(index=index, input_bytes=tree_bytes(x),
                           output_bytes=tree_bytes(traced.output),
                           **layer_costs(layer, p, x, traced, costs, repeats, forward,
                                         meter=meter))
    if menu:
        options, dropped = layer_options(layer, p, x, profile, traced, menu, costs, repeats,
                                          input_grad, forward, meter, tracer, plain)
        profile = dataclasses.replace(profile, options=options, dropped=dropped)
    return profile, traced.output


def _profile_new(layer: Callable, p: Any, x: Any, index: int, costs: str, repeats: int,
                 input_grad: bool, menu: tuple, key: tuple) -> tuple[LayerProfile, Any]:
    """Profile a layer the cache does not hold, with the calibration of an earlier shape of
    it when there is one, and keep the calibration for later shapes. Without the input's
    gradient, at a later shape, derived from the profile with it where that was checked
    (:mod:`jaxremat.sequence.derive`; that profile is then cached too). At a later batch
    size its options' programs are instantiated from symbolic ones where the first shape
    kept them (:mod:`jaxremat.sequence.polymorphic`), else traced."""
    calibrated = calibration_key(key)
    reference = cached(calibrated, layer)
    meter = meter_for(reference[0] if reference else None, costs)
    if reference is not None and not input_grad and cached(derived_key(key), layer):
        found = _derived_profile(layer, p, x, index, costs, repeats, menu, key)
        if found is not None:
            return found
    memo: dict[str, Any] = {}  # the layer traced once at a later shape, for every attempt
    tracer, keep = trace, None
    if reference is not None and meter.scale:
        found = _instantiated(layer, p, x, index, costs, repeats, input_grad, menu, key,
                              reference[0], memo)
        if found is not None:
            return found
    elif meter.scale and input_grad:  # without: derived at later shapes (derive.py)
        tracer, keep = recording_symbolic(layer, p, x, symbolic_key(key), memo, trace)
    recorded: dict[str, Any] = {}
    check = input_grad and reference is None and meter.scale
    found = _profile_one(layer, p, x, index, costs, repeats, input_grad, menu, meter,
                         recording_tracer(recorded, tracer) if check else tracer, memo)
    if keep is not None:
        keep()
    if meter.scale and (reference is None or meter.found):
        remember(calibrated, layer, meter.calibration(), None)
    if check:
        _check_derived(layer, p, x, costs, repeats, menu, key, recorded)
    return found


def _instantiated(layer: Callable, p: Any, x: Any, index: int, costs: str, repeats: int,
                  input_grad: bool, menu: tuple, key: tuple, reference: Any, memo: dict
                  ) -> tuple[LayerProfile, Any] | None:
    """The profile at a later batch size from the options' symbolic programs
    (:func:`jaxremat.sequence.polymorphic.instantiating_tracer`), its calibration kept;
    ``None`` where there are none."""
    tracer = instantiating_tracer(layer, x, symbolic_key(key), memo, trace)
    if tracer is None:
        return None
    meter = meter_for(reference, costs)
    found = _profile_one(layer, p, x, index, costs, repeats, input_grad, menu, meter, tracer,
                         memo)
    if meter.found:
        remember(calibration_key(key), layer, meter.calibration(), None)
    return found


def _check_derived(layer: Callable, p: Any, x: Any, costs: str, repeats: int, menu: tuple,
                   key: tuple, recorded: dict[str, Any]) -> None:
    """At a layer's first shape, profiled without the input's gradient (first) and with it
    (traced into ``recorded``): mark it derivable if the profile derived from ``recorded``
    equals the traced one in every field and every piece's count term by term."""
    without = with_input_grad(key, False)
    traced = cached(without, layer)
    calibration = cached(calibration_key(without), layer)
    if traced is None or calibration is None or cached(derived_key(key), layer):
        return
    meter = CostMeter(reference=calibration[0], strict="same")
    tracer = deriving_tracer(recorded, len(jax.tree.leaves(p)), len(jax.tree.leaves(x)))
    try:
        found = _layer_profile(layer, p, x, 0, costs, repeats, False, menu, meter, tracer)
    except Uncalibrated:
        return
    if same_profile(found[0], traced[0]):
        remember(derived_key(key), layer, True, None)


def _derived_profile(layer: Callable, p: Any, x: Any, index: int, costs: str, repeats: int,
                     menu: tuple, key: tuple) -> tuple[LayerProfile, Any] | None:
    """The profile without the input's gradient at a later shape, derived from the one with
    it (profiled and cached here); ``None`` where a piece would need lowering or the layer
    fails to trace (the caller then traces it)."""
    with_grad = with_input_grad(key, True)
    calibrated = calibration_key(with_grad)
    reference = cached(calibrated, layer)
    if reference is None:
        return None
    meter = meter_for(reference[0], costs)
    recorded: dict[str, Any] = {}
    memo: dict[str, Any] = {}  # the layer traced once, for both profiles
    inner = instantiating_tracer(layer, x, symbolic_key(with_grad), memo, trace) or trace
    try:
        found = _profile_one(layer, p, x, index, costs, repeats, True, menu, meter,
                             recording_tracer(recorded, inner), memo)
    except Exception:  # noqa: BLE001 - traced again without the gradient, which names it
        return None
    remember(with_grad, layer, *found)
    if meter.found:
        remember(calibrated, layer, meter.calibration(), None)
    without = calibration_key(key)
    strict = CostMeter(reference=cached(without, layer)[0], strict="scaled")
    tracer = deriving_tracer(recorded, len(jax.tree.leaves(p)), len(jax.tree.leaves(x)))
    try:
        return _layer_profile(layer, p, x, index, costs, repeats, False, menu, strict,
                              tracer, memo)
    except Uncalibrated:
        return None


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
    free_inputs: bool = True,
    vmapped: bool = False,
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
        (:mod:`jaxremat.sequence.policies`): ``None`` for the default menu (``"dots"``,
        ``"dots_no_batch"``, ``"names"``, ``"searched"``), a sequence of names and
        callables, or ``()`` for the whole tape only (no options).
      free_inputs: whether a backward frees the input leaves it reads as it goes where
        nothing after it reads them (``LayerProfile.bwd_tmp_freed``, module docstring), as
        JAX does in an unrolled sequence; ``False`` holds every input through its backward
        (:func:`jaxremat.remat_scan`'s chain, whose loops carry whole activations).
      vmapped: whether the layers run under a ``jax.vmap`` and are profiled per example:
        the menu's searched entries, whose policies are keyed by the shapes profiled, are
        left out (:func:`jaxremat.sequence.policies.unbatched_menu`; each layer's
        ``dropped`` says so).

    Layers that are the same function object on the same shapes are profiled once, also
    across calls (:func:`profile_cache`).
    """
    layers = check_layers(layers)
    params = check_params(params, len(layers))
    if costs not in COSTS:
        raise ValueError(f"costs must be one of {COSTS}, got {costs!r}.")
    menu, notes = check_policies(policies), ()
    if vmapped:
        menu, notes = unbatched_menu(menu)
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
    sizes: list[list[int]] = []  # bytes of each leaf of x[i]
    # layer 0 is lowered without the input's gradient, then with it; no automatic garbage
    # collection meanwhile (jaxremat.collector)
    with lowering_memo(), paused():
        for i in indices:
            sizes.append([leaf_bytes(leaf) for leaf in jax.tree.leaves(current)])
            needs_input_grad = input_grad or i > 0
            key = cache_key(layers[i], abstract_params[i], current, needs_input_grad, costs, menu,
                            repeats)
            hit = memo.get(key) or cached(key, layers[i])
            if hit is None:
                with shared_equations():  # a layer's pieces share most equations
                    hit = _profile_new(layers[i], abstract_params[i], current, i, costs, repeats,
                                       needs_input_grad, menu, key)
                remember(key, layers[i], *hit)
            memo[key] = hit
            found, output = hit
            found = dataclasses.replace(found, index=i, dropped=found.dropped + notes)
            profiles.append(found)
            current = output
    freed = inputs_freed(profiles, sizes) if free_inputs else [False] * len(profiles)
    chain = Chain(
        fwd_time=[p.fwd_time for p in profiles],
        bwd_time=[p.bwd_time for p in profiles],
        x_size=[p.input_bytes for p in profiles] + [profiles[-1].output_bytes],
        xbar_size=[p.tape_bytes for p in profiles],
        fwd_tmp=[p.fwd_tmp for p in profiles],
        bwd_tmp=[p.bwd_tmp_freed if f else p.bwd_tmp for p, f in zip(profiles, freed)],
        output_in_tape=[p.output_in_tape for p in profiles],
        fwd_tape_time=[p.fwd_tape_time for p in profiles],
        fwd_tape_tmp=(None if any(p.fwd_tape_tmp is None for p in profiles)
                      else [p.fwd_tape_tmp for p in profiles]),
        fwd_ck_tmp=(None if all(p.fwd_ck_tmp is None for p in profiles)
                    else [p.fwd_tmp if p.fwd_ck_tmp is None else p.fwd_ck_tmp
                          for p in profiles]),
    )
    reads = read_sizes(profiles, sizes)
    own = own_read_sizes(profiles, sizes, reads)
    chain = dataclasses.replace(chain, x_read_size=[r[0] for r in reads],
                                x_rec_size=rec_sizes(profiles, sizes, reads),
                                x_own_read_size=[r[0] for r in own])
    chain = with_options(chain, profiles, reads, freed, own)
    return Profile(chain=chain, layers=tuple(profiles), costs=costs)


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
