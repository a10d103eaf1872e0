"""checkpoint_search with a budget (least recompute against brute force, time limits, lower
bounds), fractional sizes and large complex divisions.

Feng & Huang's model (solver.graph.model); the graphs and the brute force are test_acg's.
"""

import itertools
import time
import warnings
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from solver import Graph, InfeasibleBudget, checkpoint_search, simulate_graph
from solver.graph import search as acg
from solver.graph.bounds import Lagrangian
from solver.graph.dp import COMPLEX_LIMIT, TimeLimit, evaluate
from solver.graph.simulator import schedule_graph

from test_acg import BLOCKS, _Builder, _check_result, brute_all, family_graphs
from tiers import sweep


# --------------------------------------------------------------------------- budgets
def _check_budget(graph, where):
    table = brute_all(graph)
    least = min(mem for _, mem, _ in table)
    budget = least + where * (float(graph.sizes[1:-1].sum()) - least)
    result = checkpoint_search(graph, budget=budget)
    mem, rc = _check_result(graph, result)
    assert mem <= budget + 1e-9
    assert rc == pytest.approx(min(r for _, m, r in table if m <= budget + 1e-9))
    assert result.recompute_lower_bound == result.recompute  # proven optimal


@sweep(50, quick=12)
@given(family_graphs(), st.floats(0.0, 1.0))
def test_budget_least_recompute_equals_brute_force(graph, where):
    _check_budget(graph, where)


@sweep(12, quick=3)
@given(st.data())
def test_budget_every_family_is_covered(data):
    # The Lagrangian bounds prune along the top-level division: each family on its own,
    # inception modules (branch divisions under it) and dense blocks (complex) included.
    for family in BLOCKS:
        _check_budget(data.draw(family_graphs(family)), data.draw(st.floats(0.0, 1.0)))


@sweep(15, quick=4)
@given(family_graphs(), st.floats(0.0, 1.0), st.integers(1, 4), st.sampled_from([8, 1000]))
def test_budget_one_ratio_subset_sum_equals_brute_force(graph, where, ratio, front_limit):
    # Every vertex costs the same per byte (Inception-v3's ReLUs at a large budget): the
    # least recompute is a subset sum over sizes, and every partial set has the same
    # Lagrangian bound. With front_limit=8 many evaluations are abandoned (split
    # intervals, smaller cap steps): the answer must not change.
    names = graph.names
    g = Graph.from_edges([(names[a], names[b]) for a, b in graph.edges.tolist()],
                         dict(zip(names, graph.sizes.tolist())),
                         dict(zip(names, (ratio * graph.sizes).tolist())))
    with mock.patch.object(acg, "FRONT_LIMIT", front_limit):
        _check_budget(g, where)


@settings(max_examples=10, deadline=None)
@given(family_graphs(), st.floats(0.0, 1.0), st.sampled_from([8, 32]))
def test_budget_abandoned_evaluations_stay_exact(graph, where, front_limit):
    # FRONT_LIMIT only decides when an evaluation is given up for narrower intervals or a
    # smaller cap step; tiny limits exercise those paths against brute force.
    with mock.patch.object(acg, "FRONT_LIMIT", front_limit):
        _check_budget(graph, where)


@sweep(15, quick=4)
@given(family_graphs(), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_budget_fractional_sizes(graph, where, seed):
    sizes = np.random.default_rng(seed).uniform(0.1, 5.0, len(graph))
    names = graph.names
    g = Graph.from_edges([(names[a], names[b]) for a, b in graph.edges.tolist()],
                         dict(zip(names, sizes.tolist())), dict(zip(names, graph.costs.tolist())))
    _check_budget(g, where)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30)), min_size=1, max_size=8),
       st.integers(0, 60), st.integers(0, 200), st.integers(0, 150))
