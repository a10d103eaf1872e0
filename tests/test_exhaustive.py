"""The exhaustive oracle: known optima, an unpruned search, validity, and the baselines."""

import heapq
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver import (
    BASELINE_METHODS,
    Chain,
    InfeasibleBudget,
    LayerOptions,
    OpKind,
    apply_op,
    baseline_schedule,
    drop,
    exhaustive_optimum,
    exhaustive_search,
    initial_state,
    random_chain,
    simulate,
)
from solver.chain.exhaustive import replay

INF = math.inf

# x = [1, 2, 3], tapes [2, 3]: storing everything peaks at B(1) with x[0] + tape[0] + tape[1]
# + g[2] + g[1] = 1 + 2 + 3 + 3 + 2 = 11, and B(1) needs all of those in any sequence.
TWO = Chain(fwd_time=[1, 2], bwd_time=[2, 3], x_size=[1, 2, 3], xbar_size=[2, 3])
# Three unit layers (tape = output): storing everything peaks at 6 during B(2).
UNIT = Chain.homogeneous(3, fwd_time=1.0, bwd_time=1.0, x_size=1.0)


def unpruned_optimum(chain: Chain, budget: float) -> float:
    """Dijkstra over every state, every op (F_all with each option the layer offers) and
    every drop (x[0] and gradients included), with no reduction and no heuristic: the
    definition of the optimum, slow but plain."""
    start = initial_state(chain)
    if start.memory > budget:
        return INF
    L = chain.length
    moves = [(kind, i) for kind in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE, OpKind.B)
             for i in range(L)] + [(OpKind.LOSS, L)]
    moves += [(OpKind.F_ALL, i, k) for i in range(L) for k in range(1, chain.num_options[i])]
    best, counter = {}, itertools.count()
    heap = [(0.0, next(counter), start)]
    while heap:
        cost, _, state = heapq.heappop(heap)
        key = (state.x, state.tape, state.g, state.tape_options, state.cut, state.cut_options,
               state.rec)  # rec: x[i] cut by F_ck holds less (it was missing: a state after
        # F_ck(0) and a drop of x[1] looked like the start, holding all of x[0])
        if key in best:
            continue
        best[key] = cost
        if state.g & 1:
            return cost
        for op in moves:
            try:
                after, candidate, time = apply_op(chain, state, op)
            except ValueError:
                continue
            if candidate <= budget:
                heapq.heappush(heap, (cost + time, next(counter), after))
        for name in ("x", "tape", "g"):
            for k in range(L + 1):
                if getattr(state, name) >> k & 1:
                    heapq.heappush(heap, (cost, next(counter), drop(chain, state, (name, k))))
    return INF


def test_two_layers_known_optimum():
    assert exhaustive_optimum(TWO, 11) == 8.0  # store everything: 1+2 forward, 2+3 backward
    assert exhaustive_optimum(TWO, 10.5) == INF  # B(1) alone needs 11
    result = exhaustive_search(TWO, 100)
    assert result.ops == (("F_all", 0), ("F_all", 1), ("loss", 2), ("B", 1), ("B", 0))
    assert (result.time, result.peak) == (8.0, 11.0)


def test_unit_chain_known_optima():
    # Budget 6: store everything, each layer forward once and backward once: 6.
    assert exhaustive_optimum(UNIT, 6) == 6.0
    # Budget 5: one forward per layer means all three tapes, x[0], g[3] and g[2] at B(2): 6.
    # So at least one recomputation: 7. It is reached by freeing tape[0] early (before B(2))
    # and recomputing it after: a non-persistent schedule.
    result = exhaustive_search(UNIT, 5)
    assert result.time == 7.0 and result.peak <= 5
    assert ("drop", ("tape", 0)) in result.steps
    # Budget 4: B(2) needs x[0] + x[2] + tape[2] + g[3] + g[2] = 5 in any sequence.
    assert exhaustive_optimum(UNIT, 4.99) == INF


def test_input_larger_than_budget():
    assert exhaustive_search(TWO, 0.5) is None


def test_long_chains_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="at most 6 layers"):
        exhaustive_optimum(Chain.homogeneous(7), 100)


small_chains = st.builds(
    lambda length, seed, size, tape: random_chain(length, seed, max_size=size, max_time=5,
                                                  tape_forwards=tape),
    st.integers(1, 3), st.integers(0, 10**6), st.integers(1, 6), st.booleans(),
)


