"""A :func:`jaxremat.remat_graph` plan: the regions a checkpoint set runs as, and running them.

:class:`GraphPlan` says, for one input signature, which vertices of ``fn``'s dataflow graph
(:mod:`jaxremat.measure.dataflow`) are kept (Feng & Huang's checkpoints, CVPR 2021) and how
``fn`` runs: as a sequence of *regions*, each under its own ``jax.checkpoint``
(:func:`regions_of`):

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
outside any checkpoint (:func:`run_regions`).
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.extend.core import DebugInfo, Jaxpr, Literal, jaxpr_as_fun

import solver
from solver.graph.model import strongly_connected

from ..budget import format_bytes
from ..jax_compat import close_jaxpr
from ..measure.dataflow import SOURCE, TARGET, TracedGraph

__all__ = ["GraphPlan", "SAVED", "regions_of", "run_regions"]

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


def regions_of(traced: TracedGraph, kept_set: solver.CheckpointSet) -> list[tuple[int, ...]]:
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
