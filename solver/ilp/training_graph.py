"""The training graph of a forward graph: what Checkmate's ILP schedules (:mod:`solver.ilp.solve`).

:class:`TrainingGraph` turns a forward :class:`~solver.graph.graph.Graph`
into the graph the ILP schedules: the forward vertices ``0 .. n-1`` in the graph's
topological order, then one backward vertex ``B_v`` for each non-source forward vertex
``v``, in reverse order (``B_{n-1}`` first). ``B_v`` is the backward of the operation that
produced ``v``: it reads the gradient of ``v`` (the outputs of ``B_w`` for every consumer
``w`` of ``v``), ``v``'s inputs and ``v`` itself, and outputs the gradients of ``v``'s
inputs, so its size is the sum of their sizes. The target's backward reads no gradient
(the seed of the loss is not a tensor). ``TrainingGraph.from_chain`` builds the training
graph of a Rotor :class:`~solver.chain.chain.Chain` so that the two models can be compared.
"""

from __future__ import annotations

import dataclasses
from typing import Hashable, Sequence

import numpy as np

from ..chain.chain import Chain
from ..graph.graph import Graph

__all__ = ["TrainingGraph"]


@dataclasses.dataclass(frozen=True, eq=False)
class TrainingGraph:
    """The forward + backward graph the ILP schedules (see the module docstring).

    Attributes:
      names: ``("fwd", name)`` for forward vertices, ``("bwd", name)`` for ``B_name``.
      sizes: bytes of each vertex's output.
      costs: compute cost of each vertex.
      deps: ``deps[k]`` the sorted ids ``k`` reads (all smaller than ``k``).
      num_forward: forward vertices are ids ``0 .. num_forward - 1``.
    """

    names: tuple[tuple[str, Hashable], ...]
    sizes: np.ndarray
    costs: np.ndarray
    deps: tuple[tuple[int, ...], ...]
    num_forward: int

    def __len__(self) -> int:
        return len(self.names)

    @property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """``users[i]``: the sorted ids that read ``i``."""
        out: list[list[int]] = [[] for _ in self.names]
        for k, deps in enumerate(self.deps):
            for i in deps:
                out[i].append(k)
        return tuple(tuple(u) for u in out)

    @classmethod
    def from_graph(
        cls, graph: Graph, backward_costs: Sequence[float] | np.ndarray | None = None
    ) -> "TrainingGraph":
        """The training graph of ``graph``.

        Args:
          graph: the forward graph.
          backward_costs: cost of each forward vertex's backward, by vertex id (the
            source's entry is ignored). Default: twice the forward cost.
        """
        n = len(graph)
        fwd_costs = np.asarray(graph.costs, dtype=np.float64)
        if backward_costs is None:
            bwd = 2.0 * fwd_costs
        else:
            bwd = np.asarray(backward_costs, dtype=np.float64)
            if bwd.shape != (n,):
                raise ValueError(
                    f"backward_costs needs one entry per vertex ({n}), got shape {bwd.shape}."
                )
            bad = np.flatnonzero(~np.isfinite(bwd) | (bwd < 0))
            if bad.size:
                raise ValueError(
                    f"backward_costs[{int(bad[0])}] = {float(bwd[bad[0]])!r} must be finite "
                    "and non-negative."
                )
        backward_id = {v: n + (n - 1 - v) for v in range(1, n)}  # B_{n-1} gets id n
        names = [("fwd", name) for name in graph.names]
        sizes = list(graph.sizes)
        costs = list(fwd_costs)
        deps: list[tuple[int, ...]] = [tuple(p) for p in graph.preds]
        for v in range(n - 1, 0, -1):
            grads = [backward_id[w] for w in graph.succs[v]]
            names.append(("bwd", graph.names[v]))
            sizes.append(float(sum(graph.sizes[u] for u in graph.preds[v])))
            costs.append(float(bwd[v]))
            deps.append(tuple(sorted(set(graph.preds[v]) | {v} | set(grads))))
        sizes_array = np.asarray(sizes, dtype=np.float64)
        costs_array = np.asarray(costs, dtype=np.float64)
        sizes_array.setflags(write=False)
        costs_array.setflags(write=False)
        return cls(
            names=tuple(names), sizes=sizes_array, costs=costs_array, deps=tuple(deps),
            num_forward=n,
        )

    @classmethod
    def from_chain(cls, chain: Chain) -> "TrainingGraph":
        """Rotor's chain as a training graph: ``x[0] -> ... -> x[L] -> loss``.

        ``x[k]`` has size ``x_size[k]``; ``x[i+1]`` costs ``fwd_time[i]`` and its backward
        (which outputs ``g[i]``) ``bwd_time[i]``; the loss vertex has size and cost 0 and
        its backward outputs ``g[L]``, as Rotor's ``loss`` op does. Tapes and temporaries
        are not modelled (module docstring): the correspondence with the simulator is
        exact only when ``xbar_size == x_size[1:]`` and the temporaries are zero.
        """
        L = chain.length
        names = [f"x{k}" for k in range(L + 1)] + ["loss"]
        graph = Graph.from_edges(
            [(names[k], names[k + 1]) for k in range(L + 1)],
            dict(zip(names, list(chain.x_size) + [0.0])),
            dict(zip(names, [0.0] + list(chain.fwd_time) + [0.0])),
        )
        backward = [0.0] + list(chain.bwd_time) + [0.0]
        return cls.from_graph(graph, backward)
