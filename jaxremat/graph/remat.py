"""``remat_graph``: Feng & Huang's optimal checkpoints applied to any JAX function.

``g = remat_graph(fn)`` returns a callable ``g(params, x)`` equal to ``fn(params, x)``. The
first time it is traced for an input signature it builds the dataflow graph of ``fn``'s
jaxpr (:mod:`jaxremat.measure.dataflow`), runs :func:`solver.checkpoint_search` on it (the set of
kept tensors of least training memory in Feng & Huang's model, CVPR 2021), and runs ``fn`` as a sequence of *regions*, each
under its own ``jax.checkpoint``:

* every segment of the search (a group of tensors rebuilt together) is one region, joined by
  the equations of the kept tensors that read it (a kept tensor is computed where its
  inputs are, so that its backward finds them rebuilt, not stored);
* a kept tensor whose inputs are all kept or inputs is a region of its own;
* regions that read each other both ways are merged (strongly connected classes, as the
  model merges segments), and they run in topological order.

A region's inputs are the residuals its checkpoint saves: the kept tensors, ``x`` and the
parameters. In the backward, each region rebuilds its tensors just before its own backward,
one region at a time, which is how the model charges memory: the kept tensors plus the
largest rebuilt segment. The parameter side (equations not depending on ``x``) runs first,
outside any checkpoint.

A budget (``remat_graph(fn, budget)``) bounds *measured* memory, not the model's, and asks
for the least recompute. Two things change:

* No kept tensor is recomputed, as the model's recompute assumes: a region of kept tensors
  only runs without ``jax.checkpoint``, and inside the other regions the kept tensors are
  named (``checkpoint_name``) and saved by a ``save_only_these_names`` policy. (Without a
  budget they are recomputed with their region, which costs flops the model does not count
  but saves what their backward reads: the least-memory plan keeps that choice where it
  measures least.) A name
  reaches the outputs of a kept vertex's equations, not the residuals JAX's rules take
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
import heapq
import math
import numbers
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import DebugInfo, Jaxpr, Literal, jaxpr_as_fun

import solver
from solver.errors import check_real
from solver.graph.model import memory_of, strongly_connected

from ..budget import check_budget, empty_input_hint, format_bytes, resolve_budget
from ..measure.dataflow import SOURCE, TARGET, TracedGraph, trace_graph
from .budget import fit_budget
from .memo import PlanningMemo, SignatureMemo, memo_for
from ..jax_compat import close_jaxpr
from ..measure.meter import activation_memory
from ..trace_state import vmap_levels
from ..trees import abstractify, leaf_shapes, signature

__all__ = ["GraphPlan", "RematGraph", "remat_graph"]

SAVED = "jaxremat_saved"  # the checkpoint_name of kept values saved inside a region


@dataclasses.dataclass(frozen=True)
class GraphPlan:
    """What :class:`RematGraph` does for one input signature.

    Attributes:
      graph: the dataflow graph searched (vertex ``i``: the group of top-level equations that
        starts with equation ``i``).
      checkpoints: the search's result (kept vertices, segments, model memory, recompute).
      regions: the vertices of each region, in the order they run; empty when the plain
        function fits the budget (nothing is checkpointed).
      checkpointed: for each region, whether it runs under ``jax.checkpoint``.
      saved: kept vertices whose values a checkpointed region saves for its backward
        (``checkpoint_name`` and a ``save_only_these_names`` policy) instead of recomputing.
        Without a budget, none where the least measured plan recomputes kept vertices
        inside a region with it (every region checkpointed). With a budget, no kept vertex
        is recomputed, as the model's recompute assumes: a region of kept vertices only runs
        without ``jax.checkpoint``, and the kept vertices of the other regions are saved.
      predicted: the model's training memory of the kept set, in bytes.
      recompute: extra flops spent rebuilding segments, as a fraction of the forward's (the
        model's count; without a budget JAX also recomputes kept tensors with their region,
        see ``flops x`` in ``benchmarks/graph_memory.py``: 1.16-1.27x for least memory).
      budget: the budget in bytes, or ``None`` (least memory).
      measured: the plan's :func:`jaxremat.activation_memory` (of the sum of ``fn``'s
        outputs) in bytes: at most ``budget``, and without one the least of the plans
        :class:`RematGraph` measured (module docstring).
    """

    graph: solver.Graph
    checkpoints: solver.CheckpointSet
    regions: tuple[tuple[int, ...], ...]
    checkpointed: tuple[bool, ...]
    saved: frozenset
    predicted: float
    recompute: float
    budget: int | None = None
    measured: int | None = None

    def __str__(self) -> str:
        kept = len(self.checkpoints.checkpoints)
        inner = len(self.graph) - 2
        text = (
            f"GraphPlan: {inner} operation groups, {kept} kept, {len(self.checkpoints.segments)} "
            f"segments rebuilt, {len(self.regions)} regions; model memory "
            f"{format_bytes(self.predicted)}, recompute +{100 * self.recompute:.1f}%"
        )
        if self.budget is None and self.measured is not None:
            text += f"; measured {format_bytes(self.measured)}, the least of the plans tried"
            if not self.regions:
                text += " (the plain function: it holds no more than the checkpoints)"
        if self.budget is not None:
            text += f"; measured {format_bytes(self.measured)} within a budget of {format_bytes(self.budget)}"
            if not self.checkpoints.segments:
                text += " (the budget covers what the plain function needs: nothing is recomputed)"
        return text


def _regions(traced: TracedGraph, kept_set: solver.CheckpointSet) -> list[tuple[int, ...]]:
    """Group the vertices into checkpoint regions (module docstring), in run order."""
    graph = traced.graph
    inner = [v for v in graph.topological_order if v not in (SOURCE, TARGET)]
    parent = {v: v for v in inner}

    def find(v):
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    def union(a, b):
        parent[find(a)] = find(b)

    for segment in kept_set.segments:
        for v in segment[1:]:
            union(v, segment[0])
    kept = set(kept_set.checkpoints)
    for v in kept:
        for u in graph.predecessors(v):
            if u != SOURCE and u not in kept:
                union(v, u)
    # merge regions on cycles of the quotient graph, then order it topologically
    members: dict[Any, list[int]] = {}
    for v in inner:
        members.setdefault(find(v), []).append(v)
    roots = list(members)
    index = {r: k for k, r in enumerate(roots)}
    succ: list[set[int]] = [set() for _ in roots]
    for v in inner:
        for w in graph.successors(v):
            if w != TARGET and find(w) != find(v):
                succ[index[find(v)]].add(index[find(w)])
    classes = strongly_connected(len(roots), succ)
    groups = [sorted(v for k in cls for v in members[roots[k]]) for cls in classes]
    order = _topological([set(g) for g in groups], graph)
    return [tuple(groups[k]) for k in order]


def _topological(groups: list[set[int]], graph: solver.Graph) -> list[int]:
    where = {v: k for k, g in enumerate(groups) for v in g}
    succ = [set() for _ in groups]
    indeg = [0] * len(groups)
    for k, g in enumerate(groups):
        for v in g:
            for w in graph.successors(v):
                if w in where and where[w] != k and where[w] not in succ[k]:
                    succ[k].add(where[w])
                    indeg[where[w]] += 1
    ready = sorted((min(g), k) for k, g in enumerate(groups) if indeg[k] == 0)
    order = []
    heapq.heapify(ready)
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for m in succ[k]:
            indeg[m] -= 1
            if indeg[m] == 0:
                heapq.heappush(ready, (min(groups[m]), m))
    if len(order) != len(groups):  # pragma: no cover - the classes above are acyclic
        raise AssertionError("remat_graph: the regions are not acyclic")
    return order


def _sub_jaxpr(jaxpr: Jaxpr, eqn_ids, needed_after) -> tuple[Jaxpr, list, list]:
    """The equations ``eqn_ids`` as a jaxpr: inputs read from outside, outputs read later."""
    eqns = [jaxpr.eqns[i] for i in eqn_ids]
    made = {v for e in eqns for v in e.outvars}
    inputs, seen = [], set()
    for e in eqns:
        for v in e.invars:
            if not isinstance(v, Literal) and v not in made and v not in seen:
                seen.add(v)
                inputs.append(v)
    outputs = [v for e in eqns for v in e.outvars if v in needed_after]
    effects = frozenset().union(*(e.effects for e in eqns)) if eqns else frozenset()
    info = DebugInfo("remat_graph", f"region of equations {eqn_ids[0]}..{eqn_ids[-1]}",
                     tuple(str(v) for v in inputs), tuple(str(v) for v in outputs))
    return Jaxpr([], inputs, outputs, eqns, effects, info), inputs, outputs


def _saved(value: Any) -> Any:
    """``value`` named ``SAVED``, unless complex: JAX 0.10 cannot apply a names policy to
    complex values (its partial evaluation emits a ``reduce_precision`` that rejects them),
    so those are recomputed instead; the plan's memory is measured either way."""
    if jnp.iscomplexobj(value):
        return value
    return checkpoint_name(value, SAVED)


