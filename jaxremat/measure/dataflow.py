"""The dataflow graph of a JAX function, for Feng & Huang's checkpoint search.

:func:`trace_graph` traces ``fn(params, x)`` to a jaxpr and turns its top-level equations
into a :class:`solver.Graph` (Feng & Huang, "Optimal Gradient Checkpoint Search for
Arbitrary Computation Graphs", CVPR 2021, section 3): one vertex per equation that depends
on ``x``, or per short group of them (:func:`trace_graph`), sized by the bytes of its
outputs and costed by an estimate of its flops; a source vertex ``"input"`` standing for
``x``; a target vertex ``"output"`` reading every result. An edge ``u -> v`` means that
``v`` reads a value ``u`` produced.

Equations that do not depend on ``x`` (casting or transposing parameters, constants) are
not vertices: they are the *parameter side* and run once, before everything else. Edges
from parameters are left out on purpose: parameters are always available, so they constrain
no recomputation, and counting them would join every layer to the source and hide the
graph's articulation points from the division tree.

A call (``jit``, ``custom_vjp``, ``checkpoint``...) is one equation, hence one vertex, whose
cost is the sum of its body's. Functions of more than ``max_vertices`` vertices are refused
with a message pointing to :func:`jaxremat.remat_sequence` (layer-level planning).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var

import solver

from ..jax_compat import as_jaxpr, is_call, sub_jaxprs
from .meter import aval_nbytes

__all__ = ["TracedGraph", "trace_graph", "equation_flops", "SOURCE", "TARGET"]

SOURCE = "input"
TARGET = "output"
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _body(eqn: JaxprEqn) -> Jaxpr | None:
    """The body jaxpr of a call equation (``jit``, ``custom_vjp``, ``eval_jaxpr``, a
    ``jax_remat3`` checkpoint...), or ``None``."""
    params = eqn.params
    for key in _CALL_PARAMS:
        if key in params:
            body = as_jaxpr(params[key])
            if body is not None:
                return body
    if is_call(eqn):
        bodies = sub_jaxprs(eqn)
        return bodies[0] if bodies else None
    return None


def _elements(var) -> int:
    shape = getattr(var.aval, "shape", ())
    return math.prod(shape)


def equation_flops(eqn: JaxprEqn) -> float:
    """An estimate of the flops of one equation (the vertex cost of the graph).

    ``dot_general``: ``2 * out * K`` (``K`` the product of contracted dimensions);
    ``conv_general_dilated``: ``2 * out * (kernel window * input features per group)``; a
    call: the sum over its body; anything else: one flop per output element. Only ratios
    between vertices matter to the search (which minimises memory, then recompute).
    """
    name = eqn.primitive.name
    out = sum(_elements(v) for v in eqn.outvars)
    if name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * out * math.prod(lhs[d] for d in contract)
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, spatial...)
        window = math.prod(rhs[d] for d in spec[1:])
        return 2.0 * out * window
    body = _body(eqn)
    if body is not None:
        return float(sum(equation_flops(e) for e in body.eqns)) or float(out)
    return float(out)


def _bytes(eqn: JaxprEqn) -> int:
    return sum(aval_nbytes(v.aval) for v in eqn.outvars if isinstance(v, Var) and not _dropped(v))


def _dropped(var) -> bool:
    return type(var).__name__ == "DropVar"


@dataclasses.dataclass(frozen=True)
class TracedGraph:
    """A traced function and its dataflow graph.

    Attributes:
      closed: the jaxpr of ``fn(params, x)`` (invars: the leaves of ``params``, then ``x``).
      out_tree: the pytree structure of ``fn``'s result.
      graph: the :class:`solver.Graph`; vertex ``i`` (an int) is the group of equations
        that starts with equation ``i``.
      members: the equations each vertex runs, in program order: its group, then the
        forward-only equations (no gradient flows through them) whose last input on ``x``
        it produces.
      param_side: the equations that run first, outside any checkpoint, in program order:
        those that do not depend on ``x``, and forward-only ones reading only ``x``.
    """

    closed: ClosedJaxpr
    out_tree: Any
    graph: solver.Graph
    members: Mapping[int, tuple[int, ...]]
    param_side: tuple[int, ...]


_STARTS_VERTEX = ("dot_general", "conv_general_dilated")


def _fuses(eqn: JaxprEqn, read: Var) -> bool:
    """Whether ``eqn``, whose only input on ``x`` is ``read``, joins ``read``'s vertex:
    a shape-preserving op that is not a matmul, a convolution or a call."""
    outs = [v for v in eqn.outvars if not _dropped(v)]
    return (len(outs) == 1 and getattr(outs[0].aval, "shape", None) == getattr(read.aval, "shape", ())
            and eqn.primitive.name not in _STARTS_VERTEX and _body(eqn) is None)


def trace_graph(fn: Callable, params: Any, x: Any, *, max_vertices: int = 1000) -> TracedGraph:
    """Trace ``fn(params, x)`` (abstract values suffice) and build its dataflow graph.

    Vertices are groups of equations: an equation that reads one value on ``x``, the only
    output of the equation before it and read by nothing else, and that preserves its shape
    (bias adds, activations, casts, scalings) joins that equation's vertex, so that a
    ``conv -> add bias -> relu`` is one vertex whose size is its output's. Matmuls,
    convolutions, calls, reductions and reshapes start a vertex of their own.

    Equations no gradient flows through (a BatchNorm's running statistics, returned through
    ``stop_gradient``; counters) are not vertices: they need no backward, and as extra
    results they would tie the graph into one large complex division. Each runs with the
    vertex that produces its last input on ``x``; an edge from its other inputs' vertices
    keeps the order.
    """
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(params, x)
    jaxpr = closed.jaxpr
    n_params = len(jax.tree.leaves(params))
    x_vars = set(jaxpr.invars[n_params:])
    producer: dict[Var, int] = {}
    readers: dict[Var, int] = {}
    depends = [False] * len(jaxpr.eqns)
    on_x: list[list[Var]] = []
    for i, eqn in enumerate(jaxpr.eqns):
        inputs = []
        for var in eqn.invars:
            if isinstance(var, Literal):
                continue
            readers[var] = readers.get(var, 0) + 1
            if (var in x_vars or (var in producer and depends[producer[var]])) and var not in inputs:
                inputs.append(var)
        depends[i] = bool(inputs)
        on_x.append(inputs)
        for var in eqn.outvars:
            producer[var] = i
    outputs = {v for v in jaxpr.outvars if isinstance(v, Var)}
    live = _gradient_live(jaxpr, depends, producer)
    vertex_of: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    tails: dict[Any, list[int]] = {}
    edges: set[tuple[Any, Any]] = set()
    for i, inputs in enumerate(on_x):
        if not depends[i]:
            continue
        if not live[i]:  # forward only: runs with the vertex of its last input on x
            owners = [SOURCE if var in x_vars else vertex_of[producer[var]] for var in inputs]
            vertex_of[i] = max(owners, key=lambda u: -1 if u == SOURCE else u)  # u: its first equation
            tails.setdefault(vertex_of[i], []).append(i)
            edges.update((u, vertex_of[i]) for u in owners if u not in (SOURCE, vertex_of[i]))
            continue
        v = inputs[0] if len(inputs) == 1 else None
        if (v is not None and v not in x_vars and readers[v] == 1 and v not in outputs
                and members[vertex_of[producer[v]]][-1] == producer[v] and _fuses(jaxpr.eqns[i], v)):
            vertex_of[i] = vertex_of[producer[v]]
        else:
            vertex_of[i] = i
        members.setdefault(vertex_of[i], []).append(i)
    if not members:
        raise ValueError(
            "remat_graph: no operation of fn that depends on x has a gradient (none on x, or "
            "only integer results such as argmax), so there is nothing to rematerialize; call "
            "fn directly."
        )
    if len(members) > max_vertices:
        raise ValueError(
            f"remat_graph: fn has {len(members)} operation groups on x, more than max_vertices="
            f"{max_vertices}. Raise max_vertices (the search may take long), or group the "
            f"model into layers and use jaxremat.remat_sequence."
        )
    for i, vertex in vertex_of.items():
        if not live[i]:
            continue
        for var in on_x[i]:
            u = SOURCE if var in x_vars else vertex_of[producer[var]]
            if u != vertex:
                edges.add((u, vertex))
    results = {vertex_of[producer[v]] for v in outputs if v in producer and live[producer[v]]}
    if not results:
        raise ValueError("remat_graph: no result of fn depends on x; there is no backward to plan.")
    read = {u for u, _ in edges}
    for vertex in results | {w for w in members if w not in read}:
        edges.add((vertex, TARGET))
    sizes = {SOURCE: float(sum(aval_nbytes(v.aval) for v in x_vars))}
    costs = {SOURCE: 0.0}
    for vertex, ids in members.items():
        sizes[vertex] = float(_bytes(jaxpr.eqns[ids[-1]]))
        costs[vertex] = sum(equation_flops(jaxpr.eqns[i]) for i in ids)
    sizes[TARGET] = 0.0
    costs[TARGET] = 0.0
    graph = solver.Graph.from_edges(sorted(edges, key=_edge_key), sizes, costs)
    param_side = tuple(sorted([i for i, d in enumerate(depends) if not d] + tails.pop(SOURCE, [])))
    run = {k: tuple(sorted(v + tails.get(k, []))) for k, v in members.items()}
    return TracedGraph(closed, jax.tree.structure(out_shape), graph, run, param_side)


def _gradient_live(jaxpr: Jaxpr, depends: list[bool], producer: dict[Var, int]) -> list[bool]:
    """Per equation: whether a gradient flows through it, i.e. it depends on ``x`` and some
    output of it reaches a floating-point result of the function other than through
    ``stop_gradient``. The others (running statistics, counters) are forward only."""
    wanted = {v for v in jaxpr.outvars if isinstance(v, Var) and v in producer
              and jaxpr.eqns[producer[v]].primitive.name != "stop_gradient"
              and jnp.issubdtype(v.aval.dtype, jnp.inexact)}
    live = [False] * len(jaxpr.eqns)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        if depends[i] and eqn.primitive.name != "stop_gradient" and any(v in wanted for v in eqn.outvars):
            live[i] = True
            wanted.update(v for v in eqn.invars if isinstance(v, Var))
    return live


def _edge_key(edge):
    return tuple(-1 if v == SOURCE else (1 << 60) if v == TARGET else v for v in edge)
