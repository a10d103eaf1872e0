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
      edges: directed edges ``(a, b)`` (pairs, or an ``(E, 2)`` integer array).
      recomputed: the vertices that are not kept.

    Returns:
      The segments, each a sorted vertex list, in a topological order of the quotient graph
      (a segment comes after every segment it reads from, directly or through checkpoints).
    """
    is_open = np.zeros(n, dtype=np.bool_)
    is_open[np.fromiter(set(recomputed), dtype=np.int64)] = True
    return [part.tolist() for part in _segment_arrays(n, edges, is_open)]


def _segment_arrays(n: int, edges, is_open: np.ndarray) -> list[np.ndarray]:
    """:func:`merged_segments` of the vertices where ``is_open``, as sorted int arrays."""
    pairs = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    label = _segment_labels(n, np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]),
                            is_open)
    order = np.argsort(label, kind="stable")  # by segment, vertices ascending within
    order = order[label[order] >= 0]
    if len(order) == 0:
        return []
    return np.split(order, np.flatnonzero(np.diff(label[order])) + 1)


@numba.njit(cache=True)
def _csr(n, src, dst):  # pragma: no cover - compiled
    """Sorted, duplicate-free successor lists of the edges ``src -> dst`` (CSR)."""
    order = np.argsort(src * n + dst)
    start = np.zeros(n + 1, dtype=np.int64)
    adj = np.empty(len(src), dtype=np.int64)
    count = 0
    last = -1
    for k in order:
        key = src[k] * n + dst[k]
        if key == last:
            continue
        last = key
        adj[count] = dst[k]
        start[src[k] + 1] += 1
        count += 1
    for v in range(n):
        start[v + 1] += start[v]
    return start, adj[:count]


@numba.njit(cache=True)
def _tarjan(n, start, adj):  # pragma: no cover - compiled
    """Tarjan's algorithm, iterative, roots and successors in increasing order: the
    vertices in the order their SCCs are emitted (reverse topological order), and where
    each SCC ends in that list."""
    index = np.full(n, -1, dtype=np.int64)
    low = np.zeros(n, dtype=np.int64)
    on_stack = np.zeros(n, dtype=np.bool_)
    stack = np.empty(n, dtype=np.int64)
    work_v = np.empty(n, dtype=np.int64)
    work_i = np.empty(n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    ends = np.empty(n, dtype=np.int64)
    top = depth = emitted = groups = counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack[top] = root
        top += 1
        on_stack[root] = True
        work_v[0], work_i[0], depth = root, 0, 1
        while depth:
            v, i = work_v[depth - 1], work_i[depth - 1]
            if start[v] + i < start[v + 1]:
                work_i[depth - 1] = i + 1
                x = adj[start[v] + i]
                if index[x] < 0:
                    index[x] = low[x] = counter
                    counter += 1
                    stack[top] = x
                    top += 1
                    on_stack[x] = True
                    work_v[depth], work_i[depth] = x, 0
                    depth += 1
                elif on_stack[x]:
                    low[v] = min(low[v], index[x])
                continue
            depth -= 1
            if depth:
                parent = work_v[depth - 1]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                while True:
                    top -= 1
                    x = stack[top]
                    on_stack[x] = False
                    out[emitted] = x
                    emitted += 1
                    if x == v:
                        break
                ends[groups] = emitted
                groups += 1
    return out, ends[:groups]


@numba.njit(cache=True)
def _segment_labels(n, src, dst, is_open):  # pragma: no cover - compiled
    """:func:`merged_segments` as labels: each vertex's segment, numbered in topological
    order of the quotient graph (-1: kept). Components are numbered by their least vertex
    and kept vertex ``v`` is quotient node ``r + v``, as the module docstring describes."""
    start, adj = _csr(n, np.concatenate((src, dst)), np.concatenate((dst, src)))
    comp = np.full(n, -1, dtype=np.int64)
    todo = np.empty(n, dtype=np.int64)
    r = 0
    for v in range(n):
        if not is_open[v] or comp[v] >= 0:
            continue
        comp[v] = r
        todo[0], size = v, 1
        while size:
            size -= 1
            x = todo[size]
            for k in range(start[x], start[x + 1]):
                y = adj[k]
                if is_open[y] and comp[y] < 0:
                    comp[y] = r
                    todo[size] = y
                    size += 1
        r += 1
    label = np.full(n, -1, dtype=np.int64)
    if r == 0:
        return label
    node = np.empty(n, dtype=np.int64)
    for v in range(n):
        node[v] = comp[v] if comp[v] >= 0 else r + v
    q_src = np.empty(len(src), dtype=np.int64)
    q_dst = np.empty(len(src), dtype=np.int64)
    m = 0
    for k in range(len(src)):
        if node[src[k]] != node[dst[k]]:
            q_src[m], q_dst[m] = node[src[k]], node[dst[k]]
            m += 1
    q_start, q_adj = _csr(r + n, q_src[:m], q_dst[:m])
    out, ends = _tarjan(r + n, q_start, q_adj)
    segment_of = np.full(r, -1, dtype=np.int64)
    count = 0
    for g in range(len(ends) - 1, -1, -1):  # reversed: a topological order
        first = ends[g - 1] if g else 0
        found = False
        for k in range(first, ends[g]):
            if out[k] < r:
                segment_of[out[k]] = count
                found = True
        if found:
            count += 1
    for v in range(n):
        if comp[v] >= 0:
            label[v] = segment_of[comp[v]]
    return label


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
    """Tarjan's algorithm (iterative, compiled); SCCs in reverse topological order, each
    in the order Tarjan's stack pops them."""
    src = np.array([a for a in range(n) for _ in succ[a]], dtype=np.int64)
    dst = np.array([b for a in range(n) for b in succ[a]], dtype=np.int64)
    out, ends = _tarjan(n, *_csr(n, src, dst))
    return [part.tolist() for part in np.split(out, ends[:-1])] if n else []


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
    return [tuple(s) for s in merged_segments(len(graph), graph.edges, recomputed)]


def memory_of(graph: Graph, kept: Iterable[int]) -> tuple[float, float, float]:
    """``(memory, largest segment, recompute)`` of the inner vertex ids ``kept`` (ids, fast path)."""
    kept = sorted(set(kept) - {graph.source, graph.target})
    is_open = np.ones(len(graph), dtype=np.bool_)
    is_open[[graph.source, graph.target, *kept]] = False
    segments = _segment_arrays(len(graph), graph.edges, is_open)
    sizes = graph.sizes
    largest = max((float(sizes[s].sum()) for s in segments), default=0.0)
    stored = float(sizes[kept].sum()) if kept else 0.0
    recompute = float(graph.costs[np.concatenate(segments)].sum()) if segments else 0.0
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
