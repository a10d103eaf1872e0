"""``remat_scan``: one layer scanned over stacked parameters, rematerialized under a budget.

``f = remat_scan(layer, budget)`` returns ``f(stacked_params, x)`` equal, in value and
gradient, to ``lax.scan(lambda h, p: (layer(p, h), None), x, stacked_params)[0]`` (every
leaf of ``stacked_params`` stacks the ``L`` layers' parameters on axis 0), the way
MaxText's ``scan_layers`` and Flax's ``nnx.scan`` run a deep stack so that tracing and
compiling do not grow with depth.

The first call for an input signature profiles the layer once (:mod:`jaxremat.sequence.profile`),
repeats its costs into the homogeneous chain of ``L`` layers (``solver.Chain``), and picks the
fastest plan that nested scans express and that fits the budget, exactly within that family
(:mod:`jaxremat.scan.family`: every member is costed by the chain simulator on the
unrolled chain). It is run as an outer ``lax.scan`` over ``jax.checkpoint`` segments, inner
scans over each segment's layers, more levels when they pay, remainders as one more
segment. The gradient's program has a size that does not grow with ``L``
(:func:`program_size`; tests/test_scan.py). ``f.plan(stacked_params, x)`` shows the plan
and its gap to Rotor's optimum on the unrolled chain (:class:`ScanPlan`).

The budget bounds what :func:`jaxremat.remat_sequence`'s does (activations, tapes,
gradients flowing back and transients; not the parameters nor their gradients) and is
given the same ways: bytes, ``"512MiB"``, or ``"40%"`` of the plain scan's memory (the
larger of its measured and predicted peaks). Every plan's program is measured with
:func:`jaxremat.activation_memory` before it is used, and a plan the meter finds over the
budget is replaced (:meth:`RematScan._fit`). Under
``jax.vmap`` it means the whole batch (the plan is solved per example on ``budget /
batch``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr

import solver
from solver import Chain, Schedule, format_bytes, format_plan

from ..budget import check_budget, resolve_budget
from ..measure.meter import activation_memory
from ..sequence.plan import check_settings
from ..sequence.profile import LayerProfile, profile_sequence
from .family import FamilyInfeasible, choose, member_schedule
from .members import NestedScan, pieces
from ..trace_state import vmap_batch_size
from ..trees import abstractify, signature

__all__ = ["RematScan", "ScanPlan", "remat_scan", "program_size", "SCAN_METHODS", "loop_margin"]

SCAN_METHODS = ("rotor", "none", "every_layer", "sqrt")
"""``"rotor"``: the best nested-scan plan; the others are fixed members: store every tape,
checkpoint every layer (``jax.checkpoint`` per layer, ``nnx.remat``'s default), and Chen's
sqrt(L) segments."""


def program_size(jaxpr: ClosedJaxpr | Jaxpr) -> int:
    """Number of equations of ``jaxpr``, those of its sub-programs (scan and checkpoint
    bodies, calls, branches) included: the size of the program XLA compiles."""
    jaxpr = jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(sub, (ClosedJaxpr, Jaxpr)):
                    total += program_size(sub)
    return total


def _scan_length(stacked_params: Any) -> int:
    """The common leading axis of the leaves, or an error naming the leaf that differs."""
    leaves = jax.tree_util.tree_flatten_with_path(stacked_params)[0]
    if not leaves:
        raise ValueError(
            "stacked_params has no array leaves: remat_scan reads the number of layers from "
            "their leading axis. Give the layer at least one stacked parameter, or use "
            "jaxremat.remat_sequence with one function per layer."
        )
    lengths = []
    for path, leaf in leaves:
        shape = np.shape(leaf)
        if not shape:
            raise ValueError(
                f"stacked_params{jax.tree_util.keystr(path)} is a scalar; every leaf stacks "
                f"the layers' parameters on axis 0 (shape (L, ...))."
            )
        lengths.append((jax.tree_util.keystr(path), int(shape[0])))
    first_path, length = lengths[0]
    for path, other in lengths[1:]:
        if other != length:
            raise ValueError(
                f"stacked_params leaves disagree on the number of layers (axis 0): "
                f"stacked_params{first_path} has {length}, stacked_params{path} has {other}. "
                f"Stack every parameter of the L layers on axis 0."
            )
    return length


def _describe(tree: Any) -> str:
    return str(jax.tree.map(lambda s: f"{s.dtype}{list(s.shape)}", tree))


def _check_scannable(layer: Callable, params: Any, x: Any) -> None:
    """Raise unless ``layer(params, x)`` has the structure, shapes and dtypes of ``x``."""
    try:
        out = jax.eval_shape(layer, params, x)
    except Exception as error:
        raise ValueError(
            f"remat_scan could not trace layer(params[0], x) on parameters {_describe(params)} "
            f"and input {_describe(x)}: {type(error).__name__}: {error}"
        ) from error
    same = jax.tree.structure(out) == jax.tree.structure(x) and all(
        a.shape == b.shape and a.dtype == b.dtype
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(x)))
    if not same:
        raise ValueError(
            f"remat_scan needs a layer whose output has the structure, shapes and dtypes of "
            f"its input (lax.scan carries it from layer to layer), but layer(params[0], x) maps "
            f"{_describe(x)} to {_describe(out)}. For layers that change shapes use "
            f"jaxremat.remat_sequence([layer_0, layer_1, ...], budget) with one function and "
            f"one parameter pytree per layer."
        )


def _split(params: Any, lengths: list[int]) -> list[Any]:
    """``params`` cut on axis 0 into consecutive parts of ``lengths`` layers, with one
    ``lax.split`` per leaf (its transpose is one concatenation of the gradients)."""
    leaves, treedef = jax.tree.flatten(params)
    cut = [jax.lax.split(leaf, lengths, axis=0) if len(lengths) > 1 else [leaf] for leaf in leaves]
    return [jax.tree.unflatten(treedef, [parts[j] for parts in cut]) for j in range(len(lengths))]


def _scan_layers(layer: Callable, params: Any, x: Any) -> Any:
    return jax.lax.scan(lambda h, p: (layer(p, h), None), x, params)[0]


def _run(layer: Callable, sizes: tuple[int, ...], params: Any, x: Any, length: int) -> Any:
    """Apply ``length`` layers (``params`` stacked on axis 0) under the levels ``sizes``;
    the same recursion as :func:`jaxremat.scan.family.solver_plan`."""
    while sizes and sizes[0] >= length:
        sizes = sizes[1:]
    if not sizes:
        return _scan_layers(layer, params, x)
    parts = pieces(length, sizes[0])
    groups = _runs(parts[:-1])
    chunks = _split(params, [size * len(group) for size, group in groups] + [parts[-1]])
    for (size, group), chunk in zip(groups, chunks):
        count = len(group)
        body = functools.partial(_segment, layer, sizes[1:], size)
        if count == 1:
            x = jax.checkpoint(body, prevent_cse=True)(chunk, x)
        else:  # no CSE across scan iterations: prevent_cse is not needed (jax.checkpoint docs)
            segment = jax.checkpoint(body, prevent_cse=False)
            rows = jax.tree.map(lambda leaf: leaf.reshape((count, size) + leaf.shape[1:]), chunk)
            x = jax.lax.scan(lambda h, p: (segment(p, h), None), x, rows)[0]
    return _run(layer, sizes[1:], chunks[-1], x, parts[-1])


def _segment(layer: Callable, sizes: tuple[int, ...], length: int, params: Any, x: Any) -> Any:
    return _run(layer, sizes, params, x, length)


def _runs(parts: list[int]) -> list[tuple[int, list[int]]]:
    """Consecutive equal lengths grouped: ``[1, 4, 4] -> [(1, [1]), (4, [4, 4])]``."""
    groups: list[tuple[int, list[int]]] = []
    for part in parts:
        if groups and groups[-1][0] == part:
            groups[-1][1].append(part)
        else:
            groups.append((part, [part]))
    return groups


def loop_margin(chain: Chain) -> float:
    """Bytes to add to the unrolled chain's peak per ``lax.scan`` level: one layer's input
    and tape (``x_size + xbar_size``).

    The chain counts a scanned layer as it counts an unrolled one; the program-order meter
    (:func:`jaxremat.activation_memory`, loops as in :mod:`jaxremat.measure.meter`) counts a loop's
    stacked outputs from before its body runs, beside the body's own values, and the new
    carry beside the old one: one iteration's carry and residuals twice. Measured on
    residual blocks (tests/test_scan.py), the excess over the chain's peak was 0.8 to 1.5
    times this per level."""
    return float(chain.x_size[0] + chain.xbar_size[0])


def _measured(layer: Callable, params: Any, x: Any, length: int, member: NestedScan) -> int:
    """:func:`jaxremat.activation_memory` of ``member``'s program on abstract inputs, the
    sum of the (inexact) output leaves as the loss."""
    def loss(p: Any, h: Any) -> Any:
        out = _run(layer, member.sizes, p, h, length)
        return sum(jnp.sum(jnp.real(leaf)).astype(jnp.float32) for leaf in jax.tree.leaves(out)
                   if jnp.issubdtype(leaf.dtype, jnp.inexact))
    return activation_memory(loss, params, x)


def _format_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


@dataclasses.dataclass(frozen=True)
class ScanPlan:
    """The nested-scan plan for one input signature, and how it compares.

    Attributes:
      member: the nested-scan family member applied (:class:`jaxremat.scan.family.NestedScan`).
      chain: the homogeneous chain (per example under ``jax.vmap``): the layer's profile
        repeated ``L`` times.
      schedule: the member's plan on the unrolled chain, costed by ``solver.simulate``.
      layer: the layer's profile (:class:`jaxremat.sequence.profile.LayerProfile`).
      budget: bytes, for the whole batch; method, costs: how it was chosen.
      batch_size: the ``jax.vmap`` batch (1 without vmap).
      loop_margin: bytes per example added to the chain's peak per ``lax.scan`` level
        (:func:`loop_margin`).
      measured_peak: :func:`jaxremat.activation_memory` of the gradient of the plan's
        program (the sum of the output as the loss), for the whole batch: what the budget
        was checked against.
    """

    member: NestedScan
    chain: Chain
    schedule: Schedule
    layer: LayerProfile
    budget: int
    method: str
    costs: str
    batch_size: int = 1
    loop_margin: float = 0.0
    measured_peak: int = 0

    @property
    def length(self) -> int:
        """Number of layers ``L``."""
        return self.chain.length

    @property
    def predicted_peak(self) -> float:
        """Predicted peak bytes of the step through the stack (the budget's quantity): the
        simulated peak of the unrolled chain plus the loop margin of each scan level."""
        margin = (self.member.levels + 1) * self.loop_margin
        return (float(self.schedule.peak) + margin) * self.batch_size

    @property
    def predicted_time(self) -> float:
        """Predicted forward + backward time, recomputation included (chain time unit)."""
        return float(self.schedule.time) * self.batch_size

    @property
    def no_remat(self) -> Schedule:
        """The plain scan (every tape stored) on the same chain."""
        return member_schedule(self.chain, NestedScan())

    @functools.cached_property
    def rotor(self) -> Schedule | None:
        """Rotor's optimum on the unrolled chain at this budget (``solver.solve``), or
        ``None`` where it finds none."""
        try:
            return solver.solve(self.chain, self.budget / self.batch_size, method="rotor")
        except solver.InfeasibleBudget:
            return None

    @property
    def gap_to_rotor(self) -> float | None:
        """Predicted time over Rotor's on the unrolled chain, minus one (``0.02``: 2% slower)."""
        rotor = self.rotor
        return None if rotor is None else self.schedule.time / rotor.time - 1.0

    def levels(self) -> list[str]:
        """Per checkpointing level, how the runs of layers are cut (remainder first)."""
        lines = []
        runs = [self.length]
        for depth, size in enumerate(self.member.sizes, start=1):
            cuts = sorted({tuple(pieces(n, size)) for n in runs if n > size}, reverse=True)
            if not cuts:
                continue
            text = "; ".join(f"{n} = " + " + ".join(map(str, cut)) for n, cut in
                             ((sum(cut), cut) for cut in cuts))
            lines.append(f"level {depth}: segments of {size} layers ({text}; all but the last "
                         f"checkpointed)")
            runs = sorted({p for cut in cuts for p in cut} | {n for n in runs if n <= size})
        return lines or ["no checkpoints: one scan storing every tape"]

    def report(self) -> str:
        """A readable summary: levels, predicted peak and time, gap to Rotor."""
        no_remat = self.no_remat
        gap = self.gap_to_rotor
        lines = [
            f"jaxremat scan plan: {self.length} layers, method={self.method!r}, "
            f"costs={self.costs!r}" + (f", vmap batch {self.batch_size}" if self.batch_size > 1
                                       else ""),
            f"  budget          {format_bytes(self.budget)} ({self.budget} bytes)",
            f"  nested scans    {self.member}",
        ] + [f"    {line}" for line in self.levels()] + [
            f"  predicted peak  {format_bytes(self.predicted_peak)} "
            f"({self.predicted_peak / self.budget:.0%} of budget, of which loop margin "
            f"{format_bytes((self.member.levels + 1) * self.loop_margin * self.batch_size)}; "
            f"no remat: {format_bytes((no_remat.peak + self.loop_margin) * self.batch_size)})",
            f"  measured peak   {format_bytes(self.measured_peak)} (activation_memory, "
            f"program order)",
            f"  predicted time  {_format_time(self.predicted_time)} "
            f"({self.schedule.time / max(no_remat.time, 1e-300):.3f}x no remat)",
            "  Rotor unrolled  " + ("no schedule at this budget" if gap is None else
                                    f"{self.rotor.time / max(no_remat.time, 1e-300):.3f}x no "
                                    f"remat; nested scans are {gap:+.1%} slower"),
            f"  unrolled plan   {format_plan(self.schedule.plan, max_depth=2)[:300]}",
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


class RematScan:
    """``layer`` scanned over stacked parameters under a memory budget (module docstring).

    Create it with :func:`remat_scan`; call it as ``f(stacked_params, x)``. ``f.plan(
    stacked_params, x)`` returns the :class:`ScanPlan` (cached per input signature);
    ``profile_count`` counts the layer profiles taken (one per new signature).
    """

    def __init__(self, layer: Callable, budget: int | float | str, *, method: str = "rotor",
                 costs: str = "static", max_levels: int = 2) -> None:
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
        self._cache: dict[tuple, ScanPlan] = {}
        self.profile_count = 0

    layer = property(lambda self: self._layer, doc="The layer function.")
    budget = property(lambda self: self._budget, doc="The budget as given.")

    def __repr__(self) -> str:
        return f"RematScan(budget={self._budget!r}, method={self._method!r}, costs={self._costs!r})"

    def _fit(self, chain: Chain, budget: float, margin: float, measure: Callable[[NestedScan], int]
             ) -> tuple[NestedScan, Schedule, int]:
        """The member chosen for ``budget`` (bytes per example) whose *measured* memory fits:
        when the meter finds more than the prediction, the excess is taken off the budget and
        the choice made again (a few rounds); then the member of least peak, if it fits.

        Raises ``solver.InfeasibleBudget`` naming a budget that works: the larger of the
        least predicted peak and that member's measured memory."""
        extra = 0.0
        smallest = None
        memo: dict = {}
        for _ in range(6):
            try:
                member, schedule = self._member(chain, budget - extra, margin, memo)
            except FamilyInfeasible as error:
                smallest = (error.member, error.schedule, error.min_budget)
                break
            measured = measure(member)
            if measured <= budget:
                return member, schedule, measured
            predicted = schedule.peak + (member.levels + 1) * margin
            extra = max(extra + measured - budget, measured - predicted)
        if smallest is None:
            try:
                self._member(chain, 0.0, margin, memo)
            except FamilyInfeasible as error:
                smallest = (error.member, error.schedule, error.min_budget)
        member, schedule, least = smallest
        measured = measure(member)
        if measured <= budget and least <= budget:
            return member, schedule, measured
        raise solver.InfeasibleBudget(budget, max(least, measured), f"remat_scan {self._method}")

    def _member(self, chain: Chain, budget: float, margin: float, memo: dict
                ) -> tuple[NestedScan, Schedule]:
        L = chain.length
        fixed = {"none": NestedScan(), "every_layer": NestedScan((1,) if L > 1 else ()),
                 "sqrt": NestedScan((max(1, round(math.sqrt(L))),) if L > 1 else ())}
        if self._method == "rotor":
            choice = choose(chain, budget, max_levels=self._max_levels, loop_margin=margin,
                            memo=memo)
            return choice.member, choice.schedule
        member = fixed[self._method]
        schedule = member_schedule(chain, member)
        need = schedule.peak + (member.levels + 1) * margin
        if need > budget * (1 + 1e-9):
            raise FamilyInfeasible(budget, need, member, schedule)
        return member, schedule

    def _plan(self, stacked_params: Any, x: Any) -> ScanPlan:
        length = _scan_length(stacked_params)
        batch = vmap_batch_size((stacked_params, x))
        abstract_params = abstractify(stacked_params, "stacked_params")
        abstract_x = abstractify(x, "the scan input x")
        key = (signature(abstract_params), signature(abstract_x), batch)
        plan = self._cache.get(key)
        if plan is not None:
            return plan
        one = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), abstract_params)
        _check_scannable(self._layer, one, abstract_x)
        profile = profile_sequence([self._layer] * length, [one] * length, abstract_x,
                                   costs=self._costs, progress=False, input_grad=True)
        self.profile_count += 1
        # A scan carries whole activations between its iterations, and the segment replay
        # (jaxremat.scan.simulate) tracks no inputs cut by F_all: plan with B(i) reading all
        # of x[i], as before Chain.x_read_size (conservative).
        chain = dataclasses.replace(profile.chain, x_read_size=None)
        margin = loop_margin(chain)
        measure = functools.partial(_measured, self._layer, abstract_params, abstract_x, length)
        plain = max(measure(NestedScan()), member_schedule(chain, NestedScan()).peak + margin)
        budget = resolve_budget(self._budget, plain * batch)  # "100%" always fits
        try:
            member, schedule, measured = self._fit(chain, budget / batch, margin, measure)
        except solver.InfeasibleBudget as error:
            raise solver.InfeasibleBudget(
                budget, math.ceil(error.min_budget * batch), error.method, units="bytes"
            ) from None
        plan = ScanPlan(member=member, chain=chain, schedule=schedule, layer=profile.layers[0],
                        budget=budget, method=self._method, costs=self._costs, batch_size=batch,
                        loop_margin=margin, measured_peak=measured * batch)
        self._cache[key] = plan
        return plan

    def plan(self, stacked_params: Any, x: Any) -> ScanPlan:
        """The :class:`ScanPlan` used for inputs like these (profiled and solved once per
        input signature)."""
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
        plan = self._plan(stacked_params, x)
        return _run(self._layer, plan.member.sizes, stacked_params, x, plan.length)

    def cache_clear(self) -> None:
        """Forget the cached plans."""
        self._cache.clear()


def remat_scan(layer: Callable, budget: int | float | str, *, method: str = "rotor",
               costs: str = "static", max_levels: int = 2) -> RematScan:
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

    Returns:
      A :class:`RematScan`, usable under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.
    """
    return RematScan(layer, budget, method=method, costs=costs, max_levels=max_levels)
