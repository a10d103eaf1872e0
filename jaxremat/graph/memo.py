"""What :func:`jaxremat.remat_graph` plans once per function and input signature, for every
budget (issue 18.4: planning time).

Planning one budget traces the function's dataflow graph, runs Feng & Huang's least-memory
search (CVPR 2021), measures the plain program and the least-memory plan, then bisects on
the model budget (:mod:`jaxremat.graph.budget`): a budgeted search and a measurement per
step. Of these, only the bisection's probes depend on the user's budget, and they repeat
across budgets (each bisection starts at the same midpoint; many model budgets give the same
set). A :class:`PlanningMemo` (one per function; for :class:`jaxremat.flax.RematModule`, one
per graph definition) keeps, per input signature (LRU of ``SIGNATURES``):

* the traced graph and its least-memory set;
* the measured bytes of each plan measured, by kept set and mode;
* the function of each region run (:func:`jaxremat.graph.plan.run_regions`): JAX caches
  the differentiation of a checkpointed function by the function, so a region that several
  plans share is traced and differentiated once;
* the budgeted searches run, reused for a model budget ``b`` whenever an earlier search
  with the same work limit at ``b0 >= b`` returned a set whose model memory is at most
  ``b``: the least recompute does not decrease when the budget shrinks, so that set is
  still the least (within the search's gap) at ``b``.

The memo holds plans' inputs, not compiled programs; it is guarded by one lock, so threads
planning the same function plan each signature once.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Hashable

import solver

from ..lru import LRU
from ..measure.dataflow import TracedGraph

__all__ = ["PlanningMemo", "SignatureMemo", "memo_for"]

SIGNATURES = 16


class SignatureMemo:
    """The budget-independent planning of one input signature (module docstring)."""

    def __init__(self, traced: TracedGraph) -> None:
        self.traced = traced
        self.least: solver.CheckpointSet = solver.checkpoint_search(traced.graph)
        self._measured: dict[Hashable, int] = {}
        self._searches: list[tuple[float, int | None, solver.CheckpointSet]] = []
        # each region's function, shared by the plans of this signature (plan.run_regions)
        self.functions: dict[Hashable, tuple] = {}
        self.searches_run = 0  # budgeted searches actually run (tests read it)

    def measured(self, key: Hashable, measure: Callable[[], int]) -> int:
        """``measure()``'s bytes, computed once per ``key``."""
        if key not in self._measured:
            self._measured[key] = int(measure())
        return self._measured[key]

    def search(self, model_budget: float, time_limit: float | None, gap: float,
               work_limit: int | None = None) -> solver.CheckpointSet:
        """``solver.checkpoint_search(graph, budget=model_budget, ...)``, or an earlier result
        that is also the answer at ``model_budget`` (module docstring)."""
        for budget, limit, found in self._searches:
            if limit == work_limit and found.peak <= model_budget <= budget:
                return found
        found = solver.checkpoint_search(self.traced.graph, budget=model_budget,
                                         time_limit=time_limit, gap=gap, work_limit=work_limit)
        self.searches_run += 1
        self._searches.append((model_budget, work_limit, found))
        return found


class PlanningMemo:
    """Per input signature, a :class:`SignatureMemo` (bounded, thread-safe)."""

    def __init__(self, size: int = SIGNATURES) -> None:
        self.lock = threading.RLock()  # held by the planner for a whole plan
        self._entries = LRU(size)

    def entry(self, key: Hashable, trace: Callable[[], TracedGraph]) -> SignatureMemo:
        """The memo of signature ``key``; ``trace()`` traces the graph the first time."""
        with self.lock:
            found = self._entries.get(key)
            if found is None:
                found = SignatureMemo(trace())
                self._entries.put(key, found)
            return found

    def __len__(self) -> int:
        return len(self._entries)


_memos: dict[int, tuple[weakref.ref, PlanningMemo]] = {}  # by id(fn): no __eq__ is called
_memos_lock = threading.Lock()


def memo_for(fn: Any) -> PlanningMemo:
    """The memo shared by every :class:`jaxremat.RematGraph` of the function object ``fn``
    (by identity; held while ``fn`` lives; a new, unshared one when ``fn`` cannot be weakly
    referenced)."""
    key = id(fn)
    with _memos_lock:
        found = _memos.get(key)
        if found is not None and found[0]() is fn:
            return found[1]
        try:
            ref = weakref.ref(fn, lambda _, key=key: _memos.pop(key, None))
        except TypeError:
            return PlanningMemo()
        memo = PlanningMemo()
        _memos[key] = (ref, memo)
        return memo
