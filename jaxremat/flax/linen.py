"""Flax Linen: ``RematSequential(layers=..., budget=...)``, a rematerializing ``nn.Sequential``.

::

    model = jaxremat.flax.linen.RematSequential(
        layers=[Block(256) for _ in range(12)], budget="256MiB")
    variables = model.init({"params": key, "dropout": key2}, x)
    y, updates = model.apply(variables, x, rngs={"dropout": key3}, mutable=["batch_stats"])

How: ``model.init`` runs the layers plainly (the variables do not exist yet). Under
``model.apply``, each layer (a bound submodule, or a plain function such as ``nn.relu``) is
profiled as the pure function ``(variables, x) -> layer.apply(variables, x)`` of its own
variables -- from shapes, with placeholder keys for the RNG streams the call was given -- and
solved by ``solver.solve`` (:func:`jaxremat.flax.nnx.plan_pure_layers`: the profile is cached per
layer definitions, RNG stream names and input signature, the plan per budget). The plan is applied by :func:`jaxremat.sequence.apply.apply_plan` with Linen's
lifted ``nn.remat`` (``prevent_cse=True``) nested as the plan nests. ``nn.remat`` lifts
every variable collection and RNG stream, so:

* mutable collections such as ``batch_stats`` are updated once per step, by the forward
  pass (the backward's recomputation only recomputes activations);
* ``nn.Dropout`` draws the same masks in the forward pass and in the recomputation
  (the lifted scope replays the same RNG), so gradients equal the plain model's;
* train/eval flags (``deterministic``, ``use_running_average``) are module attributes, part
  of the layer definitions, so each mode gets its own profile and plan.

The budget bounds what the layers' forward and backward passes hold (input, stored
activations and tapes, gradients flowing back, transients), not parameters, their gradients
or the optimizer state (:mod:`jaxremat.sequence.remat`).

Calling convention (``nn.Sequential``'s): the first layer receives the call's positional
arguments; a tuple output is passed on as positional arguments, a dict as keyword arguments.
Layers that create modules inline (lambdas relying on ``nn.compact`` shape inference) are not
supported: give each layer as a module.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax

from ..sequence.apply import apply_plan
from ..sequence.plan import Plan, check_settings
from ..sequence.policies import check_policies
from ..budget import check_budget
from ..trees import leaf_bytes
from .nnx import call_with_convention, plan_pure_layers, shared_function

__all__ = ["RematSequential"]


def _pure_module_call(module: nn.Module, rng_names: tuple[str, ...], variables: Any,
                      activation: Any) -> Any:
    """``module.apply`` as a pure function of its variables (the profiled layer)."""
    rngs = {name: jax.random.key(0) for name in rng_names}

    def call(bound: nn.Module, activation: Any) -> Any:
        return call_with_convention(bound, activation)

    output, _ = module.apply(variables, activation, rngs=rngs, mutable=True, method=call)
    return output


def _pure_function_call(fn: Callable, variables: Any, activation: Any) -> Any:
    del variables
    return call_with_convention(fn, activation)


def _layer_call(index: int, owner: "RematSequential", activation: Any) -> Any:
    """Layer ``index`` of ``owner`` (the bound module, possibly a lifted copy) on the input."""
    return call_with_convention(owner.layers[index], activation)


def _segment_transform(body: Callable) -> Callable:
    """A checkpointed segment as Linen's lifted ``nn.remat`` over the owning module.

    :func:`apply_plan` passes the segment's ``params`` (here: the owner module, once per
    layer); ``nn.remat`` takes a function of the module, so the body gets the lifted module
    in each slot.
    """

    def segment(owners: tuple, activation: Any) -> Any:
        count = len(owners)

        def lifted(owner: nn.Module, activation: Any) -> Any:
            return body((owner,) * count, activation)

        return nn.remat(lifted, prevent_cse=True)(owners[0], activation)

    return segment


def _option_transform(layer: Callable, policy: Any) -> Callable:
    """A layer saved under a checkpoint policy as Linen's lifted ``nn.remat`` over the owner."""
    return nn.remat(layer, policy=policy, prevent_cse=True)


