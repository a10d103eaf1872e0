"""A budget for the whole training step of a model whose blocks :func:`remat_blocks` runs.

``remat_blocks(..., scope="model")`` (the default) reads the budget as a bound on the whole
training step -- the layers before the blocks (embedding), the blocks, the layers after
them (head) and the loss -- which is what a user sees on the device, rather than on the
blocks alone (``scope="blocks"``). Only the blocks are rematerialized, so the step's memory
is a function of the blocks' budget ``b``:

* ``measured(b)`` is :func:`jaxremat.flax.activation_memory` of the step (program order,
  parameters and their gradients excluded) with the blocks planned under ``b``;
* ``b`` ranges from the blocks' least feasible budget to their no-remat peak; the largest
  ``b`` whose measurement fits the budget is found by bisection, as
  :mod:`jaxremat.graph.budget` does for ``remat_graph`` (the measurement is a step function
  of ``b``, growing with it); a schedule measured before is not measured again;
* every-layer checkpointing is measured too (for ``method="rotor"``): the chain's predicted
  peaks are not the measured ones, and at the memory ``nnx.remat`` on every block uses, the
  bisection alone found a nested plan with 10 % more flops on the GPT example; and so is
  each uniform option plan (``method="uniform:<policy>"``: every block under one policy,
  what a user picks by hand) predicted above the largest budget the bisection found to
  fit: the measurement is not monotone in the blocks' budget (the blocks' predicted peak
  and the memory held around them peak at different times), and at the memory of
  ``dots_with_no_batch_dims_saveable`` on every block of that GPT the bisection settled on
  a plan with 0.4 % more flops than the policy, whose own plan measures less but is
  predicted 1 % above Rotor's. The answer is the candidate
  of least predicted time whose measurement fits;
* for ``method="rotor"`` the blocks are planned with the step's *turn* charged
  (:func:`_turn`, :func:`jaxremat.flax.nnx.with_turn`): the head and loss run between the
  last block's forward and its backward, beside the last block's tape, which the blocks'
  chain alone finds nearly free to keep.

Guarantee: the measured step of the chosen plan is at most the budget. The step measured is
either the model's call with a loss of its outputs (``loss=``, default their sum: the loss
``remat_graph`` measures with), found when ``run_blocks`` is first traced, or, exactly, the
user's ``loss_fn(model, *batch)`` given to ``model.fit_blocks(loss_fn, *batch)`` before
training; a fit is cached per model definition, call signature and budget.

While a step is measured, ``run_blocks`` plans under the probed ``b`` (a thread-local
*probe*), and the decorated ``__call__`` records its arguments so that ``run_blocks``, which
only sees the blocks' input, knows the call it belongs to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp

import solver

from ..budget import format_bytes, resolve_budget
from ..lru import LRU
from ..sequence.options import option_aliases
from ..sequence.plan import Plan
from .meter import activation_memory

__all__ = ["SCOPES", "ScopeNote", "record_calls", "current_call", "probe", "fit", "fit_step",
           "fitted", "summed", "measure_call", "LEAST", "NO_REMAT"]

SCOPES = ("model", "blocks")

LEAST = "least"  # a blocks' budget: the least that the method fits
NO_REMAT = "100%"  # a blocks' budget: store everything
_STEPS = 8
_ROOM_STEPS = 2  # probes at the room left below the budget, after the bisection
_CACHE_SIZE = 128


@dataclasses.dataclass(frozen=True)
class ScopeNote:
    """What a plan's budget covers, for :meth:`jaxremat.Plan.report`.

    Attributes:
      scope: ``"model"`` (the whole training step) or ``"blocks"`` (the blocks only).
      budget: with ``"model"``, the whole step's budget in bytes.
      measured: the whole step's measured memory with this plan (bytes).
      no_remat: the whole step's measured memory without remat (bytes).
      step: what was measured, in words.
    """

    scope: str
    budget: int | None = None
    measured: int | None = None
    no_remat: int | None = None
    step: str = ""

    def lines(self) -> list[str]:
        if self.scope == "blocks":
            return ["  scope           the blocks only (scope='blocks'): not the layers around "
                    "them, nor the loss"]
        lines = [
            f"  scope           the whole training step ({self.step}), measured with "
            "activation_memory",
            f"  whole step      {format_bytes(self.measured)} of a {format_bytes(self.budget)} "
            f"budget (no remat: {format_bytes(self.no_remat)}); the blocks' budget below is "
            "what fits it",
        ]
        if self.budget > self.no_remat:
            lines.append("  note            the budget exceeds what the plain model needs: "
                         "nothing is recomputed")
        return lines


class _State(threading.local):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple, dict]] = []
        self.probes: list[dict] = []


_state = _State()
_fits = LRU(_CACHE_SIZE)  # key -> (choice, note, plan) of fit
_fitting = threading.RLock()
"""Held while a missing fit is searched, so that concurrent calls measure once; reentrant:
the measured step may run other remat_blocks models."""


def record_calls(cls: type) -> None:
    """Wrap ``cls.__call__`` so that :func:`current_call` can see a call's arguments."""
    original = cls.__call__

    @functools.wraps(original)
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _state.calls.append((self, args, kwargs))
        try:
            return original(self, *args, **kwargs)
        finally:
            _state.calls.pop()

    cls.__call__ = __call__


