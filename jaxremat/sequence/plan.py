"""``Plan``: what :class:`jaxremat.RematSequence` decided for one input signature, and why.

A plan bundles the profiled chain (``solver.Chain``, bytes and seconds), the solver's
``solver.Schedule`` and a per-layer table: input bytes, tape bytes, transients, forward and
backward cost, how many times the layer's forward runs, and the decision (tape stored,
input kept as a checkpoint, recomputed ``n`` times). ``print(plan)`` shows it.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Sequence

import solver
from solver import Chain, Checkpoint, Layer, Schedule, format_bytes, format_plan, make_schedule
from solver.compare import budget_range, compare_methods, format_table
from solver.solve import ORACLE_METHODS

from ..budget import empty_input_hint, resolve_budget
from .apply import MAX_NESTING
from .flat_apply import nesting_depth
from .options import option_aliases
from .profile import COSTS, LayerProfile, Profile

__all__ = ["Plan", "check_method", "solve_plan"]


def _format_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


_TIME_SOURCE = {
    "static": "roofline estimate from cost_analysis",
    "flops": "flops from cost_analysis",
    "measured": "timed on the device",
}


def chosen_options(plan: Any) -> dict[int, int]:
    """``{layer: option}`` of the ``Layer`` items of a plan, nested bodies included (each
    layer's stored tape is made by exactly one of them)."""
    chosen, pending = {}, list(plan)
    while pending:
        item = pending.pop()
        if isinstance(item, Checkpoint):
            pending.extend(item.body)
        else:
            chosen[item.index] = getattr(item, "option", 0)
    return chosen


def _dropped_lines(layers: Sequence[LayerProfile]) -> list[str]:
    """Options left off the layers' menus, grouped by (name, reason)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for layer in layers:
        for name, reason in layer.dropped:
            groups.setdefault((name, reason), []).append(layer.index)
    return [f"  option {name!r} dropped on layers {_ranges(indices)}: {reason}"
            for (name, reason), indices in groups.items()]


def _ranges(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    parts, start = [], indices[0]
    for prev, current in zip(indices, list(indices[1:]) + [None]):
        if current != prev + 1:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = current
    return ", ".join(parts)


def _checkpoint_starts(plan: Any) -> set[int]:
    """Layers whose input a top-level checkpoint keeps."""
    return {item.start for item in plan if isinstance(item, Checkpoint)}


@dataclasses.dataclass(frozen=True)
class Plan:
    """A solved rematerialization plan for one input signature.

    Attributes:
      chain: the profiled chain (per example when the sequence ran under ``jax.vmap`` and
        the batch was detected; see :class:`jaxremat.RematSequence`).
      schedule: the solver's schedule for ``chain`` (``schedule.plan`` is what is applied).
      budget: the budget in bytes, as given (for the whole batch).
      method, backend, costs: how the plan was made and is applied.
      layers: the per-layer profile (:class:`jaxremat.sequence.profile.LayerProfile`).
      batch_size: the ``jax.vmap`` batch the chain is multiplied by (1 without vmap).
      input_grad: whether the sequence's input was being differentiated when the plan was
        made; if not, the first layer was profiled without computing ``g[0]``.
      scope: what the budget covers when a wrapper says so (``remat_blocks``: the blocks or
        the whole training step, :class:`jaxremat.flax.model_scope.ScopeNote`); printed by
        :meth:`report`.
      key_bytes: bytes of RNG keys that a recomputed layer keeps alive until its backward
        (Linen's lifted ``nn.remat`` passes the call's RNG keys into the segments that draw
        from them; :func:`solve_plan`). Counted in :attr:`predicted_peak` when the plan
        recomputes anything.
    """

    chain: Chain
    schedule: Schedule
    budget: int
    method: str
    backend: str
    costs: str
    layers: tuple[LayerProfile, ...]
    batch_size: int = 1
    input_grad: bool = True
    scope: Any = None
    key_bytes: int = 0

    @property
    def predicted_peak(self) -> float:
        """Predicted peak bytes of a training step through the sequence (input ``x``,
        stored activations and tapes, gradients, transients, the RNG keys recomputed layers
        hold; not parameters or their gradients), for the whole batch."""
        held = self.key_bytes if recomputes(self.schedule.plan) else 0
        return float(self.schedule.peak) * self.batch_size + held

    @property
    def predicted_time(self) -> float:
        """Predicted time of the forward and backward passes, recomputation included, in the
        chain's time unit (roofline or measured seconds), for the whole batch."""
        return float(self.schedule.time) * self.batch_size

    @property
    def no_remat_peak(self) -> float:
        """Predicted peak of the same step storing every tape (no rematerialization)."""
        plan = tuple(Layer(i) for i in range(self.chain.length))
        return float(make_schedule(self.chain, plan).peak) * self.batch_size

    @property
    def no_remat_time(self) -> float:
        """Predicted time of the same step without recomputation."""
        return float(self.chain.fwd_time.sum() + self.chain.bwd_time.sum()) * self.batch_size

    @property
    def exceeds_no_remat(self) -> bool:
        """Whether the budget is more than the sequence needs without remat (e.g. ``"150%"``):
        then nothing is recomputed, and more budget would change nothing."""
        return self.budget > self.no_remat_peak

    @property
    def policies(self) -> tuple[tuple[Any, ...], ...]:
        """Per layer, the ``jax.checkpoint`` policy of each option (``None`` for option 0,
        the whole tape): what :func:`jaxremat.sequence.apply.apply_plan` takes as ``policies``."""
        return tuple((None,) + tuple(o.policy for o in layer.options) for layer in self.layers)

    @property
    def options(self) -> list[str]:
        """Per layer, the name of the option its stored tape is made with (``"everything"``:
        the whole tape; ``"dots"``: ``dots_saveable``...; :mod:`jaxremat.sequence.policies`)."""
        chosen = chosen_options(self.schedule.plan)
        return [layer.option_names[chosen.get(layer.index, 0)] for layer in self.layers]

    @property
    def host_bytes(self) -> list[int]:
        """Per layer, the bytes its stored tape keeps in host memory (an offload option,
        :mod:`jaxremat.measure.offload`; 0 for the others)."""
        chosen = chosen_options(self.schedule.plan)
        return [layer.options[chosen[layer.index] - 1].host_bytes
                if chosen.get(layer.index, 0) else 0 for layer in self.layers]

    def policy_summary(self) -> str:
        """The checkpoint policies the plan stores tapes with, e.g. ``"dots: layers 0-3, 7"``
        (``""`` when every stored tape is whole)."""
        groups: dict[str, list[int]] = {}
        for index, option in enumerate(self.options):
            if option != "everything":
                groups.setdefault(option, []).append(index)
        return "; ".join(f"{name}: layers {_ranges(indices)}" for name, indices in groups.items())

    def _option_names(self) -> tuple[tuple[str, ...], ...] | None:
        options = getattr(self.chain, "options", None)
        return None if options is None else options.names

    @property
    def forward_counts(self) -> list[int]:
        """How many times each layer's forward runs in a training step."""
        return self.schedule.forward_counts(self.chain.length)

    def decisions(self) -> list[str]:
        """Per layer: ``"store tape"``, or how often it is recomputed (and whether a
        top-level checkpoint keeps its input)."""
        kept = _checkpoint_starts(self.schedule.plan)
        result = []
        for i, (count, option, host) in enumerate(zip(self.forward_counts, self.options,
                                                      self.host_bytes)):
            on_host = f", {format_bytes(host)} on host" if host else ""
            policy = "" if option == "everything" else f" (policy {option}{on_host})"
            if count <= 1:
                result.append("store tape" + policy)
                continue
            text = f"recompute x{count - 1}"
            result.append(text + (", keep input" if i in kept else "") + policy)
        return result

    def rows(self) -> list[dict[str, Any]]:
        """The per-layer table as dictionaries (bytes, seconds, counts, decision; ``host_bytes``:
        what the chosen option keeps in host memory)."""
        rows = []
        for layer, count, option, decision, host in zip(self.layers, self.forward_counts,
                                                        self.options, self.decisions(),
                                                        self.host_bytes):
            rows.append({
                "layer": layer.index,
                "input_bytes": layer.input_bytes,
                "tape_bytes": layer.tape_bytes,
                "fwd_tmp": layer.fwd_tmp,
                "bwd_tmp": layer.bwd_tmp,
                "fwd_time": layer.fwd_time,
                "fwd_tape_time": layer.fwd_tape_time,
                "bwd_time": layer.bwd_time,
                "fwd_flops": layer.fwd_flops,
                "bwd_flops": layer.bwd_flops,
                "forwards": count,
                "option": option,
                "host_bytes": host,
                "decision": decision,
            })
        return rows

    def report(self) -> str:
        """A readable summary and the per-layer table."""
        per = " per example" if self.batch_size > 1 else ""
        lines = [
            f"jaxremat plan: {self.chain.length} layers, method={self.method!r}"
            + (f" (best schedule: {self.schedule.method!r})"
               if self.schedule.method and self.schedule.method != self.method else "")
            + f", backend={self.backend!r}, costs={self.costs!r}"
            + (f", vmap batch {self.batch_size}" if self.batch_size > 1 else ""),
            f"  {'blocks budget' if getattr(self.scope, 'scope', '') == 'model' else 'budget':<15} "
            f"{format_bytes(self.budget)} ({self.budget} bytes)",
            f"  predicted peak  {format_bytes(self.predicted_peak)} "
            f"({self.predicted_peak / self.budget:.0%} of budget; no remat: "
            f"{format_bytes(self.no_remat_peak)})",
            f"  predicted time  {_format_time(self.predicted_time)} "
            f"({self.predicted_time / max(self.no_remat_time, 1e-300):.3f}x no remat; "
            f"{_TIME_SOURCE.get(self.costs, self.costs)})",
            f"  plan            {format_plan(self.schedule.plan, names=self._option_names())}",
            f"  policies        {self.policy_summary() or 'none (whole tapes)'}",
        ]
        if any(self.host_bytes):
            lines.append(f"  host offload    {format_bytes(sum(self.host_bytes))} of tapes in "
                         "pinned_host memory (transfer time modelled, jaxremat.measure.offload)")
        if self.scope is not None:
            lines[1:1] = self.scope.lines()
        if self.exceeds_no_remat:
            lines.append(
                f"  note            the budget exceeds what the plain sequence needs "
                f"({format_bytes(self.no_remat_peak)}): nothing is recomputed")
        lines += [
            "",
            f"  {'layer':>5} {'input':>11} {'tape':>11} {'fwd tmp':>11} {'bwd tmp':>11} "
            f"{'fwd':>9} {'tape fwd':>9} {'bwd':>9} {'runs':>4}  decision{per}",
        ]
        for row in self.rows():
            lines.append(
                f"  {row['layer']:>5} {format_bytes(row['input_bytes']):>11} "
                f"{format_bytes(row['tape_bytes']):>11} {format_bytes(row['fwd_tmp']):>11} "
                f"{format_bytes(row['bwd_tmp']):>11} {_format_time(row['fwd_time']):>9} "
                f"{_format_time(row['fwd_tape_time']):>9} {_format_time(row['bwd_time']):>9} "
                f"{row['forwards']:>4}  {row['decision']}"
            )
        lines += _dropped_lines(self.layers)
        lines += ["", "  methods at this budget (predicted peak, time overhead vs no remat):"]
        row = compare_methods(self.chain, [self.budget / self.batch_size])[0]
        for method, time, peak in zip(row.methods, row.times, row.peaks):
            if time is None:
                lines.append(f"  {method:>12}  does not fit")
            else:
                lines.append(f"  {method:>12}  {format_bytes(peak * self.batch_size):>11}  "
                             f"{row.overhead(method):+8.1%}")
        return "\n".join(lines)

    def compare(self, budgets: Sequence[float] | None = None, *, slots: int = 500) -> str:
        """Every method's time overhead on this plan's chain, as a table
        (:func:`solver.compare.compare_methods`): at ``budgets`` (bytes per example), by
        default the plan's budget and a sweep from the smallest feasible to the no-remat peak.
        ``—`` marks a method that does not fit."""
        if budgets is None:
            budgets = [self.budget / self.batch_size] + list(budget_range(self.chain, 6))
        return format_table(compare_methods(self.chain, budgets, slots=slots))

    def __str__(self) -> str:
        return self.report()

    def plot(self, path: Any, **kwargs: Any) -> Any:
        """Draw the plan to ``path`` with :func:`jaxremat.sequence.plot.plot_plan` (needs matplotlib)."""
        from .plot import plot_plan  # lazy: matplotlib is optional

        return plot_plan(self, path, **kwargs)


def check_method(method: str) -> None:
    """Raise ``ValueError`` unless ``method`` gives a schedule the frontend can apply: one of
    ``solver.METHODS``, or ``"uniform:<policy name>"`` (every layer under one policy of the
    menu, :func:`solver.chain.uniform.uniform_plans`). ``"ilp"`` (an oracle in :func:`solver.solve`) has its own message."""
    if method in ORACLE_METHODS:
        raise ValueError(
            f"method={method!r} returns a non-persistent schedule that nested jax.checkpoint "
            f"cannot express; use it from solver.solve as an oracle, and one of "
            f"{solver.METHODS} here."
        )
    if method not in solver.METHODS and not solver.is_uniform_method(method):
        raise ValueError(f"method must be one of {solver.METHODS} or 'uniform:<policy name>' "
                         f"(every layer under that policy), got {method!r}.")


def check_settings(method: str, costs: str, slots: int) -> None:
    """Raise ``ValueError`` naming the fix unless ``method`` (:func:`check_method`), ``costs``
    and ``slots`` are valid: the checks every frontend runs before it profiles anything."""
    check_method(method)
    if costs not in COSTS:
        raise ValueError(f"costs must be one of {COSTS}, got {costs!r}.")
    if isinstance(slots, bool) or not isinstance(slots, numbers.Integral) or slots < 1:
        raise ValueError(
            f"slots must be a positive integer (the default is 500), got {slots!r}. More slots "
            "round sizes more finely, at a cost linear in slots."
        )


def recomputes(plan: Sequence[Any]) -> bool:
    """Whether a plan wraps any layer in ``jax.checkpoint``: a recomputed segment, or a tape
    saved under a policy (option > 0)."""
    return any(isinstance(item, Checkpoint) or item.option for item in plan)


def solve_plan(
    profile: Profile,
    budget: int | float | str,
    *,
    method: str,
    slots: int,
    backend: str,
    batch_size: int = 1,
    input_grad: bool = True,
    input_shapes: Sequence[Sequence[int]] = (),
    key_bytes: int = 0,
) -> Plan:
    """Solve a profiled sequence under ``budget`` and bundle the result as a :class:`Plan`.

    ``budget`` is bytes, a string (``"512MiB"``) or a share of the no-remat peak (``"40%"``,
    :func:`jaxremat.budget.resolve_budget`), for the whole ``jax.vmap`` batch: the chain is
    per example, so the solver gets ``budget / batch_size``. ``input_shapes`` (the shapes of
    the sequence's input leaves) let an infeasible share budget say that the batch is empty.
    ``slots`` is the discretisation at 200 layers: a shorter chain gets finer units for the
    same table work (:func:`solver.scaled_slots`). ``key_bytes``: RNG key bytes that stay
    alive until the backward of any layer the plan wraps in a checkpoint (Linen's lifted
    remat, :mod:`jaxremat.flax.linen`), where the plain run frees them after the forward: a
    plan that wraps a layer and does not fit with them is solved again under the budget
    less them.

    Raises:
      solver.InfeasibleBudget: nothing fits; the message gives the smallest budget in bytes
        and binary units, for the whole batch.
    """
    check_method(method)
    # The custom_vjp backend and flat segments recompute a segment's last layer with jax.vjp,
    # its whole forward; jax.checkpoint and Flax's remat only the tape (Chain.fwd_tape_tmp).
    chain = profile.chain.with_full_forwards() if backend == "custom_vjp" else profile.chain
    no_remat = make_schedule(chain, tuple(Layer(i) for i in range(chain.length))).peak
    budget_bytes = resolve_budget(budget, no_remat * batch_size)
    aliases = [option_aliases(p.dropped) for p in profile.layers]

    def solve(limit: float) -> tuple[Chain, Schedule]:
        solved = chain
        schedule = solver.solve(solved, limit, method=method,
                                slots=solver.scaled_slots(solved.length, slots), aliases=aliases)
        if backend == "checkpoint" and max(map(nesting_depth, schedule.plan), default=0) \
                > MAX_NESTING and solved is not solved.with_full_forwards():
            solved = solved.with_full_forwards()  # applied flat (jaxremat.sequence.flat_apply)
            schedule = solver.solve(solved, limit, method=method,
                                    slots=solver.scaled_slots(solved.length, slots),
                                    aliases=aliases)
        return solved, schedule

    try:
        solved, schedule = solve(budget_bytes / batch_size)
        if key_bytes and recomputes(schedule.plan) \
                and schedule.peak * batch_size + key_bytes > budget_bytes:
            solved, schedule = solve((budget_bytes - key_bytes) / batch_size)
    except solver.InfeasibleBudget as error:
        least = error.min_budget * batch_size
        if key_bytes:  # the least plan recomputes unless it is the plain sequence's
            least = min(least + key_bytes, max(least, no_remat * batch_size))
        raise solver.InfeasibleBudget(
            budget_bytes, least, method, units="bytes",
            hint=empty_input_hint(budget, input_shapes),
        ) from None
    return Plan(chain=solved, schedule=schedule, budget=budget_bytes, method=method,
                backend=backend, costs=profile.costs, layers=profile.layers,
                batch_size=batch_size, input_grad=input_grad, key_bytes=key_bytes)