def _budgets(chain: Chain):
    """Integer budgets from below the infeasible end to above storing everything."""
    top = int(baseline_schedule(chain, "none", INF).peak)
    return st.integers(max(int(chain.x_size[0]) - 1, top // 2 - 1), top + 1)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), chain=small_chains)
def test_equals_the_unpruned_search(data, chain):
    """Also: inf exactly when no sequence of ops and drops fits."""
    budget = data.draw(_budgets(chain))
    assert exhaustive_optimum(chain, budget) == unpruned_optimum(chain, budget)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), chain=small_chains | st.builds(
    lambda seed: random_chain(4, seed, max_size=8, max_time=5), st.integers(0, 10**6)))
def test_result_is_valid_and_beats_every_fitting_baseline(data, chain):
    budget = data.draw(_budgets(chain))
    result = exhaustive_search(chain, budget)
    if result is None:
        for method in BASELINE_METHODS:
            with pytest.raises(InfeasibleBudget):
                baseline_schedule(chain, method, budget)
        return
    assert replay(chain, result.steps) == (result.time, result.peak)
    assert result.peak <= budget
    if not result.drops:
        assert simulate(chain, result.ops) == (result.time, result.peak)
    for method in BASELINE_METHODS:
        try:
            baseline = baseline_schedule(chain, method, budget)
        except InfeasibleBudget:
            continue
        assert result.time <= baseline.time


def test_replay_rejects_bad_steps():
    with pytest.raises(ValueError, match="not stored"):
        replay(TWO, [("drop", ("x", 1))])
    with pytest.raises(ValueError, match="never computes"):
        replay(TWO, [("F_all", 0)])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), chain=small_chains | st.builds(
    lambda seed: random_chain(4, seed, max_size=8, max_time=5), st.integers(0, 10**6)))
def test_never_above_rotor(data, chain):
    """Rotor is optimal among persistent schedules only; the oracle searches all sequences."""
    solve = pytest.importorskip("solver.solve").solve
    budget = data.draw(_budgets(chain))
    try:
        rotor = solve(chain, budget, method="rotor")
    except InfeasibleBudget:
        return
    assert rotor.peak <= budget
    assert exhaustive_optimum(chain, budget) <= rotor.time


def test_beats_persistent_schedules_on_the_unit_chain():
    """At budget 5 the best persistent schedule (Rotor, exact with slots = budget) needs a
    checkpoint and takes 8; freeing tape[0] early and recomputing it takes 7."""
    solve = pytest.importorskip("solver.solve").solve
    assert solve(UNIT, 5, method="rotor", slots=5).time == 8.0
    assert exhaustive_optimum(UNIT, 5) == 7.0


def test_a_checkpointing_forward_that_only_cuts_its_input_is_tried():
    """``F_ck(1)`` after ``B(2)`` computes only ``x[2]``, which nobody reads, but cuts
    ``x[1]`` to what its recomputation reads (``x_rec_size``), so that ``F_all(1)`` with
    option 1 fits: the only schedule of time 0 here (a hypothesis draw of
    ``test_options.py``; the search skipped that move and found 1.0)."""
    a = np.array
    options = LayerOptions(
        xbar_size=a([[9., 5.], [2., 3.], [6., 0.]]), fwd_time=np.zeros((3, 2)),
        fwd_tape_time=np.zeros((3, 2)), bwd_time=a([[0., 1.], [0., 0.], [0., 0.]]),
        fwd_tmp=a([[3., 0.], [0., 3.], [0., 0.]]), bwd_tmp=a([[0., 0.], [1., 0.], [2., 0.]]),
        output_in_tape=a([[False, True], [True, False], [False, True]]),
        valid=a([[True, True], [True, True], [True, False]]),
        names=(("everything", "option 1"),) * 2 + (("everything", ""),),
        x_read_size=a([[1., 0.], [3., 3.], [0., 0.]]))
    chain = Chain(fwd_time=np.zeros(3), bwd_time=np.zeros(3), x_size=a([1., 5., 2., 3.]),
                  xbar_size=a([9., 2., 6.]), fwd_tmp=a([3., 0., 0.]), bwd_tmp=a([0., 1., 2.]),
                  output_in_tape=a([False, True, False]), fwd_tape_time=np.zeros(3),
                  options=options, x_read_size=a([1., 3., 0.]), x_rec_size=a([1., 3., 0.]))
    assert unpruned_optimum(chain, 17) == 0.0
    assert exhaustive_search(chain, 17).time == 0.0
