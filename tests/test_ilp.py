"""Checkmate's ILP (solver/ilp/solve.py) against an exhaustive search and hand-worked answers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, sparse

from solver import Chain, InfeasibleBudget
from solver.graph.graph import Graph
from solver import IlpSolution, TrainingGraph, ilp_min_peak, solve_ilp
from solver.ilp.model import IlpModel
from solver.chain.rotor import RotorTable, rotor_min_budget

from tiers import sweep


# --------------------------------------------------------------------------- checkers
def replay(graph: TrainingGraph, order) -> tuple[float, float]:
    """Independent check of a program order: ``(total cost, peak)``.

    Every computation needs all its dependencies resident; a free needs the value
    resident; memory is the sum of resident sizes right after each computation; the
    source is computed exactly once; every vertex is computed at least once.
    """
    resident: set[int] = set()
    computed = [0] * len(graph)
    cost = peak = 0.0
    for action, v in order:
        if action == "compute":
            missing = [i for i in graph.deps[v] if i not in resident]
            assert not missing, f"computing {graph.names[v]} without {missing}"
            resident.add(v)
            computed[v] += 1
            cost += graph.costs[v]
            peak = max(peak, sum(graph.sizes[i] for i in resident))
        else:
            assert action == "free" and v in resident, f"freeing {v} which is not resident"
            resident.discard(v)
    assert all(count >= 1 for count in computed), "some vertex is never computed"
    assert computed[0] == 1, "the input is given once"
    return cost, peak


def check_solution(solution: IlpSolution, budget: float) -> None:
    cost, peak = replay(solution.graph, solution.order)
    assert cost == pytest.approx(solution.objective)
    assert peak == pytest.approx(solution.peak)
    assert peak <= budget + 1e-9


def exhaustive(graph: TrainingGraph) -> list[tuple[float, float]]:
    """Pareto front ``(peak, cost)`` of every schedule in the ILP's class, by enumeration.

    The class: stage ``t`` starts with a held set ``S`` (subset of ``0..t-1``), computes a
    set ``R`` containing ``t`` (and never the source after stage 0) in index order with
    every dependency held or computed earlier in the stage, and keeps any subset of what it
    held or computed for the next stage. Values are freed right after their last use in
    the stage unless kept. A dynamic program over stages keeps, for each held set, the
    Pareto front of (peak so far, cost so far). No reduction of the ILP is assumed.
    """
    T = len(graph)
    deps_mask = [sum(1 << i for i in deps) for deps in graph.deps]
    size_of = [sum(graph.sizes[i] for i in range(T) if m >> i & 1) for m in range(1 << T)]
    fronts: dict[int, list[tuple[float, float]]] = {0: [(0.0, 0.0)]}
    for t in range(T):
        optional = list(range(1, t)) if t > 0 else []
        nxt: dict[int, list[tuple[float, float]]] = {}
        for held, front in fronts.items():
            for r in range(len(optional) + 1):
                for extra in itertools.combinations(optional, r):
                    computed = sorted(extra) + [t]
                    avail, ok = held, True
                    for k in computed:
                        if deps_mask[k] & ~avail:
                            ok = False
                            break
                        avail |= 1 << k
                    if not ok:
                        continue
                    # needed_after[p]: deps of the computations after position p.
                    needed_after = [0] * (len(computed) + 1)
                    for p in range(len(computed) - 1, -1, -1):
                        needed_after[p] = needed_after[p + 1] | deps_mask[computed[p]]
                    cost = float(sum(graph.costs[k] for k in computed))
                    keepable = avail if t + 1 < T else 0
                    sub = keepable
                    while True:  # every subset of what can be kept
                        keep = sub
                        resident = held & (needed_after[0] | keep)
                        peak = 0.0
                        for p, k in enumerate(computed):
                            resident |= 1 << k
                            peak = max(peak, size_of[resident])
                            resident &= needed_after[p + 1] | keep
                        for old_peak, old_cost in front:
                            nxt.setdefault(keep, []).append((max(old_peak, peak), old_cost + cost))
                        if sub == 0:
                            break
                        sub = (sub - 1) & keepable
        fronts = {state: _pareto(points) for state, points in nxt.items()}
    return _pareto([p for points in fronts.values() for p in points])


def _pareto(points):
    out, best_cost = [], np.inf
    for peak, cost in sorted(points):
        if cost < best_cost - 1e-12:
            out.append((peak, cost))
            best_cost = cost
    return out


# --------------------------------------------------------------------------- graphs
def chain_graph(sizes, costs=None) -> Graph:
    return Graph.chain(sizes, costs)


def diamond(sizes) -> Graph:
    return Graph.from_edges([(0, 1), (0, 2), (1, 3), (2, 3)], sizes)


def skip(sizes) -> Graph:
    return Graph.from_edges([(0, 1), (1, 2), (2, 3), (0, 2)], sizes)


def tiny_graphs():
    rng = np.random.default_rng(0)
    cases = []
    for n in (2, 3, 4):
        for _ in range(2):
            sizes = rng.integers(1, 5, n).tolist()
            costs = [0] + rng.integers(1, 4, n - 1).tolist()
            cases.append((f"chain{n}-{sizes}", chain_graph(sizes, costs)))
    cases.append(("chain4-ones", chain_graph([1, 1, 1, 1])))
    for build in (diamond, skip):
        for _ in range(2):
            cases.append((f"{build.__name__}-", build(rng.integers(1, 5, 4).tolist())))
    return cases


TINY = tiny_graphs()


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name, graph", TINY, ids=[c[0] for c in TINY])
def test_matches_exhaustive_search(name, graph):
    training = TrainingGraph.from_graph(graph)
    front = exhaustive(training)
    least_peak = front[0][0]
    assert ilp_min_peak(graph) == pytest.approx(least_peak)
    budgets = sorted({least_peak, least_peak + 1, least_peak + 2, float(training.sizes.sum())})
    for budget in budgets:
        expected = min(cost for peak, cost in front if peak <= budget + 1e-9)
        solution = solve_ilp(graph, budget)
        assert solution.optimal
        assert solution.objective == pytest.approx(expected), budget
        check_solution(solution, budget)
    with pytest.raises(InfeasibleBudget) as info:
        solve_ilp(graph, least_peak - 0.5)
    assert info.value.min_budget == pytest.approx(least_peak)


def test_hand_worked_chain_of_five_unit_tensors():
    # x0..x4 (unit sizes, cost 1, source free), backward costs 2: no recomputation costs
    # 4 + 8 = 12. Storing everything peaks at 6 (x0..x4 + the first gradient). The input
    # is never recomputed and the first backward needs x3, x4 and its output, so 4 + one
    # more held value: holding x2 and recomputing x1 once for the last-but-one backward
    # fits in 5 at cost 13. Nothing fits in less than 5.
    graph = chain_graph([1, 1, 1, 1, 1])
    assert ilp_min_peak(graph) == 5.0
    assert solve_ilp(graph, 6).objective == 12.0
    at_five = solve_ilp(graph, 5)
    assert at_five.objective == 13.0 and at_five.recompute == 1.0
    check_solution(at_five, 5)
    with pytest.raises(InfeasibleBudget, match="smallest budget that works is 5"):
        solve_ilp(graph, 4.9)


def test_training_graph_structure():
    training = TrainingGraph.from_graph(diamond([1, 2, 3, 4]))
    names = training.names
    assert names[:4] == (("fwd", 0), ("fwd", 1), ("fwd", 2), ("fwd", 3))
    b3, b2, b1 = (names.index(("bwd", v)) for v in (3, 2, 1))
    assert training.deps[b3] == (1, 2, 3)  # inputs 1, 2 and the output 3; no seed gradient
    assert training.sizes[b3] == 2 + 3  # gradients of both inputs
    assert set(training.deps[b1]) == {0, 1, b3}  # input 0, itself, gradient from 3's backward
    assert training.sizes[b1] == 1
    assert training.costs[b3] == 2.0  # default backward cost: twice the forward


@pytest.mark.parametrize("seed", range(3))
def test_formulations_agree(seed):
    rng = np.random.default_rng(seed)
    graphs = [
        chain_graph(rng.integers(1, 6, 7).tolist(), [0] + rng.integers(1, 4, 6).tolist()),
        Graph.from_edges(
            [(0, 1), (1, 2), (2, 3), (1, 3), (3, 4), (0, 4)], rng.integers(1, 6, 5).tolist()
        ),
    ]
    for graph in graphs:
        liveness = ilp_min_peak(graph, formulation="liveness")
        assert ilp_min_peak(graph, formulation="checkmate") == pytest.approx(liveness)
        for budget in (liveness, liveness + 2):
            a = solve_ilp(graph, budget, formulation="liveness")
            b = solve_ilp(graph, budget, formulation="checkmate")
            assert a.objective == pytest.approx(b.objective)
            check_solution(a, budget)
            check_solution(b, budget)


def residual(blocks: int, sizes) -> Graph:
    """``x0 -> a1 -> x1 -> a2 -> x2 ...`` with skip edges ``x_{b-1} -> x_b``."""
    edges = []
    for b in range(1, blocks + 1):
        edges += [(f"x{b - 1}", f"a{b}"), (f"a{b}", f"x{b}"), (f"x{b - 1}", f"x{b}")]
    names = ["x0"] + [n for b in range(1, blocks + 1) for n in (f"a{b}", f"x{b}")]
    return Graph.from_edges(edges, dict(zip(names, sizes)))


@pytest.mark.slow  # large instances for the ILP
@pytest.mark.parametrize("seed", range(2))
def test_tight_budgets_on_medium_graphs(seed):
    # Long backward stages with checkpoints held across recomputations: the returned
    # order must stay within the budget when replayed, and both formulations agree.
    rng = np.random.default_rng(10 + seed)
    graphs = [
        chain_graph(rng.integers(1, 5, 11).tolist()),
        residual(4, rng.integers(1, 5, 9).tolist()),
    ]
    for graph in graphs:
        least = ilp_min_peak(graph)
        for budget in (least, least + 1):
            a = solve_ilp(graph, budget, formulation="liveness")
            b = solve_ilp(graph, budget, formulation="checkmate")
            check_solution(a, budget)
            check_solution(b, budget)
            assert a.objective == pytest.approx(b.objective)


@pytest.mark.parametrize("seed", range(4))
def test_lower_bound_on_rotor_for_tapeless_chains(seed):
    # With xbar_size == x_size[1:] and no temporaries, every Rotor schedule is in the
    # ILP's class with the same time and no more memory.
    rng = np.random.default_rng(100 + seed)
    length = int(rng.integers(2, 5))
    x = rng.integers(1, 5, length + 1).astype(float)
    chain = Chain(
        fwd_time=rng.integers(1, 4, length), bwd_time=rng.integers(1, 5, length),
        x_size=x, xbar_size=x[1:],
    )
    training = TrainingGraph.from_chain(chain)
    rotor_least = rotor_min_budget(chain)
    assert ilp_min_peak(training) <= rotor_least + 1e-9
    for budget in (rotor_least, rotor_least + 1, rotor_least + 3):
        rotor = RotorTable(chain, max_budget=budget, slots=int(budget) + 1).schedule(budget)
        solution = solve_ilp(training, budget)
        check_solution(solution, budget)
        assert solution.objective <= rotor.time + 1e-9


def test_chain_training_graph_matches_rotor_costs():
    chain = Chain(fwd_time=[1, 2], bwd_time=[3, 4], x_size=[5, 6, 7], xbar_size=[6, 7])
    training = TrainingGraph.from_chain(chain)
    assert [n for _, n in training.names] == ["x0", "x1", "x2", "loss", "loss", "x2", "x1"]
    assert list(training.costs) == [0, 1, 2, 0, 0, 4, 3]
    # Backward of the loss outputs g[2] (size of x2); then g[1], g[0].
    assert list(training.sizes[4:]) == [7, 6, 5]
    # With an unlimited budget nothing is recomputed: the cost is the chain's total time.
    solution = solve_ilp(training, 1e9)
    assert solution.objective == 10.0 and solution.recompute == 0.0


def test_errors():
    graph = chain_graph([1, 1, 1])
    with pytest.raises(ValueError, match="formulation"):
        solve_ilp(graph, 10, formulation="gurobi")
    with pytest.raises(ValueError, match="budget"):
        solve_ilp(graph, float("nan"))
    with pytest.raises(ValueError, match="backward_costs"):
        solve_ilp(graph, 10, backward_costs=[1.0])
    with pytest.raises(TypeError, match="Graph or TrainingGraph"):
        solve_ilp([1, 2, 3], 10)


def _solve_model(graph: Graph, budget: float, **kwargs) -> float:
    """The optimal objective of an :class:`IlpModel` built with ``kwargs``."""
    model = IlpModel(TrainingGraph.from_graph(graph), "liveness", min_peak=False, **kwargs)
    result = model.solve(budget, 60.0, 0.0)
    assert result.status == 0
    return float(result.fun)


@pytest.mark.parametrize("seed", range(2))
def test_reductions_keep_the_optimum(seed):
    # The plain model (no usefulness cuts, no R + S <= 1, no dead-value fixing) has the
    # same optimum: the reductions only remove schedules that another one dominates.
    rng = np.random.default_rng(20 + seed)
    graphs = [
        chain_graph(rng.integers(1, 5, 7).tolist(), [0] + rng.integers(1, 4, 6).tolist()),
        residual(3, rng.integers(1, 5, 7).tolist()),
    ]
    for graph in graphs:
        least = ilp_min_peak(graph)
        for budget in (least, least + 1, least + 3):
            reduced = _solve_model(graph, budget)
            assert _solve_model(graph, budget, reductions=False) == pytest.approx(reduced)
            assert solve_ilp(graph, budget).objective == pytest.approx(reduced)


@pytest.mark.parametrize("name, graph", TINY[:6], ids=[c[0] for c in TINY[:6]])
def test_without_backward_recomputation_is_a_restriction(name, graph):
    # Computing every backward vertex once is a subclass: never cheaper, never a lower
    # least peak; on chains the tests of solve(method="ilp") check it against Rotor.
    least = ilp_min_peak(graph)
    assert ilp_min_peak(graph, backward_recompute=False) >= least - 1e-9
    once = solve_ilp(graph, least + 2, backward_recompute=False)
    check_solution(once, least + 2)
    assert once.objective >= solve_ilp(graph, least + 2).objective - 1e-9
    backward = range(once.graph.num_forward, len(once.graph))
    assert all(once.R[:, b].sum() == 1 for b in backward)


def test_byte_sized_problems_are_scaled():
    # Sizes in the hundreds of megabytes: the rows are scaled, the answer is unchanged.
    small = chain_graph([3, 1, 2, 4, 1])
    big = chain_graph([3e8, 1e8, 2e8, 4e8, 1e8])
    assert ilp_min_peak(big) == pytest.approx(1e8 * ilp_min_peak(small))
    budget = ilp_min_peak(small) + 1
    assert solve_ilp(big, 1e8 * budget).objective == solve_ilp(small, budget).objective


# --------------------------------------------------------------------------- one-slot cuts
def _optimum(training: TrainingGraph, budget: float, **kwargs) -> float | None:
    """The optimal objective of an :class:`IlpModel` (``None``: infeasible budget)."""
    model = IlpModel(training, "liveness", min_peak=False, **kwargs)
    result = model.solve(budget, 60.0, 0.0)
    assert result.status in (0, 2), result.message
    return None if result.status == 2 else float(result.fun)


def _check_slot_cuts(graph: Graph) -> int:
    """Every budget from the least peak to no remat: the one-slot cuts keep the optimum.

    The reference is the plain model (``reductions=False``: no reduction, no cut); the
    reduced model without cuts is checked too. Returns how many cut rows were built.
    """
    training = TrainingGraph.from_graph(graph)
    least = ilp_min_peak(training)
    top = float(training.sizes.sum())
    budgets = sorted({least - 0.5, *np.arange(least, top + 0.5, 0.5).tolist()})
    rows = 0
    for budget in budgets:
        rows += IlpModel(training, "liveness", min_peak=False).slot_cuts_for(budget).shape[0]
        plain = _optimum(training, budget, reductions=False)
        with_cuts = _optimum(training, budget)
        assert with_cuts == pytest.approx(plain), (graph.sizes, graph.costs, budget)
        assert _optimum(training, budget, slot_cuts=False) == pytest.approx(plain)
    return rows


SLOT_GRAPHS = [
    # Found by random search: a cut without the entry term, or one that assumes a single
    # free slot where there are two, changes this chain's optimum at budgets 10-11.
    chain_graph([3, 1, 1, 1, 2, 3], [0, 3, 1, 2, 2, 3]),
    chain_graph([1] * 7),
    chain_graph([1, 2, 1, 2, 1, 2, 1]),
    residual(2, [1, 2, 1, 3, 1]),
    diamond([2, 1, 3, 1]),
]


@pytest.mark.parametrize("index", range(len(SLOT_GRAPHS)))
def test_slot_cuts_keep_the_optimum(index):
    assert _check_slot_cuts(SLOT_GRAPHS[index]) > 0  # the cuts are actually built


@st.composite
def small_graphs(draw) -> Graph:
    """Chains of 3-6 vertices, with up to two skip edges, sizes 1-3 and costs 0-3."""
    n = draw(st.integers(3, 6))
    sizes = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    costs = [0] + draw(st.lists(st.integers(0, 3), min_size=n - 1, max_size=n - 1))
    edges = {(i, i + 1) for i in range(n - 1)}
    for _ in range(draw(st.integers(0, 2))):
        a = draw(st.integers(0, n - 3))
        edges.add((a, draw(st.integers(a + 2, n - 1))))
    return Graph.from_edges(sorted(edges), sizes, costs)


@sweep(20, quick=5)
@given(small_graphs())
def test_slot_cuts_keep_the_optimum_on_random_graphs(graph):
    _check_slot_cuts(graph)


def test_slot_cuts_close_the_gap_on_a_unit_chain():
    # The relaxation of a unit chain at its tightest budgets keeps fractions of every
    # value it recomputes; with one free slot the cuts lift the LP bound to the optimum.
    training = TrainingGraph.from_graph(chain_graph([1] * 10))
    model = IlpModel(training, "liveness", min_peak=False)
    cuts = model.slot_cuts_for(6.0)
    assert cuts.shape[0] > 0
    assert IlpModel(training, "liveness", min_peak=True).slot_cuts_for(6.0).shape[0] == 0

    def relaxation(matrix) -> float:
        upper = np.asarray(model.upper, dtype=float)
        upper[model.memory_rows] = 6.0 / model.scale
        lower = np.asarray(model.lower, dtype=float)
        lower = np.concatenate([lower, np.full(matrix.shape[0] - len(lower), -np.inf)])
        upper = np.concatenate([upper, np.zeros(matrix.shape[0] - len(upper))])
        bounds = optimize.Bounds(model.var_lower, model.var_upper)
        constraints = optimize.LinearConstraint(matrix, lower, upper)
        return float(optimize.milp(model.objective, bounds=bounds, constraints=constraints).fun)

    assert relaxation(model.matrix) < 33.0
    assert relaxation(sparse.vstack([model.matrix, cuts], format="csr")) == pytest.approx(34.0)
    assert solve_ilp(training, 6.0).objective == 34.0


# --------------------------------------------------------------------------- window cuts
def _rows(matrix: sparse.csr_array):
    for k in range(matrix.shape[0]):
        span = slice(matrix.indptr[k], matrix.indptr[k + 1])
        yield matrix.indices[span], matrix.data[span]


def _largest_left_side(model: IlpModel, budget: float, columns, values) -> float:
    """The largest value of ``sum values * x[columns]`` over the model's integer points."""
    objective = np.zeros(len(model.index))
    objective[columns] = -values
    matrix, lower, upper = model._bounded_rows(budget, model.slot_cuts_for(budget))
    result = optimize.milp(
        objective, integrality=model.integrality,
        bounds=optimize.Bounds(model.var_lower, model.var_upper),
        constraints=optimize.LinearConstraint(matrix, lower, upper),
    )
    assert result.status == 0, result.message
    return -float(result.fun)


