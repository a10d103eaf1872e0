"""``solve``: Rotor never loses to a baseline, budgets are respected, errors are clear."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from solver import (
    Chain, InfeasibleBudget, Layer, TrainingGraph, ilp_min_peak, make_schedule, simulate, solve_ilp,
)
from solver.chain.baselines import BASELINE_METHODS, baseline_schedule
from solver.chain.exhaustive import exhaustive_optimum, replay
from solver.chain.rotor import RotorTable, rotor_min_budget
from solver.solve import METHODS, solve

from tiers import sweep


def random_real_chain(rng: np.random.Generator, length: int) -> Chain:
    x = rng.uniform(0.1, 10.0, length + 1)
    return Chain(
        fwd_time=rng.uniform(0.0, 3.0, length),
        bwd_time=rng.uniform(0.0, 6.0, length),
        x_size=x,
        xbar_size=x[1:] * rng.uniform(1.0, 3.0, length),
        fwd_tmp=rng.uniform(0.0, 4.0, length) * (rng.random(length) < 0.5),
        bwd_tmp=rng.uniform(0.0, 4.0, length) * (rng.random(length) < 0.5),
    )


@st.composite
def integer_chains(draw, max_layers=7):
    L = draw(st.integers(1, max_layers))
    ints = lambda n, lo, hi: draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    x = ints(L + 1, 0, 8)
    extra = ints(L, 0, 6)
    fwd = ints(L, 0, 5)
    return Chain(
        fwd_time=fwd,
        fwd_tape_time=[draw(st.integers(0, f)) for f in fwd],
        bwd_time=ints(L, 0, 5),
        x_size=x,
        xbar_size=[x[i + 1] + extra[i] for i in range(L)],
        fwd_tmp=ints(L, 0, 4),
        bwd_tmp=ints(L, 0, 4),
    )


def no_remat_peak(chain: Chain) -> float:
    return make_schedule(chain, tuple(Layer(i) for i in range(chain.length))).peak


def fitting_baselines(chain: Chain, budget: float):
    for method in BASELINE_METHODS:
        try:
            yield baseline_schedule(chain, method, budget)
        except InfeasibleBudget:
            pass


@settings(max_examples=40, deadline=None)
@given(integer_chains())
def test_exact_dp_alone_beats_every_fitting_baseline(chain):
    # Every baseline plan is a persistent schedule, so the exact DP (no rounding) must find
    # one at least as fast, and fit wherever a baseline fits.
    top = int(no_remat_peak(chain)) + 1
    table = RotorTable(chain, top, slots=top)
    for budget in range(1, top + 1):
        baselines = list(fitting_baselines(chain, budget))
        if budget < table.min_budget:
            assert not baselines
            continue
        dp = table.schedule(budget)
        for baseline in baselines:
            assert dp.time <= baseline.time, (budget, baseline.method)


def test_solve_beats_every_fitting_baseline_on_real_chains():
    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(12):
        chain = random_real_chain(rng, int(rng.integers(2, 40)))
        low, high = rotor_min_budget(chain), no_remat_peak(chain)
        for budget in np.linspace(low, high * 1.05, 9):
            schedule = solve(chain, budget, slots=500)
            assert schedule.peak <= budget * (1 + 1e-9)
            assert simulate(chain, schedule.ops) == (schedule.time, schedule.peak)
            for baseline in fitting_baselines(chain, budget):
                assert schedule.time <= baseline.time
                checked += 1
    assert checked > 100


def test_slot_rounding_never_exceeds_the_budget():
    # Just above the exact minimum, rounding sizes up to budget/500 makes the table
    # infeasible; solve must fall back to the minimum-peak schedule, never overflow.
    rng = np.random.default_rng(5)
    fallbacks = 0
    for _ in range(25):
        chain = random_real_chain(rng, int(rng.integers(1, 25)))
        low = rotor_min_budget(chain)
        for factor in (1.0, 1.0 + 1e-9, 1.001, 1.01, 1.1, 1.5, 3.0):
            budget = low * factor
            table = RotorTable(chain, budget, slots=500)
            fallbacks += table.predicted_time(budget) == math.inf
            schedule = solve(chain, budget, slots=500)
            assert schedule.peak <= budget * (1 + 1e-9)
    assert fallbacks > 0, "these budgets were meant to exercise the min-peak fallback"


@settings(max_examples=60, deadline=None)
@given(integer_chains())
def test_infeasible_budget_reports_the_smallest_budget(chain):
    min_budget = rotor_min_budget(chain)
    assert min_budget == int(min_budget)
    if min_budget >= 2:
        with pytest.raises(InfeasibleBudget) as info:
            solve(chain, min_budget - 1)
        assert info.value.min_budget == min_budget
        assert info.value.method == "rotor"
        assert f"is {min_budget:.6g}" in str(info.value)
    schedule = solve(chain, max(min_budget, 1))
    assert schedule.peak <= max(min_budget, 1)


def test_infeasible_message_for_a_real_chain():
    chain = random_real_chain(np.random.default_rng(2), 10)
    need = rotor_min_budget(chain)
    with pytest.raises(InfeasibleBudget, match="smallest budget that works") as info:
        solve(chain, need * 0.9)
    assert info.value.min_budget == need
    assert solve(chain, need).peak <= need * (1 + 1e-9)


@pytest.mark.parametrize("budget", [0, -1.0, float("nan"), float("inf"), "10", None, True])
def test_bad_budget(budget):
    with pytest.raises(ValueError, match="budget"):
        solve(Chain.homogeneous(4), budget)


@pytest.mark.parametrize("slots", [0, -3, 2.5, True])
def test_bad_slots(slots):
    with pytest.raises(ValueError, match="slots"):
        solve(Chain.homogeneous(4), 10.0, slots=slots)


def test_unknown_method_lists_methods():
    with pytest.raises(ValueError, match="revolve"):
        solve(Chain.homogeneous(4), 10.0, method="chen")


@pytest.mark.parametrize("method", BASELINE_METHODS)
def test_baseline_methods_delegate(method):
    chain = random_real_chain(np.random.default_rng(4), 16)
    budget = no_remat_peak(chain) * 2
    assert solve(chain, budget, method=method) == baseline_schedule(chain, method, budget)


def test_two_hundred_layers():
    rng = np.random.default_rng(0)
    chain = random_real_chain(rng, 200)
    low, high = rotor_min_budget(chain), no_remat_peak(chain)
    budget = low + 0.2 * (high - low)
    schedule = solve(chain, budget)
    assert simulate(chain, schedule.ops) == (schedule.time, schedule.peak)
    assert schedule.peak <= budget
    assert schedule.method == "rotor"
    total = chain.fwd_time.sum() + chain.bwd_time.sum()
    assert total < schedule.time < total + chain.fwd_time.sum() * 5
    for baseline in fitting_baselines(chain, budget):
        assert schedule.time <= baseline.time


# --------------------------------------------------------------------------- method="ilp"
@st.composite
def tapeless_chains(draw, max_layers=4):
    L = draw(st.integers(1, max_layers))
    ints = lambda n, lo, hi: draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    x = ints(L + 1, 1, 6)
    return Chain(fwd_time=ints(L, 0, 4), bwd_time=ints(L, 0, 4), x_size=x, xbar_size=x[1:])


@sweep(40, quick=10)
@given(tapeless_chains(), st.floats(0.0, 1.0))
def test_ilp_between_exhaustive_and_rotor(chain, fraction):
    # Every Rotor schedule is in the ILP's class and every ILP schedule is a sequence of
    # ops and drops, so exhaustive <= ilp <= rotor; replaying the ILP's steps gives
    # exactly its reported time and peak.
    low, high = rotor_min_budget(chain), no_remat_peak(chain)
    budget = low + fraction * (high - low)
    schedule = solve(chain, budget, method="ilp")
    assert schedule.plan is None and schedule.method == "ilp"
    assert replay(chain, schedule.ops) == (schedule.time, schedule.peak)
    assert schedule.peak <= budget * (1 + 1e-9)
    assert schedule.time <= solve(chain, budget).time + 1e-9
    training = TrainingGraph.from_chain(chain)
    solution = solve_ilp(training, budget, backward_recompute=False)
    assert (schedule.time, schedule.peak) == pytest.approx((solution.objective, solution.peak))
    assert exhaustive_optimum(chain, budget) <= schedule.time + 1e-9
    assert schedule.forward_counts(chain.length)[0] >= 1
    assert "plan=None" in str(schedule)


def test_ilp_beats_rotor_somewhere():
    # Non-persistent schedules pay off on a homogeneous chain at a tight budget.
    chain = Chain.homogeneous(5)
    ilp, rotor = solve(chain, 5, method="ilp"), solve(chain, 5)
    assert ilp.time < rotor.time
    assert replay(chain, ilp.ops) == (ilp.time, ilp.peak) and ilp.peak <= 5
    assert any(step[0] == "drop" for step in ilp.ops)


def test_ilp_infeasible_budget_reports_the_ilp_minimum():
    chain = Chain(fwd_time=[1, 2, 1], bwd_time=[2, 1, 3], x_size=[2, 3, 1, 2],
                  xbar_size=[3, 1, 2])
    least = ilp_min_peak(TrainingGraph.from_chain(chain), backward_recompute=False)
    with pytest.raises(InfeasibleBudget, match="smallest budget that works") as info:
        solve(chain, least - 0.5, method="ilp")
    assert info.value.min_budget == least and info.value.method == "ilp"
    assert solve(chain, least, method="ilp").peak <= least


@pytest.mark.parametrize("field", ["xbar_size", "fwd_tmp", "bwd_tmp", "fwd_tape_time",
                                   "fwd_ck_tmp"])
def test_ilp_rejects_chains_with_tapes_or_temporaries(field):
    x = [2.0, 3.0, 1.0]
    fields = dict(fwd_time=[1, 1], bwd_time=[1, 1], x_size=x, xbar_size=x[1:])
    fields[field] = [4.0, 1.0] if field == "xbar_size" else [0.0, 1.0]
    with pytest.raises(ValueError, match="use method='rotor'"):
        solve(Chain(**fields), 100.0, method="ilp")


def test_ilp_is_accepted_but_not_a_plan_method():
    assert "ilp" not in METHODS  # callers iterating METHODS expect a plan
    with pytest.raises(ValueError, match="ilp"):
        solve(Chain.homogeneous(3), 10.0, method="checkmate")


def test_outputs_outside_tapes_fit_tighter_budgets():
    """With ``output_in_tape`` false the simulator frees outputs early: ``solve`` returns
    schedules that fit, and its least budget is the least-peak plan's simulated peak."""
    import dataclasses

    base = Chain(fwd_time=[1, 1, 1], bwd_time=[2, 2, 2], x_size=[1, 4, 4, 4],
                 xbar_size=[6, 6, 6])
    flagged = dataclasses.replace(base, output_in_tape=[False, False, False])
    with pytest.raises(InfeasibleBudget) as plain:
        solve(base, 1.0)
    with pytest.raises(InfeasibleBudget) as tight:
        solve(flagged, 1.0)
    assert tight.value.min_budget < plain.value.min_budget
    schedule = solve(flagged, tight.value.min_budget)
    assert schedule.peak <= tight.value.min_budget
    assert simulate(flagged, schedule.ops)[1] == schedule.peak
    for budget in np.linspace(tight.value.min_budget, 40.0, 9):
        assert solve(flagged, budget).peak <= budget
        if budget >= plain.value.min_budget:  # every plan that fits base fits flagged too
            assert solve(flagged, budget).time <= solve(base, budget).time
