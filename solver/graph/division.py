"""The division tree of a computation graph (Feng & Huang, CVPR 2021, arXiv:1808.00079, sec. 4).

An *independent segment* ``(u, w)`` of a DAG is a set of inner vertices that touch the rest of
the graph only through its two endpoints ``u`` (every inner vertex is reachable from it) and
``w`` (every inner vertex reaches it). The whole graph is the segment ``(source, target)``.
Feng & Huang divide segments recursively:

* **linear** (here :class:`Series`): the segment has *splitting vertices*, inner vertices every
  ``u -> w`` path passes through; they cut it into consecutive sub-segments.
* **branch** (here :class:`Parallel`): the inner vertices fall into several connected pieces
  that share only ``u`` and ``w`` (a direct edge ``u -> w`` counts as one more piece); each
  piece is a sub-segment.
* **complex** (here :class:`Complex`): neither applies (e.g. a DenseNet block where every
  layer reads every earlier one, or a "bridge" ``u->a, u->b, a->b, a->w, b->w``). Feng &
  Huang split such a segment further into maximal independent sub-segments between inner
  vertex pairs; we keep it whole and let the solver enumerate it (see :mod:`solver.graph.search`).
* a single edge ``u -> w`` with no inner vertex is a :class:`Leaf`.

Finding splitting vertices: with vertices in topological order, an inner vertex ``v`` of a
segment splits it exactly when no edge of the segment jumps over it (``a < v < b``); one
prefix sum over the edges finds them all. Pieces of a branch division are the connected
components of the inner vertices (edges taken without direction).
"""

from __future__ import annotations

import dataclasses
from typing import Union

import numpy as np

from .graph import Graph

__all__ = ["Leaf", "Series", "Parallel", "Complex", "Node", "division_tree", "format_tree"]


@dataclasses.dataclass(frozen=True, eq=False)
class Leaf:
    """The edge ``u -> w``: no inner vertex."""

    u: int
    w: int
    inner: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class Series:
    """Linear division: ``parts[i]`` spans ``(ends[i], ends[i+1])`` with ``ends = (u, *mids, w)``."""

    u: int
    w: int
    inner: tuple[int, ...]
    mids: tuple[int, ...]
    parts: tuple["Node", ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Parallel:
    """Branch division: sub-segments between the same ``u`` and ``w``."""

    u: int
    w: int
    inner: tuple[int, ...]
    branches: tuple["Node", ...]


@dataclasses.dataclass(frozen=True, eq=False)
class Complex:
    """A segment with neither splitting vertices nor separate branches.

    ``edges`` are the segment's edges ``(a, b)`` (graph ids), endpoints included.
    """

    u: int
    w: int
    inner: tuple[int, ...]
    edges: tuple[tuple[int, int], ...]


Node = Union[Leaf, Series, Parallel, Complex]


def division_tree(graph: Graph) -> Node:
    """Divide ``graph`` (the segment ``(source, target)``) recursively, as described above."""
    edges = [tuple(e) for e in graph.edges.tolist()]
    inner = tuple(range(1, len(graph) - 1))
    return _divide(graph.source, graph.target, inner, edges)


def _divide(u: int, w: int, inner: tuple[int, ...], edges: list[tuple[int, int]]) -> Node:
    if not inner:
        return Leaf(u, w)
    direct = (u, w) in edges
    pieces = _components(inner, edges, u, w)
    if len(pieces) + int(direct) >= 2:
        branches: list[Node] = []
        for piece in pieces:
            members = set(piece) | {u, w}
            sub_edges = [e for e in edges if e[0] in members and e[1] in members and e != (u, w)]
            branches.append(_divide(u, w, piece, sub_edges))
        if direct:
            branches.append(Leaf(u, w))
        return Parallel(u, w, inner, tuple(branches))
    mids = _splitting_vertices(u, w, inner, edges)
    if mids:
        ends = (u, *mids, w)
        parts: list[Node] = []
        order = (u, *inner, w)
        position = {v: i for i, v in enumerate(order)}
        for left, right in zip(ends[:-1], ends[1:]):
            lo, hi = position[left], position[right]
            sub_inner = order[lo + 1 : hi]
            sub_edges = [e for e in edges if lo <= position[e[0]] and position[e[1]] <= hi]
            parts.append(_divide(left, right, sub_inner, sub_edges))
        return Series(u, w, inner, mids, tuple(parts))
    return Complex(u, w, inner, tuple(sorted(edges)))


def _components(inner: tuple[int, ...], edges: list[tuple[int, int]], u: int, w: int) -> list[tuple[int, ...]]:
    """Connected components of the inner vertices, each sorted, ordered by first vertex."""
    parent = {v: v for v in inner}

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for a, b in edges:
        if a in parent and b in parent:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for v in inner:
        groups.setdefault(find(v), []).append(v)
    return sorted((tuple(sorted(g)) for g in groups.values()), key=lambda g: g[0])


def _splitting_vertices(u: int, w: int, inner: tuple[int, ...], edges: list[tuple[int, int]]) -> tuple[int, ...]:
    """Inner vertices no edge of the segment jumps over (topological positions)."""
    order = np.array((u, *inner, w), dtype=np.int64)
    if not edges:
        return ()
    e = np.asarray(edges, dtype=np.int64)
    pa = np.searchsorted(order, e[:, 0])
    pb = np.searchsorted(order, e[:, 1])
    cover = np.zeros(len(order) + 1, dtype=np.int64)
    np.add.at(cover, pa + 1, 1)
    np.add.at(cover, pb, -1)
    jumped = np.cumsum(cover)[: len(order)]
    return tuple(int(order[i]) for i in range(1, len(order) - 1) if jumped[i] == 0)


def format_tree(node: Node, graph: Graph | None = None, indent: int = 0) -> str:
    """A readable outline of a division tree (for debugging and docs)."""
    name = (lambda v: repr(graph.names[v])) if graph is not None else str
    pad = "  " * indent
    head = f"{pad}{type(node).__name__}({name(node.u)} -> {name(node.w)}, {len(node.inner)} inner)"
    if isinstance(node, Series):
        children = node.parts
    elif isinstance(node, Parallel):
        children = node.branches
    else:
        return head
    return "\n".join([head] + [format_tree(c, graph, indent + 1) for c in children])