def _region_function(jaxpr: Jaxpr, ids, needed_after, saved_eqns) -> tuple[Callable, list, list]:
    """The equations ``ids`` as a function of their inputs, returning what is read later.

    The outputs of the equations in ``saved_eqns`` are named ``SAVED`` (``checkpoint_name``),
    so that a ``jax.checkpoint`` with the policy ``save_only_these_names(SAVED)`` keeps them
    for the backward instead of recomputing them. Each such equation runs as a piece of its
    own, between pieces of the other equations.
    """
    sub, inputs, outputs = _sub_jaxpr(jaxpr, ids, needed_after)
    if not saved_eqns.intersection(ids):
        return jaxpr_as_fun(close_jaxpr(sub)), inputs, outputs
    chunks: list[list[int]] = [[]]
    for i in ids:
        if i in saved_eqns:
            chunks += [[i], []]
        else:
            chunks[-1].append(i)
    chunks = [chunk for chunk in chunks if chunk]
    pieces = []
    for k, chunk in enumerate(chunks):
        later = set(outputs).union(*(
            (v for v in jaxpr.eqns[i].invars if not isinstance(v, Literal))
            for rest in chunks[k + 1:] for i in rest))
        piece, piece_in, piece_out = _sub_jaxpr(jaxpr, chunk, later)
        pieces.append((jaxpr_as_fun(close_jaxpr(piece)), piece_in, piece_out, chunk[0] in saved_eqns))

    def run(*args):
        env = dict(zip(inputs, args))
        for fun, piece_in, piece_out, named in pieces:
            values = fun(*(env[v] for v in piece_in))
            env.update(zip(piece_out, [_saved(v) for v in values] if named else values))
        return [env[v] for v in outputs]

    return run, inputs, outputs


