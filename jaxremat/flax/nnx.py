"""Flax NNX: run a sequence of modules under an activation-memory budget.

Two forms, one mechanism:

* :class:`RematSequential` -- a drop-in for ``nnx.Sequential``::

      model = jaxremat.flax.RematSequential(block1, block2, ..., budget="256MiB")
      y = model(x)

* :func:`jaxremat.flax.remat_blocks` (:mod:`jaxremat.flax.blocks`) -- a class decorator
  for a model whose ``__call__`` loops over a list attribute of blocks; it runs them with
  :func:`run_modules`.

How: when a call is traced, each layer is split (``nnx.split``) into a graph definition and
its state, and the pure functions ``(state, x) -> merge(graphdef, state)(x)`` are profiled
by :func:`jaxremat.sequence.profile.profile_sequence` and solved by ``solver.solve`` (shapes only; the
profile is cached per graph definitions and input signature, the plan per budget, so a
training step under ``nnx.jit`` profiles once and changing the budget only re-solves). The solver's plan is
then applied by :func:`jaxremat.sequence.apply.apply_plan` with Flax's lifted ``nnx.remat``
(``prevent_cse=True``) as the checkpoint transform, nested as the plan nests, over the
sub-lists of modules. ``nnx.remat`` propagates state updates made inside it, so:

* ``nnx.BatchNorm`` running statistics are updated once per step, by the forward pass; the
  recomputation during the backward pass recomputes activations only (its state outputs
  are not used), so the statistics equal those of the same model without remat.
* ``nnx.Dropout`` draws from its ``nnx.Rngs`` stream in the forward pass; the recomputation
  replays the same key state, so its masks are identical and gradients equal the plain
  model's for the same seed.
* ``model.train()`` / ``model.eval()`` (``deterministic``, ``use_running_average``) change
  the graph definition, hence the profile and plan are taken for that mode.

The budget bounds what the blocks' forward and backward passes hold (their input, stored
activations and tapes, gradients flowing back, transients), not parameters, their
gradients, optimizer state, nor the layers before or after the sequence
(:mod:`jaxremat.sequence.remat`). It is bytes, a string such as ``"512MiB"``
(:func:`jaxremat.parse_budget`), or a percentage such as ``"40%"`` of the memory the sequence
needs without remat. :func:`jaxremat.budget_from_device` derives one from the device.
Shapes are the global (logical) shapes, so under data parallelism over ``n`` devices the
budget covers the whole batch: pass ``n`` times the per-device budget. Under ``nnx.vmap``
(or ``jax.vmap``) the budget means the whole batch, as for :func:`jaxremat.remat_sequence`:
the blocks are profiled per example and solved with ``budget / batch``; with a ``jit``
between the ``vmap`` and the call (``vmap(jit(f))``) the batch cannot be seen and the
budget means one example.

Calling convention (``nnx.Sequential``'s): the first layer receives the call's positional
arguments; a layer returning a tuple passes it to the next layer as positional arguments, a
dict as keyword arguments, anything else as the single argument.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable, Sequence

import numpy as np
from flax import nnx

from solver.chain.options import base_forward_tmp

from ..sequence.apply import apply_plan
from ..budget import check_budget
from ..lru import LRU
from ..sequence.plan import Plan, check_settings, solve_plan
from ..sequence.policies import check_policies
from ..sequence.profile import Profile, profile_sequence
from ..trace_state import is_differentiated, vmap_batch_size
from ..trees import abstractify, leaf_shapes, signature

__all__ = ["RematSequential", "plan_modules", "run_modules"]

_CACHE_SIZE = 128
_profiles = LRU(_CACHE_SIZE)  # profile key -> Profile
_plans = LRU(_CACHE_SIZE)  # plan key -> Plan
_pure_fns = LRU(_CACHE_SIZE)  # layer definition -> its pure function
_planning = threading.RLock()
"""Held while a missing plan is profiled and solved, so that concurrent calls with the same
shapes profile once; reentrant: a layer may itself run a RematSequential."""
_making = threading.Lock()  # get-or-make of one pure function per layer definition


def shared_function(key: Any, make: Callable[[], Callable]) -> Callable:
    """One function object per layer definition ``key`` (``make()`` builds it the first
    time), so that identical layers are profiled once (the profiler memoises by function)."""
    with _making:
        fn = _pure_fns.get(key)
        if fn is None:
            fn = make()
            _pure_fns.put(key, fn)
    return fn


def call_with_convention(layer: Callable, activation: Any) -> Any:
    """Call ``layer`` on an activation with ``nnx.Sequential``'s convention."""
    if isinstance(activation, tuple):
        return layer(*activation)
    if isinstance(activation, dict):
        return layer(**activation)
    return layer(activation)