def test_lagrangian_bound_never_drops_a_completable_set(items, used, room, limit):
    # The rest is a set of free vertices (kept: its bytes, recomputed: its cost); a partial
    # set with `used` bytes and recompute 0 must be kept whenever some completion fits the
    # room with recompute under the limit.
    sizes = np.array([0.0] + [s for s, _ in items] + [0.0])
    costs = np.array([0.0] + [c for _, c in items] + [0.0])
    lag = Lagrangian.for_graph(sizes, costs)
    rest = sum(lag.of_vertex(s, c) for s, c in items)
    best = min(
        (sum(c for (s, c), k in zip(items, keep) if not k)
         for keep in itertools.product([0, 1], repeat=len(items))
         if used + sum(s for (s, _), k in zip(items, keep) if k) <= room),
        default=np.inf)
    kept = lag.keep(np.array([float(used)]), np.array([0.0]), rest, float(room), float(limit))
    if best < limit:
        assert kept[0]


@sweep(20, quick=5)
@given(family_graphs())
def test_budget_below_optimum_is_infeasible(graph):
    least = checkpoint_search(graph).peak
    if least >= 1:  # integer sizes: the optimum is at least 1 unless nothing is inner
        with pytest.raises(InfeasibleBudget) as info:
            checkpoint_search(graph, budget=least - 0.5)
        assert info.value.min_budget == pytest.approx(least)
    # at the optimum itself the budgeted search succeeds
    assert checkpoint_search(graph, budget=least).peak <= least + 1e-9


def test_time_limit_returns_a_fitting_set():
    rng = np.random.default_rng(1)
    g = Graph.chain(rng.integers(1, 100, 30).tolist(), rng.integers(1, 10, 30).tolist())
    least = checkpoint_search(g).peak
    budget = least + 0.3 * (g.sizes[1:-1].sum() - least)
    with pytest.warns(RuntimeWarning, match=r"time limit ran out.*within [0-9.e+-]+% of the least"):
        quick = checkpoint_search(g, budget=budget, time_limit=0.0)
    assert quick.peak <= budget
    exact = checkpoint_search(g, budget=budget)
    assert exact.recompute <= quick.recompute
    assert 0 <= quick.recompute_lower_bound <= exact.recompute
    assert exact.recompute_lower_bound == exact.recompute
    assert checkpoint_search(g).recompute_lower_bound is None  # no budget: not a recompute search


def _slow_prune(monkeypatch, seconds):
    """Make every front pruning of the search take ``seconds`` longer (a loaded machine)."""
    from solver.graph import fronts
    original = fronts._prune_once

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return original(*args, **kwargs)
    monkeypatch.setattr(fronts, "_prune_once", slow)


