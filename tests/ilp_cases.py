"""Checkers and small graphs shared by the ILP tests: an independent replay of a program
order, the exhaustive search of tiny graphs, and the graphs themselves.

Not a test module: tests import it (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solver import IlpSolution, TrainingGraph
from solver.graph.graph import Graph


# --------------------------------------------------------------------------- checkers
def replay(graph: TrainingGraph, order) -> tuple[float, float]:
    """Independent check of a program order: ``(total cost, peak)``.

    Every computation needs all its dependencies resident; a free needs the value
    resident; memory is the sum of resident sizes right after each computation; the
    source is computed exactly once; every vertex is computed at least once.
    """
    resident: set[int] = set()
    computed = [0] * len(graph)
    cost = peak = 0.0
    for action, v in order:
        if action == "compute":
            missing = [i for i in graph.deps[v] if i not in resident]
            assert not missing, f"computing {graph.names[v]} without {missing}"
            resident.add(v)
            computed[v] += 1
            cost += graph.costs[v]
            peak = max(peak, sum(graph.sizes[i] for i in resident))
        else:
            assert action == "free" and v in resident, f"freeing {v} which is not resident"
            resident.discard(v)
    assert all(count >= 1 for count in computed), "some vertex is never computed"
    assert computed[0] == 1, "the input is given once"
    return cost, peak


def check_solution(solution: IlpSolution, budget: float) -> None:
    cost, peak = replay(solution.graph, solution.order)
    assert cost == pytest.approx(solution.objective)
    assert peak == pytest.approx(solution.peak)
    assert peak <= budget + 1e-9


def exhaustive(graph: TrainingGraph) -> list[tuple[float, float]]:
    """Pareto front ``(peak, cost)`` of every schedule in the ILP's class, by enumeration.

    The class: stage ``t`` starts with a held set ``S`` (subset of ``0..t-1``), computes a
    set ``R`` containing ``t`` (and never the source after stage 0) in index order with
    every dependency held or computed earlier in the stage, and keeps any subset of what it
    held or computed for the next stage. Values are freed right after their last use in
    the stage unless kept. A dynamic program over stages keeps, for each held set, the
    Pareto front of (peak so far, cost so far). No reduction of the ILP is assumed.
    """
    T = len(graph)
    deps_mask = [sum(1 << i for i in deps) for deps in graph.deps]
    size_of = [sum(graph.sizes[i] for i in range(T) if m >> i & 1) for m in range(1 << T)]
    fronts: dict[int, list[tuple[float, float]]] = {0: [(0.0, 0.0)]}
    for t in range(T):
        optional = list(range(1, t)) if t > 0 else []
        nxt: dict[int, list[tuple[float, float]]] = {}
        for held, front in fronts.items():
            for r in range(len(optional) + 1):
                for extra in itertools.combinations(optional, r):
                    computed = sorted(extra) + [t]
                    avail, ok = held, True
                    for k in computed:
                        if deps_mask[k] & ~avail:
                            ok = False
                            break
                        avail |= 1 << k
                    if not ok:
                        continue
                    # needed_after[p]: deps of the computations after position p.
                    needed_after = [0] * (len(computed) + 1)
                    for p in range(len(computed) - 1, -1, -1):
                        needed_after[p] = needed_after[p + 1] | deps_mask[computed[p]]
                    cost = float(sum(graph.costs[k] for k in computed))
                    keepable = avail if t + 1 < T else 0
                    sub = keepable
                    while True:  # every subset of what can be kept
                        keep = sub
                        resident = held & (needed_after[0] | keep)
                        peak = 0.0
                        for p, k in enumerate(computed):
                            resident |= 1 << k
                            peak = max(peak, size_of[resident])
                            resident &= needed_after[p + 1] | keep
                        for old_peak, old_cost in front:
                            nxt.setdefault(keep, []).append((max(old_peak, peak), old_cost + cost))
                        if sub == 0:
                            break
                        sub = (sub - 1) & keepable
        fronts = {state: _pareto(points) for state, points in nxt.items()}
    return _pareto([p for points in fronts.values() for p in points])


def _pareto(points):
    out, best_cost = [], np.inf
    for peak, cost in sorted(points):
        if cost < best_cost - 1e-12:
            out.append((peak, cost))
            best_cost = cost
    return out


# --------------------------------------------------------------------------- graphs
def chain_graph(sizes, costs=None) -> Graph:
    return Graph.chain(sizes, costs)


def diamond(sizes) -> Graph:
    return Graph.from_edges([(0, 1), (0, 2), (1, 3), (2, 3)], sizes)


def skip(sizes) -> Graph:
    return Graph.from_edges([(0, 1), (1, 2), (2, 3), (0, 2)], sizes)


def residual(blocks: int, sizes) -> Graph:
    """``x0 -> a1 -> x1 -> a2 -> x2 ...`` with skip edges ``x_{b-1} -> x_b``."""
    edges = []
    for b in range(1, blocks + 1):
        edges += [(f"x{b - 1}", f"a{b}"), (f"a{b}", f"x{b}"), (f"x{b - 1}", f"x{b}")]
    names = ["x0"] + [n for b in range(1, blocks + 1) for n in (f"a{b}", f"x{b}")]
    return Graph.from_edges(edges, dict(zip(names, sizes)))



def tiny_graphs():
    rng = np.random.default_rng(0)
    cases = []
    for n in (2, 3, 4):
        for _ in range(2):
            sizes = rng.integers(1, 5, n).tolist()
            costs = [0] + rng.integers(1, 4, n - 1).tolist()
            cases.append((f"chain{n}-{sizes}", chain_graph(sizes, costs)))
    cases.append(("chain4-ones", chain_graph([1, 1, 1, 1])))
    for build in (diamond, skip):
        for _ in range(2):
            cases.append((f"{build.__name__}-", build(rng.integers(1, 5, 4).tolist())))
    return cases


TINY = tiny_graphs()