def _check_window_rows_are_valid(graph: Graph, seed: int, count: int = 12) -> int:
    """Window-cut rows built at random points hold at every schedule of the reduced model.

    The separator is run on random points of the unit cube (so that it builds many rows,
    over every window and interval); each row's left side is maximised over the integer
    points of the model without window cuts at the no-remat budget (the largest feasible
    set: the rows do not depend on the budget). Returns how many rows were checked.
    """
    training = TrainingGraph.from_graph(graph)
    model = IlpModel(training, "liveness", min_peak=False, window_cuts=False)
    budget = float(training.sizes.sum())
    rng = np.random.default_rng(seed)
    rows = list(_rows(model._violated_windows(rng.random(len(model.index)))))
    checked = 0
    for index in rng.permutation(len(rows))[:count]:
        columns, values = rows[index]
        assert _largest_left_side(model, budget, columns, values) <= 1e-9
        checked += 1
    return checked


WINDOW_GRAPHS = [
    chain_graph([1] * 5),
    chain_graph([3, 1, 1, 1, 2, 3], [0, 3, 1, 2, 2, 3]),
    residual(2, [1, 2, 1, 3, 1]),
    diamond([2, 1, 3, 1]),
    skip([1, 2, 1, 2]),
]


@pytest.mark.parametrize("index", range(len(WINDOW_GRAPHS)))
def test_window_rows_hold_at_every_schedule(index):
    assert _check_window_rows_are_valid(WINDOW_GRAPHS[index], seed=index) > 0


