"""The chain simulator on hand-worked sequences."""

import pytest

from solver import Chain, Checkpoint, Layer, apply_op, drop, initial_state, make_schedule, simulate

CHAIN = Chain(fwd_time=[1, 2], bwd_time=[2, 3], x_size=[1, 2, 3], xbar_size=[2, 3])


def test_store_everything():
    # F_all(0): 1+2=3; F_all(1): 6; loss: 9; B(1): 9+2=11 -> frees g2, tape1 -> 5;
    # B(0): 5+1=6 -> frees g1, tape0, x0 -> 1.
    ops = [("F_all", 0), ("F_all", 1), ("loss", 2), ("B", 1), ("B", 0)]
    assert simulate(CHAIN, ops) == (8.0, 11.0)


def test_checkpoint_everything_recomputes():
    ops = [("F_ck", 0), ("F_none", 1), ("loss", 2), ("F_all", 0), ("F_all", 1), ("B", 1), ("B", 0)]
    assert simulate(CHAIN, ops) == (11.0, 11.0)
    schedule = make_schedule(CHAIN, (Checkpoint(0, 2, (Layer(0), Layer(1))),))
    assert schedule.ops == tuple(ops)
    assert (schedule.time, schedule.peak) == (11.0, 11.0)


@pytest.mark.parametrize(
    "ops, message",
    [
        ([("F_all", 1)], "x\\[1\\] is not available"),
        ([("F_all", 0), ("loss", 2)], "x\\[2\\] is not available"),
        ([("F_all", 0), ("F_all", 1), ("B", 1)], "g\\[2\\]"),
        ([("F_all", 2)], "out of range"),
        ([("jump", 0)], "Unknown op"),
        ([("F_all", 0), ("F_all", 1), ("loss", 2), ("B", 1)], "never computes g\\[0\\]"),
    ],
)
def test_invalid_sequences(ops, message):
    with pytest.raises(ValueError, match=message):
        simulate(CHAIN, ops)


# A three-layer chain with temporaries; sizes chosen so that every sum below is distinct.
TMP = Chain(
    fwd_time=[1, 2, 3],
    bwd_time=[10, 20, 30],
    x_size=[1, 2, 4, 8],
    xbar_size=[3, 5, 9],
    fwd_tmp=[1, 2, 3],
    bwd_tmp=[4, 5, 6],
)
NO_TMP = Chain(fwd_time=[1, 2, 3], bwd_time=[10, 20, 30], x_size=[1, 2, 4, 8], xbar_size=[3, 5, 9])

STORE_ALL = [("F_all", 0), ("F_all", 1), ("F_all", 2), ("loss", 3), ("B", 2), ("B", 1), ("B", 0)]
# F_none(1) reads x[1] from tape[0] and frees that tape; B(0) then needs tape[0] again.
RECOMPUTE = [
    ("F_all", 0), ("F_none", 1), ("F_all", 2), ("loss", 3), ("B", 2),
    ("F_ck", 0), ("F_all", 1), ("B", 1), ("F_all", 0), ("B", 0),
]


def _trace(chain, ops):
    """(state, peak candidate) after each op, applied one at a time."""
    state, out = initial_state(chain), []
    for op in ops:
        state, candidate, _ = apply_op(chain, state, op)
        out.append((state, candidate))
    return out


def test_store_all_with_temporaries():
    # Memory after each op: 4, 9, 18, loss 26 (x[3] sits in tape[2]: nothing freed),
    # B(2) 26+4=30 then -8-9 = 13 (x[2] sits in tape[1]: kept), B(1) 15 -> 6, B(0) 7 -> 1.
    # Candidates add fwd_tmp / bwd_tmp: 5, 11, 21, 26, 36, 20, 11.
    trace = _trace(TMP, STORE_ALL)
    assert [s.memory for s, _ in trace] == [4, 9, 18, 26, 13, 6, 1]
    assert [c for _, c in trace] == [5, 11, 21, 26, 36, 20, 11]
    assert simulate(TMP, STORE_ALL) == (66.0, 36.0)
    assert simulate(NO_TMP, STORE_ALL) == (66.0, 30.0)  # the same ops without temporaries


