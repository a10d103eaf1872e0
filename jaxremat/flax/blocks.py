"""``remat_blocks``: a class decorator that runs a model's list of blocks under a budget.

A model whose ``__call__`` loops over a list attribute of blocks (a transformer's
``self.blocks``) changes by the decorator line and the loop line::

    @jaxremat.flax.remat_blocks("blocks", budget="1GiB")
    class GPT(nnx.Module):
        ...
        def __call__(self, tokens):
            h = self.embed(tokens)
            h = self.run_blocks(h)          # was: for block in self.blocks: h = block(h)
            return self.head(h)

The blocks run as :func:`jaxremat.flax.run_modules` runs them (:mod:`jaxremat.flax.nnx`);
the model's state tree is unchanged (``blocks/0/...``), so existing checkpoints load.

A *scanned stack* -- one module holding the ``L`` blocks' variables stacked on axis 0, built
with ``nnx.split_rngs`` + ``nnx.vmap`` and run with ``nnx.scan`` -- takes the same decorator:
``h = self.run_blocks(h)`` replaces the ``nnx.scan`` call, and the blocks run with
:func:`jaxremat.remat_scan`'s nested-scan plan (:mod:`jaxremat.flax.scanned`; the state
tree is again unchanged). The plan is then a :class:`jaxremat.flax.scanned.ScannedPlan`.

What the budget bounds (``scope``): by default (``"model"``) the whole training step, as
:func:`jaxremat.flax.activation_memory` measures it -- embedding, blocks, head and loss;
the blocks' own budget is fitted to it (:mod:`jaxremat.flax.model_scope`). With
``scope="blocks"`` it bounds the blocks' forward and backward alone. The printed plan says
which.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
from flax import nnx

import solver

from ..budget import check_budget
from ..sequence.plan import Plan, check_settings
from ..sequence.policies import check_policies
from ..trace_state import vmap_batch_size
from ..trees import abstractify, signature
from . import model_scope
from .model_scope import SCOPES
from .nnx import plan_modules, run_modules
from .scanned import is_scanned_stack, plan_scanned, run_scanned

__all__ = ["remat_blocks"]


def remat_blocks(
    attribute: str = "blocks",
    *,
    budget: Any = None,
    scope: str = "model",
    loss: Callable[[Any], Any] | None = None,
    method: str = "rotor",
    slots: int = 500,
    costs: str = "static",
    name: str = "run_blocks",
    policies: Any = None,
) -> Callable[[type], type]:
    """Class decorator adding ``self.<name>(*args)``, which runs ``self.<attribute>`` (a
    list of modules, e.g. an ``nnx.List`` of transformer blocks) in sequence under the
    budget, as :class:`RematSequential` does, or a scanned stack (one ``nnx.vmap``-built
    module, variables stacked on axis 0) with :func:`jaxremat.remat_scan`'s nested scans
    (see the module docstring).

    Args:
      attribute: the attribute holding the blocks.
      budget: the default budget (bytes, ``"512MiB"`` or ``"40%"``). An instance attribute
        ``remat_budget``
        overrides it (``model.remat_budget = jaxremat.budget_from_device(...)``), and so
        does ``budget=`` passed to the method call. The budget must be known when the
        method first runs.
      scope: what the budget bounds. ``"model"`` (default): the whole training step of the
        model -- the layers before and after the blocks, the blocks and the loss -- as
        :func:`jaxremat.flax.activation_memory` measures it; the blocks' budget is the
        largest whose measured step fits (:mod:`jaxremat.flax.model_scope`). ``"40%"`` is
        then a share of the whole step's memory without remat. ``"blocks"``: the blocks'
        forward and backward only (their input, tapes, gradients, transients).
      loss: with ``scope="model"``, the loss of the model's outputs that the step is
        measured with (labels do not change memory: a cross-entropy against zeros measures
        what one against real labels does); default: the sum of the outputs. The loss
        counts where the step peaks at the start of its backward (its cotangents are live
        there: ``mean(out ** 2)`` holds ``2 * out`` beside the sum's broadcast of ones,
        benchmarks/RESULTS.md), so pass the training loss, or measure the exact step once
        with ``model.fit_<attribute>(loss_fn, *batch)``.
      method, slots, costs, policies: as for :class:`RematSequential` (``policies``: the
        menu of ``jax.checkpoint`` policies a block may be saved with, :mod:`jaxremat.sequence.policies`).
        For a scanned stack, ``method`` is one of :data:`jaxremat.scan.remat.SCAN_METHODS`,
        ``slots`` is unused, and ``policies`` is passed to ``remat_scan`` (an error while
        it takes none, unless ``None`` or ``()``).
      name: the name of the added method (default ``run_blocks``); also adds
        ``plan_<attribute>(*args)`` returning the :class:`jaxremat.Plan` (``args``: the
        model's arguments with ``scope="model"``, the blocks' input with ``"blocks"``; the
        printed plan says which scope it is for) and ``fit_<attribute>(loss_fn, *batch)``,
        which fits the blocks' budget to the measured step ``loss_fn(model, *batch)`` (what
        ``nnx.value_and_grad`` gets), remembers it for the training step, and returns the
        plan.

    Returns:
      The decorator; it returns the same class with the methods added (and, for
      ``scope="model"``, its ``__call__`` wrapped to note the call's arguments).
    """
    check_settings(method, costs, slots)
    if budget is not None:
        check_budget(budget)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES} (what the budget bounds: the whole "
                         f"training step or the blocks alone), got {scope!r}.")
    if loss is not None and not callable(loss):
        raise TypeError(f"loss must be a function of the model's outputs, got {loss!r}.")
    settings = dict(method=method, slots=slots, costs=costs, policies=check_policies(policies))
    # a scanned stack (nnx.vmap-built, jaxremat.flax.scanned) runs with remat_scan
    scan_settings = dict(method=method, costs=costs,
                         policies=None if policies is None else settings["policies"])
    step_loss = model_scope.summed if loss is None else loss
    step_words = ("the model's call and the sum of its outputs as the loss" if loss is None
                  else f"the model's call and {getattr(loss, '__name__', 'loss')}(outputs)")

    def budget_of(self: Any, override: Any) -> Any:
        if override is not None:
            return override
        instance = getattr(self, "remat_budget", None)
        return budget if instance is None else instance

    def blocks_of(self: Any) -> Any:
        try:
            blocks = getattr(self, attribute)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__} has no attribute {attribute!r}: remat_blocks"
                f"({attribute!r}) needs the blocks in self.{attribute} (a list of modules)."
            ) from None
        if is_scanned_stack(blocks):
            return blocks
        try:
            return list(blocks)
        except TypeError:
            raise TypeError(
                f"{type(self).__name__}.{attribute} is a {type(blocks).__name__}; "
                f"remat_blocks({attribute!r}) needs a list of modules there (e.g. nnx.List)."
            ) from None

    def owner_of(self: Any) -> str:
        return f"{type(self).__name__}.{attribute}"

    def planned(blocks: Any, args: tuple, choice: dict, owner: str) -> Plan:
        """The blocks' plan under ``choice`` (``{"budget", "method"}`` and, for a list of
        blocks, the whole step's ``"turn"``, :func:`jaxremat.flax.nnx.with_turn`; the budget
        :data:`model_scope.LEAST` is the least that the method fits)."""
        run = {**settings, **choice}
        plan_fn = plan_modules
        if is_scanned_stack(blocks):
            plan_fn = functools.partial(plan_scanned, owner=owner)
            run = {**scan_settings, **choice}
            run.pop("turn", None)  # remat_scan's family measures its members' programs
        if run["budget"] == model_scope.LEAST:
            try:
                return plan_fn(blocks, *args, **{**run, "budget": 1})
            except solver.InfeasibleBudget as error:
                run["budget"] = max(1, math.ceil(error.min_budget))
        return plan_fn(blocks, *args, **run)

    def blocks_plan(self: Any, args: tuple, chosen: Any) -> tuple[Plan, float]:
        """The blocks' plan for this call (``args``: the blocks' input) under the scope, and
        the turn it was planned with (what ``run_modules`` must plan with again)."""
        blocks = blocks_of(self)
        probing = model_scope.probe()
        if probing is not None:  # the whole step is being measured with a probed plan
            plan = planned(blocks, args, probing["choice"], owner_of(self))
            model_scope.planned_under_probe(probing, plan, model_scope.current_call(self))
            return plan, probing["choice"].get("turn", 0)
        if scope == "blocks":
            return dataclasses.replace(planned(blocks, args, {"budget": chosen}, owner_of(self)),
                                       scope=model_scope.ScopeNote("blocks")), 0
        call = model_scope.current_call(self)
        if call is None:
            raise RuntimeError(
                f"remat_blocks({attribute!r}, scope='model') bounds the model's whole step, so "
                f"self.{name} must run inside the model's __call__ (it ran outside one). Call "
                f"the model, or use scope='blocks' to bound the blocks alone.")
        choice, note, _ = fit_call(self, *call, chosen)
        return (dataclasses.replace(planned(blocks, args, choice, owner_of(self)), scope=note),
                choice.get("turn", 0))

    def call_key(self: Any, args: tuple, kwargs: dict, chosen: Any) -> tuple:
        """What a whole-step fit depends on: the model's definition and call, the budget."""
        for key, value in kwargs.items():
            if any(hasattr(leaf, "shape") for leaf in jax.tree.leaves(value)):
                raise TypeError(
                    f"remat_blocks(scope='model') measures the model's call, whose keyword "
                    f"argument {key!r} holds arrays: pass arrays positionally (keywords are "
                    f"held fixed, e.g. flags), or use scope='blocks'.")
        return (nnx.graphdef(self), signature(abstractify(args, "the model's arguments")),
                tuple(sorted(kwargs.items())), vmap_batch_size(args), chosen, attribute,
                tuple(settings.items()))

    def fit_call(self: Any, args: tuple, kwargs: dict, chosen: Any) -> tuple:
        key = call_key(self, args, kwargs, chosen)
        explicit = model_scope.fitted(key)
        if explicit is not None:
            return explicit
        return model_scope.fit(key + (step_loss,),
                               model_scope.measure_call(self, args, kwargs, step_loss), chosen,
                               batch=key[3], step=step_words, method=method)

    def run(self: Any, *args: Any, budget: Any = None) -> Any:
        chosen = budget_of(self, budget)
        check_budget(chosen)
        plan, turn = blocks_plan(self, args, chosen)
        blocks = blocks_of(self)
        if is_scanned_stack(blocks):
            return run_scanned(blocks, *args, **{**scan_settings, "budget": plan.budget,
                                                 "method": plan.method},
                               owner=owner_of(self))
        return run_modules(blocks, *args, **{**settings, "budget": plan.budget,
                                             "method": plan.method, "turn": turn})

    def plan(self: Any, *args: Any, budget: Any = None) -> Plan:
        chosen = budget_of(self, budget)
        check_budget(chosen)
        if scope == "blocks":
            return blocks_plan(self, args, chosen)[0]
        _, note, found = fit_call(self, args, {}, chosen)
        return dataclasses.replace(found, scope=note)

    def fit(self: Any, loss_fn: Callable[..., Any], *batch: Any, budget: Any = None) -> Plan:
        chosen = budget_of(self, budget)
        check_budget(chosen)
        if scope != "model":
            raise ValueError(f"fit_{attribute} fits a whole-step budget; this class was "
                             f"decorated with scope={scope!r}: use plan_{attribute}(x).")
        _, note, found = model_scope.fit_step(
            self, loss_fn, batch, chosen, method=method,
            key_of=lambda args, kwargs: call_key(self, args, kwargs, chosen))
        return dataclasses.replace(found, scope=note)

    run.__doc__ = (f"Run ``self.{attribute}`` in sequence under the activation budget "
                   "(jaxremat.flax.remat_blocks).")
    plan.__doc__ = f"The jaxremat Plan that ``self.{name}`` uses for these arguments."
    fit.__doc__ = ("Fit the blocks' budget to the measured step ``loss_fn(model, *batch)`` and "
                   "return the Plan (jaxremat.flax.remat_blocks).")

    def decorate(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, nnx.Module)):
            raise TypeError(f"remat_blocks decorates nnx.Module classes, got {cls!r}.")
        added = ((name, run), (f"plan_{attribute}", plan), (f"fit_{attribute}", fit))
        for method_name, fn in added:
            if method_name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} already defines {method_name!r}; pick another name with "
                    f"remat_blocks(..., name=...)."
                )
        for method_name, fn in added:
            fn.__name__ = method_name
            fn.__qualname__ = f"{cls.__qualname__}.{method_name}"
            setattr(cls, method_name, fn)
        if scope == "model":
            model_scope.record_calls(cls)
        return cls

    return decorate
