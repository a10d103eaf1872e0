"""Optimal gradient checkpoints on arbitrary computation graphs (ALGORITHMS.md section 4).

Reference: Jianwei Feng and Dong Huang, "Optimal Gradient Checkpoint Search for Arbitrary
Computation Graphs", CVPR 2021 (arXiv:1808.00079).

**Model** (:mod:`solver.graph_model`): the training memory of a set ``C`` of kept inner
vertices is ``sum(size[v] for v in C) + max(cost of a segment)``, where the segments are the
groups of recomputed vertices rebuilt by one local forward (connected components of the
recomputed vertices, merged when they lie on a common cycle through checkpoints) and the
cost of a segment is the sum of its vertices' sizes, as in Feng & Huang's code. The source
and the target are always available and are left out of every sum, as their code does.
``recompute`` is the summed compute cost of the recomputed vertices (each rebuilt once).

**Search.** As in the paper, the answer is the minimum over the *max term* ``m`` (the bound on
the largest segment) of ``m + f(m)``, where ``f(m)`` is the least checkpoint memory whose
segments all fit in ``m``; ``f`` is computed on the division tree (linear, branch and complex
divisions of independent segments, :mod:`solver.division`). On a linear graph the DP at one
``m`` is exactly the accessibility-graph shortest path of the paper (edge ``u -> v`` when the
segment strictly between them fits in ``m``, weighted by ``size[v]``), computed as a front
sweep. Departures from the paper, all to make the result exact for the model above:

* The paper only places checkpoints inside an independent segment whose endpoints are both
  checkpoints ("expanded" segments). A recomputed endpoint can also be cut off from the rest
  of its segment by checkpoints inside (e.g. keep one vertex of each branch of an inception
  module and recompute the module's input and output with different neighbours): our DP
  tracks, per segment, which recomputed bytes attach to each endpoint (solver.acg_dp).
* Instead of enumerating every distinct max term (quadratically many per linear division),
  ``m`` is searched by branch and bound: ``f`` never increases with ``m``, so on an interval
  ``[lo, hi)`` of max terms ``m + f(m) >= lo + f(hi)``. Intervals whose bound cannot beat
  the best set found are dropped; the others are evaluated at their top: the set found there
  has a largest segment ``m' <= m`` that fixes ``f`` on ``[m', m]``, and what is left below
  ``m'`` is split in two.
* Complex divisions are enumerated exactly up to ``solver.acg_dp.COMPLEX_LIMIT`` inner vertices;
  beyond, only the smallest inner vertices are candidates (a heuristic, with a warning). The
  paper keeps every division vertex of an expanded complex division.

Exactness: with integer sizes (bytes), the result is optimal for the model (checked against
brute force over all subsets in tests/test_acg.py). With fractional sizes, max terms closer
than ``1e-9`` of the total size are not told apart.

**Budgeted variant** (``budget=``): the least recompute among sets whose memory fits the
budget. The DP then keeps, per end state, the Pareto front of (open weights, checkpoint
bytes, recompute), and carries each candidate's largest closed segment (``top``) so that a
complete set's memory is read off its front. Best-first branch and bound over max-term
intervals ``[lo, hi]``: the relaxation "segments <= hi, checkpoint bytes <= budget - lo,
bytes + open weight <= budget" admits every set that fits the budget with its largest
segment in the interval, so its least recompute bounds them from below. An interval closes
when its least relaxed set really fits; otherwise it is split into three pieces that all
exclude that set. Two things keep the fronts small:

* a Lagrangian bound (:mod:`solver.acg_bounds`) on the recompute the rest of the graph must
  add drops partial sets along the top-level linear division that cannot beat a *cap*;
* the cap starts just above the interval's lower bound and grows by 1 % to 8 % steps: an
  evaluation that finds nothing under it raises the interval's lower bound to the cap. So
  the fronts only hold near-optimal partial sets, and the best set found so far (a greedy
  pass, then every fitting set the fronts contain) ends the search.

Every filter is a necessary condition for a fitting set to beat the cap, and monotone under
dominance, so the result stays the least recompute for the model (checked against brute
force in tests/test_acg.py); with fractional sizes, up to the tolerance above. Knapsack-like
instances where many vertices have the same recompute per byte (e.g. Inception-v3 at a
large budget, where only ReLUs and concatenations are rebuilt) still defeat the bound: the
fronts then grow with the number of distinct byte sums, see benchmarks/acg.py.
"""

