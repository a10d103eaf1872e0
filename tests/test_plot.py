"""Tests of jaxremat.sequence.plot: the numbers behind the plots, and the PNG itself."""

from __future__ import annotations

import re
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import solver
from solver import OpKind
from solver.solve import solve

from jaxremat.sequence.plot import memory_curves, plot_plan, plot_schedule, tradeoff_curve

UNLIMITED = 1e300


@pytest.fixture(scope="module")
def chain():
    return solver.random_chain(10, 7)


@pytest.mark.parametrize("fraction", [0.45, 0.6, 0.8, 1.0])
def test_memory_curve_matches_the_simulator(chain, fraction):
    none = solve(chain, UNLIMITED, method="none")
    schedule = solve(chain, fraction * none.peak)
    curve = memory_curves(chain, schedule)
    _, peak = solver.simulate(chain, schedule.ops)
    assert curve.peak == pytest.approx(peak)
    assert curve.peak <= fraction * none.peak * (1 + 1e-9)
    assert len(curve.during) == len(schedule.ops) == len(curve.after)
    assert np.all(curve.during >= curve.after - 1e-9 * peak)  # an op frees after it peaks
    # The forward phase is exactly the ops before the loss; recomputations are the extra
    # forwards, so their number is the total number of forwards minus one per layer.
    assert schedule.ops[curve.loss_index][0] == OpKind.LOSS
    assert curve.recomputed.size == schedule.num_forwards - chain.length
    assert all(schedule.ops[k][0] in ("F_all", "F_ck", "F_none") for k in curve.recomputed)
    # The memory ends holding g[0] only.
    assert curve.after[-1] == pytest.approx(chain.x_size[0])


def test_tradeoff_curve_is_rotor_never_worse_than_a_fitting_baseline(chain):
    curve = tradeoff_curve(chain, points=8)
    none = solve(chain, UNLIMITED, method="none")
    assert curve.budgets[0] == pytest.approx(curve.min_budget)
    assert curve.budgets[-1] == pytest.approx(none.peak)
    assert np.all(np.isfinite(curve.times)), "every budget >= min_budget must be feasible"
    # Below min_budget nothing fits.
    with pytest.raises(solver.InfeasibleBudget):
        solve(chain, curve.min_budget * 0.999)
    for budget, time in zip(curve.budgets, curve.times):
        for name, (peak, baseline_time) in curve.baselines.items():
            if peak <= budget:
                assert time <= baseline_time * (1 + 1e-9), (name, budget)
    # At the no-remat peak nothing needs recomputing.
    assert curve.times[-1] == pytest.approx(none.time)
    assert curve.no_remat_time == pytest.approx(none.time)
    assert set(curve.baselines) == {"none", "every_layer", "sqrt", "revolve"}


def _png_shape(path) -> tuple[int, ...]:
    import matplotlib.image

    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(path).shape


def test_plot_schedule_writes_a_png(chain, tmp_path):
    pytest.importorskip("matplotlib")
    none = solve(chain, UNLIMITED, method="none")
    schedule = solve(chain, 0.5 * none.peak)
    path = plot_schedule(chain, schedule, tmp_path / "plan.png", budget=0.5 * none.peak,
                         points=6)
    height, width = _png_shape(path)[:2]
    assert width > 1000 and height > 400


def test_plot_plan_of_a_jax_sequence(tmp_path):
    pytest.importorskip("matplotlib")
    from jaxremat.sequence.profile import profile_layers
    from jaxremat.sequence.remat import remat_sequence

    def layer(w, x):
        return jnp.tanh(x @ w)

    widths = [16, 32, 32, 16, 16, 8]
    params = [jnp.ones((a, b)) * 0.1 for a, b in zip(widths[:-1], widths[1:])]
    x = jnp.ones((64, widths[0]))
    chain = profile_layers([layer] * len(params), params, x)
    with pytest.raises(solver.InfeasibleBudget) as info:
        solve(chain, 1.0)
    no_remat = solve(chain, UNLIMITED, method="none").peak
    budget = int((info.value.min_budget + no_remat) / 2)
    seq = remat_sequence([layer] * len(params), budget)
    plan = seq.plan(params, x)
    path = plan.plot(tmp_path / "seq.png", points=5)
    assert _png_shape(path)[1] > 1000
    # The same through the module function.
    assert _png_shape(plot_plan(plan, tmp_path / "seq2.png", points=5))[1] > 1000


def test_plot_plan_rejects_other_objects(tmp_path):
    with pytest.raises(TypeError, match="plot_schedule"):
        plot_plan(object(), tmp_path / "x.png")


def test_missing_matplotlib_names_the_extra(chain, tmp_path, monkeypatch):
    schedule = solve(chain, UNLIMITED)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match=r"pip install jaxremat\[plot\]"):
        plot_schedule(chain, schedule, tmp_path / "x.png")


def test_plan_compare_table(chain):
    from jaxremat import Plan

    none = solve(chain, UNLIMITED, method="none")
    budget = 0.6 * none.peak
    plan = Plan(chain=chain, schedule=solve(chain, budget), budget=budget, method="rotor",
                backend="checkpoint", costs="static", layers=())
    table = plan.compare()
    lines = [line for line in table.splitlines() if not line.startswith("*")]
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines]
    header, rows = cells[0], cells[2:]
    assert header[2:] == ["rotor", "none", "every_layer", "sqrt", "revolve"]
    assert len(rows) == 1 + 6  # the plan's budget, then the sweep
    assert rows[0][:2] == [solver.format_bytes(budget), "60.0%"]
    assert rows[0][header.index("none")] == "—"  # storing everything needs 100%
    for row in rows:
        overheads = {m: float(c.rstrip("%*")) for m, c in zip(header[2:], row[2:]) if c != "—"}
        assert "rotor" in overheads
        assert all(overheads["rotor"] <= v + 1e-9 for v in overheads.values())
