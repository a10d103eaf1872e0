"""``remat_graph``: Feng & Huang's optimal checkpoints applied to any JAX function.

``g = remat_graph(fn)`` returns a callable ``g(params, x)`` equal to ``fn(params, x)``. The
first time it is traced for an input signature it builds the dataflow graph of ``fn``'s
jaxpr (:mod:`jaxremat.graph`), runs :func:`solver.checkpoint_search` on it (the set of
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

Why there is no budget: the model charges every vertex's output as held while its segment
is rebuilt, and JAX holds what the backward reads, which is sometimes less and sometimes
more. For the least-memory sets the two are close (model / ``activation_memory`` =
0.57-1.31 on the models of ``benchmarks/graph_memory.py``). For the looser sets that a
budget would allow, they drift apart unpredictably: 0.80-2.92 at 10-60% of the way from
the least memory to keeping everything. A budget in the model's bytes would therefore
promise nothing about the real peak. For a memory/time trade-off under a budget, plan
the model as layers with :func:`jaxremat.remat_sequence`.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any, Callable

import jax
from jax.extend.core import ClosedJaxpr, DebugInfo, Jaxpr, Literal, jaxpr_as_fun

import solver
from solver.graph_model import strongly_connected

from .graph import SOURCE, TARGET, TracedGraph, trace_graph
from .trace_state import vmap_batch_size
from .trees import abstractify, signature

__all__ = ["GraphPlan", "RematGraph", "remat_graph"]


@dataclasses.dataclass(frozen=True)
class GraphPlan:
    """What :class:`RematGraph` does for one input signature.

    Attributes:
      graph: the dataflow graph searched (vertex ``i``: the group of top-level equations that
        starts with equation ``i``).
      checkpoints: the search's result (kept vertices, segments, model memory, recompute).
      regions: the vertices of each checkpointed region, in the order they run.
      predicted: the model's training memory of the kept set, in bytes.
      recompute: extra flops spent rebuilding segments, as a fraction of the forward's.
    """

    graph: solver.Graph
    checkpoints: solver.CheckpointSet
    regions: tuple[tuple[int, ...], ...]
    predicted: float
    recompute: float

    def __str__(self) -> str:
        kept = len(self.checkpoints.checkpoints)
        inner = len(self.graph) - 2
        return (
            f"GraphPlan: {inner} operation groups, {kept} kept, {len(self.checkpoints.segments)} "
            f"segments rebuilt, {len(self.regions)} regions; model memory "
            f"{self.predicted / 2**20:.2f} MiB, recompute +{100 * self.recompute:.1f}%"
        )


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


def run_regions(traced: TracedGraph, regions, params: Any, x: Any):
    """Evaluate ``traced.closed`` on ``(params, x)``, each region under ``jax.checkpoint``."""
    jaxpr = traced.closed.jaxpr
    env = dict(zip(jaxpr.constvars, traced.closed.consts))
    env.update(zip(jaxpr.invars, jax.tree.leaves(params) + jax.tree.leaves(x)))
    equations = [tuple(sorted(i for v in region for i in traced.members[v])) for region in regions]
    blocks = [(False, traced.param_side)] + [(True, ids) for ids in equations]
    owner = {i: k for k, (_, ids) in enumerate(blocks) for i in ids}
    read_by = {k: set() for k in range(len(blocks))}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, Literal):
                read_by[owner[i]].add(v)
    final = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    for k, (remat, ids) in enumerate(blocks):
        if not ids:
            continue
        later = set().union(final, *(read_by[m] for m in range(len(blocks)) if m != k))
        sub, inputs, outputs = _sub_jaxpr(jaxpr, ids, later)
        run = jaxpr_as_fun(ClosedJaxpr(sub, []))
        if remat:
            run = jax.checkpoint(run, prevent_cse=True)
        env.update(zip(outputs, run(*(env[v] for v in inputs))))
    outs = [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]
    return jax.tree.unflatten(traced.out_tree, outs)


class RematGraph:
    """``fn`` run with Feng & Huang's checkpoints. Create it with :func:`remat_graph`."""

    def __init__(self, fn: Callable, max_vertices: int) -> None:
        self.fn = fn
        self.max_vertices = max_vertices
        self._cache: dict[Any, tuple[TracedGraph, GraphPlan]] = {}

    def __repr__(self) -> str:
        return f"RematGraph({getattr(self.fn, '__name__', self.fn)!r}, max_vertices={self.max_vertices})"

    def _planned(self, params: Any, x: Any) -> tuple[TracedGraph, GraphPlan]:
        batch = vmap_batch_size(x)
        abstract_params, abstract_x = abstractify(params, "params"), abstractify(x, "x")
        key = (signature(abstract_params), signature(abstract_x), batch)
        if key not in self._cache:
            traced = trace_graph(self.fn, abstract_params, abstract_x, max_vertices=self.max_vertices)
            graph = traced.graph
            found = solver.checkpoint_search(graph)
            forward = float(graph.costs.sum())
            plan = GraphPlan(graph, found, tuple(_regions(traced, found)), found.peak * batch,
                             found.recompute / forward if forward else 0.0)
            self._cache[key] = (traced, plan)
        return self._cache[key]

    def plan(self, params: Any, x: Any) -> GraphPlan:
        """The plan used for inputs shaped like ``(params, x)``."""
        return self._planned(params, x)[1]

    def __call__(self, params: Any, x: Any):
        traced, plan = self._planned(params, x)
        return run_regions(traced, plan.regions, params, x)


def remat_graph(fn: Callable, *, max_vertices: int = 1000) -> RematGraph:
    """Rematerialize ``fn(params, x)`` with Feng & Huang's optimal gradient checkpoints.

    Args:
      fn: a function of a parameter pytree and an input pytree; any JAX code (branches,
        residual connections, concatenations: the dataflow graph need not be a chain).
      max_vertices: refuse functions with more top-level operations on ``x`` than this.

    Returns:
      A :class:`RematGraph`; ``g(params, x)`` equals ``fn(params, x)`` and so do its
      gradients (under ``jit``, ``grad``, ``vmap``); ``g.plan(params, x)`` returns the
      :class:`GraphPlan`. The checkpoints are those of least memory in Feng & Huang's
      model; there is no budget (module docstring).

    Raises (when first traced): ``ValueError`` when nothing depends on ``x`` or the graph
    has more than ``max_vertices`` operations.
    """
    if not callable(fn):
        raise TypeError(f"remat_graph expects a function fn(params, x), got {type(fn).__name__}.")
    return RematGraph(fn, max_vertices)
