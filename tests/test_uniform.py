"""Issue 17.6: ``solve`` never loses to a uniform plan it could have made (every layer under
the same option, every tape, every layer checkpointed), and slot refinement never loses to
the DP's table at the budget."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

from solver import Chain, InfeasibleBudget, Layer, LayerOptions, RotorTable, make_schedule, rotor_min_budget, solve
from solver.chain.refine import refined_schedule
from solver.chain.uniform import UNIFORM_PREFIX, uniform_plans

from tiers import sweep

NAMES = ("dots", "dots_no_batch", "names:a")
_TOLERANCE = 1e-9


@st.composite
def named_option_chains(draw, max_layers=7):
    """Real-valued chains (sizes rounded by the DP's slots) whose layers offer a random
    subset of ``NAMES`` as options, and per layer an alias for some names it lacks."""
    L = draw(st.integers(1, max_layers))
    reals = lambda n, lo, hi: np.array(draw(st.lists(  # noqa: E731
        st.floats(lo, hi, allow_nan=False), min_size=n, max_size=n)))
    x = reals(L + 1, 0.1, 10.0)
    fwd = reals(L, 0.0, 3.0)
    chain = Chain(fwd_time=fwd, bwd_time=reals(L, 0.0, 6.0), x_size=x,
                  xbar_size=x[1:] * reals(L, 1.0, 4.0), fwd_tmp=reals(L, 0.0, 2.0),
                  bwd_tmp=reals(L, 0.0, 2.0),
                  fwd_tape_time=fwd * reals(L, 0.0, 1.0),
                  output_in_tape=draw(st.lists(st.booleans(), min_size=L, max_size=L)))
    extra, aliases = [], []
    for i in range(L):
        names = [n for n in NAMES if draw(st.booleans())]
        row = []
        for name in names:
            share = draw(st.floats(0.0, 1.0))
            row.append(dict(
                name=name,
                xbar_size=x[i + 1] + share * (chain.xbar_size[i] - x[i + 1]),
                bwd_time=chain.bwd_time[i] + draw(st.floats(0.0, 1.0)) * fwd[i],
                fwd_tape_time=chain.fwd_tape_time[i] * draw(st.floats(0.0, 1.0)),
                output_in_tape=draw(st.booleans()),
            ))
        extra.append(row)
        lacking = [n for n in NAMES if n not in names]
        aliases.append({n: draw(st.sampled_from(names + ["everything"]))
                        for n in lacking if names and draw(st.booleans())})
    return chain.with_options(LayerOptions.from_columns(chain, extra)), aliases


@sweep(full=300, quick=25)
@given(named_option_chains(), st.sampled_from([20, 500]), st.floats(1.0, 1.05))
def test_never_dearer_than_a_fitting_uniform_plan(case, slots, factor):
    chain, aliases = case
    plans = uniform_plans(chain, aliases)
    assert {"none", "every_layer"} <= set(plans)
    for method, plan in plans.items():
        uniform = make_schedule(chain, plan, method)
        budget = uniform.peak * factor
        chosen = solve(chain, budget, slots=slots, aliases=aliases)
        assert chosen.peak <= budget * (1 + _TOLERANCE)
        assert chosen.time <= uniform.time * (1 + _TOLERANCE) + 1e-12, (method, chosen.method)


def test_uniform_plans_follow_names_and_aliases():
    base = Chain(fwd_time=[1, 1, 1], bwd_time=[2, 2, 2], x_size=[1, 2, 2, 1],
                 xbar_size=[5, 5, 3])
    chain = base.with_options(LayerOptions.from_columns(base, [
        [dict(name="dots", xbar_size=3, bwd_time=3), dict(name="dots_no_batch", xbar_size=2,
                                                           bwd_time=3.5)],
        [dict(name="dots_no_batch", xbar_size=3, bwd_time=3)],
        [],
    ]))
    plans = uniform_plans(chain, [{}, {"dots": "dots_no_batch"}, {}])
    assert plans["uniform:dots"] == (Layer(0, 1), Layer(1, 1), Layer(2, 0))
    assert plans["uniform:dots_no_batch"] == (Layer(0, 2), Layer(1, 1), Layer(2, 0))
    assert uniform_plans(chain)["uniform:dots"] == (Layer(0, 1), Layer(1, 0), Layer(2, 0))
    merged = uniform_plans(chain, [{"names:a": "dots"}, {"names:a": "dots_no_batch"}, {}])
    assert merged["uniform:names:a"] == (Layer(0, 1), Layer(1, 1), Layer(2, 0))
    assert set(uniform_plans(base)) == {"none", "every_layer"}
    with pytest.raises(ValueError, match="one mapping per layer"):
        uniform_plans(chain, [{}])


def test_solve_runs_a_uniform_plan_by_name():
    """``method="uniform:<name>"`` is that plan, an InfeasibleBudget naming its peak below
    it, and a ValueError listing the plans for a name no layer has."""
    base = Chain(fwd_time=[1, 1, 1], bwd_time=[2, 2, 2], x_size=[1, 2, 2, 1],
                 xbar_size=[5, 5, 3])
    chain = base.with_options(LayerOptions.from_columns(base, [
        [dict(name="dots", xbar_size=3, bwd_time=3)], [dict(name="dots", xbar_size=3,
                                                             bwd_time=3)], []]))
    plan = uniform_plans(chain)["uniform:dots"]
    expected = make_schedule(chain, plan, "uniform:dots")
    chosen = solve(chain, expected.peak, method="uniform:dots")
    assert chosen.plan == plan and chosen.method == "uniform:dots"
    assert chosen.time == expected.time and chosen.peak == expected.peak
    with pytest.raises(InfeasibleBudget) as error:
        solve(chain, expected.peak - 0.5, method="uniform:dots")
    assert error.value.min_budget == expected.peak
    with pytest.raises(ValueError, match=r"uniform:dots'\]"):
        solve(chain, 100, method="uniform:names:a")
    with pytest.raises(ValueError, match="Unknown method"):
        solve(chain, 100, method="uniform:")


def _rounding_loser() -> tuple[Chain, float, float]:
    """A chain and budget (a uniform plan's peak) at which the 500-slot table alone returns a
    plan dearer than that uniform plan: what ``solve`` must not do."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        L = int(rng.integers(6, 14))
        x = rng.uniform(1.0, 10.0, L + 1)
        base = Chain(fwd_time=rng.uniform(1, 3, L), bwd_time=rng.uniform(2, 6, L), x_size=x,
                     xbar_size=x[1:] * rng.uniform(2, 4, L))
        chain = base.with_options(LayerOptions.from_columns(base, [[dict(
            name="dots", xbar_size=x[i + 1] * rng.uniform(1.0, 1.3),
            bwd_time=base.bwd_time[i] + 0.02 * base.fwd_time[i])] for i in range(L)]))
        uniform = make_schedule(chain, uniform_plans(chain)["uniform:dots"])
        table = RotorTable(chain, uniform.peak, 500).schedule(uniform.peak)
        if table.time > uniform.time * (1 + 1e-6):
            return chain, uniform.peak, uniform.time
    raise AssertionError("no chain where rounding costs the DP the uniform plan")


def test_rounding_no_longer_loses_the_uniform_plan():
    chain, budget, time = _rounding_loser()
    chosen = solve(chain, budget)
    assert chosen.peak <= budget * (1 + _TOLERANCE) and chosen.time <= time
    assert chosen.method in ("rotor", UNIFORM_PREFIX + "dots")
    # with coarse slots refinement cannot recover it: the uniform plan wins, and says so
    coarse = solve(chain, budget, slots=50)
    assert coarse.method == UNIFORM_PREFIX + "dots" and coarse.time == time


@sweep(full=200, quick=25)
@given(named_option_chains(), st.floats(0.0, 1.2))
def test_refinement_never_slower_than_the_table(case, share):
    chain, _ = case
    low = rotor_min_budget(chain)
    high = make_schedule(chain, uniform_plans(chain)["none"]).peak
    budget = max(low, low + share * (high - low))
    table = RotorTable(chain, budget, 500).schedule(budget)
    refined = refined_schedule(chain, budget, 500)
    assert refined.peak <= budget * (1 + _TOLERANCE)
    assert refined.time <= table.time


# ------------------------------------------------------------------ jaxremat's planning


def _plans_at_uniform_peaks():
    """A profiled attention/MLP stack and the frontend's plan at the predicted peak of each
    of its uniform policies (the frontend's aliases stand in for merged options), checked:
    no dearer than that policy's plan and within the budget."""
    from jaxremat.sequence.options import option_aliases
    from jaxremat.sequence.plan import solve_plan
    from jaxremat.sequence.profile import profile_sequence
    from test_policies import stack

    layers, params, x = stack()
    profile = profile_sequence(layers, params, x, costs="flops")
    aliases = [option_aliases(layer.dropped) for layer in profile.layers]
    uniform = {method: make_schedule(profile.chain, plan)
               for method, plan in uniform_plans(profile.chain, aliases).items()}
    assert any(m.startswith(UNIFORM_PREFIX) for m in uniform), "the stack has no options"
    plans = []
    for method, schedule in uniform.items():
        plan = solve_plan(profile, int(np.ceil(schedule.peak)), method="rotor", slots=500,
                          backend="checkpoint")
        assert plan.schedule.peak <= plan.budget
        assert plan.schedule.time <= schedule.time * (1 + _TOLERANCE), method
        plans.append(plan)
    return (layers, params, x), plans


def test_plan_at_each_uniform_policy_peak():
    _plans_at_uniform_peaks()


@pytest.mark.slow
def test_plans_at_uniform_peaks_give_plain_gradients():
    from jaxremat.sequence.apply import apply_plan
    from test_policies import assert_same_grads, plain

    (layers, params, x), plans = _plans_at_uniform_peaks()
    for plan in {p.schedule.plan: p for p in plans}.values():
        run = lambda p, x, plan=plan: apply_plan(plan.schedule.plan, layers, p, x,  # noqa: E731
                                                 policies=plan.policies)
        assert_same_grads(run, plain(layers), params, x)


def test_compare_table_footnotes_a_uniform_source():
    from solver.compare import ComparisonRow, format_table

    row = ComparisonRow(budget=5.0, methods=("rotor", "none"), times=(1.0, None),
                        peaks=(5.0, None), reference_time=1.0, reference_peak=9.0,
                        rotor_source=UNIFORM_PREFIX + "dots")
    table = format_table([row], units="")
    assert "+0.0%*" in table and "uniform option plan" in table
    plain_row = ComparisonRow(**{**row.__dict__, "rotor_source": "rotor"})
    assert "*" not in format_table([plain_row], units="")
