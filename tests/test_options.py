"""Multi-option layers (Rockmate's extension of Rotor, issue 17): the options' data type,
the simulator, Rotor's DP against every persistent plan and option of small chains, the
exhaustive oracle, the baselines, the ILP adapter and bad input."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plans import check_exact, every_plan_cost, negative_bwd_tmps
from solver import (
    BASELINE_METHODS,
    Chain,
    Checkpoint,
    InfeasibleBudget,
    Layer,
    LayerOptions,
    OpKind,
    RotorTable,
    baseline_schedule,
    exhaustive_optimum,
    exhaustive_search,
    format_plan,
    make_schedule,
    min_peak_schedule,
    plan_to_ops,
    random_chain,
    rotor_min_budget,
    simulate,
    solve,
    validate_plan,
)
from solver.chain.exhaustive import replay
from solver.chain.generators import with_random_options
from test_exhaustive import unpruned_optimum
from tiers import sweep

INF = math.inf

# Two layers, x = [2, 3, 1]; layer 0's whole tape is 8 (its output 3 included); option 1
# ("dots") keeps 4 and recomputes for 2 more in the backward.
BASE = Chain(fwd_time=[1, 1], bwd_time=[2, 2], x_size=[2, 3, 1], xbar_size=[8, 2])
DOTS = BASE.with_options(LayerOptions.from_columns(
    BASE, [[dict(xbar_size=4, bwd_time=4, name="dots")], []]))


@st.composite
def option_chains(draw, max_layers=4, max_options=3, read=False, rec=False):
    """Integer chains (flagged outputs, tape-only forwards) with 1..max_options options."""
    L = draw(st.integers(1, max_layers))
    ints = lambda n, hi: draw(st.lists(st.integers(0, hi), min_size=n, max_size=n))  # noqa: E731
    x, fwd = ints(L + 1, 6), ints(L, 5)
    chain = Chain(
        fwd_time=fwd, fwd_tape_time=[draw(st.integers(0, f)) for f in fwd],
        bwd_time=ints(L, 5), x_size=x, xbar_size=[x[i + 1] + e for i, e in enumerate(ints(L, 4))],
        fwd_tmp=ints(L, 3), bwd_tmp=negative_bwd_tmps(draw, x),
        output_in_tape=draw(st.lists(st.booleans(), min_size=L, max_size=L)),
        fwd_tape_tmp=ints(L, 4) if draw(st.booleans()) else None,
    )
    extra = []
    for i in range(L):
        row = []
        for _ in range(draw(st.integers(0, max_options - 1))):
            f = draw(st.integers(0, 5))
            row.append(dict(xbar_size=x[i + 1] + draw(st.integers(0, 4)),
                            bwd_time=draw(st.integers(0, 8)), fwd_time=f,
                            fwd_tape_time=draw(st.integers(0, f)),
                            fwd_tmp=draw(st.integers(0, 3)),
                            bwd_tmp=draw(st.integers(-min(x[i], x[i + 1]), 3)),
                            **({"fwd_tape_tmp": draw(st.integers(0, 4))}
                               if chain.fwd_tape_tmp is not None else {}),
                            output_in_tape=draw(st.booleans())))
        extra.append(row)
    if read:  # B(i) reads a part of x[i] under each option; F_all(i) frees the rest
        chain = _read_in_part(draw, chain, extra, rec)
    return chain.with_options(LayerOptions.from_columns(chain, extra))


def _read_in_part(draw, chain, extra, rec=False):
    """Draw ``x_read_size`` per layer and option (into ``extra``; the chain's own returned):
    at least ``x[i]`` less the option's tape, one value per layer where the layer before
    has an option whose output is in its tape (what ``Chain`` requires). With ``rec``, also
    ``x_rec_size``: between the largest read and ``x[i]``."""
    x, L = chain.x_size.astype(int), chain.length
    own, kept = [], []
    for i in range(L):
        tapes = [int(chain.xbar_size[i])] + [int(o["xbar_size"]) for o in extra[i]]
        shared = i > 0 and (chain.output_in_tape[i - 1] or any(
            o.get("output_in_tape", chain.output_in_tape[i - 1]) for o in extra[i - 1]))
        if shared:
            value = draw(st.integers(max(0, x[i] - min(tapes)), x[i]))
            reads = [value] * len(tapes)
        else:
            reads = [draw(st.integers(max(0, x[i] - t), x[i])) for t in tapes]
        own.append(reads[0])
        kept.append(draw(st.integers(max(reads), x[i])) if rec else x[i])
        for option, r in zip(extra[i], reads[1:]):
            option["x_read_size"] = r
    return dataclasses.replace(chain, x_read_size=own, x_rec_size=kept)


@sweep(120, quick=40)
@given(option_chains())
def test_dp_is_exact_over_every_plan_and_option(chain):
    check_exact(chain)


@settings(max_examples=60, deadline=None)
@given(option_chains(read=True))
def test_dp_is_exact_with_inputs_read_in_part(chain):
    check_exact(chain)


@settings(max_examples=40, deadline=None)
@given(option_chains(read=True, rec=True))
def test_dp_is_exact_with_checkpoints_held_in_part(chain):
    check_exact(chain)


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(option_chains(max_layers=5))
def test_dp_is_exact_over_every_plan_and_option_five_layers(chain):
    check_exact(chain)


@settings(max_examples=60, deadline=None)
@given(option_chains(max_layers=3, max_options=2, read=True, rec=True), st.data())
def test_exhaustive_oracle_with_options(chain, data):
    """A* with options equals a plain Dijkstra over every op, option and drop, and is never
    slower than the best persistent plan (Rotor's DP)."""
    top = int(max(peak for _, peak in every_plan_cost(chain))) + 1
    budget = data.draw(st.integers(max(1, int(chain.x_size[0])), top))
    result = exhaustive_search(chain, budget)
    assert (INF if result is None else result.time) == unpruned_optimum(chain, budget)
    if result is not None:
        assert replay(chain, result.steps) == (result.time, result.peak)
        assert result.peak <= budget
    if budget >= rotor_min_budget(chain):
        dp = RotorTable(chain, budget, slots=budget).schedule(budget)
        assert result is not None and result.time <= dp.time


def test_simulator_charges_the_option():
    plan = (Layer(0, 1), Layer(1))
    ops = plan_to_ops(plan, 2)
    assert ops[0] == (OpKind.F_ALL, 0, 1) and ops[1] == (OpKind.F_ALL, 1)
    # F_all(0, dots): x0 2 + 4; F_all(1): + 2; loss: + g2 1 = 9; B(1): + g1 3 = 12 ... B(0):
    # x0 2 + tape 4 + g1 3 + g0 2 = 11. Whole tapes: 2 + 8 + 2 + 1 + 3 = 16 at B(1).
    assert simulate(DOTS, ops) == (1 + 1 + 2 + 4, 12)
    assert simulate(DOTS, plan_to_ops((Layer(0), Layer(1)), 2)) == (6, 16)
    assert Layer(3) == Layer(3, 0)


def test_dp_chooses_the_option_that_fits():
    # Whole tapes need 16 (15 recomputing layer 0: the tape of 8 then sits beside g2, x1 and
    # g1 is not needed... B(0) holds x0 + tape0 + g1 + g0 = 15). The dots tape fits 12 with
    # no recomputation (time 8 = 6 + 2 more backward), and 11 recomputing layer 0 (+1).
    assert rotor_min_budget(BASE) == 15 and rotor_min_budget(DOTS) == 11
    expected = {16: ((Layer(0), Layer(1)), 6), 12: ((Layer(0, 1), Layer(1)), 8),
                11: ((Checkpoint(0, 1, (Layer(0, 1),)), Layer(1)), 9)}
    for budget, (plan, time) in expected.items():
        schedule = RotorTable(DOTS, budget, slots=budget).schedule(budget)
        assert (schedule.plan, schedule.time) == (plan, time)
    with pytest.raises(InfeasibleBudget, match="smallest budget that works is 15"):
        solve(BASE, 12)


def test_dominating_options_are_chosen():
    chain = random_chain(12, 3)
    better = chain.with_options(LayerOptions.from_columns(
        chain, [[dict(xbar_size=chain.x_size[i + 1], bwd_time=chain.bwd_time[i])]
                for i in range(chain.length)]))
    every = tuple(Layer(i, 1) for i in range(chain.length))
    budget = make_schedule(better, every).peak
    assert budget < make_schedule(chain, tuple(Layer(i) for i in range(chain.length))).peak
    schedule = solve(better, budget, slots=int(budget))
    assert schedule.plan == every
    assert schedule.time == chain.fwd_time.sum() + chain.bwd_time.sum()
    assert solve(chain, budget, slots=int(budget)).time > schedule.time


@pytest.mark.parametrize("seed", range(4))
def test_option_zero_only_chains_match_today(seed):
    """Options that are absent, or worse than the whole tape in every respect, change
    nothing: same min budget, same plans, same times."""
    chain = random_chain(25, seed, tape_forwards=True)
    L = chain.length
    table = LayerOptions.of_chain(chain)
    absent = LayerOptions(**{f: np.hstack([getattr(table, f), getattr(table, f)])
                             for f in ("xbar_size", "fwd_time", "fwd_tape_time", "bwd_time",
                                       "fwd_tmp", "bwd_tmp", "output_in_tape")},
                          valid=np.hstack([np.ones((L, 1), bool), np.zeros((L, 1), bool)]))
    worse = LayerOptions.from_columns(chain, [[dict(
        xbar_size=chain.xbar_size[i] + 1, bwd_time=chain.bwd_time[i] + 1,
        fwd_tmp=chain.fwd_tmp[i] + 1, bwd_tmp=chain.bwd_tmp[i] + 1)] for i in range(L)])
    low = rotor_min_budget(chain)
    high = make_schedule(chain, tuple(Layer(i) for i in range(L))).peak
    for options in (absent, worse):
        other = chain.with_options(options)
        assert rotor_min_budget(other) == low
        assert min_peak_schedule(other).plan == min_peak_schedule(chain).plan
        for fraction in (0.0, 0.2, 0.6, 1.0):
            budget = low + fraction * (high - low)
            a, b = RotorTable(chain, budget).schedule(budget), RotorTable(other, budget).schedule(budget)
            assert (a.plan, a.time, a.peak) == (b.plan, b.time, b.peak)


@pytest.mark.parametrize("seed", range(3))
def test_rounded_dp_with_options_fits_and_never_loses(seed):
    chain = random_chain(40, seed, tape_forwards=True)
    rich = with_random_options(chain, seed, options=4, varying=True)
    assert rotor_min_budget(rich) <= rotor_min_budget(chain)
    high = make_schedule(chain, tuple(Layer(i) for i in range(chain.length))).peak
    for fraction in (0.05, 0.3, 0.7):
        budget = rotor_min_budget(chain) + fraction * (high - rotor_min_budget(chain))
        plain, table = RotorTable(chain, budget), RotorTable(rich, budget)
        schedule = table.schedule(budget)
        assert schedule.peak <= budget
        assert simulate(rich, schedule.ops) == (schedule.time, schedule.peak)
        assert math.isclose(table.predicted_time(budget), schedule.time, rel_tol=1e-5)
        assert table.predicted_time(budget) <= plain.predicted_time(budget)
        for method in BASELINE_METHODS:
            try:
                assert schedule.time <= baseline_schedule(rich, method, budget).time + 1e-9
            except InfeasibleBudget:
                pass


def test_baselines_run_option_zero():
    chain = random_chain(9, 5)
    rich = with_random_options(chain, 5)
    for method in BASELINE_METHODS:
        a, b = baseline_schedule(chain, method, INF), baseline_schedule(rich, method, INF)
        assert (a.plan, a.ops, a.time, a.peak) == (b.plan, b.ops, b.time, b.peak)


def test_exhaustive_with_absent_options_matches_today():
    chain = random_chain(3, 7, max_size=6, max_time=5)
    same = chain.with_options(LayerOptions.from_columns(chain, [[], [], []]))
    for budget in range(int(chain.x_size[0]), 60, 7):
        assert exhaustive_optimum(same, budget) == exhaustive_optimum(chain, budget)


def test_format_and_names():
    plan = (Checkpoint(0, 2, (Layer(0, 1), Layer(1))),)
    assert format_plan(plan) == "[0-1: 0:1 1]"
    assert format_plan(plan, names=DOTS.options.names) == "[0-1: 0:dots 1]"
    assert DOTS.options.names == (("everything", "dots"), ("everything", ""))
    assert "options=[2, 1]" in repr(DOTS)


def test_equality_and_hash():
    again = BASE.with_options(LayerOptions.from_columns(
        BASE, [[dict(xbar_size=4, bwd_time=4, name="dots")], []]))
    assert again == DOTS and hash(again) == hash(DOTS)
    assert DOTS != BASE and DOTS.with_options(None) == BASE
    assert list(DOTS.num_options) == [2, 1] and list(BASE.num_options) == [1, 1]


def test_generator():
    chain = random_chain(30, 1)
    rich = with_random_options(chain, 2, options=4)
    assert rich == with_random_options(chain, 2, options=4)
    assert (rich.num_options == 4).all() and rich.is_integral
    assert (rich.options.xbar_size[:, 1:] <= chain.xbar_size[:, None]).all()
    varying = with_random_options(chain, 2, options=3, varying=True).num_options
    assert varying.min() >= 1 and varying.max() <= 3 and len(set(varying)) > 1
    with pytest.raises(ValueError, match="at least one option"):
        with_random_options(chain, 0, options=0)


# ------------------------------------------------------------------------------- bad input


def test_plans_with_options_out_of_range_are_refused():
    with pytest.raises(ValueError, match=r"Layer 0 offers 2 option\(s\) \(\[0, 1\]\), got option 2"):
        make_schedule(DOTS, (Layer(0, 2), Layer(1)))
    with pytest.raises(ValueError, match="Layer 1 offers 1 option"):
        make_schedule(DOTS, (Layer(0), Layer(1, 1)))
    with pytest.raises(ValueError, match="the chain has no options"):
        make_schedule(BASE, (Layer(0, 1), Layer(1)))
    with pytest.raises(ValueError, match="integer >= 0"):
        validate_plan((Layer(0, -1), Layer(1)), 0, 2)
    with pytest.raises(ValueError, match="integer"):
        validate_plan((Layer(0, 0.5), Layer(1)), 0, 2, chain=DOTS)
    with pytest.raises(ValueError, match="offers 2 option"):
        simulate(DOTS, [(OpKind.F_ALL, 0, 3)])
    with pytest.raises(ValueError, match="or \\(F_all, layer, option\\)"):
        simulate(DOTS, [(OpKind.F_CK, 0, 1)])


def _arrays(chain: Chain, K: int) -> dict:
    table = LayerOptions.of_chain(chain)
    return {f: np.repeat(getattr(table, f), K, axis=1)
            for f in ("xbar_size", "fwd_time", "fwd_tape_time", "bwd_time", "fwd_tmp",
                      "bwd_tmp", "output_in_tape", "valid")}


def test_bad_option_arrays_are_refused():
    good = _arrays(BASE, 2)
    with pytest.raises(ValueError, match=r"bwd_time must have shape \(2, 2\)"):
        LayerOptions(**{**good, "bwd_time": np.zeros((2, 3))})
    with pytest.raises(ValueError, match="2-d array"):
        LayerOptions(**{**good, "xbar_size": np.zeros(2)})
    with pytest.raises(ValueError, match=r"valid\[1, 0\] is false"):
        LayerOptions(**{**good, "valid": [[True, True], [False, True]]})
    with pytest.raises(ValueError, match=r"fwd_tmp\[0, 1\] = -1.0"):
        LayerOptions(**{**good, "fwd_tmp": [[0, -1], [0, 0]]})
    with pytest.raises(ValueError, match=r"fwd_tape_time\[0, 1\]"):
        LayerOptions(**{**good, "fwd_tape_time": [[1, 5], [1, 1]]})
    with pytest.raises(ValueError, match="2 rows of 2 names"):
        LayerOptions(**good, names=(("a",), ("b",)))
    with pytest.raises(ValueError, match="booleans"):
        LayerOptions(**{**good, "output_in_tape": [[1, 2], [1, 1]]})
    # Column 0 must be the chain's own fields.
    with pytest.raises(ValueError, match=r"options.bwd_time\[1, 0\] = 7.0 differs .*from_columns"):
        BASE.with_options(LayerOptions(**{**good, "bwd_time": [[2, 2], [7, 2]]}))
    with pytest.raises(ValueError, match="has 3 layers but the chain has 2"):
        BASE.with_options(LayerOptions.of_chain(random_chain(3, 0)))
    with pytest.raises(ValueError, match=r"xbar_size\[0, 1\] = 1.0 is smaller than x_size\[1\]"):
        BASE.with_options(LayerOptions(**{**good, "xbar_size": [[8, 1], [2, 2]]}))
    with pytest.raises(ValueError, match="LayerOptions or None"):
        Chain(fwd_time=[1], bwd_time=[1], x_size=[1, 1], xbar_size=[1], options="dots")


def test_bad_columns_are_refused():
    with pytest.raises(ValueError, match="one sequence of options per layer"):
        LayerOptions.from_columns(BASE, [[]])
    with pytest.raises(ValueError, match=r"missing keys \['bwd_time'\]"):
        LayerOptions.from_columns(BASE, [[dict(xbar_size=4)], []])
    with pytest.raises(ValueError, match=r"unknown keys \['bwd'\]"):
        LayerOptions.from_columns(BASE, [[dict(xbar_size=4, bwd_time=1, bwd=2)], []])


def test_ilp_refuses_options_and_names_rotor():
    chain = Chain.homogeneous(3)
    rich = chain.with_options(LayerOptions.from_columns(
        chain, [[dict(xbar_size=1, bwd_time=3)], [], []]))
    with pytest.raises(NotImplementedError, match="method='rotor'"):
        solve(rich, 10, method="ilp")
    assert solve(chain.with_options(LayerOptions.of_chain(chain)), 10, method="ilp").time == \
        solve(chain, 10, method="ilp").time


def test_x_read_size_per_option():
    """An option that recomputes from its input reads all of it; the whole tape frees x[0]
    after its forward. Where the layer before reads its output, the options must agree."""
    chain = dataclasses.replace(BASE, x_read_size=[0, 3])
    both = chain.with_options(LayerOptions.from_columns(
        chain, [[dict(xbar_size=4, bwd_time=4, x_read_size=2)], []]))
    assert both.option_x_free.tolist() == [[2.0, 0.0], [0.0, 0.0]]
    # storing everything: F_all(0) peaks at 2 + 8, then frees x0 (2); B(1) peaks at
    # 8 (tape0) + 2 (tape1) + 1 (g2) + 3 (g1) = 14, where the whole x0 gives 16
    assert make_schedule(both, (Layer(0), Layer(1))).peak == 14
    assert make_schedule(chain.with_options(None), (Layer(0), Layer(1))).peak == 14
    assert make_schedule(BASE, (Layer(0), Layer(1))).peak == 16
    # option 1 keeps x0 whole: 2 + 4 + 2 + 1 + 3
    assert make_schedule(both, (Layer(0, 1), Layer(1))).peak == 12
    check_exact(both)
    with pytest.raises(ValueError, match="one x_read_size"):
        c = dataclasses.replace(BASE, x_read_size=[2, 3])
        c.with_options(LayerOptions.from_columns(c, [[], [dict(xbar_size=2, bwd_time=1,
                                                               x_read_size=1)]]))
