"""Baselines: valid plans, simulator costs, InfeasibleBudget thresholds, revolve's counts."""

import dataclasses
import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver import (
    BASELINE_METHODS,
    Chain,
    Checkpoint,
    InfeasibleBudget,
    Layer,
    apply_op,
    baseline_schedule,
    initial_state,
    make_schedule,
    random_chain,
    simulate,
    validate_plan,
)
from solver.chain.baselines import (
    every_layer_plan,
    none_plan,
    revolve_costs,
    revolve_extra_forwards,
    revolve_plan,
    revolve_snapshot_counts,
    sqrt_plan,
)

INF = math.inf


@functools.lru_cache(maxsize=None)
def brute_forwards(n: int, s: int) -> int:
    """Least forward steps to reverse n steps with s snapshots, by trying every split.

    One step: tape it and reverse it (1 forward). More: advance m steps from the current
    snapshot, place a snapshot there, reverse the last n - m with s - 1 snapshots, then the
    first m with s (Griewank & Walther's recursion, no closed form involved).
    """
    if n == 1:
        return 1
    if s < 1:
        return 10**9
    return min(m + brute_forwards(n - m, s - 1) + brute_forwards(m, s) for m in range(1, n))


# Griewank's binomial count r*n - C(s+r, s+1), worked by hand:
# (10, 2): r = 3 since C(4,2)=6 < 10 <= C(5,2)=10, so 30 - C(5,3) = 20.
# (10, 3): r = 2 since C(4,3)=4 < 10 <= C(5,3)=10, so 20 - C(5,4) = 15.
# (20, 3): r = 3 since 10 < 20 <= C(6,3)=20, so 60 - C(6,4) = 45.
# (100, 5): r = 4 since C(8,5)=56 < 100 <= C(9,5)=126, so 400 - C(9,6) = 316.
# (1000, 10): r = 4 since C(13,10)=286 < 1000 <= C(14,10)=1001, so 4000 - C(14,11) = 3636.
# (n, 1): every layer recomputed from x[0]: n(n-1)/2. (n, s >= n-1): one sweep, n - 1.
KNOWN = [(10, 2, 20), (10, 3, 15), (20, 3, 45), (100, 5, 316), (1000, 10, 3636),
         (10, 1, 45), (37, 1, 666), (10, 9, 9), (10, 50, 9), (1, 1, 0), (2, 1, 1)]


@pytest.mark.parametrize("n, s, extra", KNOWN)
def test_revolve_closed_form_known_values(n, s, extra):
    assert revolve_extra_forwards(n, s) == extra


def test_revolve_closed_form_matches_brute_force():
    for n in range(1, 60):
        for s in range(1, 9):
            assert revolve_extra_forwards(n, s) == brute_forwards(n, s) - n, (n, s)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 21, 40])
def test_revolve_plan_runs_the_binomial_number_of_forwards(n):
    chain = Chain.homogeneous(n, fwd_time=1.0, bwd_time=2.0)
    for s in range(1, n + 1):
        schedule = make_schedule(chain, revolve_plan(n, s))
        assert schedule.num_forwards == n + revolve_extra_forwards(n, s), (n, s)
        assert schedule.time == schedule.num_forwards + 2.0 * n


@pytest.mark.parametrize("n, s", [(10, 1), (10, 2), (10, 3), (30, 4), (25, 24)])
def test_revolve_holds_at_most_its_snapshots(n, s):
    """Activations held on their own: at most s snapshots plus the current step's input."""
    chain = Chain.homogeneous(n)
    state, held = initial_state(chain), 1
    for op in make_schedule(chain, revolve_plan(n, s)).ops:
        state, _, _ = apply_op(chain, state, op)
        held = max(held, bin(state.x).count("1"))
    assert held <= min(s, n - 1) + 1


def test_revolve_uses_fewer_snapshots_than_every_layer_for_memory():
    chain = Chain.homogeneous(64)
    peaks = [make_schedule(chain, revolve_plan(64, s)).peak for s in (1, 2, 4, 8, 63)]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


@pytest.mark.parametrize("length", [1, 2, 3, 7, 16, 50])
def test_plans_validate_and_cost_like_the_simulator(length):
    chain = random_chain(length, seed=length)
    for method in BASELINE_METHODS:
        schedule = baseline_schedule(chain, method, INF)
        validate_plan(schedule.plan, 0, length)
        assert schedule.method == method
        assert (schedule.time, schedule.peak) == simulate(chain, schedule.ops)


def test_plan_shapes():
    assert none_plan(3) == (Layer(0), Layer(1), Layer(2))
    assert every_layer_plan(2) == (Checkpoint(0, 1, (Layer(0),)), Checkpoint(1, 2, (Layer(1),)))
    chain = random_chain(12, seed=0)
    assert baseline_schedule(chain, "none", INF).forward_counts(12) == [1] * 12
    assert baseline_schedule(chain, "every_layer", INF).forward_counts(12) == [2] * 12
    assert baseline_schedule(chain, "sqrt", INF).forward_counts(12) == [2] * 12


