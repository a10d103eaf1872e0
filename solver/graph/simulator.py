"""Simulate a checkpointed training step on a computation graph: time and peak memory.

The graph counterpart of :mod:`solver.chain.simulator` (which runs Rotor's chain ops): it runs an
explicit sequence of ops on a :class:`~solver.graph.graph.Graph`, counting memory in program order,
and checks that every op has what it needs. Ops are ``(kind, vertex name)`` pairs:

=========  ========================================  ======================================
op         needs                                     effect
=========  ========================================  ======================================
``F``      every input of ``v`` stored, ``v`` not    stores ``v``'s value; time ``cost[v]``
           (forward or recomputation)
``loss``   the target's value (``v`` = target)       stores the target's gradient (seed)
``B``      ``v``'s gradient, complete (every reader  stores/accumulates the gradients of
           of ``v`` already ran ``B``); the values   ``v``'s inputs (not of the source: the
           ``B(v)`` reads (below)                    input needs none), then frees ``v``'s
                                                     gradient; time ``backward_factor *
                                                     cost[v]``
``free``   ``v``'s value stored                      frees it
=========  ========================================  ======================================

What ``B(v)`` reads: ``v``'s value and its input's, when ``v`` has one input; nothing when ``v``
joins several inputs (add, concat: their gradients pass through without values). That is
the assumption Feng & Huang's model makes (their "transition" vertices); with
``joins_read_inputs=True`` a join reads its own value and all its inputs (conservative).
The source's value is stored at the start; it cannot be recomputed.

:func:`schedule_graph` turns a checkpoint set into ops: the forward in topological order
keeps the checkpoints (and source and target) and frees every other value once its
readers have run; the backward runs every ``B`` whose gradient is complete and whose
values are stored (and, inside a segment, once the segment is rebuilt), and otherwise
rebuilds one whole segment (:mod:`solver.graph.model`) by a local forward, preferring a segment whose other readers are all ready, so that it can be
finished and freed before the next one is rebuilt. Values are freed as soon as nothing
pending reads them. Each segment is rebuilt once, so the simulated time is

    time = forward cost + recompute (the model's) + backward_factor * forward cost.

Memory, relative to the model's prediction (graph_model): while the backward runs, the
stored values are checkpoints not yet freed, the source, the target and the segments being
rebuilt. When one segment at a time is rebuilt (tests/test_acg.py checks it on the test
families), the backward's value peak (``gradients=False, phase="backward"``) is at most
``model + size(source) + size(target)``. Gradients come on top: under the default convention
a join hands gradients to inputs whose segment is rebuilt later, and those wait; with
``joins_read_inputs=True`` a gradient is only stored while its vertex's value is, so
gradients at most double the value peak. The first forward is not part of Feng & Huang's
model: parallel branches in flight can make it exceed the prediction (``phase="forward"``).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import numpy as np

from ..checkpoint_set import CheckpointSet
from .graph import Graph
from .model import checkpoint_ids, segments_of

__all__ = ["schedule_graph", "simulate_graph", "GraphOp"]

GraphOp = tuple[str, Hashable]
_KINDS = ("F", "B", "loss", "free")


def _reads(graph: Graph, v: int, joins_read_inputs: bool) -> tuple[int, ...]:
    preds = graph.preds[v]
    if len(preds) == 1:
        return (v, preds[0])
    return (v, *preds) if joins_read_inputs else ()


def _as_kept(graph: Graph, checkpoints) -> frozenset[int]:
    if isinstance(checkpoints, CheckpointSet):
        checkpoints = checkpoints.checkpoints
    return checkpoint_ids(graph, checkpoints)


def schedule_graph(
    graph: Graph,
    checkpoints: CheckpointSet | Iterable[Hashable],
    *,
    joins_read_inputs: bool = False,
) -> tuple[GraphOp, ...]:
    """The op sequence of one training step keeping ``checkpoints`` (module docstring)."""
    kept = _as_kept(graph, checkpoints)
    n, s, t = len(graph), graph.source, graph.target
    names = graph.names
    segments = segments_of(graph, kept)
    segment_of = np.full(n, -1, dtype=np.int64)
    for k, seg in enumerate(segments):
        segment_of[list(seg)] = k
    ops: list[tuple[str, int]] = []
    present = np.zeros(n, dtype=bool)
    present[s] = True
    stored = set(kept) | {s, t}

    # Forward: keep checkpoints, source and target; free the rest once their readers ran.
    unread = np.array([len(graph.succs[v]) for v in range(n)])
    for v in range(1, n):
        ops.append(("F", v))
        present[v] = True
        for u in graph.preds[v]:
            unread[u] -= 1
            if unread[u] == 0 and u not in stored:
                ops.append(("free", u))
                present[u] = False
    ops.append(("loss", t))

    reads = [_reads(graph, v, joins_read_inputs) for v in range(n)]
    readers: list[list[int]] = [[] for _ in range(n)]  # pending B's that read a value
    for v in range(1, n):
        for x in reads[v]:
            readers[x].append(v)
    done = np.zeros(n, dtype=bool)
    done[s] = True  # the source has no backward
    waiting = np.array([len(graph.succs[v]) for v in range(n)])  # readers not yet through B
    rebuilt = np.zeros(len(segments), dtype=bool)
    seg_inputs = [
        sorted({u for v in seg for u in graph.preds[v] if segment_of[u] != k})
        for k, seg in enumerate(segments)
    ]

    def needed(x: int) -> bool:
        if any(not done[y] for y in readers[x]):
            return True
        return any(not rebuilt[k] and x in seg_inputs[k] for k in range(len(segments)))

    def release(candidates: Iterable[int]) -> None:
        for x in sorted(set(candidates)):
            if present[x] and not needed(x):
                ops.append(("free", x))
                present[x] = False

    remaining = n - 1
    while remaining:
        ready = [v for v in range(n - 1, 0, -1) if not done[v] and waiting[v] == 0]
        # A segment's backward runs after its local forward rebuilt all of it.
        runnable = [v for v in ready if all(present[x] for x in reads[v])
                    and (segment_of[v] < 0 or rebuilt[segment_of[v]])]
        if runnable:
            v = runnable[0]
            ops.append(("B", v))
            done[v] = True
            remaining -= 1
            for u in graph.preds[v]:
                waiting[u] -= 1
            release(list(reads[v]) + list(graph.preds[v]) + [v])
            continue
        # Rebuild one segment a ready B needs.
        wanted = {int(segment_of[x]) for v in ready for x in reads[v]
                  if not present[x] and segment_of[x] >= 0}
        wanted |= {int(segment_of[v]) for v in ready if segment_of[v] >= 0 and not rebuilt[segment_of[v]]}
        wanted = sorted(wanted, reverse=True)
        if not wanted:
            missing = [names[x] for v in ready for x in reads[v] if not present[x]]
            raise ValueError(f"Cannot schedule: values {missing[:5]!r} are gone and not recomputable.")

        def finishable(k: int) -> bool:
            members = set(segments[k])
            return all(waiting[y] == 0 for x in segments[k] for y in readers[x]
                       if not done[y] and y not in members)

        pick = next((k for k in wanted if finishable(k)), wanted[0])
        for v in segments[pick]:
            if not present[v]:
                ops.append(("F", v))
                present[v] = True
        rebuilt[pick] = True
        release(seg_inputs[pick])
    return tuple((kind, names[v]) for kind, v in ops)


def simulate_graph(
    graph: Graph,
    checkpoints: CheckpointSet | Iterable[Hashable] | None = None,
    *,
    ops: Sequence[GraphOp] | None = None,
    gradients: bool = True,
    phase: str = "all",
    joins_read_inputs: bool = False,
    backward_factor: float = 2.0,
    complete: bool = True,
) -> tuple[float, float]:
    """Time and peak memory of a training step on ``graph`` (module docstring).

    Args:
      graph: the computation graph.
      checkpoints: a checkpoint set (a :class:`CheckpointSet` or vertex names); its ops are
        built by :func:`schedule_graph`. Give this or ``ops``.
      ops: an explicit sequence of ``(kind, vertex name)`` ops, kinds ``"F"``, ``"B"``,
        ``"loss"``, ``"free"``.
      gradients: count gradients as well as values.
      phase: ``"all"``, ``"forward"`` (ops before ``loss``) or ``"backward"`` (from ``loss``
        on): which ops' memory the returned peak covers. Time always covers every op.
      joins_read_inputs: whether the backward of a vertex with several inputs reads them.
      backward_factor: time of ``B(v)`` relative to ``cost[v]``.
      complete: require every vertex but the source to have run ``B`` at the end.

    Returns:
      ``(time, peak)``: summed op times; the largest memory (bytes) in the chosen phase.

    Raises:
      ValueError: an unknown op or vertex, a value computed from missing inputs or stored
        twice, a backward whose gradient is missing or incomplete or whose values are gone,
        a loss before the target exists, freeing a value that is not stored, or (with
        ``complete``) a step that does not finish the backward.
    """
    if (checkpoints is None) == (ops is None):
        raise ValueError("Give exactly one of `checkpoints` and `ops`.")
    if phase not in ("all", "forward", "backward"):
        raise ValueError(f"phase must be 'all', 'forward' or 'backward', got {phase!r}.")
    if ops is None:
        ops = schedule_graph(graph, checkpoints, joins_read_inputs=joins_read_inputs)
    n, s, t = len(graph), graph.source, graph.target
    sizes, costs, names = graph.sizes, graph.costs, graph.names
    present = np.zeros(n, dtype=bool)
    grad = np.zeros(n, dtype=bool)
    done = np.zeros(n, dtype=bool)
    waiting = np.array([len(graph.succs[v]) for v in range(n)])
    present[s] = True
    memory = float(sizes[s])
    in_backward = False
    peak = memory if phase != "backward" else 0.0
    time = 0.0
    for position, op in enumerate(ops):
        try:
            kind, name = op
        except (TypeError, ValueError):
            raise ValueError(f"Op {position} {op!r} is not a (kind, vertex) pair.") from None
        if kind not in _KINDS:
            raise ValueError(f"Op {position} {op!r}: unknown kind; kinds are {_KINDS}.")
        try:
            v = graph.index(name)
        except KeyError:
            raise ValueError(f"Op {position} {op!r}: the graph has no vertex {name!r}.") from None
        where = f"Op {position} {op!r}"
        if kind == "F":
            if v == s:
                raise ValueError(f"{where}: the source is given, not computed.")
            if present[v]:
                raise ValueError(f"{where}: {name!r} is already stored.")
            missing = [names[u] for u in graph.preds[v] if not present[u]]
            if missing:
                raise ValueError(f"{where}: inputs {missing!r} of {name!r} are not stored.")
            present[v] = True
            memory += sizes[v]
            time += costs[v]
        elif kind == "free":
            if not present[v]:
                raise ValueError(f"{where}: {name!r} is not stored.")
            present[v] = False
            memory -= sizes[v]
        elif kind == "loss":
            if v != t:
                raise ValueError(f"{where}: the loss op seeds the target {names[t]!r}.")
            if not present[t]:
                raise ValueError(f"{where}: the target's value is not computed.")
            if grad[t] or done[t]:
                raise ValueError(f"{where}: the loss gradient is already seeded.")
            grad[t] = True
            in_backward = True
            if gradients:
                memory += sizes[t]
        else:  # B
            if v == s:
                raise ValueError(f"{where}: the source has no backward.")
            if done[v]:
                raise ValueError(f"{where}: {name!r} already ran its backward.")
            if not grad[v] or waiting[v]:
                pending = [names[x] for x in graph.succs[v] if not done[x]]
                detail = f"readers {pending!r} have not run B yet" if pending else "it was never seeded"
                raise ValueError(f"{where}: the gradient of {name!r} is missing or incomplete: {detail}.")
            missing = [names[x] for x in _reads(graph, v, joins_read_inputs) if not present[x]]
            if missing:
                raise ValueError(f"{where}: values {missing!r} needed by the backward are not stored.")
            for u in graph.preds[v]:
                waiting[u] -= 1
                if u != s and not grad[u]:
                    grad[u] = True
                    if gradients:
                        memory += sizes[u]
            done[v] = True
            time += backward_factor * costs[v]
        if phase == "all" or (phase == "backward") == in_backward:
            peak = max(peak, memory)
        if kind == "B":
            grad[v] = False
            if gradients:
                memory -= sizes[v]
    if complete:
        missing = [names[v] for v in range(1, n) if not done[v]]
        if missing:
            raise ValueError(f"The step never runs the backward of {missing[:5]!r}: it is incomplete.")
    return float(time), float(peak)