def _merged_call(graphdef: nnx.GraphDef, state: Any, activation: Any) -> Any:
    return call_with_convention(nnx.merge(graphdef, state), activation)


def _stateless_call(layer: Callable, state: Any, activation: Any) -> Any:
    del state
    return call_with_convention(layer, activation)


def _pure(layer: Any) -> tuple[Any, Callable, Any]:
    """``(key, pure_fn, state)`` of one layer, ``pure_fn(state, x) -> y``.

    Modules are split into graph definition and state; equal graph definitions share one
    function object, so identical blocks are profiled once. Plain callables (``nnx.relu``)
    have no state.
    """
    if isinstance(layer, nnx.Module):
        graphdef, state = nnx.split(layer)
        return graphdef, shared_function(
            graphdef, lambda: functools.partial(_merged_call, graphdef)), state
    if not callable(layer):
        raise TypeError(f"A layer must be an nnx.Module or a callable, got {type(layer).__name__}.")
    key = ("callable", layer)
    return key, shared_function(key, lambda: functools.partial(_stateless_call, layer)), None


def plan_pure_layers(
    keys: tuple,
    fns: Sequence[Callable],
    params: Sequence[Any],
    activation: Any,
    *,
    budget: Any,
    method: str,
    slots: int,
    costs: str,
    backend: str,
    policies: Any = None,
    key_bytes: int = 0,
    turn: float = 0,
) -> Plan:
    """Profile pure layers ``fns[i](params[i], x)`` and solve them under ``budget``.

    ``keys`` identifies the layers' definitions (NNX graph definitions, Linen modules): the
    profile is cached per ``keys``, input signature and ``costs`` -- independently of the
    budget, so changing the budget only re-runs the solver -- and the plan per profile,
    ``vmap`` batch, budget, method and slots. Works from shapes, so it runs while JAX traces
    a step. Under ``jax.vmap``/``nnx.vmap`` (seen on the tracers of ``activation`` or of
    ``params``: an ensemble batches only the params) the layers
    are profiled per example and the budget still means the whole batch; the input's
    gradient is planned for only when ``activation`` is being differentiated
    (:mod:`jaxremat.trace_state`). ``key_bytes``: RNG key bytes a recomputed layer keeps
    alive (:func:`jaxremat.sequence.plan.solve_plan`). ``turn``: what the step holds beside
    the layers where it turns from forward to backward (:func:`with_turn`; ``remat_blocks``'
    whole-step scope), per example.
    """
    check_budget(budget)
    batch = vmap_batch_size((params, activation))  # an ensemble batches the params only
    input_grad = is_differentiated(activation)
    abstract_params = [abstractify(p, f"the state of layer {i}") for i, p in enumerate(params)]
    abstract_x = abstractify(activation, "the sequence input")
    menu = check_policies(policies)
    profile_key = (keys, signature(abstract_params), signature(abstract_x), costs, input_grad, menu,
                   batch > 1)
    plan_key = (profile_key, batch, budget, method, slots, key_bytes, turn)
    plan = _plans.get(plan_key)
    if plan is not None:
        return plan
    with _planning:  # the first of concurrent callers plans; the others find its plan
        plan = _plans.get(plan_key)
        if plan is not None:
            return plan
        profile = _profiles.get(profile_key)
        if profile is None:
            try:
                profile = profile_sequence(list(fns), abstract_params, abstract_x, costs=costs,
                                           input_grad=input_grad, policies=menu,
                                           vmapped=batch > 1)
            except TypeError as error:
                _raise_side_inputs_hint(error, activation)
                raise
            _profiles.put(profile_key, profile)
        plan = solve_plan(with_turn(profile, turn), budget, method=method, slots=slots,
                          backend=backend, batch_size=batch, input_grad=input_grad,
                          input_shapes=leaf_shapes(abstract_x), key_bytes=key_bytes)
        _plans.put(plan_key, plan)
    return plan