def run_regions(traced: TracedGraph, plan: GraphPlan, params: Any, x: Any,
                functions: dict | None = None):
    """Evaluate ``traced.closed`` on ``(params, x)`` as ``plan`` says: region ``k`` under
    ``jax.checkpoint`` when ``plan.checkpointed[k]``, keeping the values of ``plan.saved``
    (no regions: the plain function).

    ``functions`` (optional, one dict per traced graph: :attr:`SignatureMemo.functions`)
    keeps each region's function across calls, keyed by what defines it (its equations,
    outputs, saved equations and checkpoint policy). Plans of one signature share most
    regions, and JAX caches a checkpointed function's trace, JVP, partial evaluation and
    transpose by the function and its jaxpr, so a region already differentiated for one plan
    costs little in the next (issue 18.4). The program is the same either way."""
    jaxpr = traced.closed.jaxpr
    if not plan.regions:
        outs = jaxpr_as_fun(traced.closed)(*jax.tree.leaves(params), *jax.tree.leaves(x))
        return jax.tree.unflatten(traced.out_tree, outs)
    env = dict(zip(jaxpr.constvars, traced.closed.consts))
    env.update(zip(jaxpr.invars, jax.tree.leaves(params) + jax.tree.leaves(x)))
    equations = [tuple(sorted(i for v in region for i in traced.members[v])) for region in plan.regions]
    saved_eqns = {i for v in plan.saved for i in traced.members[v]}
    blocks = [(False, traced.param_side)] + list(zip(plan.checkpointed, equations))
    owner = {i: k for k, (_, ids) in enumerate(blocks) for i in ids}
    read_by = {k: set() for k in range(len(blocks))}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, Literal):
                read_by[owner[i]].add(v)
    final = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    policy = jax.checkpoint_policies.save_only_these_names(SAVED)
    for k, (remat, ids) in enumerate(blocks):
        if not ids:
            continue
        later = set().union(final, *(read_by[m] for m in range(len(blocks)) if m != k))
        saved_here = saved_eqns.intersection(ids) if remat else set()
        key = (remat, ids, tuple(v for i in ids for v in jaxpr.eqns[i].outvars if v in later),
               frozenset(saved_here), remat and bool(plan.saved))
        made = None if functions is None else functions.get(key)
        if made is None:
            run, inputs, outputs = _region_function(jaxpr, ids, later, saved_here)
            if remat:
                run = jax.checkpoint(run, prevent_cse=True, policy=policy if plan.saved else None)
            made = (run, inputs, outputs)
            if functions is not None:
                functions[key] = made
        run, inputs, outputs = made
        env.update(zip(outputs, run(*(env[v] for v in inputs))))
    outs = [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]
    return jax.tree.unflatten(traced.out_tree, outs)


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
            regions = tuple(_regions(traced, found)) if found.segments else ()
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
            candidates = (plan_of(keep_all), plan_of(least, save_kept=True),
                          plan_of(least, save_kept=False))
            sizes = [measure(plan) for plan in candidates]
            best = sizes.index(min(sizes))
            return dataclasses.replace(candidates[best], measured=int(sizes[best]))
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
