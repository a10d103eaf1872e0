"""Rotor's slot count scaled with the chain's length (``solver.scaled_slots``): a short chain
gets finer memory units, which at a tight budget find the optimum the 500-slot table
missed (a whole-model fit's chain, recorded in ``tests/data/resnet6_options_chain.json``),
and ``remat_sequence`` solves with it."""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

import solver
from solver.chain.refine import shrink_options
from jaxremat import remat_sequence
from solver import Chain
from solver.chain.options import LayerOptions

DATA = pathlib.Path(__file__).parent / "data" / "resnet6_options_chain.json"
MLP = DATA.with_name("mlp16_plus_chain.json")
FINER = DATA.with_name("mlp16_finer_chain.json")
EXHAUSTIVE_OPTIMUM = 1.3234762240000001e-05
"""``solver.chain.exhaustive.exhaustive_optimum`` of the recorded chain at its budget (every
persistent plan and option; about two minutes of CPU, so recorded rather than rerun)."""


def recorded_chain(options: int | None = None, path: pathlib.Path = DATA) -> tuple[Chain, float]:
    """The chain recorded at ``path`` (its first ``options`` options per layer) and its
    budget."""
    data = json.loads(path.read_text())
    table = data.pop("options")
    budget = data.pop("budget")
    data.pop("source")
    keep = slice(None, options)
    table = {name: (value if value is None else tuple(tuple(row[keep]) for row in value)
                    if name == "names" else np.asarray(value)[:, keep])
             for name, value in table.items()}
    chain = Chain(**{name: np.asarray(value) for name, value in data.items()})
    return chain.with_options(LayerOptions(**table)), float(budget)


def test_scaled_slots_keeps_the_work_of_500_slots_at_200_layers():
    assert solver.scaled_slots(200) == 500
    assert solver.scaled_slots(400) == 500  # never fewer than asked
    assert solver.scaled_slots(100) == 2000
    assert solver.scaled_slots(6) == solver.MAX_SLOTS
    assert solver.scaled_slots(100, 1000) == 4000
    lengths = range(1, 300)
    slots = [solver.scaled_slots(n) for n in lengths]
    assert all(a >= b for a, b in zip(slots, slots[1:]))
    with pytest.raises(ValueError, match="positive"):
        solver.scaled_slots(0)


def test_the_scaled_table_finds_the_optimum_the_coarse_one_missed():
    chain, budget = recorded_chain()
    fewer, _ = recorded_chain(options=4)  # without the fifth option of each layer
    coarse = solver.solve(chain, budget, slots=500)
    fine = solver.solve(chain, budget, slots=solver.scaled_slots(chain.length))
    # a fifth option made the 500-slot table 4% slower than with four (rounding up at a
    # budget equal to a plan's peak): the scaled table reaches the exhaustive optimum
    assert coarse.time > solver.solve(fewer, budget, slots=500).time
    assert fine.time == pytest.approx(EXHAUSTIVE_OPTIMUM, rel=1e-9)
    assert fine.time <= solver.solve(fewer, budget, slots=solver.scaled_slots(6)).time
    assert fine.peak <= budget


def test_remat_sequence_solves_with_the_scaled_slots(monkeypatch):
    seen = []
    solve = solver.solve

    def spy(chain, budget, **kwargs):
        seen.append((chain.length, kwargs["slots"]))
        return solve(chain, budget, **kwargs)

    monkeypatch.setattr(solver, "solve", spy)
    layers = [lambda p, x: jnp.tanh(x @ p)] * 3
    params = [jnp.eye(4)] * 3
    remat_sequence(layers, "90%", slots=500).plan(params, jnp.ones((2, 4)))
    assert seen == [(3, solver.scaled_slots(3, 500))] and seen[0][1] > 500


def test_a_sibling_option_a_few_bytes_larger_does_not_cost_the_plan_that_fits():
    """The recorded MLP chain: ``dots_plus`` keeps 773 B more than ``dots`` per layer for
    less recomputation. At ``dots_saveable``'s measured memory the table, rounding up,
    rejects the all-``dots`` plan that fits to the byte and prefers ``dots_plus`` at every
    capacity above, so refinement found no plan that fits but a slower one (0.0134 of
    overhead against 0.0037 without the extra options). Swapping options back
    (``shrink_options``) finds it."""
    chain, budget = recorded_chain(path=MLP)
    fewer, _ = recorded_chain(options=2, path=MLP)  # the whole tape and dots only
    slots = solver.scaled_slots(chain.length)
    more, less = solver.solve(chain, budget, slots=slots), solver.solve(fewer, budget, slots=slots)
    assert more.peak <= budget and less.peak <= budget
    assert more.time <= less.time


def test_shrink_options_swaps_a_layer_again_for_a_larger_saving():
    """The recorded MLP chain with ``policies.py --finer``'s options (``finer:1`` keeps what
    ``dots`` keeps for less recomputation, ``finer:2`` 256 B more, ``finer:3`` 512 B more on
    layer 0 and 768 B on the others): at ``dots_saveable``'s measured memory the plan of
    ``finer:1`` and the whole tape last fits to the byte. The table's plans above the budget
    keep ``finer:2`` or ``finer:3`` and miss by exactly what swapping every layer down to
    ``finer:1`` saves.
    The greedy cover took each layer's cheapest swap per byte (one step down) and never
    swapped that layer again, so no cover existed and the plan fell to 0.0134 of overhead
    against the 0.0034 that ``solver.chain_time_bound`` proves optimal."""
    chain, budget = recorded_chain(path=FINER)
    base = chain.fwd_time.sum() + chain.bwd_time.sum()
    bound = solver.chain_time_bound(chain, budget)
    for slots in (500, solver.scaled_slots(chain.length)):
        schedule = solver.solve(chain, budget, slots=slots)
        assert schedule.peak <= budget
        assert schedule.time == pytest.approx(bound.time, rel=1e-12), schedule.time / base - 1
    # the plan the refinement hands over: layer 0 one step above finer:1 twice, the rest once
    over = (solver.Layer(0, 4),) + tuple(solver.Layer(i, 3) for i in range(1, 15)) + (
        solver.Layer(15),)
    assert solver.make_schedule(chain, over).peak == budget + 4096
    repaired = shrink_options(chain, over, budget)
    assert repaired is not None and repaired.peak <= budget
    assert repaired.time == pytest.approx(bound.time, rel=1e-12)


def test_shrink_options_changes_options_only_and_fits_or_gives_up():
    chain, budget = recorded_chain(path=MLP)
    all_plus = tuple(solver.Layer(i, 2) for i in range(chain.length - 1)) + (
        solver.Layer(chain.length - 1),)  # dots_plus everywhere, the whole tape last
    assert solver.make_schedule(chain, all_plus).peak > budget
    repaired = shrink_options(chain, all_plus, budget)
    assert repaired is not None and repaired.peak <= budget
    assert [item.index for item in repaired.plan] == [item.index for item in all_plus]
    # a budget no swap reaches: None; one the plan fits already: the plan as it is
    assert shrink_options(chain, all_plus, budget / 4) is None
    assert shrink_options(chain, all_plus, 2 * budget).plan == all_plus
