"""Optimal gradient checkpoints on arbitrary computation graphs (ALGORITHMS.md section 4).

Reference: Jianwei Feng and Dong Huang, "Optimal Gradient Checkpoint Search for Arbitrary
Computation Graphs", CVPR 2021 (arXiv:1808.00079).

**Model** (:mod:`solver.graph.model`): the training memory of a set ``C`` of kept inner
vertices is ``sum(size[v] for v in C) + max(cost of a segment)``, where the segments are the
groups of recomputed vertices rebuilt by one local forward (connected components of the
recomputed vertices, merged when they lie on a common cycle through checkpoints) and the
cost of a segment is the sum of its vertices' sizes, as in Feng & Huang's code. The source
and the target are always available and are left out of every sum, as their code does.
``recompute`` is the summed compute cost of the recomputed vertices (each rebuilt once).

**Search.** As in the paper, the answer is the minimum over the *max term* ``m`` (the bound on
the largest segment) of ``m + f(m)``, where ``f(m)`` is the least checkpoint memory whose
segments all fit in ``m``; ``f`` is computed on the division tree (linear, branch and complex
divisions of independent segments, :mod:`solver.graph.division`). On a linear graph the DP at one
``m`` is exactly the accessibility-graph shortest path of the paper (edge ``u -> v`` when the
segment strictly between them fits in ``m``, weighted by ``size[v]``), computed as a front
sweep. Departures from the paper, all to make the result exact for the model above:

* The paper only places checkpoints inside an independent segment whose endpoints are both
  checkpoints ("expanded" segments). A recomputed endpoint can also be cut off from the rest
  of its segment by checkpoints inside (e.g. keep one vertex of each branch of an inception
  module and recompute the module's input and output with different neighbours): our DP
  tracks, per segment, which recomputed bytes attach to each endpoint (solver.graph.dp).
* Instead of enumerating every distinct max term (quadratically many per linear division),
  ``m`` is searched by branch and bound: ``f`` never increases with ``m``, so on an interval
  ``[lo, hi)`` of max terms ``m + f(m) >= lo + f(hi)``. Intervals whose bound cannot beat
  the best set found are dropped; the others are evaluated at their top: the set found there
  has a largest segment ``m' <= m`` that fixes ``f`` on ``[m', m]``, and what is left below
  ``m'`` is split in two.
* Complex divisions are enumerated exactly up to ``solver.graph.dp.COMPLEX_LIMIT`` inner vertices;
  beyond, only the smallest inner vertices are candidates (a heuristic, with a warning). The
  paper keeps every division vertex of an expanded complex division.

**Limits.** ``time_limit`` (seconds of wall time) and ``work_limit`` (candidates examined:
rows of the fronts before pruning plus one per front pruned, counted in
``solver.graph.dp.Context.tick``) stop the budgeted search with the best set found and a
lower bound (below). The work limit is deterministic: the same graph, budget and limits stop
at the same evaluation on any machine and under any load, so the result does too
(``jaxremat.remat_graph`` uses it by default; tests/test_acg_budget.py checks it on a
slowed-down search).

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

* a Lagrangian bound (:mod:`solver.graph.bounds`) on the recompute the rest of the graph must
  add drops partial sets along the top-level linear division that cannot beat a *cap*;
  its multipliers include every vertex's recompute per byte (the kinks of the bound);
* the cap starts just above the interval's lower bound and grows by 1 % to 8 % steps: an
  evaluation that finds nothing under it raises the interval's lower bound to the cap. So
  the fronts only hold near-optimal partial sets, and the best set found so far (a greedy
  pass, then every fitting set the fronts contain) ends the search;
* an evaluation whose top-level fronts outgrow ``FRONT_LIMIT`` (1000) candidates is given up:
  an interval wider than ``MIN_WIDTH`` (0.1 %) of the budget is halved (the upper half's
  relaxation, ``bytes <= budget - mid``, is tighter, and the lower half's segments are
  smaller), a narrower one is retried with a quarter of the cap step (down to 0.1 %, which
  runs without the limit). Both keep the interval's lower bound: they cover the same sets.

Every filter is a necessary condition for a fitting set to beat the cap, and monotone under
dominance, so the result stays the least recompute for the model (checked against brute
force in tests/test_acg.py, also with every vertex at one recompute per byte and with tiny
front limits); with fractional sizes, up to the tolerance above.

**Lower bound** (``CheckpointSet.recompute_lower_bound``). Claim: when the search stops,
``min(lb of the interval being evaluated, floor, best)`` is at most the recompute of every
set that fits, where ``floor`` is the least ``stop = best * (1 - max(gap, 1e-12))`` against
which an interval was dropped. Proof: the max-term intervals ever pushed cover ``[0,
budget]``, which holds every fitting set's largest segment, except for relaxed sets that do
not fit (a split only leaves out the least relaxed set, which does not fit); an interval
leaves the heap in one of four ways: (i) its least relaxed set fits: every set in it has
recompute at least that set's, which is at least ``best`` from then on; (ii) it is replaced
by pieces (split, halved, or retried with a new cap) that cover all its fitting sets and
whose ``lb`` is still a lower bound for them (the least relaxed recompute, the same ``lb``,
or ``max(cap, Lagrangian prebound)`` when nothing is under the cap); (iii) nothing under
``cap = stop``: every set in it has recompute ``>= stop >= floor``; (iv) at the end, the
ones still in the heap, each with recompute ``>= lb``. The heap pops the least ``lb``
first, so at a time or work limit the interval being evaluated has the least ``lb`` of all in (iv),
and every fitting set is covered by one of the four. ``best`` only decreases, so the ``stop``
of an earlier drop is at least the current one, and costs are non-negative, so the bound is
clamped at 0. When the search ends with ``gap=0``, the bound reported is ``recompute``
itself (``floor`` then only differs from it by the ``1e-12`` margin that absorbs rounding
in recompute sums). The time-limit warning gives the same gap in percent.

**Measured** (``python benchmarks/acg.py --budget``, 2-core container, before / after the
multipliers at the vertex ratios and ``FRONT_LIMIT``): Inception-v3 at 50 % (only ReLUs and
concatenations, 1 flop per 4 bytes, are worth rebuilding: a subset-sum over their sizes)
went from the 60 s limit, 36 % from its lower bound with a set of recompute 8.48e8, to
proven optimal in about 6 s (recompute 7.22e8, 15 % less). The Lagrangian bound was the
culprit: with 40 log-spaced multipliers it stayed about 10 % under the optimum in the
optimum's max-term interval, so every partial subset sum within 10 % passed it; at the
vertex ratios it is within 0.5 %. Other rows: see benchmarks/RESULTS.md.

Notes, tried and left out: starting from 8 geometric max-term intervals instead of one
(ResNet-50 at 10 % 3.4 -> 3.7 s, Inception at 50 % still at the limit); halving every
interval wider than 0.5 % of the budget whenever its cap fails (Inception at 50 % proven in
38 s, but ResNet-50 at 10 % 3.5 -> 17.8 s and DenseNet-121 10.5 -> 43.5 s: 9x more
evaluations); dropping the upper part of an interval whose Lagrangian prebound at
``bytes <= budget - x`` reaches the best (no change); an exact bound over runs of linked
top-level vertices whose joint segment must fit the max term (raised the prebound, 6.52e8 ->
6.81e8, but no time saved once the multipliers include the vertex ratios); smaller cap steps
(max 2 % or 4 % instead of 8 %: slower); ``FRONT_LIMIT`` 250 (DenseNet-121 at 10 % then
splits into so many intervals that it hits the 60 s limit), 5000 (Inception 13 s), 20000
(20 s), none (60 s limit); not growing the cap step again after an abandoned evaluation
(no gain).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
import warnings
import weakref
from typing import NamedTuple

import numpy as np

from ..checkpoint_set import CheckpointSet
from ..errors import InfeasibleBudget, check_real
from .bounds import Lagrangian
from .division import Node, division_tree
from .dp import Context, FrontLimit, TimeLimit, evaluate
from .graph import Graph
from .model import memory_of, segments_of

__all__ = ["checkpoint_search"]

_METHOD = "checkpoint_search"
FRONT_LIMIT = 1000  # candidates in one front of the top-level division: beyond, abandon
MIN_WIDTH = 1e-3  # (of the budget) intervals this narrow are not split when abandoned
MIN_STEP = 1e-3  # cap steps this small run without FRONT_LIMIT (the search must progress)
MAX_STEP = 0.08


def checkpoint_search(
    graph: Graph, *, budget: float | None = None, time_limit: float | None = None,
    gap: float = 0.0, work_limit: int | None = None,
) -> CheckpointSet:
    """Feng & Huang's optimal gradient checkpoints of ``graph`` (module docstring).

    Args:
      graph: the computation graph (sizes in bytes, costs in flops or seconds).
      budget: if given, return the set of least ``recompute`` whose predicted memory is at
        most ``budget`` instead of the set of least memory.
      time_limit: seconds allowed to the budgeted search (the least-memory search always
        runs to the end). When they run out, the best set found so far is returned (it fits
        the budget but may not have the least recompute), a ``RuntimeWarning`` says so and
        ``recompute_lower_bound`` says how far from the least it may be. Default: no limit.
      work_limit: candidates the budgeted search may examine: rows of the division-tree
        DP's fronts before pruning, plus one per front pruned, summed over its evaluations
        (about 3 million a CPU second on the 2-core container of benchmarks/RESULTS.md).
        When they run out it stops as for ``time_limit``, but at the same point on every
        run: the result depends on the graph and the limits only, not on the machine's
        speed or load. Default: no limit. Both limits may be given; the first reached stops.
      gap: relative optimality gap of the budgeted search, in ``[0, 1)``: it stops once no
        set can have less than ``(1 - gap)`` times the recompute of the best set found, so
        the result's recompute is at most ``least / (1 - gap)``. Default 0: exact.

    Returns:
      A :class:`~solver.checkpoint_set.CheckpointSet`: ``checkpoints`` the kept vertex names
      (source and target, always kept, are not listed), ``segments`` the groups of
      recomputed vertex names (topological order) each rebuilt by one local forward,
      ``peak`` the predicted training memory, ``recompute`` the cost of the local forwards.
      With ``budget``, ``recompute_lower_bound`` is a proven lower bound on the least
      recompute of any set that fits (module docstring): ``recompute`` itself when the
      search ran to the end with ``gap=0``, less after a time or work limit or with a gap.

    Raises:
      InfeasibleBudget: no checkpoint set fits ``budget``; ``min_budget`` is the least
        achievable memory.

    Among sets of least memory the search keeps the least recompute it comes across, not
    necessarily the least overall; ``checkpoint_search(graph, budget=result.peak)`` gives
    that.
    """
    if not isinstance(graph, Graph):
        raise TypeError(f"checkpoint_search expects a solver.Graph, got {type(graph).__name__}.")
    if budget is None and (time_limit is not None or work_limit is not None or gap != 0.0):
        raise ValueError(
            "checkpoint_search: time_limit, work_limit and gap apply to the budgeted search "
            "only; pass a "
            "budget, or leave them out (the least-memory search always runs to the end)."
        )
    if budget is not None:
        budget = check_real(budget, "budget", hint="Pass the memory available, in bytes.")
        gap = check_real(gap, "gap", below=1.0, hint="Pass a relative gap such as 0.01 (0: exact).")
        if time_limit is not None:
            time_limit = check_real(time_limit, "time_limit",
                                    hint="Pass seconds, or None for no limit.")
        if work_limit is not None:
            work_limit = check_real(work_limit, "work_limit",
                                    hint="Pass a number of candidates such as 3e6, or None for no limit.")
    search, (mem, rc, kept) = _searched(graph)
    bound = None
    if budget is not None:
        if mem > budget + search.eps:
            raise InfeasibleBudget(budget, mem, _METHOD, units="bytes")
        deadline = np.inf if time_limit is None else time.monotonic() + time_limit
        (mem, rc, kept), bound = search.least_recompute(
            budget, incumbent=(mem, rc, kept), deadline=deadline, gap=gap,
            work_limit=np.inf if work_limit is None else work_limit)
    return search.result(kept, bound)


_searches: "weakref.WeakKeyDictionary[Graph, tuple]" = weakref.WeakKeyDictionary()
_searches_lock = threading.Lock()


def _searched(graph: Graph) -> tuple["_Search", tuple[float, float, list[int]]]:
    """The search state of ``graph`` (its division tree) and its least-memory set, made once
    per graph object: a :class:`Graph` is immutable, and a caller that searches one graph at
    several budgets (``jaxremat.remat_graph``'s bisection) reruns neither. Held while the
    graph lives; thread-safe (one computation per graph)."""
    with _searches_lock:
        found = _searches.get(graph)
        if found is None:
            search = _Search(graph)
            found = _searches[graph] = (search, search.least_memory())
    search, (mem, rc, kept) = found
    return search, (mem, rc, list(kept))


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
        # memory_of by kept set: the greedy passes of searches at different budgets share
        # their first steps (same order of vertices), so later searches mostly look it up
        self._memory: dict[frozenset, tuple[float, float, float]] = {}
        self._memory_lock = threading.Lock()

    # ------------------------------------------------------------------ helpers
    def _solve(self, ctx: Context, seg_limit: float, size_limit: float):
        ctx.seg_limit = seg_limit + self.eps
        ctx.size_limit = size_limit + self.eps
        self.evaluations += 1
        return evaluate(self.tree, ctx, {"cc"})["cc"]

    def _memory_of(self, kept: set[int]) -> tuple[float, float, float]:
        """:func:`memory_of` of ``kept``, cached (bounded: cleared past 8192 sets)."""
        key = frozenset(kept)
        found = self._memory.get(key)
        if found is None:
            found = memory_of(self.graph, kept)
            with self._memory_lock:
                if len(self._memory) > 8192:
                    self._memory.clear()
                self._memory[key] = found
        return found

    def _kept(self, mask: int) -> list[int]:
        return [v for v in range(1, len(self.graph) - 1) if mask >> v & 1]

    def result(self, kept: list[int], bound: float | None = None) -> CheckpointSet:
        """The answer for the kept vertices; ``bound``: the least recompute's lower bound."""
        names = self.graph.names
        mem, _, rc = memory_of(self.graph, kept)
        segments = tuple(tuple(names[v] for v in s) for s in segments_of(self.graph, kept))
        if bound is not None:
            bound = min(float(bound), rc)
        return CheckpointSet(tuple(names[v] for v in kept), segments, mem, rc, bound)

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
            mem, _, rc = self._memory_of(kept | {v})
            if mem <= budget + self.eps:
                kept.add(v)
                if rc < best[1]:
                    best = (mem, rc, sorted(kept))
        return best

    def least_recompute(self, budget: float, incumbent, deadline: float = np.inf, gap: float = 0.0,
                        work_limit: float = np.inf):
        """Best-first branch and bound over max-term intervals ``[lo, hi]`` (module docstring).

        The heap's least ``lb`` bounds every set not yet excluded, so stopping once it
        reaches ``(1 - gap)`` times the best recompute found leaves that set within ``gap``.

        Each heap entry is an :class:`_Interval`: no set that fits the budget, has its largest
        segment in ``[lo, hi]`` and recompute below ``lb`` exists. An evaluation looks for the
        sets under ``cap = lb + step * lb`` only, which the Lagrangian bounds prune hard;
        finding none proves ``lb >= cap`` (the step then grows, up to 8 %). An evaluation
        whose fronts outgrow ``FRONT_LIMIT`` is abandoned for narrower intervals or a
        smaller step (:meth:`_abandon`).

        Returns ``(best, bound)``: the best set found as ``(memory, recompute, kept)`` and a
        lower bound on the least recompute of every set that fits (module docstring).
        """
        limit = budget + self.eps
        ctx = Context(self.graph.sizes, self.graph.costs, budget_mode=True, knapsack_limit=limit,
                      memory_limit=limit, deadline=deadline, work_limit=work_limit,
                      bounded=self.tree,
                      lagrangian=Lagrangian.for_graph(self.graph.sizes, self.graph.costs))
        best = self._first_incumbent(budget, incumbent)
        unit = 1.0 if self.integral else self.tol
        heap = [_Interval(0.0, 0.0, math.floor(budget) if self.integral else budget, 0.01)]
        floor = np.inf  # no set in an interval dropped against `stop` has recompute below it
        while heap:
            box = heapq.heappop(heap)
            lb, lo, hi, step = box
            stop = best[1] * (1 - max(gap, 1e-12)) if best[1] > 0 else -np.inf
            if lb >= stop:  # every interval left, this one included, has none below lb
                floor = min(floor, stop)
                break
            ctx.rc_limit, ctx.seg_limit, ctx.size_limit = stop, hi + self.eps, budget - lo + self.eps
            ctx.cap = min(stop, lb + step * max(lb, 0.01 * stop))
            ctx.prebound = -np.inf  # set by the evaluation if the graph is a linear division
            wide = hi - lo > max(MIN_WIDTH * budget, unit)
            ctx.front_limit = FRONT_LIMIT if wide or step > MIN_STEP else np.inf
            try:
                self.evaluations += 1
                front = evaluate(self.tree, ctx, {"cc"})["cc"]
            except FrontLimit:
                for child in self._abandon(box, wide, unit):
                    heapq.heappush(heap, child)
                continue
            except TimeLimit:  # time or work: best-first, every interval left has none below lb
                bound = max(0.0, min(lb, floor, best[1]))
                _warn_time_limit(best[1], bound)
                return best, bound
            if len(front) == 0:  # nothing under the cap (or under the Lagrangian bound)
                if ctx.cap < stop:
                    heapq.heappush(heap, _Interval(max(ctx.cap, ctx.prebound), lo, hi,
                                                   min(2 * step, MAX_STEP)))
                else:
                    floor = min(floor, stop)
                continue
            order = np.lexsort((front.size, front.rc))
            least = float(front.rc[order[0]])
            fits = np.flatnonzero(front.size[order] + front.top[order] <= limit)
            if len(fits) and float(front.rc[order[fits[0]]]) < best[1]:
                best = self._fitting(int(front.mask[order[fits[0]]]), limit)
            if len(fits) and fits[0] == 0:
                continue  # the interval's least relaxed set fits: none in it does better
            # Split so that the least set (largest segment m') is in no child: [lo, mid),
            # [mid, m') have smaller segments, [m', hi] leaves it fewer bytes than it has.
            largest = max(float(front.top[order[0]]), lo + unit)  # > lo but for rounding
            mid = math.floor((lo + largest) / 2) if self.integral else (lo + largest) / 2
            for a, b in ((lo, mid - unit), (max(mid, lo), largest - unit), (largest, hi)):
                if a <= b:
                    heapq.heappush(heap, _Interval(least, a, b, 0.01))
        # Ran to the end: with gap 0, `floor` only differs from the best by the 1e-12 margin
        # that absorbs rounding in recompute sums; it is not counted against the bound.
        return best, best[1] if gap == 0 else max(0.0, min(floor, best[1]))

    def _first_incumbent(self, budget: float, incumbent):
        """The better of ``incumbent``, "keep everything" (if it fits) and the greedy pass."""
        everything = list(range(1, len(self.graph) - 1))
        mem_all, _, rc_all = memory_of(self.graph, everything)
        if mem_all <= budget + self.eps and rc_all < incumbent[1]:
            incumbent = (mem_all, rc_all, everything)
        return self._greedy(budget, incumbent)

    def _fitting(self, mask: int, limit: float):
        """``(memory, recompute, kept)`` of a set the DP found to fit ``limit``."""
        kept = self._kept(mask)
        mem, _, rc = memory_of(self.graph, kept)
        assert mem <= limit + 10 * self.eps, (
            "internal error: the division-tree DP disagrees with the memory model")
        return mem, rc, kept

    def _abandon(self, box: "_Interval", wide: bool, unit: float) -> list["_Interval"]:
        """What replaces an interval whose evaluation outgrew ``FRONT_LIMIT``: its two halves
        if it is wide (a narrower interval has a tighter relaxation, ``size <= budget - lo``,
        so fewer partial sets pass the bounds), else itself with a quarter of the cap step
        (the cap then passes fewer near-optimal partial sets). Both keep ``lb``: they cover
        the same sets. Intervals narrower than ``MIN_WIDTH`` and steps of ``MIN_STEP`` run
        without the limit, so at most about ``1 / MIN_WIDTH`` intervals come from halving
        and four abandonments in a row from quartering the step."""
        lb, lo, hi, step = box
        if not wide:
            return [_Interval(lb, lo, hi, max(step / 4, MIN_STEP))]
        mid = math.ceil((lo + hi) / 2) if self.integral else (lo + hi) / 2  # lo < mid <= hi
        return [_Interval(lb, lo, mid - unit, step), _Interval(lb, mid, hi, step)]


class _Interval(NamedTuple):
    """A max-term interval of the budgeted search: no fitting set with its largest segment
    in ``[lo, hi]`` has recompute below ``lb``; the next evaluation caps recompute at
    ``lb * (1 + step)`` (``step`` doubles, up to ``MAX_STEP``, when nothing is found)."""

    lb: float
    lo: float
    hi: float
    step: float


def _warn_time_limit(best: float, bound: float) -> None:
    """Say that the budgeted search stopped at its time or work limit, and how far from the
    least recompute its best set may be (``bound``: a lower bound on the least)."""
    proven = f"{100 * (1 - bound / best):.3g}%" if best > 0 else "0%"
    warnings.warn(
        "checkpoint_search: the time limit ran out (or the work limit); returning the best "
        "checkpoint set found, "
        f"which fits the budget but may not have the least recompute (it is within {proven} "
        f"of the least: recompute {best:.6g}, lower bound {bound:.6g}, kept as "
        "CheckpointSet.recompute_lower_bound).", RuntimeWarning, stacklevel=4)