def test_f_none_frees_the_tape_it_read_from():
    (after_f_all, _), (after_f_none, candidate) = _trace(TMP, RECOMPUTE[:2])
    assert (after_f_all.x, after_f_all.tape) == (0b1, 0b1)
    # F_none(1): x[2] is stored (4 + 4 = 8, + fwd_tmp[1] = 10), then tape[0] is freed.
    assert candidate == 10
    assert (after_f_none.x, after_f_none.tape, after_f_none.memory) == (0b101, 0, 5)
    assert not after_f_none.has_x(1)


def test_f_none_frees_an_activation_stored_on_its_own():
    (_, _), (state, candidate) = _trace(TMP, [("F_ck", 0), ("F_none", 1)])
    # F_ck(0): 1 + 2 = 3 (+1); F_none(1): 3 + 4 = 7 (+2), then x[1] is freed: 5.
    assert candidate == 9
    assert (state.x, state.tape, state.memory) == (0b101, 0, 5)


def test_backward_frees_own_input_but_not_a_tape():
    trace = _trace(TMP, RECOMPUTE)
    # B(2) with x[2] on its own (from F_none(1)): frees g[3], tape[2] and x[2]: 26 -> 5.
    state, candidate = trace[4]
    assert (state.x, state.tape, state.g, state.memory, candidate) == (0b1, 0, 0b100, 5, 32)
    # B(1) with x[1] on its own (from F_ck(0)): 12 + 2 = 14 (+5), then -4 -5 -2 = 3.
    state, candidate = trace[7]
    assert (state.x, state.tape, state.g, state.memory, candidate) == (0b1, 0, 0b10, 3, 19)
    # In STORE_ALL, B(2) reads x[2] from tape[1] and leaves tape[1] alone: 26 -> 13.
    state, _ = _trace(TMP, STORE_ALL)[4]
    assert (state.x, state.tape, state.memory) == (0b1, 0b11, 13)
    # Forward time 1+2+3+1+2+1, backward 10+20+30; peak at B(2).
    assert simulate(TMP, RECOMPUTE) == (70.0, 32.0)
    assert simulate(NO_TMP, RECOMPUTE) == (70.0, 26.0)


def test_loss_frees_an_output_stored_on_its_own():
    # F_ck(0), F_ck(1), F_ck(2): 1+2+4+8 = 15; the loss stores g[3] (23) and frees x[3] (15).
    state, candidate = _trace(NO_TMP, [("F_ck", 0), ("F_ck", 1), ("F_ck", 2), ("loss", 3)])[-1]
    assert (candidate, state.memory, state.x, state.g) == (23, 15, 0b111, 0b1000)


def test_drop_frees_a_stored_value():
    state, _ = _trace(NO_TMP, [("F_all", 0), ("F_ck", 1)])[-1]
    assert state.memory == 1 + 3 + 4
    assert drop(NO_TMP, state, ("tape", 0)).memory == 5
    assert drop(NO_TMP, state, ("x", 2)).memory == 4
    with pytest.raises(ValueError, match="not stored"):
        drop(NO_TMP, state, ("x", 1))  # x[1] is only inside tape[0]