def test_work_limit_is_deterministic(monkeypatch):
    # The work limit counts candidates, not seconds: a slower machine stops at the same
    # point and returns the same set (a time limit would not), which fits and is bounded.
    rng = np.random.default_rng(1)
    g = Graph.chain(rng.integers(1, 100, 30).tolist(), rng.integers(1, 10, 30).tolist())
    least = checkpoint_search(g).peak
    budget = least + 0.3 * (g.sizes[1:-1].sum() - least)
    exact = checkpoint_search(g, budget=budget)
    with pytest.warns(RuntimeWarning, match=r"work limit"):
        quick = checkpoint_search(g, budget=budget, work_limit=300)
    assert quick.recompute > exact.recompute  # the limit did cut the search short
    assert quick.peak <= budget and 0 <= quick.recompute_lower_bound <= exact.recompute
    _slow_prune(monkeypatch, 2e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        loaded = checkpoint_search(g, budget=budget, work_limit=300)
    assert loaded == quick
    with pytest.raises(ValueError, match="work_limit"):
        checkpoint_search(g, work_limit=10)  # the least-memory search has no limit


class _StopAfter:
    """Stands in for solver.graph.search.evaluate: the budgeted search's evaluation number ``calls``
    raises TimeLimit, as a deadline passing inside it would (deterministic, unlike a clock)."""

    def __init__(self, calls):
        self.calls, self.seen = calls, 0

    def __call__(self, node, ctx, needs):
        if ctx.budget_mode:
            self.seen += 1
            if self.seen == self.calls:
                raise TimeLimit
        return evaluate(node, ctx, needs)


@sweep(25, quick=6)
@given(family_graphs(), st.floats(0.0, 1.0), st.data())
def test_time_limit_lower_bound_is_below_the_optimum(graph, where, data):
    # Stop the budgeted search at every possible evaluation: the set returned fits, and the
    # bound it reports never exceeds the least recompute (brute force).
    table = brute_all(graph)
    least = min(mem for _, mem, _ in table)
    budget = least + where * (float(graph.sizes[1:-1].sum()) - least)
    optimum = min(r for _, m, r in table if m <= budget + 1e-9)
    counter = _StopAfter(0)
    with mock.patch.object(acg, "evaluate", counter):
        checkpoint_search(graph, budget=budget)
    calls = data.draw(st.integers(1, max(counter.seen, 1)))
    with mock.patch.object(acg, "evaluate", _StopAfter(calls)), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = checkpoint_search(graph, budget=budget)
    mem, rc = _check_result(graph, result)
    assert mem <= budget + 1e-9
    assert 0 <= result.recompute_lower_bound <= optimum + 1e-9
    assert result.recompute_lower_bound <= rc


@sweep(30, quick=8)
@given(family_graphs(), st.floats(0.0, 1.0), st.sampled_from([0.05, 0.2, 0.5]))
def test_budget_gap_bounds_the_recompute(graph, where, gap):
    table = brute_all(graph)
    least = min(mem for _, mem, _ in table)
    budget = least + where * (float(graph.sizes[1:-1].sum()) - least)
    result = checkpoint_search(graph, budget=budget, gap=gap)
    mem, rc = _check_result(graph, result)
    optimum = min(r for _, m, r in table if m <= budget + 1e-9)
    assert mem <= budget + 1e-9
    assert optimum - 1e-9 <= rc <= optimum / (1 - gap) + 1e-9
    assert rc * (1 - gap) - 1e-9 <= result.recompute_lower_bound <= optimum + 1e-9


def test_large_budget_keeps_everything():
    g = Graph.chain([3, 4, 5, 6, 7], [0, 1, 1, 1, 1])
    result = checkpoint_search(g, budget=1e9)
    assert set(result.checkpoints) == {1, 2, 3} and result.recompute == 0.0


def test_invalid_arguments():
    with pytest.raises(TypeError, match="solver.Graph"):
        checkpoint_search([1, 2, 3])
    with pytest.raises(ValueError, match="budget"):
        checkpoint_search(Graph.chain([1, 2, 3]), budget=-1)
    with pytest.raises(ValueError, match="gap"):
        checkpoint_search(Graph.chain([1, 2, 3]), budget=10, gap=1.0)


# --------------------------------------------------------------------------- linear graphs
@sweep(40, quick=10)
@given(st.lists(st.integers(0, 60), min_size=3, max_size=40))
def test_linear_graph_matches_min_peak_chain(sizes):
    from solver.chain.min_peak import min_peak_chain

    result = checkpoint_search(Graph.chain(sizes))
    assert result.peak == pytest.approx(min_peak_chain(sizes[1:-1]).peak)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=3, max_size=12))
def test_linear_graph_brute_force(sizes):
    g = Graph.chain(sizes)
    assert checkpoint_search(g).peak == pytest.approx(min(m for _, m, _ in brute_all(g)))


def test_fractional_sizes():
    sizes = [0.5, 1.25, 2.5, 0.75, 3.125, 1.5, 0.25]
    g = Graph.chain(sizes)
    assert checkpoint_search(g).peak == pytest.approx(min(m for _, m, _ in brute_all(g)))


def test_large_complex_block_is_consistent():
    # A dense block with more inner vertices than the exact enumeration handles: the
    # heuristic must still return a set whose predicted memory is the model's.
    b = _Builder()
    feats = [b.new(0)]
    for _ in range(COMPLEX_LIMIT + 2):
        feats.append(b.new(*feats))
    b.new(b.new(*feats))
    rng = np.random.default_rng(0)
    g = Graph.from_edges(b.edges, rng.integers(1, 50, b.n).tolist())
    with pytest.warns(RuntimeWarning, match="complex division"):
        result = checkpoint_search(g)
    _check_result(g, result)
    assert result.peak <= g.sizes[1:-1].sum()


def test_too_large_complex_block_is_refused():
    # 61 inner vertices do not fit the 64-bit subset masks: a clear error, not an overflow.
    b = _Builder()
    feats = [b.new(0)]
    for _ in range(61):
        feats.append(b.new(*feats[-3:]))
    b.new(b.new(*feats[-3:]), feats[1])
    g = Graph.from_edges(b.edges, [1.0] * b.n)
    with pytest.raises(ValueError, match="at most 61 are supported"):
        checkpoint_search(g)


