"""The matrices of Checkmate's ILP for one training graph (used by :mod:`solver.ilp.solve`).

:class:`IlpModel` builds the variables, rows and objective that :mod:`solver.ilp.solve`'s module
docstring states (Jain et al., "Checkmate", MLSys 2020, section 4 and appendix), in either
formulation, with or without the reductions, adds the one-slot cuts for the budget at
hand, separates the window cuts against the LP relaxation, and solves the lot with
``scipy.optimize.milp`` (HiGHS). Nothing here is specific to chains.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from scipy import optimize, sparse

from .training_graph import TrainingGraph

__all__ = ["IlpModel", "last_descendant"]

# HiGHS options beyond scipy's documented ones (scipy passes them on verbatim, with a
# warning). Pseudocosts are trusted from the first observation instead of after 8 strong
# branchings: about 2x faster on unit-size chains, never slower on the benchmark
# (benchmarks/ilp_speed.py; solver.ilp.solve's module docstring).
HIGHS_OPTIONS: dict[str, float | int | bool] = {"mip_pscost_minreliable": 0}

# Window-cut separation (IlpModel.window_cuts_for): the least violation for a cut to be
# added, and the most rounds of LP relaxation + separation.
WINDOW_TOLERANCE = 1e-4
WINDOW_ROUNDS = 30


def last_descendant(graph: TrainingGraph) -> np.ndarray:
    """``last[i]``: the largest id among ``i`` and its descendants.

    In stage ``t > last[i]`` nothing ``i`` could help compute is still ahead of the
    frontier, so ``R[t,i] = S[t,i] = 0`` loses no schedule's cost or peak.
    """
    last = np.arange(len(graph))
    for k in range(len(graph) - 1, -1, -1):
        for i in graph.deps[k]:
            last[i] = max(last[i], last[k])
    return last


class IlpModel:
    """Variables, constraints and objective of the ILP for one training graph.

    Columns are created on first mention of a key: ``("R", t, i)``, ``("S", t, i)``,
    ``("F", t, i, k)``, ``("U", t, k)`` (Checkmate), ``("L", t, i, j)`` (liveness, ``j`` a
    user of ``i``), ``("B",)`` (the peak, when minimising it).

    Args:
      graph: the training graph.
      formulation: ``"liveness"`` or ``"checkmate"``.
      min_peak: minimise the peak ``B`` instead of the compute cost.
      reductions: add the reductions of the module docstring of :mod:`solver.ilp.solve` (the
        two usefulness cuts, ``R + S <= 1`` and the dead-value fixing). ``False`` gives the
        plain model, which the tests solve to check that the reductions keep the optimum.
      backward_recompute: allow recomputing backward vertices; ``False`` computes each
        one once, in its own stage (the chain simulator's class, :mod:`solver.ilp.chain_adapter`).
      slot_cuts: add the one-slot cuts of :mod:`solver.ilp.solve`'s module docstring at every
        stage whose end leaves room for one more value of an interval (built per budget in
        :meth:`solve`; only with ``reductions`` and a fixed budget). ``False`` for the tests
        that check them against the model without.
      window_cuts: add the window cuts of :mod:`solver.ilp.solve`'s module docstring that the LP
        relaxation violates (separated per budget in :meth:`solve` by
        :meth:`window_cuts_for`; only with ``reductions`` and a fixed budget). ``False``
        for the tests that check them against the model without.

    Memory rows are divided by the largest size (``scale``) so that byte-sized problems
    have coefficients near 1 for HiGHS's tolerances; budgets are divided alike in
    :meth:`solve`.
    """

    def __init__(
        self,
        graph: TrainingGraph,
        formulation: str,
        min_peak: bool,
        *,
        reductions: bool = True,
        backward_recompute: bool = True,
        slot_cuts: bool = True,
        window_cuts: bool = True,
    ) -> None:
        self.graph = graph
        self.slot_cuts = slot_cuts and reductions and not min_peak
        self.window_cuts = window_cuts and reductions and not min_peak
        self.scale = float(graph.sizes.max()) if len(graph) and graph.sizes.max() > 0 else 1.0
        self.users = graph.users
        self.reductions = reductions
        self.index: dict[tuple, int] = {}
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.memory_rows: list[int] = []  # rows whose upper bound is the budget
        T = len(graph)
        last = last_descendant(graph)
        # alive[t][i]: i may be held or computed in stage t (all i <= t without reductions).
        self.alive = [[i <= t and (not reductions or last[i] >= t) for i in range(T)]
                      for t in range(T)]
        for t in range(T):
            for i in range(t + 1):
                self._col(("R", t, i))
            for i in range(t):
                self._col(("S", t, i))
        for t in range(T):
            self._schedule_rows(t)
            if formulation == "checkmate":
                self._checkmate_rows(t, min_peak)
            else:
                self._liveness_rows(t, min_peak)
        size = len(self.index)
        self.matrix = sparse.csr_array(
            (self.vals, (self.rows, self.cols)), shape=(len(self.lower), size)
        )
        self.integrality = np.array([key[0] in "RSF" for key in self.index], dtype=np.uint8)
        self.var_lower = np.zeros(size)
        self.var_upper = np.array([np.inf if key[0] in "UB" else 1.0 for key in self.index])
        for t in range(T):
            self.var_lower[self.index[("R", t, t)]] = 1.0  # frontier advancing
            if t > 0:
                self.var_upper[self.index[("R", t, 0)]] = 0.0  # the input is given once
            if not backward_recompute:
                for i in range(graph.num_forward, t):
                    self.var_upper[self.index[("R", t, i)]] = 0.0
            for i in range(t):
                if not self.alive[t][i]:  # i can no longer serve the frontier
                    self.var_upper[self.index[("R", t, i)]] = 0.0
                    self.var_upper[self.index[("S", t, i)]] = 0.0
        self.objective = np.zeros(size)
        if min_peak:
            self.objective[self.index[("B",)]] = 1.0
        else:
            for t in range(T):
                for i in range(t + 1):
                    self.objective[self.index[("R", t, i)]] = graph.costs[i]

    def _col(self, key: tuple) -> int:
        column = self.index.get(key)
        if column is None:
            column = self.index[key] = len(self.index)
        return column

    def _row(self, terms: dict, low: float, high: float) -> int:
        row = len(self.lower)
        for key, value in terms.items():
            self.rows.append(row)
            self.cols.append(self._col(key))
            self.vals.append(float(value))
        self.lower.append(low)
        self.upper.append(high)
        return row

    def _memory_row(self, terms: dict, min_peak: bool) -> None:
        """``terms <= budget``, or ``terms <= B`` when minimising the peak (sizes / scale)."""
        terms = {key: value / self.scale for key, value in terms.items()}
        if min_peak:
            self._row({**terms, ("B",): -1.0}, -np.inf, 0.0)
        else:
            self.memory_rows.append(self._row(terms, -np.inf, np.inf))

    def _schedule_rows(self, t: int) -> None:
        """Dependencies, checkpoint carry-over and (with reductions) the cuts of stage ``t``."""
        graph, users, nxt = self.graph, self.users, t + 1 < len(self.graph)
        for k in range(t + 1):
            for i in graph.deps[k]:  # R[t,k] <= R[t,i] + S[t,i]
                self._row({("R", t, k): 1, ("R", t, i): -1, ("S", t, i): -1}, -np.inf, 0)
            if nxt:  # S[t+1,k] <= S[t,k] + R[t,k]
                terms = {("S", t + 1, k): 1, ("R", t, k): -1}
                if k < t:
                    terms[("S", t, k)] = -1
                self._row(terms, -np.inf, 0)
        if not self.reductions:
            return
        for i in range(t):
            if not self.alive[t][i]:
                continue
            use = {("R", t, j): -1.0 for j in users[i] if j <= t}
            if nxt:
                use[("S", t + 1, i)] = -1.0
            self._row({("S", t, i): 1.0, **use}, -np.inf, 0)  # held => used or kept
            if i > 0:
                self._row({("R", t, i): 1.0, **use}, -np.inf, 0)  # recomputed => used or kept
                self._row({("R", t, i): 1.0, ("S", t, i): 1.0}, -np.inf, 1)  # not both

    def _checkmate_rows(self, t: int, min_peak: bool) -> None:
        """Checkmate's FREE linearisation and memory recurrence for stage ``t``."""
        graph, users, M, nxt = self.graph, self.users, self.graph.sizes, t + 1 < len(self.graph)
        for k in range(t + 1):
            for i in sorted(set(graph.deps[k]) | {k}):
                hazard = {("R", t, j): 1.0 for j in users[i] if k < j <= t}
                if nxt:
                    hazard[("S", t + 1, i)] = 1.0
                kappa = 1 + len(hazard)
                free = ("F", t, i, k)
                # 1 - F <= (1 - R[t,k]) + hazards      <=>  -F + R[t,k] - hazards <= 0
                self._row({free: -1, ("R", t, k): 1, **{h: -1 for h in hazard}}, -np.inf, 0)
                # kappa (1 - F) >= (1 - R[t,k]) + hazards  <=>  kappa F - R[t,k] + hazards <= kappa - 1
                self._row({free: kappa, ("R", t, k): -1, **hazard}, -np.inf, kappa - 1)
                # Factor-wise bounds of the product (valid, tighter LP): F <= R[t,k], F <= 1 - h.
                self._row({free: 1, ("R", t, k): -1}, -np.inf, 0)
                for key in hazard:
                    self._row({free: 1, key: 1}, -np.inf, 1)
        # U[t,0] = sum_i M_i S[t,i] + M_0 R[t,0];  U[t,k] = U[t,k-1] + M_k R[t,k] - frees after k-1
        terms = {("U", t, 0): 1.0, ("R", t, 0): -M[0], **{("S", t, i): -M[i] for i in range(t)}}
        self._row(terms, 0, 0)
        for k in range(1, t + 1):
            terms = {("U", t, k): 1.0, ("U", t, k - 1): -1.0, ("R", t, k): -M[k]}
            for i in set(graph.deps[k - 1]) | {k - 1}:
                terms[("F", t, i, k - 1)] = M[i]
            self._row(terms, 0, 0)
        for k in range(t + 1):
            self._memory_row({("U", t, k): 1.0}, min_peak)

    def _liveness_rows(self, t: int, min_peak: bool) -> None:
        """The liveness memory constraints of stage ``t`` (module docstring of solver.ilp.solve).

        ``L[t,i,j]`` exists only for the users ``j <= t`` of ``i``: ``L[t,i,k]`` at any
        other ``k`` equals ``L`` at the first user ``j >= k`` (or ``S[t+1,i]`` past the
        last one), so the memory row at ``k`` uses that column.
        """
        M, nxt = self.graph.sizes, t + 1 < len(self.graph)
        live: dict[tuple[int, int], tuple | None] = {}  # (i, k) -> column of "i live at k"
        for i in range(t):
            if not self.alive[t][i]:
                continue
            later = ("S", t + 1, i) if nxt else None
            for k in range(t, i, -1):
                if k in self.users[i]:
                    here = ("L", t, i, k)
                    self._row({here: 1, ("R", t, k): -1}, 0, np.inf)  # live at k if k reads it
                    if later is not None:  # live at k if live at its next user (or kept)
                        self._row({here: 1, later: -1}, 0, np.inf)
                    later = here
                live[i, k] = later
        for k in range(t + 1):
            terms = {("R", t, k): M[k]}
            for i in range(t):
                if not self.alive[t][i] or i == k:
                    continue
                key = live[i, k] if i < k else ("S", t, i)
                if key is not None:
                    terms[key] = terms.get(key, 0.0) + M[i]
            self._memory_row(terms, min_peak)

    def slot_cuts_for(self, budget: float) -> sparse.csr_array:
        """The one-slot cuts for ``budget`` (module docstring of :mod:`solver.ilp.solve`), ``<= 0``.

        For a stage ``t`` and an interval ``U = {a..m}`` of ids (``1 <= a <= m < t``), let
        ``K`` be the ids of ``U`` outside ``deps(t)`` whose ``S[t+1]`` is not fixed at 0.
        When the end of stage ``t`` has room for at most one of them next to ``t``, its
        inputs and the source (if a later stage reads it), the row is
        ``sum_K S[t+1,i] - sum_U S[t,i] - sum_{entry(U)} R[t,u] <= 0``, where ``entry(U)``
        are the ids of ``U`` with no input in ``U``. Columns fixed at 0 are left out.
        """
        graph, M, T = self.graph, self.graph.sizes, len(self.graph)
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        count = 0
        if not self.slot_cuts or not np.isfinite(budget):
            return sparse.csr_array((0, len(self.index)))
        last_input = [max(deps, default=-1) for deps in graph.deps]
        source_read_after = [max(self.users[0], default=-1) > t for t in range(T)]

        def free(key: tuple) -> int | None:
            column = self.index.get(key)
            return column if column is not None and self.var_upper[column] > 0 else None

        for t in range(1, T - 1):
            deps = set(graph.deps[t])
            room = budget - M[t] - sum(M[i] for i in deps)
            if 0 not in deps and source_read_after[t]:
                room -= M[0]
            kept = {i: free(("S", t + 1, i)) for i in range(1, t) if i not in deps}
            held = [free(("S", t, i)) for i in range(t)]
            computed = [free(("R", t, u)) for u in range(t)]
            for m in range(1, t):
                smallest = np.inf
                for a in range(m, 0, -1):
                    if kept.get(a) is not None:
                        smallest = min(smallest, M[a])
                    if smallest == np.inf:
                        continue
                    if smallest <= 0 or np.floor(room / smallest + 1e-7) >= 2:
                        break  # room for two: also for every longer interval
                    terms = [kept[i] for i in range(a, m + 1) if kept.get(i) is not None]
                    negative = [held[i] for i in range(a, m + 1)]
                    negative += [computed[u] for u in range(a, m + 1) if last_input[u] < a]
                    negative = [c for c in negative if c is not None]
                    rows += [count] * (len(terms) + len(negative))
                    cols += terms + negative
                    values += [1.0] * len(terms) + [-1.0] * len(negative)
                    count += 1
        return sparse.csr_array((values, (rows, cols)), shape=(count, len(self.index)))

    def window_cuts_for(self, budget: float, time_limit: float = np.inf) -> sparse.csr_array:
        """Window cuts (module docstring of :mod:`solver.ilp.solve`) that the LP relaxation violates.

        For stages ``1 <= s <= t`` and an interval ``U = {a..i}`` of ids (``1 <= a <= i <
        t``) the row is ``S[t,i] + R[t,i] - sum_{u in U} S[s,u] - sum_{r=s..t} sum_{u in
        entry(U)} R[r,u] <= 0``, ``entry(U)`` the ids of ``U`` with no input in ``U``;
        columns fixed at 0 are left out. Each round solves the LP relaxation at ``budget``
        (the model, its one-slot cuts and the window cuts found so far) and adds, for each
        ``(t, i, a)``, the window ``s`` of the most violated row (the latest ``s`` among
        ties) if it is violated by more than ``WINDOW_TOLERANCE``; rounds stop when none
        is, after ``WINDOW_ROUNDS``, or once a quarter of ``time_limit`` has passed. Every
        row is valid whatever the LP point: the LP only chooses which ones to add.
        """
        empty = sparse.csr_array((0, len(self.index)))
        if not self.window_cuts or not np.isfinite(budget):
            return empty
        start = time.perf_counter()
        matrix, lower, upper = self._bounded_rows(budget, self.slot_cuts_for(budget))
        found: list[sparse.csr_array] = []
        for _ in range(WINDOW_ROUNDS):
            if time.perf_counter() - start > time_limit / 4:
                break
            relaxation = optimize.milp(
                self.objective,
                bounds=optimize.Bounds(self.var_lower, self.var_upper),
                constraints=optimize.LinearConstraint(matrix, lower, upper),
            )
            if relaxation.status != 0 or relaxation.x is None:
                break  # an infeasible budget: the MIP reports it
            cuts = self._violated_windows(relaxation.x)
            if cuts.shape[0] == 0:
                break
            found.append(cuts)
            matrix = sparse.vstack([matrix, cuts], format="csr")
            lower = np.concatenate([lower, np.full(cuts.shape[0], -np.inf)])
            upper = np.concatenate([upper, np.zeros(cuts.shape[0])])
        return sparse.vstack(found, format="csr") if found else empty

    def _violated_windows(self, x: np.ndarray) -> sparse.csr_array:
        """The window-cut rows violated at the LP point ``x`` (see :meth:`window_cuts_for`).

        For fixed ``t`` and ``a``, with ``held[s, i] = sum_{u=a..i} S[s,u]`` and
        ``started[s, i] = sum_{r=s..t} sum_{u in entry({a..i}), u <= i} R[r,u]`` (an id
        ``u >= a`` is an entry of every ``{a..i}`` containing it iff its inputs are all
        below ``a``), the right side for every ``(s, i)`` is ``held + started``.
        """
        graph, T = self.graph, len(self.graph)
        S = np.zeros((T, T))
        R = np.zeros((T, T))
        for key, column in self.index.items():
            if key[0] in "RS" and self.var_upper[column] > 0:
                (R if key[0] == "R" else S)[key[1], key[2]] = x[column]
        last_input = np.array([max(deps, default=-1) for deps in graph.deps])
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        count = 0

        def present(keys) -> list[int]:
            found = (self.index.get(key) for key in keys)
            return [c for c in found if c is not None and self.var_upper[c] > 0]

        for t in range(2, T):
            avail = S[t, :t] + R[t, :t]
            candidates = np.flatnonzero(avail[1:] > WINDOW_TOLERANCE) + 1
            if candidates.size == 0:
                continue
            top = int(candidates.max())
            for a in range(1, top + 1):
                entry = last_input[a:top + 1] < a
                held = np.cumsum(S[1:t + 1, a:top + 1], axis=1)  # row s - 1, column i - a
                started = np.cumsum(R[1:t + 1, a:top + 1] * entry, axis=1)
                started = np.cumsum(started[::-1], axis=0)[::-1]  # stages s..t
                right = held + started
                latest = t - 1 - np.argmin(right[::-1], axis=0)  # row of the latest best s
                violation = avail[a:top + 1] - right[latest, np.arange(top + 1 - a)]
                for i in candidates[candidates >= a]:
                    if violation[i - a] <= WINDOW_TOLERANCE:
                        continue
                    s = int(latest[i - a]) + 1
                    positive = present([("S", t, i), ("R", t, i)])
                    negative = present(("S", s, u) for u in range(a, i + 1))
                    negative += present(("R", r, u) for u in range(a, i + 1)
                                        if last_input[u] < a for r in range(max(s, u), t + 1))
                    rows += [count] * (len(positive) + len(negative))
                    cols += positive + negative
                    values += [1.0] * len(positive) + [-1.0] * len(negative)
                    count += 1
        return sparse.csr_array((values, (rows, cols)), shape=(count, len(self.index)))

    def _bounded_rows(self, budget: float, cuts: sparse.csr_array):
        """The constraint matrix and row bounds at ``budget``, ``cuts`` (``<= 0``) appended."""
        upper = np.asarray(self.upper, dtype=np.float64)
        upper[self.memory_rows] = budget / self.scale
        lower = np.asarray(self.lower, dtype=np.float64)
        matrix = self.matrix
        if cuts.shape[0]:
            matrix = sparse.vstack([matrix, cuts], format="csr")
            lower = np.concatenate([lower, np.full(cuts.shape[0], -np.inf)])
            upper = np.concatenate([upper, np.zeros(cuts.shape[0])])
        return matrix, lower, upper

    def solve(self, budget: float, time_limit: float, gap: float) -> optimize.OptimizeResult:
        """Run HiGHS with every memory row bounded by ``budget``, with the slot and window cuts.

        The window-cut separation counts against ``time_limit``.
        """
        start = time.perf_counter()
        cuts = self.slot_cuts_for(budget)
        windows = self.window_cuts_for(budget, time_limit)
        if windows.shape[0]:
            cuts = sparse.vstack([cuts, windows], format="csr")
        matrix, lower, upper = self._bounded_rows(budget, cuts)
        remaining = max(float(time_limit) - (time.perf_counter() - start), 1.0)
        options = {"time_limit": remaining, "mip_rel_gap": float(gap), "disp": False}
        options.update(HIGHS_OPTIONS)
        with warnings.catch_warnings():
            # scipy warns that it passes options it does not know verbatim to HiGHS.
            warnings.filterwarnings("ignore", message="Unrecognized options")
            return optimize.milp(
                self.objective,
                integrality=self.integrality,
                bounds=optimize.Bounds(self.var_lower, self.var_upper),
                constraints=optimize.LinearConstraint(matrix, lower, upper),
                options=options,
            )

    def decisions(self, result: optimize.OptimizeResult) -> tuple[np.ndarray, np.ndarray]:
        """The boolean ``R`` and ``S`` matrices (``T x T``) of a solution."""
        T = len(self.graph)
        R = np.zeros((T, T), dtype=bool)
        S = np.zeros((T, T), dtype=bool)
        for key, column in self.index.items():
            if key[0] in "RS" and result.x[column] > 0.5:
                (R if key[0] == "R" else S)[key[1], key[2]] = True
        return R, S