@pytest.mark.parametrize(
    "ops, message",
    [
        ([("F_all", 0), ("F_all", 0)], "tape\\[0\\] is already stored"),
        ([("F_ck", 0), ("F_ck", 0)], "x\\[1\\] is already stored"),
        ([("F_ck", 0), ("F_all", 1), ("F_none", 0)], "x\\[1\\] is already stored"),
        (STORE_ALL[:4] + [("loss", 3)], "g\\[3\\] is already stored"),
        # F_none(0) frees x[0], which nothing can recompute: B(0) lacks it.
        ([("F_none", 0), ("F_all", 1), ("F_all", 2), ("loss", 3), ("B", 2), ("B", 1), ("B", 0)],
         "x\\[0\\]"),
        ([("F_all", 0), ("F_none", 1), ("F_all", 2), ("loss", 3), ("B", 2), ("B", 1)],
         "tape\\[1\\], x\\[1\\] not available"),
    ],
)
def test_invalid_sequences_with_three_layers(ops, message):
    with pytest.raises(ValueError, match=message):
        simulate(TMP, ops)


# --- outputs outside the tape (Chain.output_in_tape) ------------------------------------

import dataclasses  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from solver import RotorTable, memory_trace, validate_plan  # noqa: E402

from plans import plans  # noqa: E402


def with_flags(chain: Chain, flags) -> Chain:
    return dataclasses.replace(chain, output_in_tape=list(flags))


def test_output_outside_the_tape_is_freed_by_the_next_backward():
    # layer 0's backward does not read x1: tape0 = 5 - 2 = 3, x1 stored on its own.
    chain = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[1, 2, 3], xbar_size=[5, 3],
                  output_in_tape=[False, True])
    ops = [("F_all", 0), ("F_all", 1), ("loss", 2), ("B", 1), ("B", 0)]
    after = [memory for _, memory, _ in memory_trace(chain, ops)]
    # 1+3+2; +3; +g2; B(1): +g1 then frees g2, tape1 and x1 (its own input); B(0): +g0 - 6
    assert after == [6.0, 9.0, 12.0, 6.0, 1.0]
    assert [peak for _, _, peak in memory_trace(chain, ops)][-1] == 7.0  # 9.0 with x1 in tape0
    assert simulate(chain, ops) == (4.0, 14.0)


def test_recomputed_last_layer_does_not_store_an_output_nobody_reads():
    # Checkpoint(0, 2): the recomputation's F_all(1) finds g2 stored, so x2 is computed
    # (it counts in that op's peak) but not stored: B(1) runs without it.
    chain = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[1, 2, 3], xbar_size=[3, 7],
                  output_in_tape=[True, False])
    plan = (Checkpoint(0, 2, (Layer(0), Layer(1))),)
    trace = memory_trace(chain, make_schedule(chain, plan).ops)
    # F_ck(0) F_none(1) loss F_all(0) F_all(1) B(1) B(0)
    assert [peak for _, _, peak in trace] == [3.0, 6.0, 7.0, 7.0, 14.0, 13.0, 7.0]
    assert [memory for _, memory, _ in trace][4] == 11.0  # 1 + tape0 3 + g2 3 + tape1 4
    assert make_schedule(chain, plan).peak == 14.0
    conservative = memory_trace(with_flags(chain, [True, True]), make_schedule(chain, plan).ops)
    assert [peak for _, _, peak in conservative][4:6] == [14.0, 16.0]


def test_tape_only_forward_when_the_gradient_is_there():
    # F_all(1) with g[2] stored (the last layer of a recomputed segment): fwd_tape_time.
    chain = Chain(fwd_time=[3, 5], bwd_time=[1, 1], x_size=[1, 1, 1], xbar_size=[1, 1],
                  fwd_tape_time=[1, 2])
    recompute = [("F_ck", 0), ("F_ck", 1), ("loss", 2), ("F_all", 1), ("B", 1), ("F_all", 0),
                 ("B", 0)]
    # the first forwards compute outputs (3 + 5); the recomputations only tapes (2 + 1)
    assert simulate(chain, recompute)[0] == 3 + 5 + 2 + 1 + 1 + 1
    store_all = [("F_all", 0), ("F_all", 1), ("loss", 2), ("B", 1), ("B", 0)]
    assert simulate(chain, store_all)[0] == 3 + 5 + 1 + 1
    assert simulate(dataclasses.replace(chain, fwd_tape_time=None), recompute)[0] == 18


