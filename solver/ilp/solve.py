"""Checkmate's integer linear program: the exact oracle for small graphs (ALGORITHMS.md s. 5).

Jain, Jain, Nrusimha, Gholami, Abbeel, Keutzer, Stoica, Gonzalez, "Checkmate: Breaking the
Memory Wall with Optimal Tensor Rematerialization", MLSys 2020, section 4 (the MILP with
frontier-advancing stages) and appendix (the linearisation of ``FREE``), solved with
``scipy.optimize.milp`` (HiGHS).

**Training graph.** :class:`~solver.ilp.training_graph.TrainingGraph` (forward vertices, then one
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

``formulation="liveness"`` (ours, the default): continuous ``L[t,i,j]`` in ``[0, 1]``
for each user ``j <= t`` of ``i``, "``i`` is still needed when ``j`` is computed in stage
``t``": ``L[t,i,j] >= R[t,j]``, ``L[t,i,j] >= L[t,i,j']`` for the next user ``j'`` of ``i``
and ``L[t,i,j] >= S[t+1,i]`` for the last one; for every ``k <= t``
``M_k R[t,k] + sum_{i<k} M_i L[t,i,k] + sum_{k<i<t} M_i S[t,i] <= budget``, where
``L[t,i,k]`` for a ``k`` that does not read ``i`` means ``L`` at the first user ``j >= k``
(``S[t+1,i]`` past the last one): "needed at ``k``" only changes at a user. (A checkpoint
with a larger index than ``k`` is held from the stage's start until its first use, which
comes after ``k``.) With integral ``R, S`` the least ``L`` is exactly the 0/1 "needed
later" indicator, so each row is the memory at the moment ``k`` is computed when values
are freed right after their last use in the stage: Checkmate's accounting. It has
``O(T^2)`` continuous variables (one per edge and stage; an earlier version had one per
``(t, i, k)``, ``O(T^3)``, with the same LP relaxation) and no ``FREE`` binaries, and its
relaxation is tighter; on chains of 15-20 forward vertices it solves 5-15x faster than
``"checkmate"``.

**Reductions.** Both formulations carry these, each of which keeps at least one optimal
schedule (and one of least peak). Each replaces a schedule by one with strictly fewer
ones in ``R`` and ``S``, no larger cost and no larger memory at any moment, so a
schedule where none applies exists among the optimal ones:

* drop a held value that the stage neither reads nor keeps, or a recomputation that it
  neither reads nor keeps (``S[t,i]``, ``R[t,i] <= sum_{users j <= t} R[t,j] + S[t+1,i]``):
  removing it never raises cost or memory;
* ``R[t,i] + S[t,i] <= 1``: a held value that the stage also recomputes is never read
  before the recomputation (its readers have larger ids, so come later in the stage):
  stop holding it (``S[t,i] = 0``; the previous stage frees it earlier);
* fix ``R[t,i] = S[t,i] = 0`` once ``t`` is past ``i`` and all its descendants (nothing
  ahead of the frontier can use ``i``).

With them the two formulations count memory identically: Checkmate's only extra charges
(a held value used by nothing in the stage; a value both held and recomputed) never occur.
The tests check the reductions against the plain model (``IlpModel(reductions=False)``),
both formulations against each other, and everything against an exhaustive enumeration
of the class on tiny graphs.

**One-slot cuts.** With a fixed budget (not in :func:`ilp_min_peak`), :meth:`IlpModel.solve
<solver.ilp.model.IlpModel.solve>` adds valid inequalities: they remove no feasible
schedule, so no optimum. For a stage ``t`` and an interval ``U = {a..m}`` of ids
(``1 <= a <= m < t``), let ``K = U - deps(t)``, ``entry(U)`` the ids of ``U`` none of whose
inputs is in ``U``, and ``room = budget - M_t - sum_{deps(t)} M_i - M_0`` (``M_0`` only if
``0`` is not an input of ``t`` and a vertex after ``t`` reads it). When ``room < 2 min_K M_i``
(one slot for ``K``)::

    sum_{i in K} S[t+1,i] <= sum_{i in U} S[t,i] + sum_{u in entry(U)} R[t,u].

*Proof.* Right after ``t`` is computed, ``t``, its inputs, every value kept for ``t + 1``
and the source (never recomputed, so held until its last reader) are resident, within
the budget (the memory row at ``k = t``): at most one value of ``K`` is kept, the left
side is at most 1. If the right side is 0, no vertex of ``U`` is held and no entry is
computed in stage ``t``; then no vertex of ``U`` is computed at all, since the first one
(smallest id) would read only vertices outside ``U`` (an input in ``U`` would be held, or
computed before it), i.e. be an entry; so nothing of ``K`` is kept
(``S[t+1,i] <= S[t,i] + R[t,i]``). *Effect.* At tight budgets the relaxation keeps small
fractions of every value it recomputes besides those it holds (the held mass doubles
from stage to stage); the cuts forbid that where one slot is free. On unit-size chains
at budget 6 they close the gap: LP bound 52 -> 62 (= optimum) for 15 vertices and
72 -> 95 for 20; proving time 2.1 s -> 0.3 s and 37 s -> 1 s.

**Window cuts.** With a fixed budget, :meth:`IlpModel.solve
<solver.ilp.model.IlpModel.solve>` also adds valid inequalities that the LP relaxation
violates (:meth:`~solver.ilp.model.IlpModel.window_cuts_for`). For stages
``1 <= s <= t`` and an interval ``U = {a..i}`` of ids (``1 <= a <= i < t``), with
``entry(U)`` as above::

    S[t,i] + R[t,i] <= sum_{u in U} S[s,u] + sum_{r=s..t} sum_{u in entry(U)} R[r,u].

*Proof.* The right side is a sum of binaries and the left side is at most 1 (``R + S <=
1``), so the row can only fail if the right side is 0: no vertex of ``U`` is held at the
start of stage ``s`` and no entry of ``U`` is computed in stages ``s..t``. Then, stage by
stage from ``s``, no vertex of ``U`` is computed (the first one of the stage, smallest id,
would find its inputs in ``U`` neither held nor computed before it in the stage, so it
would read only vertices outside ``U``, i.e. be an entry), hence none is held at the next
stage (``S[r+1,u] <= S[r,u] + R[r,u]``); so in stage ``t`` ``i`` is neither held nor
computed and the left side is 0. The row uses no memory argument and removes no schedule
that satisfies the reduced model's rows (hence no optimum; it holds for any set ``U``, the
separator tries intervals). *Separation.* Each
round solves the LP relaxation (with the one-slot cuts and the window cuts so far) and
adds, for each ``(t, i, a)`` where ``i`` is (fractionally) held or computed at ``t``, the
most violated window (the latest ``s`` among ties: the shortest window), until none is
violated by more than ``1e-4``, after 30 rounds, or once a quarter of the time limit has
passed (the separation counts against it); the LP point only chooses which valid rows to
add. *Effect.* Summing the dependency and checkpoint rows lets one fractional
computation of an entry support fractions of several values kept into later stages (it
appears once per kept value); the window cut counts it once. The root bound does not move
(70 at unit-chain20 / budget 8; the relaxation then spreads fractions of the checkpoints
held across the forward phase instead), but once the checkpoints held at the first
backward stage are fixed the relaxation with the cuts is exact or nearly (7 such sets
tried: LP 70-72.1 without, 73-75.2 with, optimum 73-77), so branch-and-bound only has to
sort out those checkpoints: 9000 nodes -> 180-450, 117 s -> 12-16 s (four HiGHS seeds),
for 600 rows and 0.4 s of separation. Elsewhere on the benchmark it adds 0.1-0.3 s
or saves up to 4 s.

*Tried, not kept* (valid, but no effect, measured on unit chains of 15 / 20 at budgets
7 / 8, two or three free slots): the same cut with ``Q >= 2`` slots (``left <= Q right``),
also over windows of up to 14 stages (values of ``U`` kept after stage ``t'`` need a held
one at ``t`` or an entry computed in ``t..t'``), separated in rounds until none is
violated, and a per-stage split of ``S[t+1]`` by the nearest held value: the LP bound
stays 51 / 70, the relaxation spreads small fractions of many checkpoints instead.
Unproven restrictions measured too: checkpoints of the backward phase held until their
last reader (same optimum, no gain), no recomputation in forward stages or of backward
vertices (3x at 15 / 7, none at 20 / 8; the latter false on DAGs), integer counting
variables for HiGHS to branch on (presolve removes them), an explicit objective row
``cost <= optimum - 1`` (proving infeasibility is as slow), HiGHS without presolve (2-3x
slower). Of HiGHS's options only ``mip_pscost_minreliable = 0`` (pseudocosts trusted at
once, less strong branching) helps: about 2x on unit chains, never slower on the
benchmark; ``scipy.optimize.milp`` passes it verbatim
(:data:`solver.ilp.model.HIGHS_OPTIONS`). Tried with the window cuts (unit-chain20 /
budget 8, 117 s before them, 12-16 s with them): the slot version of the window cut
(kept values of ``U`` after ``t`` at most ``Q`` times the right side) and one-slot cuts
lifted by other kept values (``kept(K) + kept(O) <= (Q - |O|) right + |O|``), valid and
violated, but the LP bound stays 70 and the time 16-22 s; a lazy-recomputation reduction
(a value recomputed in stage ``t`` only to be kept, whose inputs are kept too, is
recomputed in stage ``t + 1`` instead: ``R[t,i] + sum_{deps d} S[t+1,d] <= |deps(i)| +
sum_{users j <= t} R[t,j]``, valid when nothing else reads ``d`` before ``i``): 117 ->
97 s alone, nothing on top of the window cuts; the complete window family in extended
form (a continuous ``A[t,a,i]``, "some vertex of ``{a..i}`` is available in stage ``t``",
with ``A[t] <= A[t-1] + entries`` and ``A[t] <= held + entries``): 40-50 nodes instead of
150-400 on unit-chain19 / budget 8, but 4x the rows and a root so slow that it takes
40-70 s instead of 9-15 s; separating again at perturbed objectives or along dives (no
gain; which valid rows the degenerate LP yields does matter: taking the earliest instead
of the latest ``s`` among ties gave 80 s);
forbidding recomputation in forward stages (unproven; no gain); HiGHS options
``random_seed`` (times vary by up to 30 %), ``mip_heuristic_effort``, ``mip_detect_symmetry``,
``mip_lp_age_limit``, ``mip_pool_soft_limit``, ``mip_pool_age_limit``,
``mip_pscost_minreliable`` 1-8, ``objective_bound`` at the optimum (none helps). A
Dantzig-Wolfe bound with one block per stage (the LP with every valid single-stage
inequality) is still 70 at unit-chain20 / budget 8 and 43 at unit-chain13 / budget 7
(optimum 44; a block of 6 backward stages reaches 44): no single-stage cut can lift the
root bound. Also measured at unit-chain20 / budget 8 (12-18 s with the window cuts; HiGHS
spends about 4 s at the root, where a sub-MIP finds 73 and a restart fixes 36 % of the
integer columns, then about 290 nodes), none kept: fixing the number ``k`` of checkpoints
of ``1..17`` held at the first backward stage (LP 75.3 / 73 / 72 / 71 / 70 / 71 for
``k = 0..5``, optima 90 / 82 / 78 / 75 / 73 / 75; the ``k = 1, 2`` pieces take over 60 s
each, ``k = 4`` 16 s), so an outer search over ``k`` or over that checkpoint set (413 LP
nodes, 50 s, to enumerate the sets whose LP is below 73) does not pay; probing each of
those checkpoints at 0 and at 1 (LP 70-71.5 either way: no fixing); splitting on one of
them (``S[20,15]``: 12 + 15 s, ``S[20,12]``: 13 + 8 s, ``S[20,16]``: 16 + 31 s: both
halves as hard as the whole, since many schedules of cost 73 exist); window cuts
separated again in the pieces ``k = 0..6`` (they lift those pieces' LP to 87 / 78 / 73.1,
but the root stays 70 and the full solve takes 22 s); column orders (S first, stages
descending, reversed: 12-19 s) and the HiGHS options ``mip_heuristic_run_rins``,
``_rens``, ``_root_reduced_cost``, ``_feasibility_jump``, ``mip_heuristic_effort = 0``,
``mip_pool_soft_limit = 500``, ``mip_lp_age_limit = 2`` (12-18 s, within the noise).

``backward_recompute=False`` additionally fixes ``R[t,b] = 0`` for every backward vertex
``b`` and ``t > b``: a subclass (a gradient computed once), the one the chain simulator can
replay (:mod:`solver.ilp.chain_adapter`, ``solve(method="ilp")``). It never changed the optimum on
75 random chains of 3-7 vertices we tried; on small DAGs recomputing a gradient
sometimes helps (found on 5 of 75 random DAGs).

**Speed** (``benchmarks/ilp_speed.py``, CPU seconds on a shared 2-core machine, HiGHS
1.12 through scipy 1.17). The compact liveness variables (4x fewer columns on a
39-vertex training graph) and ``R + S <= 1`` give about 1-2x, not more: the LP
relaxation itself is the bottleneck. Random chains of 10-20 forward vertices (19-39
training vertices), residual and diamond DAGs of 13-19 forward vertices and unit-size
chains of 15 and 20 prove optimal in 0.1-4 s at every budget of the benchmark but one:
unit-chain20 at budget 8 (1.6x the least peak, three free slots), where the relaxation
recomputes "half" a value and holds the other half, stage after stage (a geometric
series; LP bound 70, optimum 73): about 2 minutes without the window cuts, 12-16 s with
them. Random chains of 30 and 40 forward vertices (59 and 79 training vertices) prove
optimal at every budget of the benchmark (``--chains 30 40``) in 0.7-29 s with the window
cuts; without them the least two budgets of each hit 60 s.

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

**Differences from the chain simulator** (:mod:`solver.chain.simulator`, Rotor's model):
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
from scipy import optimize

from ..errors import InfeasibleBudget, check_real
from ..graph.graph import Graph
from .model import IlpModel
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


def _solution(model: IlpModel, result: optimize.OptimizeResult, budget: float) -> IlpSolution:
    """The :class:`IlpSolution` of a HiGHS result (peak recomputed from the program order)."""
    R, S = model.decisions(result)
    order, peak = _program_order(model.graph, R, S)
    gap = getattr(result, "mip_gap", None)
    return IlpSolution(
        objective=float(model.graph.costs @ R.sum(axis=0)), R=R, S=S, order=order,
        peak=peak, budget=float(budget), optimal=result.status == 0,
        gap=float(gap) if gap is not None else float("nan"), graph=model.graph,
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


def _check_time_limit(time_limit: object) -> float:
    return check_real(time_limit, "time_limit",
                      hint="Pass the seconds HiGHS may spend (default 60).")


def ilp_min_peak(
    graph: Graph | TrainingGraph,
    *,
    backward_costs: Sequence[float] | np.ndarray | None = None,
    formulation: Formulation = "liveness",
    time_limit: float = 60.0,
    backward_recompute: bool = True,
) -> float:
    """The least budget that admits any schedule of the ILP's class.

    Solves the ILP with objective ``B`` and every memory row ``<= B`` (module docstring).
    If the time limit stops HiGHS before it proves optimality, warns and returns the best
    peak found, an upper bound.
    """
    time_limit = _check_time_limit(time_limit)
    training = _training(graph, backward_costs)
    model = IlpModel(training, _formulation(formulation), min_peak=True,
                     backward_recompute=backward_recompute)
    result = model.solve(np.inf, time_limit, 0.0)
    _check_result(result, time_limit)
    solution = _solution(model, result, np.inf)
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
    backward_recompute: bool = True,
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
      time_limit: seconds the window-cut separation and HiGHS may spend together; past
        it the best schedule found is returned with ``optimal=False``.
      mip_gap: relative optimality gap at which HiGHS may stop (0: prove optimality).
      backward_recompute: ``False`` computes every backward vertex exactly once (no
        gradient recomputation): the class the chain simulator can replay
        (:mod:`solver.ilp.chain_adapter`).

    Returns:
      An :class:`IlpSolution`.

    Raises:
      InfeasibleBudget: no schedule of the class fits ``budget``; ``.min_budget`` is the
        least budget that does (:func:`ilp_min_peak`).
      RuntimeError: the time limit passed before any schedule was found.
    """
    budget = check_real(budget, "budget", finite=False,
                        hint="Pass the memory available, in the units of the sizes.")
    time_limit = _check_time_limit(time_limit)
    mip_gap = check_real(mip_gap, "mip_gap", below=1.0,
                         hint="Pass a relative gap such as 0.01 (0: prove optimality).")
    training = _training(graph, backward_costs)
    model = IlpModel(training, _formulation(formulation), min_peak=False,
                     backward_recompute=backward_recompute)
    result = model.solve(budget, time_limit, mip_gap)
    if result.status == 2:
        least = ilp_min_peak(training, formulation=formulation, time_limit=time_limit,
                             backward_recompute=backward_recompute)
        raise InfeasibleBudget(budget, least, "checkmate-ilp")
    _check_result(result, time_limit)
    return _solution(model, result, budget)