def current_call(model: Any) -> tuple[tuple, dict] | None:
    """The arguments of the innermost running ``model(...)`` call, or ``None``."""
    for entry, args, kwargs in reversed(_state.calls):
        if entry is model:
            return args, kwargs
    return None


def probe() -> dict | None:
    """The probe of the measurement running now, or ``None``: ``{"choice": {"budget": b,
    "method": m}, "plan": ..., "call": ...}``; ``run_blocks`` plans with ``choice`` and
    writes the plan and the model call it belongs to."""
    return _state.probes[-1] if _state.probes else None


@contextlib.contextmanager
def _probing(choice: dict) -> Iterator[dict]:
    entry = {"choice": choice, "plan": None, "call": None}
    _state.probes.append(entry)
    try:
        yield entry
    finally:
        _state.probes.pop()


def summed(out: Any) -> jax.Array:
    """The sum of the floating-point leaves of ``out``: the default loss to measure with."""
    leaves = [jnp.sum(jnp.real(leaf)) for leaf in jax.tree.leaves(out)
              if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)]
    return sum(leaves, jnp.zeros((), jnp.float32))


class _Known(Exception):
    """Raised by :func:`planned_under_probe` to stop a measurement whose blocks' schedule
    was measured before: the trace stops at the blocks, and the known value is reused."""


def planned_under_probe(entry: dict, plan: Any, call: Any) -> None:
    """Note the blocks' plan and the model call in the probe ``entry``; stop the
    measurement (:class:`_Known`) when this schedule has been measured already."""
    entry["plan"], entry["call"] = plan, call
    if _schedule_key(plan) in entry["known"]:
        raise _Known()


def _schedule_key(plan: Any) -> str:
    return repr((plan.chain.length, plan.schedule.plan))


def _measurer(measure: Callable[[], int]) -> Callable[[dict], tuple[int, dict]]:
    """Measure the step with the blocks planned by ``choice``: ``(bytes, probe entry)``.
    Bisection often lands on a schedule already measured; that measurement is reused."""
    known: dict[str, int] = {}

    def measured(choice: dict) -> tuple[int, dict]:
        with _probing(choice) as entry:
            entry["known"] = known
            try:
                value = int(measure())
            except _Known:
                value = known[_schedule_key(entry["plan"])]
        if entry["plan"] is not None:
            known[_schedule_key(entry["plan"])] = value
        if entry["plan"] is None:
            raise RuntimeError(
                "run_blocks did not run inside the model's __call__ while the step was "
                "measured: call it from __call__ (and the model from the loss), or use "
                "remat_blocks(..., scope='blocks').")
        return value, entry
    return measured


