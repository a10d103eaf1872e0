"""The ILP's cuts (solver/ilp/): one-slot and window rows hold at every schedule and keep the
optimum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, sparse

from solver import TrainingGraph, ilp_min_peak, solve_ilp
from solver.graph.graph import Graph
from solver.ilp.model import IlpModel

from tiers import sweep
from ilp_cases import chain_graph, diamond, residual, skip


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