class RematSequential(nn.Module):
    """``nn.Sequential`` that rematerializes optimally under an activation-memory budget.

    Attributes:
      layers: Linen modules or plain functions (``nn.relu``), applied in order.
      budget: bytes, a string such as ``"512MiB"``, or a share of the no-remat memory such
        as ``"40%"`` (see the module docstring).
      method: ``"rotor"`` (optimal) or a baseline (``"none"``, ``"every_layer"``,
        ``"sqrt"``, ``"revolve"``).
      slots: memory discretisation of the dynamic program.
      costs: ``"static"`` (roofline from shapes) or ``"measured"`` (timed on the device).
      policies: the menu of ``jax.checkpoint`` policies a layer may be saved with, as for
        :func:`jaxremat.remat_sequence` (``None``: the default menu; ``()``: none).

    ``model.apply(variables, x, method="plan")`` returns the :class:`jaxremat.Plan` that a
    call on ``x`` uses (``print`` it for the per-layer decisions).
    """

    layers: Sequence[Callable[..., Any]]
    budget: Any = None
    method: str = "rotor"
    slots: int = 500
    costs: str = "static"
    policies: Any = None

    def __post_init__(self) -> None:
        # Check the settings when the module is built, not at its first apply.
        if self.layers is None or not len(self.layers):
            raise ValueError("RematSequential needs at least one layer: pass layers=[...].")
        for i, layer in enumerate(self.layers):
            if not callable(layer):
                raise TypeError(
                    f"layers[{i}] is a {type(layer).__name__}; each layer must be an nn.Module "
                    "or a callable."
                )
        check_budget(self.budget)
        check_settings(self.method, self.costs, self.slots)
        check_policies(self.policies)
        super().__post_init__()

    def _pure_layers(self) -> tuple[tuple, tuple, list]:
        """``(keys, functions, variables)`` of the layers as pure functions."""
        # The RNG streams this call was given (e.g. "dropout"): the profile uses
        # placeholder keys for them.
        rng_names = tuple(sorted(getattr(self.scope, "rngs", None) or ()))
        keys, fns, variables = [], [], []
        for i, layer in enumerate(self.layers):
            if isinstance(layer, nn.Module):
                unbound = layer.clone(parent=None, name=None)
                key = ("linen", unbound, rng_names)
                fns.append(shared_function(key, lambda: functools.partial(
                    _pure_module_call, unbound, rng_names)))
                variables.append(dict(layer.variables))
            elif callable(layer):
                key = ("linen-callable", layer)
                fns.append(shared_function(key, lambda: functools.partial(
                    _pure_function_call, layer)))
                variables.append(None)
            else:
                raise TypeError(
                    f"layers[{i}] is a {type(layer).__name__}; each layer must be an nn.Module "
                    "or a callable."
                )
            keys.append(key)
        return tuple(keys), tuple(fns), variables

    def plan(self, *args: Any) -> Plan:
        """The :class:`jaxremat.Plan` for a call on ``args`` (cached); needs bound variables
        (call through ``model.apply(variables, x, method="plan")``)."""
        check_budget(self.budget)
        if not self.layers:
            raise ValueError("RematSequential has no layers.")
        keys, fns, variables = self._pure_layers()
        activation = tuple(args)  # the first layer is called f(*args), as Sequential does
        return plan_pure_layers(keys, fns, variables, activation, budget=self.budget,
                                method=self.method, slots=self.slots, costs=self.costs,
                                backend="nn.remat", policies=self.policies,
                                key_bytes=self._key_bytes())

    def _key_bytes(self) -> int:
        """Bytes of the RNG keys this call was given (one per stream).

        ``nn.remat`` passes a stream's key into each checkpointed segment that draws from
        it, so a recomputed ``nn.Dropout`` keeps the key alive until its backward, where the
        plain run drops it after the forward (the layers' profile, with keys made inside the
        layer, does not see it): :func:`jaxremat.sequence.plan.solve_plan` counts it.
        """
        rngs = (getattr(self.scope, "rngs", None) or {}).values()
        return sum(leaf_bytes(getattr(lazy, "rng", lazy)) for lazy in rngs)

    def __call__(self, *args: Any) -> Any:
        """Run the layers on ``args`` under the budget (plainly while initializing)."""
        activation = tuple(args)  # the first layer is called f(*args), as Sequential does
        if self.is_initializing():
            for layer in self.layers:
                activation = call_with_convention(layer, activation)
            return activation
        plan = self.plan(*args)
        fns = [functools.partial(_layer_call, i) for i in range(len(self.layers))]
        owners = [self] * len(self.layers)
        return apply_plan(plan.schedule.plan, fns, owners, activation,
                          transform=_segment_transform, policies=plan.policies,
                          option_transform=_option_transform)