def test_tape_forward_is_validated():
    with pytest.raises(ValueError, match=r"fwd_tape_time\[1\] = 6.0 exceeds fwd_time\[1\]"):
        Chain(fwd_time=[3, 5], bwd_time=[1, 1], x_size=[1, 1, 1], xbar_size=[1, 1],
              fwd_tape_time=[1, 6])
    with pytest.raises(ValueError, match="fwd_tape_time must have 2 entries"):
        Chain(fwd_time=[3, 5], bwd_time=[1, 1], x_size=[1, 1, 1], xbar_size=[1, 1],
              fwd_tape_time=[1])


def test_flags_are_validated():
    with pytest.raises(ValueError, match="output_in_tape must have 2 entries"):
        Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[1, 1, 1], xbar_size=[1, 1],
              output_in_tape=[True])
    with pytest.raises(ValueError, match="booleans"):
        Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[1, 1, 1], xbar_size=[1, 1],
              output_in_tape=[2, 0])
    chain = Chain(fwd_time=[1], bwd_time=[1], x_size=[1, 1], xbar_size=[1])
    assert chain.output_in_tape.tolist() == [True] and chain == with_flags(chain, [True])
    assert chain != with_flags(chain, [False])


@st.composite
def flagged_chains(draw, max_layers=3):
    L = draw(st.integers(1, max_layers))
    ints = lambda n, lo=0: draw(st.lists(st.integers(lo, 6), min_size=n, max_size=n))  # noqa: E731
    x = ints(L + 1, 1)
    extra = ints(L)
    return Chain(fwd_time=ints(L, 1), bwd_time=ints(L, 1), x_size=x,
                 xbar_size=[x[i + 1] + extra[i] for i in range(L)], fwd_tmp=ints(L),
                 bwd_tmp=ints(L), output_in_tape=draw(st.lists(st.booleans(), min_size=L,
                                                              max_size=L)))


@settings(max_examples=60, deadline=None)
@given(flagged_chains())
def test_outputs_outside_tapes_never_raise_a_plans_memory(chain):
    """Every plan runs under the flags, in the same time, never above the all-true peak: the
    dynamic programs (which plan with all-true flags) stay within budget."""
    conservative = with_flags(chain, [True] * chain.length)
    for plan in plans(0, chain.length):
        validate_plan(plan, 0, chain.length)
        tight, loose = make_schedule(chain, plan), make_schedule(conservative, plan)
        assert tight.time == loose.time
        assert tight.peak <= loose.peak
    budget = make_schedule(conservative, tuple(Layer(i) for i in range(chain.length))).peak
    for fraction in (0.6, 0.8, 1.0):
        try:
            schedule = RotorTable(chain, fraction * budget, 200).schedule(fraction * budget)
        except Exception:  # infeasible at this budget
            continue
        assert make_schedule(chain, schedule.plan).peak <= fraction * budget + 1e-9


def test_a_forward_after_the_backward_passed_its_layer_is_invalid():
    """Once ``B(i)`` has run nothing reads what layer ``i``'s forward computes; before the
    rule, a recomputation there could trigger the ``x_read_size`` cut of ``x[i]`` out of
    ``tape[i-1]`` for free, and the unpruned search of tests/test_exhaustive.py found a
    schedule cheaper than the exhaustive oracle's on a chain of zero forward times."""
    chain = Chain(fwd_time=[1.0, 1.0], bwd_time=[1.0, 1.0], x_size=[1.0, 1.0, 1.0],
                  xbar_size=[2.0, 2.0])
    ops = [("F_all", 0), ("F_all", 1), ("loss", 2), ("B", 1)]
    state = initial_state(chain)
    for op in ops:
        state, _, _ = apply_op(chain, state, op)
    with pytest.raises(ValueError, match="backward has passed layer 1"):
        apply_op(chain, state, ("F_all", 1))
    apply_op(chain, state, ("B", 0))  # the sequence goes on as before
