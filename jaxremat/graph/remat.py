"""``remat_graph``: Feng & Huang's optimal checkpoints applied to any JAX function.

``g = remat_graph(fn)`` returns a callable ``g(params, x)`` equal to ``fn(params, x)``. The
first time it is traced for an input signature it builds the dataflow graph of ``fn``'s
jaxpr (:mod:`jaxremat.measure.dataflow`), runs :func:`solver.checkpoint_search` on it (the set of
kept tensors of least training memory in Feng & Huang's model, CVPR 2021), and runs
``fn`` as a sequence of checkpointed *regions* (:mod:`jaxremat.graph.plan`).

A budget (``remat_graph(fn, budget)``) bounds *measured* memory, not the model's, and asks
for the least recompute. Two things change:

* No kept tensor is recomputed, as the model's recompute assumes: a region of kept tensors
  only runs without ``jax.checkpoint``, and inside the other regions the kept tensors are
  named (``checkpoint_name``) and saved by a ``save_only_these_names`` policy. (Without a
  budget they are recomputed with their region, which costs flops the model does not count
  but saves what their backward reads: the least-memory plan keeps that choice where it
  measures least.) A name reaches the outputs of a kept vertex's equations, not the residuals JAX's rules take
  from inside a primitive (an activation's derivative reads the activation's own output),
  so a kept matmul + activation inside a region saves the matmul's output and recomputes
  the cheap activation from it: it holds two tensors where the model counts one.
* The model charges every vertex's output as held while its segment is rebuilt, and JAX
  holds what the backward reads. On ``benchmarks/graph_memory.py`` model / measured is
  0.63-1.57 for budgeted plans. So the budgeted search's model budget is only a knob: each
  candidate set is measured with :func:`jaxremat.activation_memory` on the program it
  yields, and the plan is the least recompute among those that fit
  (:mod:`jaxremat.graph.budget`). If none fits, the least-memory plan without a budget is
  used when it fits: a budget that ``remat_graph(fn)`` meets is always met.

Without a budget the plan is the least *measured* of three: the least-memory checkpoints
with their kept tensors recomputed or saved, and the plain function (the least recompute
first among equals). On a small function the model's least can hold more than the plain
function (21 of 290 random functions of 3-8 operations, up to 1.38x, before this choice).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp

import solver
from solver.errors import check_real
from solver.graph.model import memory_of

from ..budget import check_budget, empty_input_hint, resolve_budget
from ..measure.dataflow import SOURCE, TARGET, trace_graph
from ..measure.meter import activation_memory
from ..trace_state import vmap_levels
from ..trees import abstractify, leaf_shapes, signature
from .budget import fit_budget
from .memo import PlanningMemo, SignatureMemo, memo_for
from .plan import GraphPlan, regions_of, run_regions

__all__ = ["GraphPlan", "RematGraph", "remat_graph", "run_regions"]

def _scalar(out: Any) -> jax.Array:
    """The sum of the floating-point leaves of ``out`` (real parts): a loss to measure with."""
    leaves = [jnp.sum(jnp.real(leaf)) for leaf in jax.tree.leaves(out)
              if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)]
    return sum(leaves, jnp.zeros((), jnp.float32))


def _stacked(tree: Any, batch: int) -> Any:
    """``tree`` of ``jax.ShapeDtypeStruct`` with a leading axis of ``batch`` on each leaf."""
    return jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct((batch, *leaf.shape), leaf.dtype, weak_type=leaf.weak_type),
        tree)


WORK_LIMIT = 2_000_000
"""Default ``work_limit`` of :func:`remat_graph`: candidates each budgeted search may examine
(:func:`solver.checkpoint_search`), about 0.4 to 0.7 CPU seconds on the 2-core container of
benchmarks/RESULTS.md."""

MODULE_WORK_LIMIT = 1_000_000
"""Default ``work_limit`` of :class:`jaxremat.flax.RematModule`, half of :data:`WORK_LIMIT`
(issue 18.4: a model's first budget planned in <= 5 CPU s). On the 6-block ResNet of
``benchmarks/planning_time.py`` it gives the same plans as ``WORK_LIMIT`` at 50/60/75/90 %."""


def check_graph_settings(max_vertices: int, time_limit: float | None,
                         work_limit: int | None = None) -> None:
    """Raise ``ValueError`` naming the fix unless ``max_vertices`` is a positive integer,
    ``time_limit`` is ``None`` or a finite number of seconds ``>= 0`` and ``work_limit``
    ``None`` or a finite number ``>= 0``."""
    if isinstance(max_vertices, bool) or not isinstance(max_vertices, numbers.Integral) or (
            max_vertices < 1):
        raise ValueError(
            f"max_vertices must be a positive integer (the default is 1000), got {max_vertices!r}."
        )
    if time_limit is not None:
        check_real(time_limit, "time_limit", hint="Pass seconds, or None (the default).")
    if work_limit is not None:
        check_real(work_limit, "work_limit",
                   hint=f"Pass a number of candidates (the default is {WORK_LIMIT:.0e}), or None.")


class RematGraph:
    """``fn`` run with Feng & Huang's checkpoints. Create it with :func:`remat_graph`."""

    def __init__(self, fn: Callable, budget: int | str | None, max_vertices: int,
                 time_limit: float | None, memo: PlanningMemo | None = None,
                 work_limit: int | None = WORK_LIMIT) -> None:
        check_graph_settings(max_vertices, time_limit, work_limit)
        self.fn = fn
        self.budget = None if budget is None else check_budget(budget)
        self.max_vertices = max_vertices
        self.time_limit = time_limit
        self.work_limit = work_limit
        # what every budget of fn shares (jaxremat.graph.memo); max_vertices only refuses
        self._memo = memo_for(fn) if memo is None else memo
        self._cache: dict[Any, tuple[TracedGraph, GraphPlan]] = {}
        self._functions: dict[Any, dict] = {}  # the regions' functions (run_regions)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__name__", self.fn)
        return f"RematGraph({name!r}, budget={self.budget!r}, max_vertices={self.max_vertices})"

    def _planned(self, params: Any, x: Any) -> tuple[TracedGraph, GraphPlan, dict]:
        # the vmap levels over (params, x) and the leaves each batches (an ensemble batches
        # the params only, a table shared by the examples is not batched): the plans are
        # measured that way, for the whole batch
        batched = vmap_levels((params, x)) or None
        batch = math.prod(size for size, _ in batched or ())
        abstract_params, abstract_x = abstractify(params, "params"), abstractify(x, "x")
        key = (signature(abstract_params), signature(abstract_x), batch, batched)
        with self._memo.lock:
            if key not in self._cache:
                memo = self._memo.entry((key, self.max_vertices), lambda: trace_graph(
                    self.fn, abstract_params, abstract_x, max_vertices=self.max_vertices))
                self._cache[key] = (memo.traced, self._plan(memo, abstract_params, abstract_x,
                                                            batch, batched))
                self._functions[key] = memo.functions
            return (*self._cache[key], self._functions[key])

    def _plan(self, memo: SignatureMemo, params: Any, x: Any, batch: int,
              batched: tuple[tuple[int, tuple[bool, ...]], ...] | None = None) -> GraphPlan:
        traced, least = memo.traced, memo.least
        graph = traced.graph
        forward = float(graph.costs.sum())

        def plan_of(found: solver.CheckpointSet, save_kept: bool = self.budget is not None,
                    **measured) -> GraphPlan:
            regions = tuple(regions_of(traced, found)) if found.segments else ()
            kept = set(found.checkpoints)
            checkpointed = tuple(not save_kept or not kept.issuperset(region) for region in regions)
            saved = frozenset(v for region, remat in zip(regions, checkpointed) if remat
                              for v in region if v in kept) if save_kept else frozenset()
            return GraphPlan(graph, found, regions, checkpointed, saved, found.peak * batch,
                             found.recompute / forward if forward else 0.0, **measured)

        def measure(plan: GraphPlan) -> int:
            """The whole batch's bytes: under ``vmap`` the vmapped program is measured (its
            batching rules may add buffers), by a ``vmap`` per level of ``batched``, each
            batching its leaves along a leading axis of its size. Once per plan (its kept set
            and whether it saves them) and signature: ``memo``."""
            key = (plan.checkpoints.checkpoints, plan.checkpointed, plan.saved)
            return memo.measured(key, lambda: _measure(plan))

        def _measure(plan: GraphPlan) -> int:
            # every leaf of params is a parameter, as in activation_memory(g, params, x):
            # integer and boolean leaves (counters, masks) are not counted either
            loss = lambda p, x: _scalar(run_regions(traced, plan, p, x, memo.functions))  # noqa: E731
            if batched is None:
                return activation_memory(loss, params, x)
            leaves, tree = jax.tree.flatten((params, x))
            for size, which in reversed(batched):  # the innermost level's vmap first
                loss = jax.vmap(loss, in_axes=tree.unflatten([0 if b else None for b in which]))
                leaves = [_stacked(leaf, size) if b else leaf for leaf, b in zip(leaves, which)]
            return activation_memory(lambda *args: jnp.sum(loss(*args)), *tree.unflatten(leaves))

        inner = [v for v in graph.topological_order if v not in (SOURCE, TARGET)]
        everything = memory_of(graph, list(range(1, len(graph) - 1)))[0]
        keep_all = solver.CheckpointSet(tuple(inner), (), everything, 0.0)
        if self.budget is None:
            # the least measured of the least-memory checkpoints (kept tensors recomputed
            # with their regions, or saved) and the plain function, the least recompute
            # first among equals: on a small function the model's least can hold more
            # (a plan the meter cannot read, e.g. names under JAX's experimental jax_remat3,
            # is not a candidate; the least-memory set runs unmeasured if none can be read)
            found = []
            for plan in (plan_of(keep_all), plan_of(least, save_kept=True),
                         plan_of(least, save_kept=False)):
                try:
                    found.append((measure(plan), len(found), plan))
                except NotImplementedError:
                    continue
            if not found:
                return plan_of(least)
            size, _, plan = min(found)
            return dataclasses.replace(plan, measured=int(size))
        plain = measure(plan_of(keep_all))
        budget = resolve_budget(self.budget, plain)
        try:
            found, measured = fit_budget(graph, least, measure(plan_of(least)), plain, budget,
                                         lambda found: measure(plan_of(found)), time_limit=self.time_limit,
                                         work_limit=self.work_limit, search=memo.search)
        except solver.InfeasibleBudget as error:
            # Whatever fits without a budget fits with one: the least-memory plan, its kept
            # tensors recomputed with their regions (less memory, more flops).
            fallback = plan_of(least, save_kept=False)
            lowest = measure(fallback)
            if lowest > budget:
                raise solver.InfeasibleBudget(budget, min(lowest, error.min_budget), "remat_graph",
                                              units="bytes", exact=False, other_methods=False,
                                              hint=empty_input_hint(self.budget, leaf_shapes(x))) from None
            return dataclasses.replace(fallback, budget=budget, measured=int(lowest))
        return plan_of(keep_all if found is None else found, budget=budget, measured=int(measured))

    def plan(self, params: Any, x: Any) -> GraphPlan:
        """The plan used for inputs shaped like ``(params, x)``."""
        return self._planned(params, x)[1]

    def __call__(self, params: Any, x: Any):
        traced, plan, functions = self._planned(params, x)
        return run_regions(traced, plan, params, x, functions)


def remat_graph(
    fn: Callable,
    budget: int | float | str | None = None,
    *,
    max_vertices: int = 1000,
    time_limit: float | None = None,
    work_limit: int | None = WORK_LIMIT,
) -> RematGraph:
    """Rematerialize ``fn(params, x)`` with Feng & Huang's optimal gradient checkpoints.

    Args:
      fn: a function of a parameter pytree and an input pytree; any JAX code (branches,
        residual connections, concatenations: the dataflow graph need not be a chain).
      budget: ``None`` for the checkpoints of least memory in Feng & Huang's model.
        Otherwise the bound on *measured* memory: bytes, a string such as ``"512MiB"``,
        or a share of the plain function's measured memory such as ``"40%"``. The plan is
        then the set of least recompute found whose :func:`jaxremat.activation_memory`
        (of the sum of ``fn``'s outputs, parameters and their gradients excluded) fits
        (:mod:`jaxremat.graph.budget`). Under ``jax.vmap`` it means the whole batch (or
        ensemble), and the vmapped program is what is measured.
      max_vertices: refuse functions with more top-level operations on ``x`` than this.
      time_limit: with a budget, seconds allowed to the (at most 5) budgeted searches
        together; one that runs out returns the best set it found. ``None`` (default): no
        limit. A time limit makes the plan depend on the machine's speed and load.
      work_limit: with a budget, candidates each budgeted search may examine
        (:func:`solver.checkpoint_search`; default :data:`WORK_LIMIT`, about 0.5-1 CPU
        seconds each); one that runs out returns the best set it found. Deterministic: the
        same function, shapes and budget give the same plan on any machine. ``None``: no
        limit. Planning happens once per input signature, when ``g`` is first traced.

    Returns:
      A :class:`RematGraph`; ``g(params, x)`` equals ``fn(params, x)`` and so do its
      gradients (under ``jit``, ``grad``, ``vmap``); ``g.plan(params, x)`` returns the
      :class:`GraphPlan`.

    Raises (when first traced): ``ValueError`` when nothing depends on ``x`` or the graph
    has more than ``max_vertices`` operations; ``solver.InfeasibleBudget`` (a
    ``ValueError``) when no plan tried fits the budget (the least-memory checkpoints, the
    budgeted searches' sets and the plain function), with the least they measure in
    ``min_budget`` and in the message: a budget that works. At construction:
    ``ValueError`` for a malformed budget, ``max_vertices``, ``time_limit`` or ``work_limit``.
    """
    if not callable(fn):
        raise TypeError(f"remat_graph expects a function fn(params, x), got {type(fn).__name__}.")
    return RematGraph(fn, budget, max_vertices, time_limit, work_limit=work_limit)
