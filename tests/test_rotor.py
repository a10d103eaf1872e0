"""Rotor's DP against an independent memoised implementation of its recurrence.

The reference below is written from ALGORITHMS.md section 2 directly (recursion over
``(m, i, l)`` with ``functools.lru_cache``), with the documented chain-option correction
(solver/chain/rotor.py): ``F_all(i)`` runs while ``g[l+1]`` is held, so the chain option needs
``m >= cw[l+1] + cbw[i+1] + ftmp[i]`` for it and ``m >= cw[i] + cw[i+1] + cbw[i+1] +
btmp[i]`` for ``B(i)``, instead of the published ``Opt[m][i][i]`` (which charges ``F_all(i)``
as if ``g[i+1]`` were held). ``corrected=False`` gives the published recurrence.

Outputs outside the tape (``Chain.output_in_tape[i]`` false, :mod:`solver.chain.simulator`) change
one term: ``B(i)`` holds ``tape[i]`` without ``x[i+1]`` (freed at the end of the sub-solve,
whose input it is), so it needs ``cout[i+1]`` less, ``cout[i+1] = x_size[i+1]`` where the
flag is false. Every other term is unchanged (see solver/chain/rotor.py). The brute-force tests
at the end check the DP against every plan of small chains under the flagged simulator.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from solver import Chain, Checkpoint, InfeasibleBudget, Layer, make_schedule, simulate
from solver.chain.options import base_forward_tmp
from solver.chain.schedule import plan_to_ops
from solver.chain.simulator import memory_trace
from solver.chain.rotor import RotorTable, min_peak_schedule, plan_from_decisions, rotor_min_budget

from plans import check_exact, negative_bwd_tmps
from tiers import sweep

INF = math.inf


def reference(chain: Chain, corrected: bool = True):
    """``solve(budget) -> (time, plan)`` by plain memoised recursion (integer sizes)."""
    L = chain.length
    cw = [int(v) for v in chain.x_size] + [0]
    cbw = [0] + [int(v) for v in chain.xbar_size] + [0]
    cout = [0] + [0 if keep else int(v)
                  for keep, v in zip(chain.output_in_tape, chain.x_size[1:])] + [0]
    ftmp = [int(v) for v in chain.fwd_tmp] + [0]
    btmp = [int(v) for v in chain.bwd_tmp] + [0]
    fw = [float(v) for v in chain.fwd_time] + [0.0]
    bw = [float(v) for v in chain.bwd_time] + [0.0]
    ft = [float(v) for v in chain.fwd_tape_time] + [0.0]  # F_all(i) while g[i+1] is held
    # its peak above the whole tape (the tape-only forward's, less a dropped output)
    fttr = [int(t) - c for t, c in zip(base_forward_tmp(chain)[:, 0], cout[1:])] + [0]

    @functools.lru_cache(maxsize=None)
    def opt(m: int, i: int, l: int):
        """(time, plan items for layers i..min(l, L-1)) or (inf, None)."""
        if i == l:
            need = max(cw[i + 1] + cbw[i + 1] + fttr[i],
                       cw[i] + cw[i + 1] + cbw[i + 1] - cout[i + 1] + btmp[i])
            if m < need:
                return INF, None
            return ft[i] + bw[i], ((Layer(i),) if i < L else ())
        lower = cw[l + 1] + max(
            [cw[i + 1] + ftmp[i]] + [cw[k] + cw[k + 1] + ftmp[k] for k in range(i + 1, l)]
        )
        if m < lower:
            return INF, None
        best, plan = INF, None
        # Chain option first: ties favour storing.
        if corrected:
            fits = m >= max(cw[l + 1] + cbw[i + 1] + ftmp[i],
                            cw[i] + cw[i + 1] + cbw[i + 1] - cout[i + 1] + btmp[i])
            t0 = fw[i] + bw[i] if fits else INF
        else:  # Opt[m][i][i], the base case, but with the chain option's full forward
            t0 = opt(m, i, i)[0] - ft[i] + fw[i]
        if m >= cbw[i + 1]:
            t1, rest = opt(m - cbw[i + 1], i + 1, l)
            if t0 + t1 < best:
                best, plan = t0 + t1, (Layer(i),) + rest
        for j in range(i + 1, l + 1):
            if m < cw[j]:
                continue
            t1, rest = opt(m - cw[j], j, l)
            t2, body = opt(m, i, j - 1)
            t = sum(fw[i:j]) + t1 + t2
            if t < best:
                best, plan = t, (Checkpoint(i, j, body),) + rest
        return best, plan

    def solve(budget: int):
        if budget < cw[0]:
            return INF, None
        return opt(budget - cw[0], 0, L)

    return solve


def no_remat_peak(chain: Chain) -> float:
    return make_schedule(chain, tuple(Layer(i) for i in range(chain.length))).peak


@st.composite
def integer_chains(draw, max_layers=5, flagged=False, read=False, rec=False):
    L = draw(st.integers(1, max_layers))
    ints = lambda n, hi: draw(st.lists(st.integers(0, hi), min_size=n, max_size=n))
    x = ints(L + 1, 6)
    extra = ints(L, 4)
    fwd = ints(L, 5)
    # B(i) reads x_read[i] of x[i]; F_all(i) may free at most its tape, x[i+1] + extra[i].
    x_read = ([draw(st.integers(max(0, x[i] - x[i + 1] - extra[i]), x[i])) for i in range(L)]
              if read else None)
    # A checkpoint x[i] keeps x_rec[i] (at least what B(i) reads) for its recomputation.
    x_rec = ([draw(st.integers(x_read[i] if read else x[i], x[i])) for i in range(L)]
             if rec else None)
    return Chain(
        x_read_size=x_read,
        x_rec_size=x_rec,
        fwd_time=fwd,
        fwd_tape_time=[draw(st.integers(0, f)) for f in fwd],
        bwd_time=ints(L, 5),
        x_size=x,
        xbar_size=[x[i + 1] + extra[i] for i in range(L)],
        fwd_tmp=ints(L, 3),
        bwd_tmp=negative_bwd_tmps(draw, x),
        output_in_tape=draw(st.lists(st.booleans(), min_size=L, max_size=L)) if flagged else None,
        fwd_tape_tmp=ints(L, 4) if draw(st.booleans()) else None,
    )


def check_every_budget(chain: Chain) -> None:
    """Every integer budget 1..no-remat peak + 1, exact table (unit 1): DP == reference."""
    ref = reference(chain)
    top = int(no_remat_peak(chain)) + 1
    table = RotorTable(chain, top, slots=max(top, 1))
    assert table.exact and table.unit == 1.0
    min_budget = rotor_min_budget(chain)
    assert min_budget == table.min_budget
    first_feasible = next(b for b in range(0, top + 1) if ref(b)[0] < INF)
    assert min_budget == first_feasible
    for budget in range(1, top + 1):
        expected, _ = ref(budget)
        if budget < min_budget:
            assert expected == INF
            assert table.predicted_time(budget) == INF
            with pytest.raises(InfeasibleBudget) as info:
                table.schedule(budget)
            assert info.value.min_budget == min_budget
            continue
        schedule = table.schedule(budget)
        assert simulate(chain, schedule.ops) == (schedule.time, schedule.peak)
        assert schedule.peak <= budget
        assert schedule.time == expected
        assert table.predicted_time(budget) == expected
    # Memory to store everything: no recomputation at all (the published recurrence fails
    # this when a layer's fwd_tmp is charged beside a gradient that is not yet there).
    assert table.schedule(max(top - 1, 1)).time == chain.fwd_time.sum() + chain.bwd_time.sum()


@sweep(300, quick=75)
@given(integer_chains())
def test_matches_reference_at_every_budget(chain):
    check_every_budget(chain)


@settings(max_examples=60, deadline=None)
@given(integer_chains(max_layers=8))
def test_longer_chains_match_reference(chain):
    check_every_budget(chain)


@settings(max_examples=100, deadline=None)
@given(integer_chains())
def test_min_peak_schedule_attains_min_budget(chain):
    schedule = min_peak_schedule(chain)
    assert simulate(chain, schedule.ops) == (schedule.time, schedule.peak)
    assert schedule.peak == rotor_min_budget(chain)


@settings(max_examples=40, deadline=None)
@given(integer_chains(), st.data())
def test_table_for_each_budget_equals_one_big_table(chain, data):
    top = int(no_remat_peak(chain)) + 1
    budget = data.draw(st.integers(max(1, int(rotor_min_budget(chain))), top))
    big = RotorTable(chain, top, slots=top)
    own = RotorTable(chain, budget, slots=budget)
    assert own.schedule(budget).plan == big.schedule(budget).plan


def test_hand_checked_single_layer():
    # F_all(0): 2, loss: 3, B(0): 4. The only schedule; time 1 + 1.
    chain = Chain(fwd_time=[1], bwd_time=[1], x_size=[1, 1], xbar_size=[1])
    assert rotor_min_budget(chain) == 4
    table = RotorTable(chain, 10, slots=10)
    assert (table.schedule(4).time, table.schedule(4).peak) == (2, 4)
    with pytest.raises(InfeasibleBudget, match="smallest budget that works is 4"):
        table.schedule(3)


def test_hand_checked_two_layers():
    # Tapes twice the activations. Storing both tapes peaks at 7 during B(1)
    # (x0 + tape0 + tape1 + g2 + g1 = 1 + 2 + 2 + 1 + 1). Checkpointing layer 0 alone
    # (F_ck(0), F_all(1), loss, B(1), F_all(0), B(0)) peaks at 6 for one extra forward.
    chain = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[1, 1, 1], xbar_size=[2, 2])
    table = RotorTable(chain, 8, slots=8)
    assert table.min_budget == 6
    assert table.schedule(7).plan == (Layer(0), Layer(1))
    assert (table.schedule(7).time, table.schedule(7).peak) == (4, 7)
    six = table.schedule(6)
    assert six.plan == (Checkpoint(0, 1, (Layer(0),)), Layer(1))
    assert (six.time, six.peak) == (5, 6)
    with pytest.raises(InfeasibleBudget):
        table.schedule(5)


def test_homogeneous_chain_recomputes_less_with_more_memory():
    chain = Chain.homogeneous(30, fwd_time=1.0, bwd_time=2.0, x_size=1.0, xbar_size=1.0)
    top = int(no_remat_peak(chain))
    table = RotorTable(chain, top, slots=top)
    times = [table.schedule(b).time for b in range(int(table.min_budget), top + 1)]
    assert all(a >= b for a, b in zip(times, times[1:]))
    assert times[-1] == 90.0
    # At the minimum budget every forward is recomputed many times.
    assert times[0] > 90.0 + 30


def test_chain_option_correction_is_needed():
    # Without the correction the recurrence lets F_all(0) (fwd_tmp 11) run inside a
    # checkpoint body beside the incoming gradient without counting it: at budget 22 it
    # claims time 21 with a plan that overflows; the true optimum is 24.
    chain = Chain(fwd_time=[3, 3, 2], bwd_time=[2, 2, 3], x_size=[5, 1, 3, 5],
                  xbar_size=[4, 5, 5], fwd_tmp=[11, 2, 0], bwd_tmp=[0, 1, 1])
    t_bad, plan_bad = reference(chain, corrected=False)(22)
    assert t_bad == 21 and make_schedule(chain, plan_bad).peak > 22
    table = RotorTable(chain, 40, slots=40)
    schedule = table.schedule(22)
    assert schedule.peak <= 22
    assert schedule.time == reference(chain)(22)[0] == 24


def test_chain_option_does_not_overcount():
    # Storing the tape peaks at 4 (F_all(0): tape 2 + fwd_tmp 2; loss: tape 2 + g1 2).
    # The published recurrence charges F_all(0) beside g[1], which does not exist yet, and
    # finds nothing below 6.
    chain = Chain(fwd_time=[1], bwd_time=[1], x_size=[0, 2], xbar_size=[2], fwd_tmp=[2])
    assert reference(chain, corrected=False)(5)[0] == INF
    assert rotor_min_budget(chain) == 4
    assert RotorTable(chain, 4, slots=4).schedule(4).plan == (Layer(0),)


@pytest.mark.parametrize("flagged,cut", [(False, False), (True, False), (True, True)])
def test_rounded_table_fits_real_budget(flagged, cut):
    rng = np.random.default_rng(3)
    for _ in range(20):
        L = int(rng.integers(2, 30))
        x = rng.uniform(0.5, 10, L + 1)
        flags = rng.random(L) < 0.5 if flagged else None
        # inputs read in part, checkpoints held in part (at least what B reads)
        read = x[:L] * rng.uniform(0.2, 1, L) if cut else None
        rec = read + (x[:L] - read) * rng.uniform(0, 1, L) if cut else None
        chain = Chain(fwd_time=rng.uniform(0, 3, L), bwd_time=rng.uniform(0, 5, L), x_size=x,
                      xbar_size=x[1:] * rng.uniform(1, 3, L) + (x[:L] if cut else 0),
                      fwd_tmp=rng.uniform(0, 4, L),
                      bwd_tmp=rng.uniform(0, 4, L), output_in_tape=flags, x_read_size=read,
                      x_rec_size=rec)
        low, high = rotor_min_budget(chain), no_remat_peak(chain)
        table = RotorTable(chain, high, slots=int(rng.integers(5, 300)))
        assert not table.exact
        for budget in np.linspace(low, high, 7):
            schedule = table.schedule(budget)
            assert schedule.peak <= budget * (1 + 1e-12)
            predicted = table.predicted_time(budget)
            if predicted < INF:  # not the min-peak fallback: the DP's time is the real time
                assert schedule.time == pytest.approx(predicted, rel=1e-5)


def test_plan_reconstruction_is_not_recursive():
    # One snapshot's worth of memory on a long chain nests checkpoints ~L deep; rebuilding
    # the plan must not hit Python's recursion limit (plan_to_ops is not tested here).
    L = 1500
    decide = lambda i, l: i + 1 if l - i >= 2 else 0  # noqa: E731
    plan = plan_from_decisions(L, decide)
    depth, item = 0, plan[0]
    assert isinstance(item, Checkpoint) and (item.start, item.stop) == (0, 1)
    # Leaf at i+1 everywhere: a flat spine of single-layer checkpoints, then Layer(L-1).
    assert len(plan) == L and plan[-1] == Layer(L - 1)
    deep = plan_from_decisions(L, lambda i, l: l if l - i >= 1 else 0)
    while isinstance(deep[0], Checkpoint):
        deep = deep[0].body
        depth += 1
    assert depth == L


def test_rejects_bad_table_arguments():
    chain = Chain.homogeneous(3)
    with pytest.raises(ValueError, match="max_budget"):
        RotorTable(chain, 0.0)
    with pytest.raises(ValueError, match="slots"):
        RotorTable(chain, 10.0, slots=0)
    table = RotorTable(chain, 10.0, slots=10)
    with pytest.raises(ValueError, match="exceeds the table's max_budget"):
        table.schedule(11.0)


@pytest.mark.slow  # a large instance: 1100 layers
def test_deeply_nested_schedule_beyond_the_recursion_limit():
    # A homogeneous chain at its minimum budget keeps one extra activation: checkpoints
    # nest ~L deep, more than Python's default recursion limit of 1000.
    L = 1100
    chain = Chain.homogeneous(L, fwd_time=1.0, bwd_time=2.0, x_size=1.0, xbar_size=1.0)
    budget = rotor_min_budget(chain)
    assert budget == 5
    table = RotorTable(chain, budget, slots=500)
    schedule = table.schedule(budget)  # plan_to_ops recurses once per nesting level
    assert schedule.peak <= budget
    assert schedule.time == table.predicted_time(budget)
    # Recomputing from the start: quadratic in L.
    assert schedule.num_forwards > L * (L - 1) / 2


# --- outputs outside the tape (Chain.output_in_tape): exact against every plan --------


@settings(max_examples=150, deadline=None)
@given(integer_chains(flagged=True))
def test_flagged_chains_match_reference_at_every_budget(chain):
    check_every_budget(chain)


@sweep(300, quick=75)
@given(integer_chains(max_layers=4, flagged=True))
def test_flagged_dp_is_exact_over_every_plan(chain):
    """At every integer budget the DP's time is the least flagged simulated time of the plans
    that fit, and its minimum budget is the least flagged simulated peak of any plan."""
    check_exact(chain)


def test_output_outside_the_tape_lowers_the_backward():
    # x = [5, 4, 1], tape0 = 4 (all of it x1). B(0) needs x0 + g0 + g1 + tape0 = 18 with x1
    # in tape0, whatever the plan. When layer 0's backward does not read x1, B(1) frees it
    # and B(0) needs 14; storing everything then peaks at B(1): x0 + x1 + g1 + tape1 + g2
    # = 15, which the DP must see.
    kept = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[5, 4, 1], xbar_size=[4, 1])
    freed = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[5, 4, 1], xbar_size=[4, 1],
                  output_in_tape=[False, True])
    store_all = (Layer(0), Layer(1))
    assert make_schedule(kept, store_all).peak == 18
    assert make_schedule(freed, store_all).peak == 15
    assert rotor_min_budget(kept) == 18 and rotor_min_budget(freed) == 15
    table = RotorTable(freed, 15, slots=15)
    assert table.min_budget == 15 and table.schedule(15).plan == store_all


# --- inputs read in part (Chain.x_read_size): exact against every plan ----------------


@sweep(300, quick=75)
@given(integer_chains(max_layers=4, flagged=True, read=True))
def test_read_part_dp_is_exact_over_every_plan(chain):
    """With x_read_size < x_size, the DP's time at every budget is still the least simulated
    time of the plans that fit, and its minimum budget the least simulated peak."""
    check_exact(chain)


def test_unread_input_is_freed_by_its_forward():
    # x = [6, 2, 1], tapes [5, 1]; B(0) reads 1 of x0's 6, B(1) all of x1. Storing
    # everything: F_all(0) peaks at 6 + 5 = 11, then x0 shrinks to 1; F_all(1) and the loss
    # bring memory to 8; B(1) adds g1 = 2 (10); B(0) holds x0's 1, tape0 5, g1 2 and adds
    # g0 = 6: 14, where the whole x0 gives 19.
    full = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[6, 2, 1], xbar_size=[5, 1])
    part = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[6, 2, 1], xbar_size=[5, 1],
                 x_read_size=[1, 2])
    store_all = (Layer(0), Layer(1))
    assert make_schedule(full, store_all).peak == 19
    assert make_schedule(part, store_all).peak == 14
    assert rotor_min_budget(part) == 14
    table = RotorTable(part, 14, slots=14)
    assert table.schedule(14).plan == store_all
    assert part.x_free.tolist() == [5.0, 0.0]
    # The default keeps every chain's meaning.
    assert full.x_read_size.tolist() == [6.0, 2.0] and not full.x_free.any()


def test_x_read_size_is_checked():
    kw = dict(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[6, 2, 1], xbar_size=[2, 1])
    assert Chain(**kw, x_read_size=[4, 1]).x_free.tolist() == [2.0, 1.0]
    with pytest.raises(ValueError, match="exceeds x_size"):
        Chain(**kw, x_read_size=[7, 2])
    with pytest.raises(ValueError, match="layer 0.s tape"):
        Chain(**kw, x_read_size=[3, 2])  # would free 3 of x0 beside a tape of 2
    with pytest.raises(ValueError, match="x_read_size"):
        Chain(**kw, x_read_size=[1])


# --- checkpoints held in part (Chain.x_rec_size): exact against every plan --------------


@sweep(300, quick=75)
@given(integer_chains(max_layers=4, flagged=True, read=True, rec=True))
def test_checkpoint_part_dp_is_exact_over_every_plan(chain):
    """With x_rec_size < x_size (F_ck(i) cuts x[i] to what its recomputation reads), the
    DP's time at every budget is the least simulated time of the plans that fit, and its
    minimum budget the least simulated peak (its two contexts: a subproblem's input whole,
    or already cut)."""
    check_exact(chain)


def test_checkpoint_is_cut_by_its_forward():
    # x = [4, 4, 1], tapes [4, 1]; B(0) reads 1 of x0 and B(1) 3 of x1, and so do the
    # recomputations. Every layer checkpointed: F_ck(0) peaks at x0 + x1 = 8, then x0 is
    # cut to 1 (5 held, 8 without the cut); F_ck(1) peaks at 1 + 4 + 1 = 6 and cuts x1 to 3
    # (5 held, 9 without). The recomputation's F_all(1) reads the cut x1.
    kw = dict(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[4, 4, 1], xbar_size=[4, 1],
              x_read_size=[1, 3])
    whole, part = Chain(**kw), Chain(**kw, x_rec_size=[1, 3])
    plan = (Checkpoint(0, 1, (Layer(0),)), Checkpoint(1, 2, (Layer(1),)))
    ops = plan_to_ops(plan, 2)
    assert [m for _, m, _ in memory_trace(whole, ops)[:2]] == [8, 9]
    assert [m for _, m, _ in memory_trace(part, ops)][:2] == [5, 5]
    assert [p for _, _, p in memory_trace(part, ops)][:2] == [8, 6]
    assert part.x_rec_free.tolist() == [3.0, 1.0] and not whole.x_rec_free.any()
    check_exact(part)
    with pytest.raises(ValueError, match="x_rec_size"):
        Chain(**dict(kw, x_read_size=[2, 3]), x_rec_size=[1, 3])  # below what B(0) reads
    with pytest.raises(ValueError, match="exceeds x_size"):
        Chain(**kw, x_rec_size=[5, 3])


def test_negative_transients_do_not_make_a_tiny_budget_feasible():
    # Sizes above the table's capacity are clipped to it; a negative bwd_tmp (and a base-case
    # forward dropping its output) rounded on its own once made thresholds negative there
    # (writes before the table's rows). They are rounded with the size they offset now.
    chain = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[400, 400, 400], xbar_size=[900, 900],
                  bwd_tmp=[-400, -400], output_in_tape=[False, False], fwd_tape_tmp=[0, 0])
    least = rotor_min_budget(chain)
    for budget in (1.0, least / 100, least - 1):
        table = RotorTable(chain, budget, slots=50)
        assert table.plan(budget) is None
        with pytest.raises(InfeasibleBudget):
            table.schedule(budget)
    schedule = RotorTable(chain, least, slots=50).schedule(least)
    assert schedule.peak <= least == simulate(chain, plan_to_ops(schedule.plan, 2))[1]
