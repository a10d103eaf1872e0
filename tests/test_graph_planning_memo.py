"""Planning ``remat_graph`` / ``RematModule`` at several budgets shares the budget-free work
(issue 18.4, ``jaxremat.graph.memo``): one trace and one least-memory search per function and
signature, measurements and budgeted searches reused, results the same as fresh ones."""

from __future__ import annotations

import threading
import time
import types

import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import solver
from jaxremat import activation_memory, remat_graph
from jaxremat.graph.memo import SignatureMemo
from solver.graph import search as search_module
from test_acg import family_graphs
from test_remat_graph import MLP, X


def test_least_memory_search_runs_once_per_graph(monkeypatch):
    graph = solver.Graph.chain([4, 2, 7, 3, 5, 1])
    calls = []
    original = search_module._Search.least_memory
    monkeypatch.setattr(search_module._Search, "least_memory",
                        lambda self: calls.append(1) or original(self))
    first = solver.checkpoint_search(graph)
    assert solver.checkpoint_search(graph) == first
    budgeted = solver.checkpoint_search(graph, budget=first.peak + 3)
    assert len(calls) == 1
    assert budgeted.peak <= first.peak + 3


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(family_graphs(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_reused_searches_are_the_least_recompute(graph, u, v):
    # A search at b0 whose set has model memory p also answers every b in [p, b0].
    memo = SignatureMemo(types.SimpleNamespace(graph=graph))
    least, total = memo.least.peak, float(graph.sizes[1:-1].sum())
    b0 = least + max(u, v) * (total - least)
    first = memo.search(b0, None, 0.0)
    b = first.peak + min(u, v) / max(u, v, 1e-9) * (b0 - first.peak)
    again = memo.search(b, None, 0.0)
    assert memo.searches_run == 1 and again is first
    fresh = solver.checkpoint_search(graph, budget=b)
    assert abs(fresh.recompute - again.recompute) <= 1e-9 * max(1.0, fresh.recompute)


def _counting_mlp():
    traces = []

    def fn(params, x):
        traces.append(1)
        for w1, w2 in params[:4]:
            x = x + jnp.tanh(jnp.tanh(x @ w1) @ w2)
        return jnp.sum(x ** 2)
    return fn, traces


@pytest.mark.slow
def test_budgets_of_one_function_share_the_trace_and_measurements():
    fn, traces = _counting_mlp()
    params = MLP[:4]
    plain = activation_memory(fn, params, X)
    traces.clear()
    budgets = [int(plain * s) for s in (0.6, 0.8, 0.7)]
    plans = [remat_graph(fn, b).plan(params, X) for b in budgets]
    assert len(traces) == 1  # traced once for the three budgets
    for budget, plan in zip(budgets, plans):
        assert plan.measured <= budget == plan.budget
    g = remat_graph(fn, budgets[0])
    assert activation_memory(g, params, X) == plans[0].measured


@pytest.mark.slow
def test_threads_planning_one_function_trace_it_once():
    fn, traces = _counting_mlp()
    params = MLP[:4]
    plain = activation_memory(fn, params, X)
    traces.clear()
    budgets = [int(plain * s) for s in (0.6, 0.7, 0.8, 0.9)]
    plans = [None] * len(budgets)

    def work(k):
        plans[k] = remat_graph(fn, budgets[k]).plan(params, X)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(budgets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(traces) == 1
    assert all(p is not None and p.measured <= b for p, b in zip(plans, budgets))


@pytest.mark.slow
def test_work_limited_plan_is_the_same_under_load(monkeypatch):
    # remat_graph's default limit counts candidates, not seconds: a fresh planner on a
    # slowed-down machine makes the same plan (same kept set, same measured bytes).
    import warnings

    from solver.graph import fronts
    from test_remat_graph import residual_mlp

    def plan(fn):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return remat_graph(fn, "50%", work_limit=2000).plan(MLP, X)

    first = plan(lambda p, x: residual_mlp(p, x))  # a new function object: a fresh memo
    original = fronts._prune_once
    monkeypatch.setattr(fronts, "_prune_once",
                        lambda *a, **k: (time.sleep(5e-5), original(*a, **k))[1])
    again = plan(lambda p, x: residual_mlp(p, x))
    assert again.checkpoints == first.checkpoints and again.measured == first.measured
    monkeypatch.setattr(fronts, "_prune_once", original)
    unlimited = remat_graph(lambda p, x: residual_mlp(p, x), "50%", work_limit=None).plan(MLP, X)
    assert unlimited.checkpoints.recompute < first.checkpoints.recompute  # the limit did bite
    with pytest.raises(ValueError, match="work_limit"):
        remat_graph(residual_mlp, "50%", work_limit=-1)


def test_shared_region_functions_run_the_same_program():
    # The memo keeps each region's function (plan.run_regions' `functions`), so that JAX's
    # differentiation caches hit for the regions several plans share: a plan then runs and
    # measures exactly what freshly built region functions give.
    import jax

    from jaxremat.graph.remat import _scalar, run_regions
    from test_remat_graph import residual_mlp

    fn = lambda p, x: residual_mlp(p, x)  # noqa: E731  (a fresh memo)
    params = MLP[:3]
    plain = activation_memory(fn, params, X)
    graphs = [remat_graph(fn, budget) for budget in (None, int(0.7 * plain))]
    plans = [g.plan(params, X) for g in graphs]
    traced, _, functions = graphs[1]._planned(params, X)
    assert functions and len({id(f) for f in functions.values()}) == len(functions)
    expected = jax.grad(fn)(params, X)
    for plan in plans:
        assert plan.regions
        def loss(p, x, shared):
            return _scalar(run_regions(traced, plan, p, x, functions if shared else None))
        shared, fresh = (jax.make_jaxpr(jax.grad(lambda p, x, s=s: loss(p, x, s)))(params, X)
                         for s in (True, False))
        assert str(shared) == str(fresh)
        measured = activation_memory(lambda p, x: loss(p, x, True), params, X)
        assert measured == activation_memory(lambda p, x: loss(p, x, False), params, X)
        assert plan.measured in (None, measured)
        got = jax.grad(lambda p, x: loss(p, x, True))(params, X)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            assert jnp.allclose(a, b, rtol=1e-5, atol=1e-5)