from __future__ import annotations

import heapq
import math
import time
import warnings

import numpy as np

from .acg_bounds import Lagrangian
from .acg_dp import Context, TimeLimit, evaluate
from .checkpoint_set import CheckpointSet
from .division import Node, division_tree
from .errors import InfeasibleBudget
from .graph import Graph
from .graph_model import memory_of, segments_of

__all__ = ["checkpoint_search"]

_METHOD = "checkpoint_search"


def checkpoint_search(
    graph: Graph, *, budget: float | None = None, time_limit: float | None = None,
    gap: float = 0.0,
) -> CheckpointSet:
    """Feng & Huang's optimal gradient checkpoints of ``graph`` (module docstring).

    Args:
      graph: the computation graph (sizes in bytes, costs in flops or seconds).
      budget: if given, return the set of least ``recompute`` whose predicted memory is at
        most ``budget`` instead of the set of least memory.
      time_limit: seconds allowed to the budgeted search (the least-memory search always
        runs to the end). When they run out, the best set found so far is returned (it fits
        the budget but may not have the least recompute) and a ``RuntimeWarning`` says so.
        Default: no limit.
      gap: relative optimality gap of the budgeted search, in ``[0, 1)``: it stops once no
        set can have less than ``(1 - gap)`` times the recompute of the best set found, so
        the result's recompute is at most ``least / (1 - gap)``. Default 0: exact.

    Returns:
      A :class:`~solver.checkpoint_set.CheckpointSet`: ``checkpoints`` the kept vertex names
      (source and target, always kept, are not listed), ``segments`` the groups of
      recomputed vertex names (topological order) each rebuilt by one local forward,
      ``peak`` the predicted training memory, ``recompute`` the cost of the local forwards.

    Raises:
      InfeasibleBudget: no checkpoint set fits ``budget``; ``min_budget`` is the least
        achievable memory.

    Among sets of least memory the search keeps the least recompute it comes across, not
    necessarily the least overall; ``checkpoint_search(graph, budget=result.peak)`` gives
    that.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"checkpoint_search expects a solver.Graph, got {type(graph).__name__}.")
    search = _Search(graph)
    mem, rc, kept = search.least_memory()
    if budget is not None:
        budget = float(budget)
        if not math.isfinite(budget) or budget < 0:
            raise ValueError(f"budget must be a finite non-negative number of bytes, got {budget!r}.")
        if not 0.0 <= gap < 1.0:
            raise ValueError(f"gap must be a relative gap in [0, 1), such as 0.01; got {gap!r}.")
        if mem > budget + search.eps:
            raise InfeasibleBudget(budget, mem, _METHOD, units="bytes")
        deadline = np.inf if time_limit is None else time.monotonic() + float(time_limit)
        mem, rc, kept = search.least_recompute(budget, incumbent=(mem, rc, kept), deadline=deadline,
                                               gap=gap)
    return search.result(kept)


class _Search:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.tree: Node = division_tree(graph)
        sizes = graph.sizes
        inner = sizes[1:-1]
        total = float(inner.sum())
        self.integral = bool(np.all(inner == np.round(inner))) and total < 2.0**52
        self.eps = 1e-9 if self.integral else 1e-12 * max(total, 1.0)
        self.tol = 1.0 if self.integral else 1e-9 * max(total, 1.0)
        self.total = total
        self.evaluations = 0

    # ------------------------------------------------------------------ helpers
    def _solve(self, ctx: Context, seg_limit: float, size_limit: float):
        ctx.seg_limit = seg_limit + self.eps
        ctx.size_limit = size_limit + self.eps
        self.evaluations += 1
        return evaluate(self.tree, ctx, {"cc"})["cc"]

    def _kept(self, mask: int) -> list[int]:
        return [v for v in range(1, len(self.graph) - 1) if mask >> v & 1]

    def result(self, kept: list[int]) -> CheckpointSet:
        names = self.graph.names
        mem, _, rc = memory_of(self.graph, kept)
        segments = tuple(tuple(names[v] for v in s) for s in segments_of(self.graph, kept))
        return CheckpointSet(tuple(names[v] for v in kept), segments, mem, rc)

    # ------------------------------------------------------------------ least memory
    def least_memory(self) -> tuple[float, float, list[int]]:
        """Branch and bound over the max term ``m`` of ``m + f(m)`` (module docstring).

        An interval ``[lo, hi)`` of max terms with ``f >= f_low`` on it is examined at its top
        ``t = hi - step``: if ``f(t)`` is too large to win, so is every ``f(m)``, ``m <= t``;
        otherwise the set found has a largest segment ``m' <= t`` and fixes ``f`` on
        ``[m', t]``, leaving ``[lo, m')`` (split in two halves) with ``f >= f(t)``.
        """
        ctx = Context(self.graph.sizes, self.graph.costs, budget_mode=False)
        best_mem, _, best_rc = memory_of(self.graph, [])
        best = (best_mem, best_rc, [])
        step = 1.0 if self.integral else self.tol
        margin = 0.5 if self.integral else self.eps
        heap = [(0.0, 0.0, best_mem, 0.0)]  # (lower bound, lo, hi, f_low)
        while heap:
            bound, lo, hi, f_low = heapq.heappop(heap)
            if bound >= best[0] - margin:
                break
            top = hi - step
            if top < lo:
                continue
            front = self._solve(ctx, top, best[0] - lo - (step if self.integral else 0.0))
            if len(front) == 0:  # f(top) too large to win: so is f(m) for every m <= top
                continue
            size, mask = float(front.size[0]), int(front.mask[0])
            kept = self._kept(mask)
            mem, largest, rc = memory_of(self.graph, kept)
            assert largest <= top + 10 * self.eps and abs(mem - size - largest) <= 1e-6 * max(mem, 1), (
                "internal error: the division-tree DP disagrees with the memory model")
            if mem < best[0] - margin or (mem <= best[0] + self.eps and rc < best[1]):
                best = (mem, rc, kept)
            if largest <= lo:
                continue
            mid = math.floor((lo + largest) / 2) if self.integral else (lo + largest) / 2
            if mid > lo:
                heapq.heappush(heap, (mid + size, mid, largest, size))
                heapq.heappush(heap, (lo + size, lo, mid, size))
            else:
                heapq.heappush(heap, (lo + size, lo, largest, size))
        return best

    # ------------------------------------------------------------------ least recompute
    def _greedy(self, budget: float, best):
        """A first incumbent: from the least-memory set, keep more vertices, best compute per
        byte first, while the memory fits (it prunes the exact search, nothing more)."""
        graph = self.graph
        kept = set(best[2])
        ratio = graph.costs / np.maximum(graph.sizes, 1e-300)
        for v in sorted(range(1, len(graph) - 1), key=lambda v: -ratio[v]):
            if v in kept or graph.costs[v] <= 0:
                continue
            mem, _, rc = memory_of(graph, kept | {v})
            if mem <= budget + self.eps:
                kept.add(v)
                if rc < best[1]:
                    best = (mem, rc, sorted(kept))
        return best

    def least_recompute(self, budget: float, incumbent, deadline: float = np.inf, gap: float = 0.0):
        """Best-first branch and bound over max-term intervals ``[lo, hi]`` (module docstring).

        The heap's least ``lb`` bounds every set not yet excluded, so stopping once it
        reaches ``(1 - gap)`` times the best recompute found leaves that set within ``gap``.

        Each heap entry is ``(lb, lo, hi, step)``: no set that fits the budget, has its largest
        segment in ``[lo, hi]`` and recompute below ``lb`` exists. An evaluation looks for the
        sets under ``cap = lb + step * lb`` only, which the Lagrangian bounds prune hard;
        finding none proves ``lb >= cap`` (the step then doubles, up to 8 %).
        """
        limit = budget + self.eps
        ctx = Context(self.graph.sizes, self.graph.costs, budget_mode=True, knapsack_limit=limit,
                      memory_limit=limit, deadline=deadline, bounded=self.tree,
                      lagrangian=Lagrangian.for_graph(self.graph.sizes, self.graph.costs))
        best = incumbent
        everything = list(range(1, len(self.graph) - 1))
        mem_all, _, rc_all = memory_of(self.graph, everything)
        if mem_all <= limit and rc_all < best[1]:
            best = (mem_all, rc_all, everything)
        best = self._greedy(budget, best)
        unit = 1.0 if self.integral else self.tol
        heap = [(0.0, 0.0, math.floor(budget) if self.integral else budget, 0.01)]
        while heap:
            lb, lo, hi, step = heapq.heappop(heap)
            stop = best[1] * (1 - max(gap, 1e-12)) if best[1] > 0 else -np.inf
            if lb >= stop:
                break
            ctx.rc_limit, ctx.seg_limit, ctx.size_limit = stop, hi + self.eps, budget - lo + self.eps
            ctx.cap = min(stop, lb + step * max(lb, 0.01 * stop))
            ctx.prebound = -np.inf  # set by the evaluation if the graph is a linear division
            try:
                self.evaluations += 1
                front = evaluate(self.tree, ctx, {"cc"})["cc"]
            except TimeLimit:  # best-first: every set left has recompute >= lb
                proven = f"{100 * (1 - lb / best[1]):.2g}%" if best[1] > 0 else "0%"
                warnings.warn(
                    "checkpoint_search: the time limit ran out; returning the best checkpoint "
                    "set found, which fits the budget but may not have the least recompute "
                    f"(it is within {proven} of the least).", RuntimeWarning, stacklevel=3)
                return best
            if len(front) == 0:  # nothing under the cap (or under the Lagrangian bound)
                if ctx.cap < stop:
                    heapq.heappush(heap, (max(ctx.cap, ctx.prebound), lo, hi, min(2 * step, 0.08)))
                continue
            order = np.lexsort((front.size, front.rc))
            least = float(front.rc[order[0]])
            fits = np.flatnonzero(front.size[order] + front.top[order] <= limit)
            if len(fits) and float(front.rc[order[fits[0]]]) < best[1]:
                kept = self._kept(int(front.mask[order[fits[0]]]))
                mem, _, rc = memory_of(self.graph, kept)
                assert mem <= limit + 10 * self.eps, (
                    "internal error: the division-tree DP disagrees with the memory model")
                best = (mem, rc, kept)
            if len(fits) and fits[0] == 0:
                continue  # the interval's least relaxed set fits: none in it does better
            # Split so that the least set (largest segment m') is in no child: [lo, mid),
            # [mid, m') have smaller segments, [m', hi] leaves it fewer bytes than it has.
            largest = max(float(front.top[order[0]]), lo + unit)  # > lo but for rounding
            mid = math.floor((lo + largest) / 2) if self.integral else (lo + largest) / 2
            for a, b in ((lo, mid - unit), (max(mid, lo), largest - unit), (largest, hi)):
                if a <= b:
                    heapq.heappush(heap, (least, a, b, 0.01))
        return best
