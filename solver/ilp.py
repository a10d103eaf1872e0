"""Checkmate's integer linear program: the exact oracle for small graphs (ALGORITHMS.md s. 5).

Jain, Jain, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez, "Checkmate: Breaking the
Memory Wall with Optimal Tensor Rematerialization", MLSys 2020, section 4 (the MILP with
frontier-advancing stages) and appendix (the linearisation of ``FREE``), solved with
``scipy.optimize.milp`` (HiGHS).

**Training graph.** :class:`~solver.training_graph.TrainingGraph` (forward vertices, then one
backward vertex per non-source forward vertex) is what the ILP schedules.

**ILP** (``T = N`` stages for ``N`` training vertices, 0-based). Binaries ``R[t,i]``
(compute ``i`` in stage ``t``) for ``i <= t`` and ``S[t,i]`` (``i`` resident at the start of
``t``) for ``i < t``. Minimise ``sum C_i R[t,i]`` subject to

* frontier advancing: ``R[t,t] = 1`` (stage ``t`` computes ``t`` for the first time);
* dependencies: ``R[t,k] <= R[t,i] + S[t,i]`` for every dependency ``i`` of ``k``;
* checkpoints: ``S[t+1,i] <= S[t,i] + R[t,i]``;
* memory <= budget, in one of two formulations of the same accounting:

``formulation="checkmate"`` (the paper's): binaries ``FREE[t,i,k]`` (free ``i`` right after
computing ``k`` in stage ``t``; ``k <= t``, ``i`` in ``deps(k) + {k}``) and continuous
``U[t,k]`` (memory just after computing ``k``, before the frees that follow it):
``U[t,0] = sum_i M_i S[t,i] + M_0 R[t,0]``,
``U[t,k] = U[t,k-1] + M_k R[t,k] - sum_{i in deps(k-1)+{k-1}} M_i FREE[t,i,k-1]``,
``U[t,k] <= budget``, and
``FREE[t,i,k] = R[t,k] (1 - S[t+1,i]) prod_{j in users(i), k < j <= t} (1 - R[t,j])``
linearised as in Checkmate's appendix: with the number of "hazards"
``h = (1 - R[t,k]) + S[t+1,i] + sum_j R[t,j]`` and ``kappa`` its largest value,
``1 - FREE <= h`` and ``kappa (1 - FREE) >= h`` (so ``FREE = 1`` iff ``h = 0``). We add the
factor-wise bounds ``FREE <= R[t,k]``, ``FREE <= 1 - S[t+1,i]``, ``FREE <= 1 - R[t,j]``
(valid, and a tighter relaxation than the aggregated ``kappa`` row).

``formulation="liveness"`` (ours, the default): continuous ``L[t,i,k]`` in ``[0, 1]`` for
``i < k <= t``, "``i`` is still needed when ``k`` is computed in stage ``t``":
``L[t,i,k] >= L[t,i,k+1]``, ``L[t,i,t] >= S[t+1,i]``, ``L[t,i,k] >= R[t,k]`` when ``k``
reads ``i``; and for every ``k <= t``
``M_k R[t,k] + sum_{i<k} M_i L[t,i,k] + sum_{k<i<t} M_i S[t,i] <= budget``
(a checkpoint with a larger index than ``k`` is held from the stage's start until its
first use, which comes after ``k``). With integral ``R, S`` the least ``L`` is exactly the
0/1 "needed later" indicator, so each row is the memory at the moment ``k`` is computed
when values are freed right after their last use in the stage: Checkmate's accounting.
It has ``O(T^3)`` continuous variables but no ``FREE`` binaries, and its relaxation is
tighter; on chains of 15-20 forward vertices it solves 5-15x faster.

Both formulations also carry these reductions, each of which keeps at least one optimal
schedule (and one of least peak): drop a held value that the stage neither reads nor
keeps, or a recomputation that it neither reads nor keeps (``S[t,i]``, ``R[t,i] <=
sum_{users j <= t} R[t,j] + S[t+1,i]``; removing such a value never raises cost or memory,
and repeating the removal terminates); fix ``R[t,i] = S[t,i] = 0`` once ``t`` is past ``i``
and all its descendants (nothing ahead of the frontier can use ``i``). With them the two
formulations count memory identically: Checkmate's only extra charges (a held value used
by nothing in the stage; a value both held and recomputed) never occur in an optimal
solution, which the tests check by solving both.

The source (the input) is given once: it is "computed" in stage 0 at its cost (0 by the
Graph convention) and never recomputed (``R[t,0] = 0`` for ``t > 0``), so it stays
resident while something still needs it, like ``x[0]`` in Rotor.

**Memory model** (what ``peak`` and ``budget`` count): the values resident at a stage's
start (its checkpoints) plus everything computed in the stage, each freed right after its
last use in the stage unless the next stage keeps it; forward activations and gradients
(backward outputs) both count; an operation's inputs and output are resident together
while it runs. Not counted: parameters and their gradients, an operation's transient
workspace, the seed gradient of the loss. ``IlpSolution.peak`` is recomputed from the
returned program order (:func:`_program_order`), not read off the solver's variables.

**Differences from the chain simulator** (:mod:`solver.simulate`, Rotor's model):
Checkmate has no *tape*: a backward reads forward tensors that must be resident (its
inputs and output), so Rotor's ``xbar_size[i] > x_size[i+1]`` (residuals beyond the
output) has no counterpart, and neither have ``fwd_tmp`` / ``bwd_tmp``; a value may be
freed and recomputed at any point (no persistence), but stage ``t`` evaluates its vertices
in index order, each at most once, and the first computations follow the fixed
topological order. For a chain with ``xbar_size == x_size[1:]`` and no temporaries, every
Rotor schedule is a feasible ILP solution of the same time and no larger memory, so the
ILP's optimum is a lower bound on Rotor's (tested in ``tests/test_ilp.py``).

**Minimum budget.** :func:`ilp_min_peak` solves the same ILP with a free variable ``B``
above every memory row and objective ``B``: the least budget that admits any schedule of
the class. :func:`solve_ilp` calls it only to report an infeasible budget
(:class:`~solver.errors.InfeasibleBudget`).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Hashable, Literal, Sequence

import numpy as np
from scipy import optimize, sparse

from .errors import InfeasibleBudget
from .graph import Graph
from .training_graph import TrainingGraph

__all__ = ["TrainingGraph", "IlpSolution", "solve_ilp", "ilp_min_peak"]

Action = tuple[str, int]  # ("compute", vertex) or ("free", vertex), training-graph ids
Formulation = Literal["liveness", "checkmate"]


@dataclasses.dataclass(frozen=True, eq=False)
class IlpSolution:
    """A schedule found by Checkmate's ILP.

    Attributes:
      objective: total compute cost, recomputations included (``sum C_i R[t,i]``).
      R: ``R[t, i]`` (bool, ``T x T``): vertex ``i`` computed in stage ``t``.
      S: ``S[t, i]`` (bool): vertex ``i`` resident at the start of stage ``t``.
      order: the schedule as ``("compute", i)`` / ``("free", i)`` actions over training
        vertex ids, in program order; each value is freed right after its last use in its
        stage unless the next stage keeps it (:func:`_program_order`).
      peak: the peak memory of ``order`` (module docstring's model), at most ``budget``.
      budget: the budget it was solved for (``inf`` for :func:`ilp_min_peak`'s schedule).
      optimal: whether HiGHS proved optimality (``False``: the time limit stopped it with a
        feasible schedule; ``gap`` says how far from optimal it may be).
      gap: HiGHS's relative MIP gap at the end.
      graph: the training graph the ids refer to.
    """

    objective: float
    R: np.ndarray
    S: np.ndarray
    order: tuple[Action, ...]
    peak: float
    budget: float
    optimal: bool
    gap: float
    graph: TrainingGraph

    @property
    def recompute(self) -> float:
        """Compute spent on recomputation: ``objective`` minus one run of every vertex."""
        return float(self.objective - self.graph.costs.sum())

    @property
    def named_order(self) -> tuple[tuple[str, tuple[str, Hashable]], ...]:
        """``order`` with vertex names, e.g. ``("compute", ("bwd", "x3"))``."""
        return tuple((action, self.graph.names[i]) for action, i in self.order)


class _Model:
    """Variables, constraints and objective of the ILP for one training graph.

    Columns are created on first mention of a key: ``("R", t, i)``, ``("S", t, i)``,
    ``("F", t, i, k)``, ``("U", t, k)`` (Checkmate), ``("L", t, i, k)`` (liveness), ``("B",)``.
    """

    def __init__(self, graph: TrainingGraph, formulation: str, min_peak: bool) -> None:
        self.graph = graph
        self.users = graph.users
        self.index: dict[tuple, int] = {}
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.memory_rows: list[int] = []  # rows whose upper bound is the budget
        T = len(graph)
        self.alive = _last_descendant(graph)
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
            for i in range(t):
                if self.alive[i] < t:  # i can no longer serve the frontier
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
        """``terms <= budget``, or ``terms <= B`` when minimising the peak."""
        if min_peak:
            self._row({**terms, ("B",): -1.0}, -np.inf, 0.0)
        else:
            self.memory_rows.append(self._row(terms, -np.inf, np.inf))

    def _schedule_rows(self, t: int) -> None:
        """Dependencies, checkpoint carry-over and the two usefulness cuts of stage ``t``."""
        graph, users, nxt = self.graph, self.users, t + 1 < len(self.graph)
        for k in range(t + 1):
            for i in graph.deps[k]:  # R[t,k] <= R[t,i] + S[t,i]
                self._row({("R", t, k): 1, ("R", t, i): -1, ("S", t, i): -1}, -np.inf, 0)
            if nxt:  # S[t+1,k] <= S[t,k] + R[t,k]
                terms = {("S", t + 1, k): 1, ("R", t, k): -1}
                if k < t:
                    terms[("S", t, k)] = -1
                self._row(terms, -np.inf, 0)
        for i in range(t):
            use = {("R", t, j): -1.0 for j in users[i] if j <= t}
            if nxt:
                use[("S", t + 1, i)] = -1.0
            self._row({("S", t, i): 1.0, **use}, -np.inf, 0)  # held => used or kept
            if i > 0:
                self._row({("R", t, i): 1.0, **use}, -np.inf, 0)  # recomputed => used or kept

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
        """The liveness memory constraints of stage ``t`` (module docstring)."""
        graph, M, nxt = self.graph, self.graph.sizes, t + 1 < len(self.graph)
        for i in range(t):
            if self.alive[i] < t:
                continue
            for k in range(i + 1, t + 1):
                live = ("L", t, i, k)
                later = ("L", t, i, k + 1) if k < t else (("S", t + 1, i) if nxt else None)
                if later is not None:  # live at k if live at k + 1 (or kept, after t)
                    self._row({live: 1, later: -1}, 0, np.inf)
                if i in graph.deps[k]:  # live at k if k reads it
                    self._row({live: 1, ("R", t, k): -1}, 0, np.inf)
        for k in range(t + 1):
            terms = {("R", t, k): M[k]}
            for i in range(t):
                if self.alive[i] >= t and i != k:
                    terms[("L", t, i, k) if i < k else ("S", t, i)] = M[i]
            self._memory_row(terms, min_peak)

    def solve(self, budget: float, time_limit: float, gap: float) -> optimize.OptimizeResult:
        upper = np.asarray(self.upper, dtype=np.float64)
        upper[self.memory_rows] = budget
        return optimize.milp(
            self.objective,
            integrality=self.integrality,
            bounds=optimize.Bounds(self.var_lower, self.var_upper),
            constraints=optimize.LinearConstraint(self.matrix, self.lower, upper),
            options={"time_limit": float(time_limit), "mip_rel_gap": float(gap), "disp": False},
        )

    def solution(self, result: optimize.OptimizeResult, budget: float) -> IlpSolution:
        T = len(self.graph)
        R = np.zeros((T, T), dtype=bool)
        S = np.zeros((T, T), dtype=bool)
        for key, column in self.index.items():
            if key[0] in "RS" and result.x[column] > 0.5:
                (R if key[0] == "R" else S)[key[1], key[2]] = True
        order, peak = _program_order(self.graph, R, S)
        gap = getattr(result, "mip_gap", None)
        return IlpSolution(
            objective=float(self.graph.costs @ R.sum(axis=0)), R=R, S=S, order=order,
            peak=peak, budget=float(budget), optimal=result.status == 0,
            gap=float(gap) if gap is not None else float("nan"), graph=self.graph,
        )


def _program_order(graph: TrainingGraph, R: np.ndarray, S: np.ndarray) -> tuple[tuple[Action, ...], float]:
    """The actions of a solution in program order, and their peak memory.

    Stage ``t`` starts holding ``S[t]`` and computes the vertices of ``R[t]`` in index order;
    after each computation (and at the stage's start) every value no later computation of
    the stage reads and ``S[t+1]`` does not keep is freed. Peak = the largest sum of
    resident sizes right after a computation.
    """
    T, users, sizes = len(graph), graph.users, graph.sizes
    order: list[Action] = []
    peak = 0.0
    for t in range(T):
        kept = set(np.flatnonzero(S[t + 1]).tolist()) if t + 1 < T else set()
        resident = set(np.flatnonzero(S[t]).tolist())
        computed = np.flatnonzero(R[t]).tolist()

        def release(after: int) -> None:
            for i in sorted(resident):
                if i not in kept and not any(R[t, j] for j in users[i] if j > after):
                    resident.discard(i)
                    order.append(("free", i))

        release(-1)
        for k in computed:
            order.append(("compute", k))
            resident.add(k)
            peak = max(peak, float(sum(sizes[i] for i in resident)))
            release(k)
    return tuple(order), peak


def _last_descendant(graph: TrainingGraph) -> np.ndarray:
    """``last[i]``: the largest id among ``i`` and its descendants.

    In stage ``t > last[i]`` nothing ``i`` could help compute is still ahead of the
    frontier, so ``R[t,i] = S[t,i] = 0`` loses no schedule's cost or peak.
    """
    last = np.arange(len(graph))
    for k in range(len(graph) - 1, -1, -1):
        for i in graph.deps[k]:
            last[i] = max(last[i], last[k])
    return last


def _training(graph: Graph | TrainingGraph, backward_costs) -> TrainingGraph:
    if isinstance(graph, TrainingGraph):
        if backward_costs is not None:
            raise ValueError("backward_costs only applies to a forward Graph, not a TrainingGraph.")
        return graph
    if not isinstance(graph, Graph):
        raise TypeError(f"Expected a Graph or TrainingGraph, got {type(graph).__name__}.")
    return TrainingGraph.from_graph(graph, backward_costs)


def _formulation(name: str) -> str:
    if name not in ("liveness", "checkmate"):
        raise ValueError(f"formulation must be 'liveness' or 'checkmate', got {name!r}.")
    return name


def _check_result(result: optimize.OptimizeResult, time_limit: float) -> None:
    if result.x is None:
        raise RuntimeError(
            f"HiGHS found no schedule within time_limit={time_limit:g} s (status "
            f"{result.status}: {result.message}). Raise time_limit, or use a faster solver "
            "for a graph this large."
        )


def ilp_min_peak(
    graph: Graph | TrainingGraph,
    *,
    backward_costs: Sequence[float] | np.ndarray | None = None,
    formulation: Formulation = "liveness",
    time_limit: float = 60.0,
) -> float:
    """The least budget that admits any schedule of the ILP's class.

    Solves the ILP with objective ``B`` and every memory row ``<= B`` (module docstring).
    If the time limit stops HiGHS before it proves optimality, warns and returns the best
    peak found, an upper bound.
    """
    training = _training(graph, backward_costs)
    model = _Model(training, _formulation(formulation), min_peak=True)
    result = model.solve(np.inf, time_limit, 0.0)
    _check_result(result, time_limit)
    solution = model.solution(result, np.inf)
    if not solution.optimal:
        warnings.warn(
            f"ilp_min_peak: HiGHS stopped at time_limit={time_limit:g} s before proving the "
            f"least peak; {solution.peak:.6g} is an upper bound. Raise time_limit for the exact "
            "value.",
            RuntimeWarning,
            stacklevel=2,
        )
    return solution.peak


def solve_ilp(
    graph: Graph | TrainingGraph,
    budget: float,
    *,
    backward_costs: Sequence[float] | np.ndarray | None = None,
    formulation: Formulation = "liveness",
    time_limit: float = 60.0,
    mip_gap: float = 0.0,
) -> IlpSolution:
    """The least-compute schedule of ``graph``'s training step within ``budget`` (Checkmate).

    Args:
      graph: a forward :class:`Graph` (turned into its training graph) or a
        :class:`TrainingGraph`.
      budget: memory budget, in the units of the sizes (module docstring's model).
      backward_costs: per forward vertex, the cost of its backward (default 2x forward).
      formulation: ``"liveness"`` (default, same optimum, solves 5-15x faster on chains of
        15-20 vertices) or ``"checkmate"`` (the paper's ``FREE``/``U`` linearisation);
        see the module docstring.
      time_limit: seconds HiGHS may spend; past it the best schedule found is returned
        with ``optimal=False``.
      mip_gap: relative optimality gap at which HiGHS may stop (0: prove optimality).

    Returns:
      An :class:`IlpSolution`.

    Raises:
      InfeasibleBudget: no schedule of the class fits ``budget``; ``.min_budget`` is the
        least budget that does (:func:`ilp_min_peak`).
      RuntimeError: the time limit passed before any schedule was found.
    """
    budget = float(budget)
    if not budget >= 0:
        raise ValueError(f"budget must be a non-negative number, got {budget!r}.")
    training = _training(graph, backward_costs)
    model = _Model(training, _formulation(formulation), min_peak=False)
    result = model.solve(budget, time_limit, mip_gap)
    if result.status == 2:
        least = ilp_min_peak(training, formulation=formulation, time_limit=time_limit)
        raise InfeasibleBudget(budget, least, "checkmate-ilp")
    _check_result(result, time_limit)
    return model.solution(result, budget)
