"""The dataflow graph of a JAX function, for Feng & Huang's checkpoint search.

:func:`trace_graph` traces ``fn(params, x)`` to a jaxpr and turns its top-level equations
into a :class:`solver.Graph` (Feng & Huang, "Optimal Gradient Checkpoint Search for
Arbitrary Computation Graphs", CVPR 2021, section 3): one vertex per equation that depends
on ``x`` (its size: the bytes of its outputs; its cost: an estimate of its flops), a source
vertex ``"input"`` standing for ``x`` and a target vertex ``"output"`` reading every result.
An edge ``u -> v`` means equation ``v`` reads a value equation ``u`` produced.

Equations that do not depend on ``x`` (casting or transposing parameters, constants) are
not vertices: they are the *parameter side* and run once, before everything else. Edges
from parameters are left out on purpose: parameters are always available, so they constrain
no recomputation, and counting them would join every layer to the source and hide the
graph's articulation points from the division tree.

A call (``jit``, ``custom_vjp``, ``checkpoint``...) is one equation, hence one vertex, whose
cost is the sum of its body's. The graph is as fine as the jaxpr: an elementwise op is a
vertex. Functions of more than ``max_vertices`` equations are refused with a message
pointing to :func:`jaxremat.remat_sequence` (layer-level planning).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn, Literal, Var

import solver

from .meter import aval_nbytes

__all__ = ["TracedGraph", "trace_graph", "equation_flops", "SOURCE", "TARGET"]

SOURCE = "input"
TARGET = "output"
_CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _body(eqn: JaxprEqn) -> Jaxpr | None:
    """The body jaxpr of a call equation (``jit``, ``custom_vjp``...), or ``None``."""
    for key in _CALL_PARAMS:
        body = eqn.params.get(key)
        if isinstance(body, ClosedJaxpr):
            return body.jaxpr
        if isinstance(body, Jaxpr):
            return body
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
      graph: the :class:`solver.Graph`; vertex ``i`` (an int) is equation ``i``.
      param_side: indices of the equations that do not depend on ``x``, in program order.
    """

    closed: ClosedJaxpr
    out_tree: Any
    graph: solver.Graph
    param_side: tuple[int, ...]


def trace_graph(fn: Callable, params: Any, x: Any, *, max_vertices: int = 1000) -> TracedGraph:
    """Trace ``fn(params, x)`` (abstract values suffice) and build its dataflow graph."""
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(params, x)
    jaxpr = closed.jaxpr
    n_params = len(jax.tree.leaves(params))
    x_vars = set(jaxpr.invars[n_params:])
    producer: dict[Var, int] = {}
    depends = [False] * len(jaxpr.eqns)
    edges: set[tuple[Any, Any]] = set()
    for i, eqn in enumerate(jaxpr.eqns):
        for var in eqn.invars:
            if isinstance(var, Literal):
                continue
            if var in x_vars:
                depends[i] = True
                edges.add((SOURCE, i))
            elif var in producer and depends[producer[var]]:
                depends[i] = True
                edges.add((producer[var], i))
        for var in eqn.outvars:
            producer[var] = i
    vertices = [i for i, d in enumerate(depends) if d]
    if not vertices:
        raise ValueError(
            "remat_graph: no operation of fn depends on x, so there is nothing to rematerialize."
        )
    if len(vertices) > max_vertices:
        raise ValueError(
            f"remat_graph: fn has {len(vertices)} operations on x, more than max_vertices="
            f"{max_vertices}. Raise max_vertices (the search may take long), or group the "
            f"model into layers and use jaxremat.remat_sequence."
        )
    read = {src for src, _ in edges}
    results = [producer[v] for v in jaxpr.outvars if isinstance(v, Var) and v in producer
               and depends[producer[v]]]
    if not results:
        raise ValueError("remat_graph: no result of fn depends on x; there is no backward to plan.")
    for i in set(results) | {i for i in vertices if i not in read}:
        edges.add((i, TARGET))
    sizes = {SOURCE: float(sum(aval_nbytes(v.aval) for v in x_vars))}
    costs = {SOURCE: 0.0}
    for i in vertices:
        sizes[i] = float(_bytes(jaxpr.eqns[i]))
        costs[i] = equation_flops(jaxpr.eqns[i])
    sizes[TARGET] = 0.0
    costs[TARGET] = 0.0
    graph = solver.Graph.from_edges(sorted(edges, key=_edge_key), sizes, costs)
    param_side = tuple(i for i, d in enumerate(depends) if not d)
    return TracedGraph(closed, jax.tree.structure(out_shape), graph, param_side)


def _edge_key(edge):
    return tuple(-1 if v == SOURCE else (1 << 60) if v == TARGET else v for v in edge)