# --------------------------------------------------------------------------- simulator
@sweep(60, quick=15)
@given(family_graphs())
def test_simulator_agrees_with_the_model(graph):
    result = checkpoint_search(graph)
    forward = float(graph.costs[1:].sum())
    time, peak = simulate_graph(graph, result)
    # Every segment is rebuilt exactly once: time = forward + recompute + 2 x forward.
    assert time == pytest.approx(3 * forward + result.recompute)
    # Backward values: checkpoints + one rebuilt segment at a time + source + target.
    _, values = simulate_graph(graph, result, gradients=False, phase="backward")
    ends = float(graph.sizes[graph.source] + graph.sizes[graph.target])
    assert values <= result.peak + ends + 1e-9
    assert peak >= values
    # Joins reading their inputs (conservative): valid too, never cheaper, and then a
    # gradient is only stored while its vertex's value is: gradients at most double the peak.
    _, strict = simulate_graph(graph, result, gradients=False, phase="backward", joins_read_inputs=True)
    assert strict >= values - 1e-9
    _, strict_all = simulate_graph(graph, result, gradients=False, joins_read_inputs=True)
    _, strict_grads = simulate_graph(graph, result, joins_read_inputs=True)
    assert strict_all <= strict_grads <= 2 * strict_all + 1e-9


@settings(max_examples=30, deadline=None)
@given(family_graphs(), st.data())
def test_simulator_runs_any_checkpoint_set(graph, data):
    inner = list(graph.names[1:-1])
    kept = data.draw(st.lists(st.sampled_from(inner), unique=True)) if inner else []
    time, _ = simulate_graph(graph, kept)
    recompute = sum(graph.cost(v) for v in inner if v not in kept)
    assert time == pytest.approx(3 * float(graph.costs[1:].sum()) + recompute)


def test_simulator_hand_worked_chain():
    # s(1) -> a(2) -> b(4) -> t(1), keep a. Forward: s, a, b(7), t(8), free b (4).
    # loss: +g_t 1 (5). Rebuild b: 9. B(t): g_b +4 = 13, then g_t freed (12).
    g = Graph.chain([1, 2, 4, 1], [0, 1, 1, 1])
    ops = schedule_graph(g, [1])
    assert ops[:6] == (("F", 1), ("F", 2), ("F", 3), ("free", 2), ("loss", 3), ("F", 2))
    time, peak = simulate_graph(g, ops=ops)
    assert time == 3 + 1 + 2 * 3
    assert peak == 13.0
    assert simulate_graph(g, [1], gradients=False) == (10.0, 8.0)


@pytest.mark.parametrize(
    "ops, message",
    [
        ([("F", 2)], "inputs \\[1\\] of 2 are not stored"),
        ([("F", 1), ("F", 1)], "already stored"),
        ([("F", 0)], "source is given"),
        ([("free", 1)], "not stored"),
        ([("F", 1), ("F", 2), ("F", 3), ("B", 3)], "gradient of 3 is missing"),
        ([("F", 1), ("F", 2), ("F", 3), ("loss", 3), ("B", 2)], "readers \\[3\\]"),
        ([("F", 1), ("F", 2), ("F", 3), ("free", 2), ("loss", 3), ("B", 3)], "values \\[3, 2\\]|values \\[2\\]"),
        ([("loss", 3)], "target's value"),
        ([("F", 1), ("loss", 1)], "seeds the target"),
        ([("jump", 1)], "unknown kind"),
        ([("F", 9)], "no vertex 9"),
        ([("F", 1), ("F", 2), ("F", 3), ("loss", 3), ("B", 3)], "never runs the backward"),
    ],
)
def test_simulator_rejects_invalid_sequences(ops, message):
    g = Graph.chain([1, 2, 4, 1])
    with pytest.raises(ValueError, match=message):
        simulate_graph(g, ops=ops)


def test_simulator_argument_errors():
    g = Graph.chain([1, 2, 1])
    with pytest.raises(ValueError, match="exactly one"):
        simulate_graph(g)
    with pytest.raises(ValueError, match="phase"):
        simulate_graph(g, [], phase="middle")