def _search(measured: Callable[[dict], tuple[int, dict]], budget: Any, *, method: str,
            batch: int, step: str) -> tuple[dict, ScopeNote, Any]:
    """The fastest blocks' plan (least predicted time) whose measured step fits ``budget``.

    Candidates: ``method`` at the blocks' least budget, then at budgets bisected between
    that and their no-remat peak (the largest that fits is the fastest of these), then at
    the largest that fits plus the room its measured step leaves below ``budget``, or half
    way to the least that does not fit if nearer (:data:`_ROOM_STEPS` times: the bisection
    stops within 1% of the peak), and, for
    ``"rotor"``, every-layer checkpointing (the chain's predicted peaks are not the
    measured ones, so the bisection alone can miss a baseline that fits). Returns
    ``(choice, note, plan)``: the blocks' ``{"budget", "method"}`` (an int budget is for
    the whole ``vmap`` batch), what the plan prints, and the blocks' plan (per example).
    """
    plain, entry = measured({"budget": NO_REMAT, "method": method})
    limit = resolve_budget(budget, plain * batch) / batch  # per example, as measured
    note = functools.partial(ScopeNote, "model", int(limit * batch), no_remat=plain * batch,
                             step=step)
    if plain <= limit:
        return {"budget": NO_REMAT, "method": method}, note(measured=plain * batch), entry["plan"]
    top = entry["plan"].no_remat_peak
    turn = _turn(measured, plain, entry["plan"]) if method == "rotor" else 0
    fitting, tried = [], []

    def consider(choice: dict) -> tuple[bool, Any]:
        if turn:
            choice = dict(choice, turn=turn)
        value, seen = measured(choice)
        tried.append(value)
        if value <= limit:
            fitting.append((seen["plan"].predicted_time, value, choice, seen["plan"]))
        return value <= limit, seen["plan"]

    fits, least = consider({"budget": LEAST, "method": method})
    if fits:
        low, high, at_low = least.budget, top, tried[-1]
        for _ in range(_STEPS):
            if high - low <= 0.01 * top:
                break
            middle = int((low + high) // 2)
            if consider({"budget": middle, "method": method})[0]:
                low, at_low = middle, tried[-1]
            else:
                high = middle
        # what the step holds around the blocks is about the same at every blocks' budget,
        # so the room the step leaves at ``low`` is about what the blocks may still add
        for _ in range(_ROOM_STEPS):
            target = int(min(low + limit - at_low, (low + high) // 2))
            if target <= low:
                break
            if consider({"budget": target, "method": method})[0]:
                low, at_low = target, tried[-1]
            else:
                high = target
    if method == "rotor":
        consider({"budget": LEAST, "method": "every_layer"})
        if fits:  # every block under one policy: the bisection may step over these
            for name in _uniform_methods(least, low):
                consider({"budget": LEAST, "method": name})
    if not fitting:
        raise solver.InfeasibleBudget(
            limit * batch, min(tried) * batch, f"remat_blocks (whole step, {method})",
            units="bytes", exact=False,
            hint=f"The layers around the blocks and the loss hold about "
                 f"{format_bytes(max(plain - top, 0) * batch)} without remat; "
                 "remat_blocks(..., scope='blocks') bounds the blocks alone.")
    _, value, choice, plan = min(fitting, key=lambda c: (c[0], c[1]))
    if isinstance(choice["budget"], int):
        choice = dict(choice, budget=choice["budget"] * batch)
    return choice, note(measured=value * batch), plan


def _turn(measured: Callable[[dict], tuple[int, dict]], plain: int, no_remat: Any) -> float:
    """What the step holds at its turn beside the blocks' chain, above what it holds beside
    them throughout (per example; :func:`jaxremat.flax.nnx.with_turn` charges it).

    The head and the loss run between the last block's forward and its backward, beside all
    the blocks keep then: without remat the step peaks there, ``plain - no_remat_peak`` above
    the chain. Part of that is held throughout (a stem's residuals): every-layer
    checkpointing, whose peak is inside a block's backward, measures it above its
    prediction. The difference is the head's own, charged at the turn only."""
    if not isinstance(no_remat, Plan):  # a scanned stack: remat_scan measures its members
        return 0
    every, seen = measured({"budget": LEAST, "method": "every_layer"})
    throughout = max(0, every - seen["plan"].predicted_peak)
    return max(0, plain - no_remat.no_remat_peak - throughout)


def _uniform_methods(plan: Any, low: float) -> list[str]:
    """The blocks' uniform option plans (``"uniform:<policy>"``: every block under one
    ``jax.checkpoint`` policy, :func:`solver.uniform_plans`) that differ from the baselines
    and predict a peak above ``low`` (Rotor's plan at ``low`` fits and is as fast as any
    plan predicted to fit it). None for a scanned stack: :func:`jaxremat.remat_scan`'s
    family has those plans as members already."""
    if not isinstance(plan, Plan):
        return []
    aliases = [option_aliases(layer.dropped) for layer in plan.layers]
    plans = solver.uniform_plans(plan.chain, aliases)
    seen = {plans["none"], plans["every_layer"]}
    names = []
    for name, p in plans.items():
        if name.startswith(solver.UNIFORM_PREFIX) and p not in seen:
            seen.add(p)
            if solver.make_schedule(plan.chain, p).peak > low:
                names.append(name)
    return names


def fit(key: tuple, measure: Callable[[], int], budget: Any, *, batch: int = 1, step: str,
        method: str) -> tuple[dict, ScopeNote, Any]:
    """The blocks' plan whose measured whole step fits ``budget`` (cached under ``key``).

    Args:
      key: the cache key (model definition, call signature, budget, settings, step).
      measure: runs the whole step's :func:`jaxremat.flax.activation_memory`; the blocks
        plan as probed while it runs.
      budget: the whole step's budget (bytes, ``"512MiB"``, or ``"40%"`` of its measured
        no-remat memory), for the whole ``vmap`` batch; ``measure`` sees one example.
      batch: the ``vmap`` batch.
      step: what is measured, in words (printed by the plan).
      method: the blocks' method.

    Returns:
      ``(choice, note, plan)`` (:func:`_search`).

    Raises:
      solver.InfeasibleBudget: no plan tried fits; ``min_budget`` is the least measured
        whole step among them (for the whole batch).
    """
    found = _fits.get(key)
    if found is None:
        with _fitting:
            found = _fits.get(key)
            if found is None:
                found = _search(_measurer(measure), budget, method=method, batch=batch,
                                step=step)
                _fits.put(key, found)
    return found


_explicit = LRU(_CACHE_SIZE)  # the model call's key -> fit_step's (choice, note, plan)


def fitted(key: tuple) -> tuple[dict, ScopeNote, Any] | None:
    """What :func:`fit_step` fitted for this call of the model, or ``None``."""
    return _explicit.get(key)


def fit_step(model: Any, loss_fn: Callable[..., Any], batch: tuple, budget: Any, *,
             method: str, key_of: Callable[[tuple, dict], tuple]) -> tuple[dict, ScopeNote, Any]:
    """Fit the blocks' plan to the measured step ``loss_fn(model, *batch)`` and remember it
    for the model call that step makes (``key_of(args, kwargs)`` of that call), so that the
    training step plans with it."""
    measured = _measurer(lambda: activation_memory(model, loss_fn, *batch))
    calls = []

    def noting(choice: dict) -> tuple[int, dict]:
        value, entry = measured(choice)
        calls.append(entry["call"])
        return value, entry

    name = getattr(loss_fn, "__name__", "loss_fn")
    result = _search(noting, budget, method=method, batch=1, step=f"{name}(model, *batch)")
    if calls[0] is None:
        raise RuntimeError(f"run_blocks ran outside the model's __call__ while {name}(model, "
                           "*batch) was measured; use remat_blocks(..., scope='blocks').")
    _explicit.put(key_of(*calls[0]), result)
    return result


def measure_call(model: Any, args: tuple, kwargs: dict, loss: Callable[[Any], Any]) -> Callable[[], int]:
    """A ``measure`` for :func:`fit`: ``model(*args, **kwargs)`` with ``loss`` of its outputs
    (``args`` are arrays; ``kwargs`` are held fixed)."""
    return lambda: activation_memory(model, lambda m, *a: loss(m(*a, **kwargs)), *args)