def with_turn(profile: Profile, turn: float) -> Profile:
    """``profile`` with ``turn`` bytes charged where the step turns from forward to backward.

    Within a whole training step, what comes after the layers (a model's head and loss: its
    logits and their gradient) runs between the last layer's forward and its backward,
    beside everything the layers keep then, the last layer's tape included. Rotor models it
    as the chain's loss layer (Beaumont et al. 2019, section 3); the chain here has a loss
    op of no memory of its own, so ``turn`` (:func:`jaxremat.flax.model_scope._turn`) is
    charged to the forwards that precede it, those of the last layer before ``g[L]`` exists:
    ``fwd_tmp[L-1]`` (every option) and ``fwd_ck_tmp[L-1]`` grow by ``turn``, while the
    tape-only forward that recomputes the last layer after the loss (``fwd_tape_tmp``, made
    explicit here) does not. Without it the last block's whole tape looks nearly free
    (its backward follows at once) and plans keep it, while the measured step pays the
    head on top: at the memory of ``nnx.remat`` on every block, the fits of a 6-block
    Llama and GPT cost as much as every-layer checkpointing (1.247x and 1.266x the plain
    step's flops); with it, plans of 1.207x and 1.225x fit there (CPU,
    ``benchmarks/model_budget.py``).
    """
    if turn <= 0:
        return profile
    chain = profile.chain
    base = base_forward_tmp(chain)  # the tape-only forward after the loss: unchanged
    fwd_tmp = np.array(chain.fwd_tmp)
    fwd_tmp[-1] += turn
    ck_tmp = np.array(chain.ck_tmp)
    ck_tmp[-1] += turn
    options = chain.options
    if options is not None:
        option_tmp = np.array(options.fwd_tmp)
        option_tmp[-1] += turn
        options = dataclasses.replace(options, fwd_tmp=option_tmp,
                                      fwd_tape_tmp=np.where(options.valid, base, 0.0))
    chain = dataclasses.replace(chain, fwd_tmp=fwd_tmp, fwd_ck_tmp=ck_tmp, options=options,
                                fwd_tape_tmp=base[:, 0])
    return dataclasses.replace(profile, chain=chain)


def _raise_side_inputs_hint(error: TypeError, activation: Any) -> None:
    """Raise ``error`` with Flax's ``Sequential`` convention explained where it is the likely
    cause: a layer after the first failed to trace (a missing argument) while the first was
    given several arguments -- e.g. blocks that each take ``(h, positions)``, of which only
    the first gets the positions. Returns when that is not the case."""
    index = getattr(error, "layer_index", 0)
    if index < 1 or not (isinstance(activation, tuple) and len(activation) > 1):
        return
    raise TypeError(
        f"{error}\nThe layers run as Flax's Sequential runs them: layer 0 is called with the "
        f"{len(activation)} arguments given, each later layer with the previous layer's output "
        "alone (a tuple is passed as positional arguments). A block that takes inputs beside "
        "the activation (positions, rotary tables, a mask) must return them with its output "
        "(`return h, positions`, and the model unpacks the last block's), or compute them "
        "itself.") from error


def plan_modules(
    layers: Sequence[Any],
    *args: Any,
    budget: Any,
    method: str = "rotor",
    slots: int = 500,
    costs: str = "static",
    policies: Any = None,
    turn: float = 0,
) -> Plan:
    """The :class:`jaxremat.Plan` for running ``layers`` on ``args`` under ``budget``.

    ``layers`` are NNX modules or plain callables; ``args`` the first layer's positional
    arguments. Profiling works from shapes; the result is cached per graph definitions and
    input signature. Raises :class:`solver.InfeasibleBudget` when nothing fits. ``turn``:
    bytes the step holds beside the layers at its turn (:func:`with_turn`).
    """
    check_budget(budget)
    if not layers:
        raise ValueError("There are no layers to run: pass at least one module.")
    activation = tuple(args)  # the first layer is called f(*args), as Sequential does
    keys, fns, states = zip(*(_pure(layer) for layer in layers))
    return plan_pure_layers(keys, fns, states, activation, budget=budget, method=method,
                            slots=slots, costs=costs, backend="nnx.remat", policies=policies,
                            turn=turn)


