"""Flax NNX: run any module with :func:`jaxremat.remat_graph`'s checkpoints.

:class:`RematModule` wraps an ``nnx.Module`` whose ``__call__`` is not a chain of blocks
(branches, concatenations, residual connections)::

    model = jaxremat.flax.RematModule(InceptionNet(...), budget="40%")
    y = model(x)                     # same values and gradients as InceptionNet's

How: at each call the wrapped module is split (``nnx.split``) into its graph definition and
state, and the pure function ``(state, args) -> (outputs, updated non-parameter state)`` is
run by :func:`jaxremat.remat_graph` (one per graph definition, budget and limits, so the
plan is made once per mode and input signature and reused by every step under ``nnx.jit``).
The updated state is then written back (``nnx.update``), so:

* ``nnx.BatchNorm`` statistics are those of the forward pass, updated once per step: the
  recomputation in the backward pass only rebuilds activations;
* ``nnx.Dropout`` keys come from the state passed in, so the recomputation replays the same
  masks, and ``nnx.Rngs`` counters advance once per call;
* ``train()`` / ``eval()`` change the graph definition, hence the plan.

The updated state leaves the function through ``jax.lax.stop_gradient``: running statistics
and RNG counters carry no gradient (as in the plain model, where they are not part of the
loss). Parameters are not written back (a forward pass does not change them).

The budget means what it means for :func:`jaxremat.remat_graph`: measured activation memory
(:func:`jaxremat.activation_memory` of the sum of the outputs), bytes, ``"512MiB"`` or
``"40%"`` of the plain module's; ``None`` for Feng & Huang's least-memory checkpoints.
"""

from __future__ import annotations

import threading
from typing import Any

import jax
from flax import nnx

from ..budget import check_budget
from ..graph.memo import PlanningMemo
from ..graph.remat import MODULE_WORK_LIMIT, GraphPlan, RematGraph, check_graph_settings
from ..lru import LRU

__all__ = ["RematModule"]

_graphs = LRU(128)  # (graph definition, settings) -> RematGraph
_memos = LRU(128)  # graph definition -> PlanningMemo
_making = threading.Lock()  # get-or-make: one RematGraph and one memo per key


def _pure_call(graphdef: nnx.GraphDef, state: Any, args: tuple) -> tuple[Any, Any]:
    module = nnx.merge(graphdef, state)
    out = module(*args)
    _, _, updated = nnx.split(module, nnx.Param, ...)
    return out, jax.lax.stop_gradient(updated)


def _graph_for(graphdef: nnx.GraphDef, budget: Any, max_vertices: int, time_limit: float | None,
               work_limit: int | None):
    """One :class:`jaxremat.RematGraph` per graph definition and settings (it caches plans);
    those of one graph definition share a :class:`jaxremat.graph.memo.PlanningMemo`, so a
    new budget reuses the traced graph, the least-memory search and the measurements."""
    key = (graphdef, budget, max_vertices, time_limit, work_limit)
    with _making:
        graph = _graphs.get(key)
        if graph is None:
            memo = _memos.get(graphdef)
            if memo is None:
                memo = PlanningMemo()
                _memos.put(graphdef, memo)
            graph = RematGraph(lambda state, args: _pure_call(graphdef, state, args),
                               budget, max_vertices, time_limit, memo=memo,
                               work_limit=work_limit)
            _graphs.put(key, graph)
    return graph


class RematModule(nnx.Module):
    """``module`` run with :func:`jaxremat.remat_graph`'s checkpoints (module docstring).

    Args:
      module: any ``nnx.Module``; its state tree is available as ``self.module``.
      budget: ``None`` (least memory), bytes, ``"512MiB"`` or ``"40%"``.
      max_vertices: refuse modules with more top-level operations on the input than this.
      time_limit: seconds allowed to the budgeted searches when a plan is made (default
        ``None``: none; a time limit makes plans depend on the machine's load).
      work_limit: candidates each budgeted search may examine (deterministic; default
        :data:`jaxremat.graph.remat.MODULE_WORK_LIMIT`, half of ``remat_graph``'s), as for
        :func:`jaxremat.remat_graph`.
    """

    def __init__(self, module: nnx.Module, budget: int | float | str | None = None, *,
                 max_vertices: int = 1000, time_limit: float | None = None,
                 work_limit: int | None = MODULE_WORK_LIMIT) -> None:
        if not isinstance(module, nnx.Module):
            raise TypeError(f"RematModule wraps an nnx.Module, got {type(module).__name__}; "
                            f"for a plain function use jaxremat.remat_graph.")
        check_graph_settings(max_vertices, time_limit, work_limit)
        self.module = module
        self.budget = None if budget is None else check_budget(budget)
        self.max_vertices = max_vertices
        self.time_limit = time_limit
        self.work_limit = work_limit

    def _split(self) -> tuple[Any, Any, Any]:
        graphdef, state = nnx.split(self.module)
        return (_graph_for(graphdef, self.budget, self.max_vertices, self.time_limit,
                           self.work_limit), graphdef, state)

    def __call__(self, *args: Any) -> Any:
        graph, _, state = self._split()
        out, updated = graph(state, args)
        nnx.update(self.module, updated)
        return out

    def plan(self, *args: Any) -> GraphPlan:
        """The :class:`jaxremat.GraphPlan` used for inputs shaped like ``args``."""
        graph, _, state = self._split()
        return graph.plan(state, args)