@pytest.mark.parametrize("length", [1, 4, 10, 50, 99, 100, 400, 1000])
def test_sqrt_uses_about_sqrt_l_segments_of_about_sqrt_l_layers(length):
    plan = sqrt_plan(length)
    validate_plan(plan, 0, length)
    root = math.sqrt(length)
    assert all(isinstance(item, Checkpoint) for item in plan)
    assert root - 1 <= len(plan) <= root + 1
    assert max(item.stop - item.start for item in plan) <= math.ceil(root) + 1
    assert all(item.body == tuple(Layer(i) for i in range(item.start, item.stop)) for item in plan)


def test_sqrt_peak_grows_like_sqrt_l():
    for length in (100, 400):
        chain = Chain.homogeneous(length)  # x = tape = 1
        sqrt_peak = baseline_schedule(chain, "sqrt", INF).peak
        every_peak = baseline_schedule(chain, "every_layer", INF).peak
        assert sqrt_peak <= 3 * math.sqrt(length) + 5
        assert every_peak >= length


@settings(max_examples=40, deadline=None)
@given(length=st.integers(1, 14), seed=st.integers(0, 10**6),
       method=st.sampled_from(BASELINE_METHODS))
def test_infeasible_budget_threshold(length, seed, method):
    chain = random_chain(length, seed)
    with pytest.raises(InfeasibleBudget) as info:
        baseline_schedule(chain, method, 0.0)
    least = info.value.min_budget
    assert info.value.method == method and info.value.budget == 0.0
    at_least = baseline_schedule(chain, method, least)  # at min_budget it succeeds
    assert at_least.peak <= least
    with pytest.raises(InfeasibleBudget) as below:  # just below it fails (sizes are integers)
        baseline_schedule(chain, method, least - 0.5)
    assert below.value.min_budget == least
    if method != "revolve":
        assert least == baseline_schedule(chain, method, INF).peak


@settings(max_examples=30, deadline=None)
@given(length=st.integers(2, 12), seed=st.integers(0, 10**6), fraction=st.floats(0.0, 1.2))
def test_revolve_picks_the_fastest_snapshot_count_that_fits(length, seed, fraction):
    chain = random_chain(length, seed)
    schedules = [make_schedule(chain, revolve_plan(length, s)) for s in range(1, length)]
    peaks = [s.peak for s in schedules]
    budget = min(peaks) + fraction * (max(peaks) - min(peaks))
    fitting = [s.time for s in schedules if s.peak <= budget]
    try:
        chosen = baseline_schedule(chain, "revolve", budget)
    except InfeasibleBudget as error:
        assert not fitting and error.min_budget == min(peaks)
        return
    assert chosen.peak <= budget and chosen.time == min(fitting)


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 20), seed=st.integers(0, 10**6), tape=st.booleans(),
       flags=st.sampled_from(["all", "none", "random"]), tape_tmp=st.booleans())
