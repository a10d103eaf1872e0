"""The chain simulator on hand-worked sequences."""

import pytest

from solver import Chain, Checkpoint, Layer, make_schedule, simulate

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
