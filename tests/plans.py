"""Every persistent plan of a small chain (every option too), and the brute-force check of
Rotor's DP against them.

Not a test module: tests import it (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import pytest

from solver import (
    Checkpoint,
    InfeasibleBudget,
    Layer,
    RotorTable,
    make_schedule,
    min_peak_schedule,
    rotor_min_budget,
    simulate,
)


def plans(start: int, stop: int, body: bool = False):
    """Every plan over layers ``start .. stop-1`` (a checkpoint's body ends with a Layer)."""
    if start == stop:
        yield ()
        return
    for rest in plans(start + 1, stop):
        yield (Layer(start),) + rest
    for end in range(start + 1, stop + (0 if body else 1)):
        for inner in plans(start, end, body=True):
            if isinstance(inner[-1], Layer):
                for rest in plans(end, stop):
                    yield (Checkpoint(start, end, inner),) + rest


def with_options(plan, counts):
    """Every way to give each ``Layer`` of ``plan`` one of its layer's options
    (``counts[i]`` options for layer ``i``, numbered ``0 .. counts[i] - 1``)."""
    if not plan:
        yield ()
        return
    head, tail = plan[0], plan[1:]
    if isinstance(head, Layer):
        heads = [Layer(head.index, k) for k in range(counts[head.index])]
    else:
        heads = [Checkpoint(head.start, head.stop, body)
                 for body in with_options(head.body, counts)]
    for first in heads:
        for rest in with_options(tail, counts):
            yield (first,) + rest


def every_plan_cost(chain) -> list[tuple[float, float]]:
    """(time, peak) under the simulator of every persistent plan with every option."""
    return [(s.time, s.peak) for s in (make_schedule(chain, q) for p in plans(0, chain.length)
                                       for q in with_options(p, chain.num_options))]


def check_exact(chain) -> None:
    """The DP's min budget and its time at every integer budget (exact table) are the least
    simulated peak and time over every persistent plan and option; its plans fit."""
    costs = every_plan_cost(chain)
    least = min(peak for _, peak in costs)
    assert rotor_min_budget(chain) == least
    assert min_peak_schedule(chain).peak == least
    top = int(max(peak for _, peak in costs)) + 1
    table = RotorTable(chain, top, slots=top)
    assert table.exact and table.min_budget == least
    for budget in range(1, int(least)):
        with pytest.raises(InfeasibleBudget):
            table.schedule(budget)
    for budget in range(max(1, int(least)), top + 1):
        schedule = table.schedule(budget)
        assert schedule.peak <= budget
        assert simulate(chain, schedule.ops) == (schedule.time, schedule.peak)
        assert schedule.time == min(time for time, peak in costs if peak <= budget)
        assert table.predicted_time(budget) == schedule.time


def negative_bwd_tmps(draw, x_size, high: int = 3) -> list[int]:
    """A hypothesis draw of ``bwd_tmp`` per layer from the chain's floor,
    ``-min(x_size[i], x_size[i+1])`` (a backward that frees what it reads before ``g[i]`` is
    whole), to ``high``."""
    from hypothesis import strategies as st

    return [draw(st.integers(-min(x_size[i], x_size[i + 1]), high))
            for i in range(len(x_size) - 1)]