def _segment_transform(body: Callable) -> Callable:
    """A checkpointed segment as Flax's lifted ``nnx.remat`` (state updates propagate)."""

    def segment(modules: Any, x: Any) -> Any:
        return body(modules, x)

    return nnx.remat(segment, prevent_cse=True)


def _option_transform(layer: Callable, policy: Any) -> Callable:
    """A layer saved under a checkpoint policy as Flax's lifted ``nnx.remat``."""
    return nnx.remat(layer, policy=policy, prevent_cse=True)


def run_modules(
    layers: Sequence[Any],
    *args: Any,
    budget: Any,
    method: str = "rotor",
    slots: int = 500,
    costs: str = "static",
    policies: Any = None,
    turn: float = 0,
) -> Any:
    """Run ``layers`` in sequence on ``args`` with the rematerialization plan of
    :func:`plan_modules`, applied with nested ``nnx.remat``.

    The result, its gradients (``nnx.grad``/``nnx.value_and_grad``) and the state updates of
    the modules (batch statistics, RNG counters) equal those of running the layers plainly.
    """
    plan = plan_modules(layers, *args, budget=budget, method=method, slots=slots, costs=costs,
                        policies=policies, turn=turn)
    activation = tuple(args)  # the first layer is called f(*args), as Sequential does
    # apply_plan calls fns[i](params[i], x): for a module, params[i] is the module itself
    # (nnx.remat lifts it and propagates its state updates); a plain callable has None.
    modules = [layer if isinstance(layer, nnx.Module) else None for layer in layers]
    fns = [call_with_convention if isinstance(layer, nnx.Module) else functools.partial(
        _stateless_call, layer) for layer in layers]
    return apply_plan(plan.schedule.plan, fns, modules, activation, transform=_segment_transform,
                      policies=plan.policies, option_transform=_option_transform)


class RematSequential(nnx.Sequential):
    """``nnx.Sequential`` that rematerializes optimally under an activation-memory budget.

    Args:
      *layers: NNX modules or plain callables (e.g. ``nnx.relu``), applied in order.
      budget: bytes, a string such as ``"512MiB"``, or a share of the no-remat memory such
        as ``"40%"``; see the module docstring for what it bounds. A static attribute: ``model.budget = ...`` changes it (outside
        ``nnx.jit``).
      method: ``"rotor"`` (optimal) or a baseline (``"none"``, ``"every_layer"``,
        ``"sqrt"``, ``"revolve"``).
      slots: memory discretisation of the dynamic program.
      costs: ``"static"`` (roofline from shapes) or ``"measured"`` (timed on the device).
      policies: the menu of ``jax.checkpoint`` policies a layer may be saved with, as for
        :func:`jaxremat.remat_sequence` (``None``: the default menu; ``()``: none).

    ``model.plan(x)`` returns the :class:`jaxremat.Plan` a call on ``x`` uses;
    ``print(model.plan(x))`` shows the per-layer decisions.
    """

    def __init__(
        self,
        *layers: Any,
        budget: Any,
        method: str = "rotor",
        slots: int = 500,
        costs: str = "static",
        policies: Any = None,
    ) -> None:
        check_budget(budget)
        check_settings(method, costs, slots)
        policies = check_policies(policies)
        for i, layer in enumerate(layers):
            if not callable(layer):
                raise TypeError(
                    f"layers[{i}] is a {type(layer).__name__}; each layer must be an NNX module "
                    "or a callable."
                )
        super().__init__(*layers)
        self.budget = budget
        self.method = method
        self.slots = slots
        self.costs = costs
        self.policies = policies

    def _settings(self) -> dict[str, Any]:
        return dict(budget=self.budget, method=self.method, slots=self.slots, costs=self.costs,
                    policies=self.policies)

    def plan(self, *args: Any) -> Plan:
        """The :class:`jaxremat.Plan` for a call on ``args`` (cached)."""
        return plan_modules(list(self.layers), *args, **self._settings())

    def __call__(self, *args: Any) -> Any:  # type: ignore[override]
        """Run the layers on ``args`` under the budget (see the class docstring)."""
        return run_modules(list(self.layers), *args, **self._settings())

    def __iter__(self):
        raise TypeError(
            "Iterating over a RematSequential would run its layers without the schedule; "
            "call it instead (model(x)), or iterate over model.layers if you really mean to."
        )

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index: int) -> Any:
        return self.layers[index]
