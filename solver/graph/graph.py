"""Computation graphs: a DAG of tensors with sizes and compute costs (ALGORITHMS.md section 4).

A :class:`Graph` is the model Feng & Huang ("Optimal Gradient Checkpoint Search for
Arbitrary Computation Graphs", CVPR 2021, arXiv:1808.00079, section 3) and Checkmate
(Jain et al., MLSys 2020) work on: vertices are tensors, each with the bytes it occupies and
the compute cost of producing it; an edge ``u -> v`` means the operation producing ``v``
reads ``u``. There is exactly one source (the input, nothing produces it from another
vertex) and exactly one target (the loss or output, nothing reads it).

Vertices carry integer ids equal to their position in a deterministic topological order
(Kahn's algorithm, ties broken by the order vertices were given in), so ``u < v`` for every
edge, the source is id ``0`` and the target id ``len(graph) - 1``. The solvers work on ids
and numpy arrays; names are for users.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["Graph"]


def _weights(kind: str, values, names: Sequence[Hashable], default: float | None) -> np.ndarray:
    """Per-vertex numbers from a mapping (by name) or a sequence (by vertex given order)."""
    if values is None:
        assert default is not None
        return np.full(len(names), default, dtype=np.float64)
    out = np.empty(len(names), dtype=np.float64)
    if isinstance(values, Mapping):
        known = set(names)
        extra = [k for k in values if k not in known]
        if extra:
            raise ValueError(f"Graph {kind} given for unknown vertex {extra[0]!r}.")
        for i, name in enumerate(names):
            if name not in values:
                raise ValueError(f"Graph vertex {name!r} has no {kind[:-1]}: give one for every vertex.")
            out[i] = _number(kind, name, values[name])
    else:
        values = list(values)
        if len(values) != len(names):
            raise ValueError(f"Graph {kind}: expected {len(names)} values, got {len(values)}.")
        for i, name in enumerate(names):
            out[i] = _number(kind, name, values[i])
    return out


def _number(kind: str, name: Hashable, value) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise ValueError(f"Graph vertex {name!r}: {kind[:-1]} {value!r} is not a number.")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Graph vertex {name!r}: {kind[:-1]} {value!r} is not a number.") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(
            f"Graph vertex {name!r}: {kind[:-1]} {value!r} must be finite and non-negative."
        )
    return number


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """An immutable DAG of tensors with one source and one target.

    Build it with :meth:`from_edges` or :meth:`chain`; the constructor takes the already
    validated, topologically ordered fields below and is not meant to be called directly.

    Attributes:
      names: vertex names by id (ids are positions in the topological order).
      sizes: read-only float64 array, bytes of each vertex's tensor, by id.
      costs: read-only float64 array, compute cost (flops, seconds...) of producing each
        vertex from its predecessors, by id. The source's cost is never paid by a solver.
      edges: read-only int64 array of shape ``(E, 2)``, rows ``(u, v)`` with ``u < v``,
        sorted, without duplicates.
      preds: ``preds[v]`` is the sorted tuple of ids ``v`` reads.
      succs: ``succs[u]`` is the sorted tuple of ids that read ``u``.
    """

    names: tuple[Hashable, ...]
    sizes: np.ndarray
    costs: np.ndarray
    edges: np.ndarray
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_edges(
        cls,
        edges: Iterable[tuple[Hashable, Hashable]],
        sizes: Mapping[Hashable, float] | Sequence[float],
        costs: Mapping[Hashable, float] | Sequence[float] | None = None,
    ) -> "Graph":
        """Build a graph from ``(u, v)`` edges (``v`` reads ``u``) and per-vertex sizes.

        Args:
          edges: pairs of vertex names. Duplicate edges are merged.
          sizes: bytes of every vertex: a mapping name -> size (its order is the tie-break
            order of the topological sort), or a sequence, in which case the vertices are
            named ``0 .. len(sizes) - 1``.
          costs: compute cost of every vertex, same form as ``sizes``. Default: 1 for every
            vertex except the source, which costs 0 (the input is given, not computed).

        Raises:
          ValueError: an edge names a vertex absent from ``sizes``; a self-loop or a cycle;
            no source or several sources (vertices nothing points to), no target or several
            targets (vertices that point nowhere); fewer than two vertices; a size or cost
            that is missing, not a number, negative or not finite. The message names the
            offending vertex.
        """
        for name, value in (("edges", edges), ("sizes", sizes)):
            if value is None or isinstance(value, (str, bytes)):
                raise ValueError(
                    f"Graph.from_edges: {name} must be a sequence (edges: (u, v) pairs; sizes: "
                    f"a mapping or a sequence of numbers), got {value!r}."
                )
        if isinstance(sizes, Mapping):
            given = list(sizes.keys())
        else:
            sizes = list(sizes)
            given = list(range(len(sizes)))
        if costs is not None and not isinstance(costs, Mapping):
            costs = list(costs)
        if len(given) < 2:
            raise ValueError(
                f"A Graph needs at least two vertices (a source and a target), got {len(given)}."
            )
        position = {name: i for i, name in enumerate(given)}
        pairs: set[tuple[int, int]] = set()
        for edge in edges:
            try:
                if isinstance(edge, (str, bytes)):  # "ab" would unpack to ("a", "b")
                    raise TypeError
                u, v = edge
            except (TypeError, ValueError):
                raise ValueError(f"Graph edge {edge!r} is not a (u, v) pair.") from None
            for end in (u, v):
                if end not in position:
                    raise ValueError(
                        f"Graph edge {(u, v)!r} names vertex {end!r}, which has no size: "
                        "every vertex needs an entry in `sizes`."
                    )
            if u == v:
                raise ValueError(f"Graph edge {(u, v)!r} is a self-loop: vertex {u!r} reads itself.")
            pairs.add((position[u], position[v]))

        n = len(given)
        out_lists: list[list[int]] = [[] for _ in range(n)]
        indegree = [0] * n
        for u, v in pairs:
            out_lists[u].append(v)
            indegree[v] += 1
        sources = [given[i] for i in range(n) if indegree[i] == 0]
        sinks = [given[i] for i in range(n) if not out_lists[i]]
        if len(sources) != 1:
            raise ValueError(
                f"A Graph needs exactly one source (a vertex no edge points to), found "
                f"{len(sources)}: {sources[:5]!r}. Connect the extra inputs to the real "
                "input, or merge them into one vertex."
                if sources
                else "The graph has no source (every vertex is read from another): it has a cycle."
            )
        if len(sinks) != 1:
            raise ValueError(
                f"A Graph needs exactly one target (a vertex with no outgoing edge), found "
                f"{len(sinks)}: {sinks[:5]!r}. Feed every output into the loss vertex."
                if sinks
                else "The graph has no target (every vertex is read by another): it has a cycle."
            )

        # Kahn's algorithm; ties broken by the given order, so the order is deterministic.
        remaining = list(indegree)
        ready = [i for i in range(n) if remaining[i] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            u = heapq.heappop(ready)
            order.append(u)
            for v in out_lists[u]:
                remaining[v] -= 1
                if remaining[v] == 0:
                    heapq.heappush(ready, v)
        if len(order) != n:
            stuck = [given[i] for i in range(n) if remaining[i] > 0]
            raise ValueError(f"The graph has a cycle through vertex {stuck[0]!r}.")

        new_id = {old: new for new, old in enumerate(order)}
        names = tuple(given[old] for old in order)
        size_given = _weights("sizes", sizes, given, None)
        if costs is None:
            cost_given = np.ones(n)
            cost_given[order[0]] = 0.0
        else:
            cost_given = _weights("costs", costs, given, None)
        perm = np.asarray(order, dtype=np.int64)
        edge_array = np.array(sorted((new_id[u], new_id[v]) for u, v in pairs), dtype=np.int64)
        edge_array = edge_array.reshape(-1, 2)
        preds: list[list[int]] = [[] for _ in range(n)]
        succs: list[list[int]] = [[] for _ in range(n)]
        for u, v in edge_array.tolist():
            preds[v].append(u)
            succs[u].append(v)
        sizes_arr = size_given[perm]
        costs_arr = cost_given[perm]
        for array in (sizes_arr, costs_arr, edge_array):
            array.setflags(write=False)
        return cls(
            names=names,
            sizes=sizes_arr,
            costs=costs_arr,
            edges=edge_array,
            preds=tuple(tuple(p) for p in preds),
            succs=tuple(tuple(s) for s in succs),
        )

    @classmethod
    def chain(cls, sizes: Sequence[float], costs: Sequence[float] | None = None) -> "Graph":
        """The linear graph ``0 -> 1 -> ... -> n-1`` with the given sizes (and costs)."""
        sizes = list(sizes)
        return cls.from_edges([(i, i + 1) for i in range(len(sizes) - 1)], sizes, costs)

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return (
            f"Graph({len(self)} vertices, {len(self.edges)} edges, "
            f"source={self.names[0]!r}, target={self.names[-1]!r}, "
            f"total size={float(self.sizes.sum()):.6g}, total cost={float(self.costs.sum()):.6g})"
        )

    @property
    def source(self) -> int:
        """Id of the source (always 0)."""
        return 0

    @property
    def target(self) -> int:
        """Id of the target (always ``len(self) - 1``)."""
        return len(self.names) - 1

    @property
    def topological_order(self) -> tuple[Hashable, ...]:
        """Vertex names in the deterministic topological order (the id order)."""
        return self.names

    @property
    def is_linear(self) -> bool:
        """True when the graph is a single path ``0 -> 1 -> ... -> n-1``."""
        return len(self.edges) == len(self) - 1 and bool(
            np.all(self.edges[:, 1] == self.edges[:, 0] + 1)
        )

    def index(self, name: Hashable) -> int:
        """Integer id of the vertex called ``name``."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"Graph has no vertex {name!r}.") from None

    @property
    def _index(self) -> dict[Hashable, int]:
        cached = self.__dict__.get("_index_cache")
        if cached is None:
            cached = {name: i for i, name in enumerate(self.names)}
            object.__setattr__(self, "_index_cache", cached)
        return cached

    def predecessors(self, name: Hashable) -> tuple[Hashable, ...]:
        """Names of the vertices ``name`` reads, in topological order."""
        return tuple(self.names[u] for u in self.preds[self.index(name)])

    def successors(self, name: Hashable) -> tuple[Hashable, ...]:
        """Names of the vertices that read ``name``, in topological order."""
        return tuple(self.names[v] for v in self.succs[self.index(name)])

    def size(self, name: Hashable) -> float:
        """Bytes of vertex ``name``."""
        return float(self.sizes[self.index(name)])

    def cost(self, name: Hashable) -> float:
        """Compute cost of producing vertex ``name``."""
        return float(self.costs[self.index(name)])

    def adjacency(self) -> np.ndarray:
        """Dense boolean matrix ``A[u, v]`` = edge ``u -> v`` (upper triangular)."""
        n = len(self)
        matrix = np.zeros((n, n), dtype=bool)
        if len(self.edges):
            matrix[self.edges[:, 0], self.edges[:, 1]] = True
        return matrix
