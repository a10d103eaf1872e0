"""Feng & Huang's training-memory model of a checkpoint set on a computation graph.

Reference: Feng & Huang, "Optimal Gradient Checkpoint Search for Arbitrary Computation
Graphs", CVPR 2021 (arXiv:1808.00079), section 3: training memory = the sizes of the
gradient checkpoints + the largest memory cost of a local forward.

Precisely, for a :class:`~solver.graph.graph.Graph` and a set ``C`` of kept inner vertices:

* The source (the given input) and the target (the loss) are always available and are left
  out of every sum, as Feng & Huang's code does.
* The other vertices are *recomputed*. Two recomputed vertices joined by an edge must be
  rebuilt by the same local forward, so the recomputed vertices first group into the
  connected components of the graph they induce (edges taken without direction).
* A local forward rebuilds one group and then runs the group's backward. If component ``X``
  feeds a checkpoint that, maybe through other components, feeds ``X`` back, then ``X``'s
  backward needs gradients that only those other components' backwards produce, while those
  need ``X``'s values: they must be rebuilt together. So components that lie on a common
  cycle of the *quotient graph* (components and checkpoints as nodes, graph edges between
  them) merge: the **segments** are the strongly connected classes of components.
  (On series-parallel graphs this happens exactly when a component joins both ends of an
  independent segment while another branch of it holds a checkpoint.)
* The cost of a segment is the sum of its vertices' sizes (as in Feng & Huang's code: the
  local forward keeps every tensor it rebuilds until its backward).

    memory(C) = sum(size[v] for v in C) + max(cost(segment) for each segment, or 0)
    recompute(C) = sum(cost[v] for every recomputed vertex)  (each rebuilt once)

The segments, in reverse topological order of the quotient graph, are also the order in
which :func:`solver.graph.simulator.simulate_graph` runs their local forwards.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import numba
import numpy as np

from .graph import Graph

__all__ = [
    "merged_segments", "segment_masks", "segments_of", "memory_of", "graph_segments", "training_memory",
    "recompute_cost", "checkpoint_ids", "strongly_connected",
]


def merged_segments(
    n: int,
    edges: Sequence[tuple[int, int]],
    recomputed: Iterable[int],
) -> list[list[int]]:
    """Segments of a small graph: components of ``recomputed`` vertices, merged along cycles.

    Args:
      n: number of vertices ``0..n-1`` (any numbering; edges need not follow it).
      edges: directed edges ``(a, b)``.
      recomputed: the vertices that are not kept.

    Returns:
      The segments, each a sorted vertex list, in a topological order of the quotient graph
      (a segment comes after every segment it reads from, directly or through checkpoints).
    """
    open_set = sorted(set(recomputed))
    succ: list[list[int]] = [[] for _ in range(n)]
    undirected: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        succ[a].append(b)
        undirected[a].append(b)
        undirected[b].append(a)
    is_open = np.zeros(n, dtype=bool)
    is_open[open_set] = True
    comp = np.full(n, -1, dtype=np.int64)
    members: list[list[int]] = []
    for v in open_set:
        if comp[v] >= 0:
            continue
        c = len(members)
        comp[v] = c
        stack, group = [v], [v]
        while stack:
            x = stack.pop()
            for y in undirected[x]:
                if is_open[y] and comp[y] < 0:
                    comp[y] = c
                    stack.append(y)
                    group.append(y)
        members.append(group)
    r = len(members)
    if r == 0:
        return []
    # Quotient graph: node c < r is component c, node r + v is kept vertex v.
    node = np.where(comp >= 0, comp, r + np.arange(n))
    q_succ: list[set[int]] = [set() for _ in range(r + n)]
    for a, b in edges:
        qa, qb = int(node[a]), int(node[b])
        if qa != qb:
            q_succ[qa].add(qb)
    scc = strongly_connected(r + n, q_succ)
    # Tarjan emits SCCs in reverse topological order; reverse for a topological order.
    segments: list[list[int]] = []
    for group in reversed(scc):
        vertices = sorted(v for c in group if c < r for v in members[c])
        if vertices:
            segments.append(vertices)
    return segments


@numba.njit(cache=True)
def _neighbours(mask: np.int64, adjacency: np.ndarray, n: int) -> np.int64:  # pragma: no cover
    out = np.int64(0)
    for v in range(n):
        if (mask >> v) & 1:
            out |= adjacency[v]
    return out


@numba.njit(cache=True)
def segment_masks(recomputed: np.int64, undirected: np.ndarray, successors: np.ndarray,
                  n: int) -> np.ndarray:  # pragma: no cover - compiled
    """:func:`merged_segments` on a graph of at most 62 vertices, with bitmasks.

    ``recomputed`` is the bitmask of recomputed vertices; ``undirected[v]`` and
    ``successors[v]`` the bitmasks of ``v``'s neighbours and successors. Returns the
    segment bitmasks (unordered). Components that reach each other through the quotient
    graph (a component entered at any vertex is entered whole) merge.
    """
    comps = np.empty(n, dtype=np.int64)
    r = 0
    remaining = recomputed
    while remaining != 0:
        low = remaining & (-remaining)
        comp = low
        frontier = low
        while frontier != 0:
            grown = _neighbours(frontier, undirected, n) & recomputed & ~comp
            comp |= grown
            frontier = grown
        comps[r] = comp
        r += 1
        remaining &= ~comp
    reach = np.empty(r, dtype=np.int64)
    for k in range(r):
        seen = comps[k]
        frontier = comps[k]
        while frontier != 0:
            grown = _neighbours(frontier, successors, n) & ~seen
            for j in range(r):
                if comps[j] & grown:
                    grown |= comps[j]
            grown &= ~seen
            seen |= grown
            frontier = grown
        reach[k] = seen
    segment = np.full(r, -1, dtype=np.int64)
    out = np.empty(r, dtype=np.int64)
    count = 0
    for k in range(r):
        if segment[k] >= 0:
            continue
        merged = comps[k]
        segment[k] = count
        for j in range(k + 1, r):
            if segment[j] < 0 and (comps[j] & reach[k]) != 0 and (comps[k] & reach[j]) != 0:
                merged |= comps[j]
                segment[j] = count
        out[count] = merged
        count += 1
    return out[:count]


def strongly_connected(n: int, succ: list[set[int]]) -> list[list[int]]:
    """Tarjan's algorithm, iterative; SCCs in reverse topological order."""
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    adjacency = [sorted(s) for s in succ]
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            if i < len(adjacency[v]):
                work[-1] = (v, i + 1)
                x = adjacency[v][i]
                if index[x] < 0:
                    index[x] = low[x] = counter
                    counter += 1
                    stack.append(x)
                    on_stack[x] = True
                    work.append((x, 0))
                elif on_stack[x]:
                    low[v] = min(low[v], index[x])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    x = stack.pop()
                    on_stack[x] = False
                    group.append(x)
                    if x == v:
                        break
                out.append(group)
    return out


