"""Checkmate's ILP (solver/ilp/solve.py) against an exhaustive search and hand-worked answers."""

from __future__ import annotations

import numpy as np
import pytest

from solver import Chain, InfeasibleBudget, TrainingGraph, ilp_min_peak, solve_ilp
from solver.graph.graph import Graph
from solver.ilp.model import IlpModel
from solver.chain.rotor import RotorTable, rotor_min_budget

from ilp_cases import TINY, chain_graph, check_solution, diamond, exhaustive, residual


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
