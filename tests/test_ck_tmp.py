"""Forwards without tape peak at a transient of their own (``Chain.fwd_ck_tmp``, issue 17.5).

``F_ck(i)`` and ``F_none(i)`` run the layer's plain forward, which keeps no tape; the chain
charged them ``fwd_tmp``, measured on the vjp's forward above the input and the whole tape,
which undercounts a plain forward that holds more beside ``x[i] + x[i+1]`` (a checkpointed
Flax ``LayerNorm`` block measured 512 B against 416 B predicted: tests/test_edge_inputs.py).
Here: the simulator charges ``fwd_ck_tmp`` there and only there, Rotor's DP and the
min-peak DP stay exact against every persistent plan and option, A* against an unpruned
search, revolve's compiled costs equal the simulator's, and the ILP's bound stays below
the optimum, with ``fwd_ck_tmp`` drawn above and below ``fwd_tmp``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plans import check_exact, every_plan_cost
from solver import (Chain, Checkpoint, Layer, OpKind, RotorTable, chain_time_bound,
                    exhaustive_search, memory_trace, random_chain, rotor_min_budget)
from solver.chain.baselines import revolve_costs, revolve_plan
from solver.chain.exhaustive import replay
from solver.chain.schedule import plan_to_ops
from solver.chain.simulator import make_schedule
from test_exhaustive import unpruned_optimum
from test_options import option_chains
from test_rotor import integer_chains

# x = 2 each; F_all's transient 1, the plain forward's 20 (layer 0) and 3 (layer 1).
CK = Chain(fwd_time=[1, 1], bwd_time=[1, 1], x_size=[2, 2, 2], xbar_size=[4, 4],
           fwd_tmp=[1, 1], fwd_ck_tmp=[20, 3])


def _candidates(chain, plan):
    """``{op: peak candidate}`` of the plan's ops (the first of each)."""
    found = {}
    for op, _, candidate in memory_trace(chain, plan_to_ops(plan, chain.length, chain=chain)):
        found.setdefault(op[:2], candidate)
    return found


def test_the_simulator_charges_the_plain_forward_to_forwards_without_tape():
    segment = (Checkpoint(0, 2, (Layer(0), Layer(1))),)
    own = _candidates(CK, segment)
    default = _candidates(dataclasses.replace(CK, fwd_ck_tmp=None), segment)
    # F_ck(0): x[0] + x[1] + 20; F_none(1): x[0] + x[1] + x[2] + 3 (fwd_tmp: 1 each)
    assert own[(OpKind.F_CK, 0)] == 24 and default[(OpKind.F_CK, 0)] == 5
    assert own[(OpKind.F_NONE, 1)] == 9 and default[(OpKind.F_NONE, 1)] == 7
    # the recomputation's F_all keep fwd_tmp (and fwd_tape_tmp's default) whatever fwd_ck_tmp
    for op in ((OpKind.F_ALL, 0), (OpKind.F_ALL, 1)):
        assert own[op] == default[op]
    assert make_schedule(CK, segment).peak == 24
    stored = (Layer(0), Layer(1))
    assert make_schedule(CK, stored).peak == make_schedule(
        dataclasses.replace(CK, fwd_ck_tmp=None), stored).peak


def test_fwd_ck_tmp_is_checked():
    with pytest.raises(ValueError, match="fwd_ck_tmp"):
        dataclasses.replace(CK, fwd_ck_tmp=[1])
    with pytest.raises(ValueError, match=r"fwd_ck_tmp\[1\]"):
        dataclasses.replace(CK, fwd_ck_tmp=[1, -1])
    assert CK != dataclasses.replace(CK, fwd_ck_tmp=None)
    assert not dataclasses.replace(CK, fwd_ck_tmp=[0.5, 0]).is_integral


def _with_ck(draw, chain: Chain) -> Chain:
    """``chain`` with ``fwd_ck_tmp`` drawn per layer, from below to above its ``fwd_tmp``."""
    return dataclasses.replace(chain, fwd_ck_tmp=[draw(st.integers(0, 8))
                                                  for _ in range(chain.length)])


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_dps_are_exact_with_the_plain_forwards_transient(data):
    """Rotor's DP (exact table) and the min-peak DP against every persistent plan and option
    under the simulator: chains without options (flagged outputs, inputs and checkpoints
    held in part) and with them."""
    plain = integer_chains(max_layers=4, flagged=True, read=True, rec=True)
    chain = data.draw(st.one_of(plain, option_chains(read=True, rec=True), option_chains()))
    check_exact(_with_ck(data.draw, chain))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_oracle_and_the_ilp_bound_with_the_plain_forwards_transient(data):
    """A* equals a plain Dijkstra over every op, option and drop, and is never slower than
    Rotor's plan; Rotor's plans fit every budget; the ILP's lower bound (which leaves
    forward transients out) stays below the optimum."""
    chain = _with_ck(data.draw, data.draw(option_chains(max_layers=3, max_options=2,
                                                        read=True, rec=True)))
    top = int(max(peak for _, peak in every_plan_cost(chain))) + 1
    budget = data.draw(st.integers(max(1, int(chain.x_size[0])), top))
    result = exhaustive_search(chain, budget)
    best = np.inf if result is None else result.time
    assert best == unpruned_optimum(chain, budget)
    if result is not None:
        assert replay(chain, result.steps) == (result.time, result.peak) and result.peak <= budget
    table = RotorTable(chain, top, slots=top)
    for b in range(max(1, int(np.ceil(rotor_min_budget(chain)))), top + 1):
        assert table.schedule(b).peak <= b
    if budget >= rotor_min_budget(chain):
        assert result is not None and result.time <= table.schedule(budget).time
    assert chain_time_bound(chain, budget).time <= best + 1e-9 * max(1.0, best if result else 1.0)


@settings(max_examples=30, deadline=None)
@given(length=st.integers(1, 20), seed=st.integers(0, 10**6))
def test_revolve_costs_equal_the_simulator_with_the_plain_forwards_transient(length, seed):
    chain = random_chain(length, seed, tape_forwards=True)
    rng = np.random.default_rng(seed + 2)
    chain = dataclasses.replace(chain, fwd_ck_tmp=rng.integers(0, 3, length) * chain.x_size[1:])
    counts, times, peaks = revolve_costs(chain)
    for s, time, peak in zip(counts, times, peaks):
        schedule = make_schedule(chain, revolve_plan(length, s))
        assert schedule.peak == peak and schedule.time == pytest.approx(time, rel=1e-12)
