"""``remat_scan``: one layer scanned over stacked parameters, rematerialized under a budget.

``f = remat_scan(layer, budget)`` returns ``f(stacked_params, x)`` equal, in value and
gradient, to ``lax.scan(lambda h, p: (layer(p, h), None), x, stacked_params)[0]`` (every
leaf of ``stacked_params`` stacks the ``L`` layers' parameters on axis 0), the way
MaxText's ``scan_layers`` and Flax's ``nnx.scan`` run a deep stack so that tracing and
compiling do not grow with depth.

The first call for an input signature profiles the layer once (:mod:`jaxremat.sequence.profile`),
with the ``jax.checkpoint`` policies of its menu (``policies=``, :mod:`jaxremat.sequence.policies`),
repeats its costs into the homogeneous chain of ``L`` layers (``solver.Chain`` with options), and
picks the fastest plan that nested scans express and that fits the budget, exactly within that
family (:mod:`jaxremat.scan.family`: every member is costed by the chain simulator on the
unrolled chain). When the outer segment length ``k`` divides ``L`` it is run as one
``lax.scan`` over the parameters reshaped to ``(L / k, k, ...)`` (nothing copied), each
segment a ``jax.checkpoint`` around an inner scan over its layers, more levels when they pay;
other lengths leave a remainder segment and split the parameters. The layers that store their
tapes run under the member's policy (the whole tape, or e.g. ``dots_saveable``): the plain scan
under a uniform policy, and ``jax.checkpoint`` per layer, are members. The gradient's program
has a size that does not grow with ``L`` (:func:`program_size`; tests/test_scan.py).
``f.plan(stacked_params, x)`` shows the plan and its gap to Rotor's optimum on the unrolled
chain (:class:`ScanPlan`, :mod:`jaxremat.scan.plan`).

The budget bounds what :func:`jaxremat.remat_sequence`'s does (activations, tapes,
gradients flowing back and transients; not the parameters nor their gradients) and is
given the same ways: bytes, ``"512MiB"``, or ``"40%"`` of the plain scan's memory (the
larger of its measured and predicted peaks). Every plan's program is measured with
:func:`jaxremat.activation_memory` before it is used, and a plan the meter finds over the
budget is replaced (:meth:`RematScan._fit`). Under ``jax.vmap`` it means the whole batch
(the plan is solved per example on ``budget / batch``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from typing import Any, Callable

import jax

import solver
from solver import Chain, Schedule

from ..budget import check_budget, is_share, parse_budget, resolve_budget
from ..sequence.cache import SCAN_MARGINS
from ..sequence.plan import check_settings
from ..collector import paused
from ..sequence.policies import DEFAULT_POLICIES, check_policies, without_searched
from ..sequence.profile import profile_sequence
from .checks import check_differentiable, check_scannable, program_size, scan_length
from .family import FamilyInfeasible, chain_options, choose, loop_margin, member_schedule
from .margins import margin_bytes
from .loops import ScanBody
from .members import NestedScan, auto_unroll, check_unroll
from .plan import ScanPlan, option_policies
from .realize import measured_memory, run_member
from ..trace_state import vmap_batch_size
from ..trees import abstractify, signature

__all__ = ["RematScan", "ScanPlan", "remat_scan", "program_size", "SCAN_METHODS", "SCAN_POLICIES",
           "loop_margin", "margin_bytes"]

SCAN_METHODS = ("rotor", "none", "every_layer", "sqrt")
"""``"rotor"``: the best nested-scan plan; the others are fixed members: store every tape,
checkpoint every layer (``jax.checkpoint`` per layer, ``nnx.remat``'s default), and Chen's
sqrt(L) segments."""

SCAN_POLICIES = without_searched(DEFAULT_POLICIES)
"""The default menu of a scanned layer: the sequence's default without the searched options
(``"searched"``), whose scanned loops' peaks the loop margins were not fitted to (on the
test suite's MLP and GPT-2 blocks they measured up to 2% above the prediction); name them
in ``policies=`` to have them."""

_MARGINS = SCAN_MARGINS  # (layer id, signatures, options) -> (weak reference, margin_bytes)


def _margin_sizes(layer: Callable, params: Any, x: Any, policies: tuple[Callable | None, ...],
                  names: tuple[str, ...]) -> dict[str, Any]:
    """:func:`margin_bytes`, remembered per layer, shapes and options (``names``): its five
    traces cost a quarter of a plan whose profile is cached (a new budget, a new
    ``RematScan`` of the same layer)."""
    key = (id(layer), signature(params), signature(x), names)
    found = _MARGINS.get(key)
    if found is not None and found[0]() is layer:  # not a dead function's id, reused
        return found[1]
    sizes = margin_bytes(layer, params, x, policies, names)
    try:
        _MARGINS.put(key, (weakref.ref(layer), sizes))
    except TypeError:  # no weak references: not kept across calls
        pass
    return sizes


def _whole_inputs(chain: Chain) -> Chain:
    """``chain`` with ``Chain.x_read_size``, ``x_rec_size`` and ``x_own_read_size`` at their
    defaults (every option): a scan carries whole activations between iterations, and the
    segment replay (:mod:`jaxremat.scan.simulate`) records no cut inputs: conservative."""
    chain = chain.with_full_forwards()  # the segment replay charges whole forwards
    options = chain.options and dataclasses.replace(chain.options, x_read_size=None,
                                                    x_own_read_size=None)
    return dataclasses.replace(chain, x_read_size=None, x_rec_size=None, x_own_read_size=None,
                               options=options)


class RematScan:
    """``layer`` scanned over stacked parameters under a memory budget (module docstring).

    Create it with :func:`remat_scan`; call it as ``f(stacked_params, x)``. ``f.plan(
    stacked_params, x)`` returns the :class:`ScanPlan` (cached per input signature);
    ``profile_count`` counts the layer profiles taken (one per new signature).
    """

    def __init__(self, layer: Callable, budget: int | float | str, *, method: str = "rotor",
                 costs: str = "static", max_levels: int = 2, policies: Any = None,
                 unroll: int | str = "auto") -> None:
        if not callable(layer):
            raise TypeError(f"layer must be a function layer(params, x) -> y, got "
                            f"{type(layer).__name__}.")
        if method not in SCAN_METHODS:
            raise ValueError(f"remat_scan's method must be one of {SCAN_METHODS}, got "
                             f"{method!r} (revolve's and Rotor's unrolled plans are not nested "
                             f"scans: use jaxremat.remat_sequence for them).")
        check_settings("rotor", costs, 1)
        if isinstance(max_levels, bool) or not isinstance(max_levels, int) or max_levels < 0:
            raise ValueError(f"max_levels must be an integer >= 0, got {max_levels!r}.")
        self._layer, self._budget = layer, check_budget(budget)
        self._method, self._costs, self._max_levels = method, costs, max_levels
        menu = check_policies(policies) if policies is not None else SCAN_POLICIES
        self._policies = menu if method == "rotor" else ()
        self._unroll = check_unroll(unroll)
        self._cache: dict[tuple, ScanPlan] = {}
        self.profile_count = 0

    layer = property(lambda self: self._layer, doc="The layer function.")
    budget = property(lambda self: self._budget, doc="The budget as given.")

    def __repr__(self) -> str:
        return f"RematScan(budget={self._budget!r}, method={self._method!r}, costs={self._costs!r})"

    def _fit(self, chain: Chain, budget: float, measure: Callable[[NestedScan], int],
             margin: Callable[[NestedScan], float],
             margin_floor: Callable[[NestedScan], float] | None = None
             ) -> tuple[NestedScan, Schedule, int]:
        """The member chosen for ``budget`` (bytes per example) whose *measured* memory fits:
        when the meter finds more than the prediction, the excess is taken off the budget and
        the choice made again (a few rounds); then the member of least predicted peak, if
        its measured memory fits: below two levels :func:`jaxremat.scan.family.loop_margin`
        is an upper bound (it counts each level's loops and parameter pieces at once, where
        the meter's peak finds some of them freed), so a budget between that member's
        measured and predicted peaks runs it.

        Raises ``solver.InfeasibleBudget`` naming the budget that works: that member's
        measured memory. ``margin(member)``: bytes added to the chain's peak
        (:func:`jaxremat.scan.family.loop_margin`); ``margin_floor``: a cheaper lower bound
        on it, for the search's pruning (:func:`jaxremat.scan.family.choose`).

        Where that member does not fit, the plain scan and ``jax.checkpoint`` per layer
        (each option) are measured too and the fastest that fits is taken (under ``jax.vmap``
        the predictions per example may rank them otherwise than the meter)."""
        extra = 0.0
        smallest = None
        memo: dict = {}
        for _ in range(6):
            try:
                member, schedule = self._member(chain, budget - extra, memo, margin,
                                                margin_floor)
            except FamilyInfeasible as error:
                smallest = (error.member, error.schedule, error.min_budget)
                break
            measured = measure(member)
            if measured <= budget:
                return self._plain_if_faster(chain, budget, measure, margin,
                                             (member, schedule, measured))
            predicted = schedule.peak + margin(member)
            extra = max(extra + measured - budget, measured - predicted)
        if smallest is None:
            try:
                self._member(chain, 0.0, memo, margin, margin_floor)
            except FamilyInfeasible as error:
                smallest = (error.member, error.schedule, error.min_budget)
        tried = {smallest[0]: (smallest[1], measure(smallest[0]))}
        if self._method == "rotor":  # the plain scan and checkpoint per layer too, measured
            for option in range(chain_options(chain)):
                for sizes in ((), (1,)) if chain.length > 1 else ((),):
                    member = NestedScan(sizes, option)
                    if member not in tried:
                        tried[member] = (member_schedule(chain, member), measure(member))
        fitting = [(schedule.time, measured, member) for member, (schedule, measured)
                   in tried.items() if measured <= budget]
        if fitting:
            _, measured, member = min(fitting, key=lambda item: item[:2])
            return member, tried[member][0], measured
        least = min(measured for _, measured in tried.values())
        raise solver.InfeasibleBudget(budget, least, f"remat_scan {self._method}")

    def _plain_if_faster(self, chain: Chain, budget: float, measure: Callable[[NestedScan], int],
                         margin: Callable[[NestedScan], float],
                         found: tuple[NestedScan, Schedule, int]) -> tuple[NestedScan, Schedule, int]:
        """``found`` (member, schedule, measured peak), or a faster plain scan whose chain
        peak fits ``budget`` and whose measured peak does, though its loop margin (an upper
        bound, loose on some pytree carries) does not."""
        if self._method != "rotor":
            return found
        for option in range(chain_options(chain)):
            member = NestedScan((), option)
            schedule = member_schedule(chain, member)
            if (schedule.time < found[1].time and schedule.peak <= budget
                    < schedule.peak + margin(member)):
                measured = measure(member)
                if measured <= budget:
                    found = (member, schedule, measured)
        return found

    def _member(self, chain: Chain, budget: float, memo: dict,
                margin: Callable[[NestedScan], float],
                margin_floor: Callable[[NestedScan], float] | None = None
                ) -> tuple[NestedScan, Schedule]:
        L = chain.length
        fixed = {"none": NestedScan(), "every_layer": NestedScan((1,) if L > 1 else ()),
                 "sqrt": NestedScan((max(1, round(math.sqrt(L))),) if L > 1 else ())}
        if self._method == "rotor":
            choice = choose(chain, budget, max_levels=self._max_levels, margin=margin,
                            memo=memo, margin_floor=margin_floor)
            return choice.member, choice.schedule
        member = fixed[self._method]
        schedule = member_schedule(chain, member)
        need = schedule.peak + margin(member)
        if need > budget * (1 + 1e-9):
            raise FamilyInfeasible(budget, need, member, schedule)
        return member, schedule

    def _plan(self, stacked_params: Any, x: Any) -> ScanPlan:
        length = scan_length(stacked_params)
        batch = vmap_batch_size((stacked_params, x))
        abstract_params = abstractify(stacked_params, "stacked_params")
        abstract_x = abstractify(x, "the scan input x")
        key = (signature(abstract_params), signature(abstract_x), batch)
        plan = self._cache.get(key)
        if plan is not None:
            return plan
        one = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), abstract_params)
        equations = check_scannable(self._layer, one, abstract_x)
        check_differentiable(abstract_x)
        unroll = auto_unroll(equations) if self._unroll == "auto" else self._unroll
        profile = profile_sequence([self._layer] * length, [one] * length, abstract_x,
                                   costs=self._costs, progress=False, input_grad=True,
                                   policies=self._policies, free_inputs=False,
                                   vmapped=batch > 1)
        self.profile_count += 1
        chain = _whole_inputs(profile.chain)
        policies = option_policies(profile.layers[0])
        sizes = {name: (tuple(v.per_example(batch) if isinstance(v, ScanBody) else v / batch
                              for v in value) if isinstance(value, tuple) else value / batch)
                 for name, value in _margin_sizes(self._layer, one, abstract_x, policies,
                                                  profile.layers[0].option_names).items()}
        # once per member for this plan: the search and _fit's rounds ask again, and the
        # plain scan's and checkpoint-per-layer's terms simulate the chain (by phase)
        margin = functools.cache(functools.partial(loop_margin, chain, unroll=unroll, **sizes))
        margin_floor = functools.cache(functools.partial(  # the search's pruning: cheaper
            loop_margin, chain, unroll=unroll, floor=True, **sizes))
        measure = functools.partial(measured_memory, self._layer, abstract_params, abstract_x,
                                    length, policies, unroll,
                                    names=profile.layers[0].option_names)
        if not is_share(self._budget):  # bytes: no need to measure the plain scan
            budget = parse_budget(self._budget)
        else:
            plain = max(measure(NestedScan()), member_schedule(chain, NestedScan()).peak
                        + margin(NestedScan()))
            budget = resolve_budget(self._budget, plain * batch)  # "100%" always fits
        try:
            member, schedule, measured = self._fit(chain, budget / batch, measure, margin,
                                                   margin_floor)
        except solver.InfeasibleBudget as error:
            raise solver.InfeasibleBudget(
                budget, math.ceil(error.min_budget * batch), error.method, units="bytes"
            ) from None
        plan = ScanPlan(member=member, chain=chain, schedule=schedule, layer=profile.layers[0],
                        budget=budget, method=self._method, costs=self._costs, batch_size=batch,
                        loop_margin=margin(member), measured_peak=measured * batch,
                        unroll=unroll)
        self._cache[key] = plan
        return plan

    def plan(self, stacked_params: Any, x: Any) -> ScanPlan:
        """The :class:`ScanPlan` used for inputs like these (profiled and solved once per
        input signature)."""
        with paused():  # planning frees what it makes by reference counting (collector.py)
            return self._plan(stacked_params, x)

    def __call__(self, stacked_params: Any, x: Any) -> Any:
        """Run the ``L`` layers on ``x``; value and gradients equal the plain ``lax.scan``'s.

        Raises:
          solver.InfeasibleBudget: no nested-scan plan fits; the message names the smallest
            budget that does, within the family.
          ValueError: leaves of ``stacked_params`` disagree on their leading axis (the leaf
            and both lengths are named), or the layer changes the structure, shape or dtype
            of its input (use :func:`jaxremat.remat_sequence` then).
        """
        with paused():
            plan = self._plan(stacked_params, x)
        return run_member(self._layer, plan.member.sizes, stacked_params, x, plan.length,
                    plan.policy, unroll=plan.unroll)

    def cache_clear(self) -> None:
        """Forget the cached plans."""
        self._cache.clear()


def remat_scan(layer: Callable, budget: int | float | str, *, method: str = "rotor",
               costs: str = "static", max_levels: int = 2, policies: Any = None,
               unroll: int | str = "auto") -> RematScan:
    """``f(stacked_params, x)``: ``layer`` scanned over parameters stacked on axis 0, with
    the fastest nested-scan rematerialization that fits ``budget`` (module docstring).

    Args:
      layer: ``layer(params, x) -> y`` with ``y`` of the structure, shapes and dtypes of
        ``x`` (one layer's parameters: a slice of the stacked ones on axis 0).
      budget: bytes, a string such as ``"512MiB"``, or a share of the plain scan's memory
        such as ``"40%"`` (as :func:`jaxremat.remat_sequence`).
      method: ``"rotor"`` (the best nested-scan plan, exactly within the family of
        :mod:`jaxremat.scan.family`), ``"none"``, ``"every_layer"`` or ``"sqrt"``.
      costs: ``"static"``, ``"flops"`` or ``"measured"`` (:mod:`jaxremat.sequence.profile`).
      max_levels: the most checkpointing levels (nested ``lax.scan`` depth is one more).
      policies: the ``jax.checkpoint`` policies the scanned layers may run under
        (:mod:`jaxremat.sequence.policies`; uniform within the scan: one body): ``None`` for
        :data:`SCAN_POLICIES`, a sequence of names and callables, or ``()`` for the whole
        tape only. A member of the family is then, e.g., the plain scan with the layer under
        ``dots_saveable``, or checkpointed segments whose layers run under it. Only
        ``method="rotor"`` uses them.
      unroll: inner runs of at most this many layers run unrolled inside the scan over
        their segments rather than as a nested scan (fewer loop bodies to compile, less
        memory, for a small layer); 0 scans every run. ``"auto"`` (the default) takes
        :data:`jaxremat.scan.members.UNROLL` (2) for a layer of at most
        :data:`jaxremat.scan.members.UNROLL_MAX_EQUATIONS` jaxpr equations and 0 for a
        larger one (:func:`jaxremat.scan.members.auto_unroll`; ``f.plan(...).unroll`` says
        which).

    Returns:
      A :class:`RematScan`, usable under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.
    """
    return RematScan(layer, budget, method=method, costs=costs, max_levels=max_levels,
                     policies=policies, unroll=unroll)