def test_revolve_costs_equal_the_simulator(length, seed, tape, flags, tape_tmp):
    chain = random_chain(length, seed, tape_forwards=tape)
    if flags != "all":  # outputs outside the tape: the walk must free them as the simulator does
        inside = np.random.default_rng(seed).random(length) < 0.5 if flags == "random" else False
        chain = dataclasses.replace(chain, output_in_tape=np.broadcast_to(inside, (length,)))
    if tape_tmp:  # the base case's own forward transient (Chain.fwd_tape_tmp)
        chain = dataclasses.replace(
            chain, fwd_tape_tmp=np.random.default_rng(seed + 1).integers(0, 60, length))
    counts, times, peaks = revolve_costs(chain)
    assert counts == tuple(range(1, max(2, length)))
    for s, time, peak in zip(counts, times, peaks):
        schedule = make_schedule(chain, revolve_plan(length, s))
        assert schedule.peak == peak and schedule.time == pytest.approx(time, rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(length=st.integers(2, 12), seed=st.integers(0, 10**6))
def test_revolve_min_budget_works_with_outputs_outside_the_tape(length, seed):
    # The smallest budget an InfeasibleBudget names must itself be accepted (it once was
    # not: the tree walk ignored output_in_tape and overestimated the peaks).
    chain = random_chain(length, seed)
    inside = np.random.default_rng(seed).random(length) < 0.5
    chain = dataclasses.replace(chain, output_in_tape=inside)
    with pytest.raises(InfeasibleBudget) as info:
        baseline_schedule(chain, "revolve", 0.0)
    schedule = baseline_schedule(chain, "revolve", info.value.min_budget)
    assert schedule.peak == info.value.min_budget
    assert (schedule.time, schedule.peak) == simulate(chain, schedule.ops)


def test_revolve_on_long_chains_skips_only_the_deepest_plan():
    counts = revolve_snapshot_counts(1000)
    assert counts == tuple(range(2, 1000))  # one snapshot would nest 999 checkpoints deep
    assert revolve_snapshot_counts(150) == tuple(range(1, 150))


def test_revolve_fits_tight_budgets_on_long_chains():
    chain = random_chain(300, seed=3)
    loose = baseline_schedule(chain, "revolve", INF)
    with pytest.raises(InfeasibleBudget) as info:
        baseline_schedule(chain, "revolve", 0.0)
    tight = baseline_schedule(chain, "revolve", info.value.min_budget)
    assert tight.peak < loose.peak and tight.time > loose.time
    assert (tight.time, tight.peak) == simulate(chain, tight.ops)


def test_unknown_method_says_what_exists():
    with pytest.raises(ValueError, match="every_layer"):
        baseline_schedule(random_chain(3, 0), "chen", INF)


def test_revolve_needs_a_snapshot():
    with pytest.raises(ValueError, match="snapshot"):
        revolve_plan(5, 0)
    assert revolve_plan(1, 0) == (Layer(0),)
    assert np.all(np.diff([revolve_extra_forwards(50, s) for s in range(1, 50)]) < 0)


# ------------------------------------------------------------------ compare_methods, chains


@pytest.mark.parametrize("seed", range(4))
def test_compare_methods_rotor_never_worse_than_a_fitting_baseline(seed):
    from solver.compare import budget_range, compare_methods, format_table

    chain = random_chain(3 + 3 * seed, seed, max_size=50)
    budgets = budget_range(chain, 5)
    rows = compare_methods(chain, budgets)
    assert [row.budget for row in rows] == list(budgets)
    for row in rows:
        assert row.time("rotor") is not None  # budgets start at rotor's min_budget
        for method in row.methods:
            time, peak = row.time(method), row.peaks[row.methods.index(method)]
            if time is not None:
                assert peak <= row.budget
                assert row.time("rotor") <= time
    top = rows[-1]
    assert top.overhead("none") == 0.0 and top.overhead("rotor") == 0.0
    assert top.budget == baseline_schedule(chain, "none", INF).peak
    table = format_table(rows)
    lines = table.splitlines()
    assert all(m in lines[0] for m in ("rotor", "none", "every_layer", "sqrt", "revolve"))
    assert len(lines) >= len(rows) + 2
    if any(row.time("none") is None for row in rows):
        assert "—" in table


def test_transformer_like_sizes_follow_the_documented_formulas():
    from solver import transformer_like

    chain = transformer_like(num_blocks=2, batch=2, seq_len=16, hidden=8, heads=2,
                             mlp_ratio=4, bytes_per_value=2)
    T, P = 2 * 16 * 8 * 2, 2 * 2 * 16 * 16 * 2
    assert chain.length == 4 and np.all(chain.x_size == T)
    assert list(chain.xbar_size) == [6 * T + P, 10 * T] * 2
    assert list(chain.fwd_tmp) == [P, 0] * 2 and list(chain.bwd_tmp) == [P + 3 * T, 4 * T] * 2
    attention = 8 * 2 * 16 * 8 * 8 + 4 * 2 * 16 * 16 * 8
    assert list(chain.fwd_time) == [attention, 16 * 2 * 16 * 8 * 8] * 2
    assert np.array_equal(chain.bwd_time, 2 * chain.fwd_time)


def test_resnet_like_shapes():
    from solver import resnet_like

    chain = resnet_like(batch=2, resolution=32, widths=(4, 8), depths=(2, 2), num_classes=10,
                        bytes_per_value=4)
    assert chain.length == 1 + 4 + 1 and chain.is_integral
    A0, A1 = 2 * 8 * 8 * 4 * 4, 2 * 4 * 4 * 8 * 4  # stage outputs: 32/4 = 8, then 4
    assert list(chain.x_size) == [2 * 32 * 32 * 3 * 4, A0, A0, A0, A1, A1, 2 * 10 * 4]
    stem = 2 * 16 * 16 * 4 * 4
    assert list(chain.xbar_size) == [2 * stem + A0, 4 * A0, 4 * A0, 5 * A1, 4 * A1,
                                     2 * 8 * 4 + 2 * 10 * 4]
    assert np.all(chain.xbar_size > chain.x_size[1:])  # BN and ReLU keep extra maps


def test_random_chain_is_reproducible_and_integral():
    a, b = random_chain(20, 7), random_chain(20, 7)
    assert a == b and a != random_chain(20, 8) and a.is_integral
    assert np.all(random_chain(5, 1, temporaries=False).fwd_tmp == 0)