@settings(max_examples=15, deadline=None)
@given(small_graphs(), st.integers(0, 2**16))
def test_window_rows_hold_on_random_graphs(graph, seed):
    _check_window_rows_are_valid(graph, seed, count=6)


@pytest.mark.parametrize("length, budget", [(10, 7.0), (11, 8.0), (12, 7.0)])
def test_window_cuts_keep_the_optimum_on_unit_chains(length, budget):
    # Unit chains at tight budgets are where the LP relaxation violates window cuts: they
    # are built, the optimal schedule found without them satisfies every one, and the
    # optimum is that of the model without them and of the plain model.
    training = TrainingGraph.from_graph(chain_graph([1] * length))
    model = IlpModel(training, "liveness", min_peak=False)
    cuts = model.window_cuts_for(budget)
    assert cuts.shape[0] > 0
    without = IlpModel(training, "liveness", min_peak=False, window_cuts=False)
    assert without.window_cuts_for(budget).shape[0] == 0
    result = without.solve(budget, 60.0, 0.0)
    assert result.status == 0
    assert np.all(cuts @ result.x <= 1e-9)
    assert _optimum(training, budget) == pytest.approx(result.fun)
    assert _optimum(training, budget, reductions=False) == pytest.approx(result.fun)


@sweep(15, quick=4)
@given(small_graphs())
def test_window_cuts_keep_the_optimum_on_random_graphs(graph):
    training = TrainingGraph.from_graph(graph)
    least = ilp_min_peak(training)
    for budget in (least, least + 1.0, least + 2.0):
        with_cuts = _optimum(training, budget)
        assert with_cuts == pytest.approx(_optimum(training, budget, window_cuts=False))
        assert with_cuts == pytest.approx(_optimum(training, budget, reductions=False))


def test_window_cuts_only_with_a_budget():
    training = TrainingGraph.from_graph(chain_graph([1] * 10))
    assert IlpModel(training, "liveness", min_peak=True).window_cuts_for(7.0).shape[0] == 0
    model = IlpModel(training, "liveness", min_peak=False)
    assert model.window_cuts_for(np.inf).shape[0] == 0
    plain = IlpModel(training, "liveness", min_peak=False, reductions=False)
    assert plain.window_cuts_for(7.0).shape[0] == 0
