"""How fast Checkmate's ILP (solver.ilp, HiGHS) solves chains and small DAGs, per budget.

For each graph: the least peak (:func:`solver.ilp_min_peak`), the peak of the schedule
without recomputation, and at budgets spaced between the two, the CPU and wall seconds of
:func:`solver.solve_ilp` (model building included), whether HiGHS proved optimality within
``--time-limit`` and the objective (total compute cost, recomputations included).

Run from the repository root::

    .venv/bin/python benchmarks/ilp_speed.py --time-limit 60
    .venv/bin/python benchmarks/ilp_speed.py --chains --graphs unit-chain15 unit-chain20
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solver import Graph, TrainingGraph, ilp_min_peak, solve_ilp  # noqa: E402


def random_chain(n: int, seed: int) -> Graph:
    """``n`` vertices in a line, sizes 1..4 and costs 1..3 drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    return Graph.chain(rng.integers(1, 5, n).tolist(), [0] + rng.integers(1, 4, n - 1).tolist())


def residual(blocks: int, seed: int) -> Graph:
    """``x0 -> a1 -> x1 -> a2 -> ...`` with a skip edge ``x[b-1] -> x[b]`` per block."""
    rng = np.random.default_rng(seed)
    edges = []
    for b in range(1, blocks + 1):
        edges += [(f"x{b - 1}", f"a{b}"), (f"a{b}", f"x{b}"), (f"x{b - 1}", f"x{b}")]
    names = ["x0"] + [name for b in range(1, blocks + 1) for name in (f"a{b}", f"x{b}")]
    return Graph.from_edges(edges, dict(zip(names, rng.integers(1, 5, len(names)).tolist())))


def diamonds(count: int, seed: int) -> Graph:
    """``count`` diamonds in a row: ``d -> l, d -> r, l -> d', r -> d'``."""
    rng = np.random.default_rng(seed)
    edges = []
    for b in range(count):
        edges += [(f"d{b}", f"l{b}"), (f"d{b}", f"r{b}"), (f"l{b}", f"d{b + 1}"),
                  (f"r{b}", f"d{b + 1}")]
    names = sorted({v for e in edges for v in e})
    return Graph.from_edges(edges, dict(zip(names, rng.integers(1, 5, len(names)).tolist())))


def graphs(chains: Sequence[int]) -> Iterator[tuple[str, Graph]]:
    for n in chains:
        yield f"chain{n}", random_chain(n, n)
    yield "unit-chain15", Graph.chain([1] * 15)
    yield "unit-chain20", Graph.chain([1] * 20)
    yield "residual6", residual(6, 0)
    yield "residual9", residual(9, 1)
    yield "diamonds5", diamonds(5, 2)


def row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds HiGHS may spend per solve (default 60)")
    parser.add_argument("--chains", type=int, nargs="*", default=[10, 15, 20, 30, 40],
                        help="forward vertices of the random chains (default 10 15 20 30 40)")
    parser.add_argument("--fractions", type=float, nargs="*", default=[0.0, 0.1, 0.2, 0.3, 0.5, 1.0],
                        help="budgets as fractions between the least and no-remat peaks")
    parser.add_argument("--graphs", nargs="*", default=None,
                        help="only these graphs, by name (e.g. unit-chain20; default all)")
    args = parser.parse_args(argv)
    header = ["graph", "fwd", "train", "fraction", "budget", "cpu s", "wall s", "optimal",
              "objective"]
    widths = [13, 4, 6, 9, 7, 7, 7, 8, 10]
    print(row(header, widths))
    print(row(["-" * w for w in widths], widths))
    for name, graph in graphs(args.chains):
        if args.graphs is not None and name not in args.graphs:
            continue
        training = TrainingGraph.from_graph(graph)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an upper bound is fine here
            least = ilp_min_peak(training, time_limit=args.time_limit)
        top = solve_ilp(training, float(training.sizes.sum()), time_limit=args.time_limit).peak
        for fraction in args.fractions:
            budget = float(np.floor(least + fraction * (top - least)))
            cpu, wall = time.process_time(), time.perf_counter()
            solution = solve_ilp(training, max(budget, least), time_limit=args.time_limit)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            cells = [name, str(graph.__len__()), str(len(training)), f"{fraction:.2f}",
                     f"{max(budget, least):g}", f"{cpu:.1f}", f"{wall:.1f}", str(solution.optimal),
                     f"{solution.objective:g}"]
            print(row(cells, widths), flush=True)


if __name__ == "__main__":
    main()