def checkpoint_ids(graph: Graph, checkpoints: Iterable[Hashable]) -> frozenset[int]:
    """Vertex ids of ``checkpoints`` (names); source and target are dropped (always kept)."""
    ids = set()
    for name in checkpoints:
        ids.add(graph.index(name))
    ids.discard(graph.source)
    ids.discard(graph.target)
    return frozenset(ids)


def segments_of(graph: Graph, kept: Iterable[int]) -> list[tuple[int, ...]]:
    """The segments (vertex ids, topological order) when the inner vertex ids ``kept`` are kept."""
    kept = set(kept)
    recomputed = [v for v in range(1, len(graph) - 1) if v not in kept]
    return [tuple(s) for s in merged_segments(len(graph), graph.edges.tolist(), recomputed)]


def memory_of(graph: Graph, kept: Iterable[int]) -> tuple[float, float, float]:
    """``(memory, largest segment, recompute)`` of the inner vertex ids ``kept`` (ids, fast path)."""
    kept = sorted(set(kept) - {graph.source, graph.target})
    segments = segments_of(graph, kept)
    sizes = graph.sizes
    largest = max((float(sizes[list(s)].sum()) for s in segments), default=0.0)
    stored = float(sizes[kept].sum()) if kept else 0.0
    recomputed = [v for s in segments for v in s]
    recompute = float(graph.costs[recomputed].sum()) if recomputed else 0.0
    return stored + largest, largest, recompute


def graph_segments(graph: Graph, checkpoints: Iterable[Hashable]) -> list[tuple[Hashable, ...]]:
    """The segments (vertex names) of a checkpoint set (names), in topological order."""
    return [tuple(graph.names[v] for v in s) for s in segments_of(graph, checkpoint_ids(graph, checkpoints))]


def training_memory(graph: Graph, checkpoints: Iterable[Hashable]) -> float:
    """Feng & Huang's predicted training memory of a checkpoint set (module docstring)."""
    return memory_of(graph, checkpoint_ids(graph, checkpoints))[0]


def recompute_cost(graph: Graph, checkpoints: Iterable[Hashable]) -> float:
    """Compute cost of the local forwards: every recomputed inner vertex rebuilt once."""
    return memory_of(graph, checkpoint_ids(graph, checkpoints))[2]
