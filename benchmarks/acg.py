"""Feng & Huang's checkpoint search on ResNet-50, DenseNet-121 and Inception-v3 graphs.

Run: ``python benchmarks/acg.py`` (add ``--budget`` for the budgeted variant, each search
capped by ``--time-limit`` seconds; ``--graphs`` and ``--where`` pick the graphs and budgets).
A search that hits its time limit prints how far its best set may be from the least
recompute (``CheckpointSet.recompute_lower_bound``).

Per graph (benchmarks/graphs.py: fp32, batch 32, 224x224 or 299x299) it prints:

* vertices and the solve time of :func:`solver.checkpoint_search`;
* memory without rematerialisation: the sum of every tensor's size (Feng & Huang's
  "regular training" convention, every tensor kept);
* memory with Chen's sqrt(n) heuristic: walking the topological order, keep the first
  vertex that splits the graph (every path passes through it) after every ~sqrt(n)
  vertices;
* memory with checkpoint_search, the memory cut against no remat, and the recompute
  overhead: recomputed flops / (forward + backward flops), backward = 2 x forward;
* the graph simulator's peak for the same set (values and gradients; the model counts
  values only and leaves the input and the loss out, so the two differ);
* Feng & Huang's published cuts (CVPR 2021, Table 2; measured on a GPU as peak memory of
  intermediate tensors in PyTorch, on their own graph parsing, at their batch sizes).

Remat memories below include the input and the loss tensors (tiny) so that they compare
with the no-remat sum.

With ``--budget`` (budgets 10 % and 50 % of the way from the least memory to no remat),
measured on a 2-core container: ResNet-50 about 4 s and 3 s, DenseNet-121 11 s and 4.5 s,
Inception-v3 7 s and 5 s, all proven optimal (Inception-v3 at 50 %, a subset-sum over the
sizes of its ReLUs and concatenations, used to hit the 60 s limit; see solver/graph/search.py).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphs import GRAPHS  # noqa: E402

from solver import Graph, checkpoint_search, format_bytes, simulate_graph, training_memory  # noqa: E402
from solver.graph.model import memory_of  # noqa: E402

PUBLISHED_CUT = {"ResNet-50": 0.63, "DenseNet-121": 0.78, "Inception-v3": 0.71}


def splitting_vertices(graph: Graph) -> list[int]:
    """Vertices every source-target path passes through (no edge jumps over them)."""
    n = len(graph)
    cover = np.zeros(n + 1, dtype=np.int64)
    np.add.at(cover, graph.edges[:, 0] + 1, 1)
    np.add.at(cover, graph.edges[:, 1], -1)
    jumped = np.cumsum(cover)[:n]
    return [v for v in range(1, n - 1) if jumped[v] == 0]


def chen_sqrt(graph: Graph) -> list[int]:
    """Chen et al.'s sqrt(n) rule on the topological order, at splitting vertices."""
    n = len(graph)
    step = max(1, round(math.sqrt(n)))
    kept, last = [], 0
    for v in splitting_vertices(graph):
        if v - last >= step:
            kept.append(v)
            last = v
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", action="store_true",
                        help="also run the budgeted variant at budgets 10%% and 50%% of the way "
                             "from the optimum to no remat")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds allowed to each budgeted search (default 60)")
    parser.add_argument("--gap", type=float, default=0.0,
                        help="relative optimality gap of the budgeted searches (default 0: exact)")
    parser.add_argument("--graphs", nargs="+", choices=list(GRAPHS), default=list(GRAPHS),
                        help="graphs to run (default: all)")
    parser.add_argument("--where", nargs="+", type=float, default=[0.1, 0.5],
                        help="budgets, as fractions of the way from the least memory to no "
                             "remat (default: 0.1 0.5)")
    args = parser.parse_args()
    head = (f"{'graph':<13} {'V':>4} {'solve s':>8} {'no remat':>10} {'Chen sqrt':>10} "
            f"{'ours':>10} {'cut':>6} {'Chen cut':>8} {'recompute':>9} {'sim peak':>10} "
            f"{'F&H cut':>7}")
    print(head)
    print("-" * len(head))
    for name in args.graphs:
        graph = GRAPHS[name]()
        ends = float(graph.sizes[0] + graph.sizes[-1])
        total = float(graph.sizes.sum())
        forward = float(graph.costs.sum())
        start = time.perf_counter()
        result = checkpoint_search(graph)
        seconds = time.perf_counter() - start
        chen = chen_sqrt(graph)
        chen_mem = memory_of(graph, chen)[0] + ends
        ours = result.peak + ends
        _, sim_peak = simulate_graph(graph, result)
        print(f"{name:<13} {len(graph):>4} {seconds:>8.2f} {format_bytes(total):>10} "
              f"{format_bytes(chen_mem):>10} {format_bytes(ours):>10} "
              f"{100 * (1 - ours / total):>5.1f}% {100 * (1 - chen_mem / total):>7.1f}% "
              f"{100 * result.recompute / (3 * forward):>8.1f}% {format_bytes(sim_peak):>10} "
              f"{100 * PUBLISHED_CUT[name]:>6.0f}%", flush=True)
        assert abs(training_memory(graph, result.checkpoints) - result.peak) < 1e-6 * total
        if args.budget:
            inner = float(graph.sizes[1:-1].sum())
            for where in args.where:
                budget = result.peak + where * (inner - result.peak)
                start = time.perf_counter()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    budgeted = checkpoint_search(graph, budget=budget, time_limit=args.time_limit,
                                                 gap=args.gap)
                seconds = time.perf_counter() - start
                timed_out = any("time limit" in str(w.message) for w in caught)
                note = (_gap_note(budgeted, forward) if timed_out else
                        f"within {100 * args.gap:g}% of the least" if args.gap else "exact")
                print(f"{'  budget':<13} {'':>4} {seconds:>8.2f} {'':>10} {'':>10} "
                      f"{format_bytes(budgeted.peak + ends):>10} "
                      f"{100 * (1 - (budgeted.peak + ends) / total):>5.1f}% {'':>8} "
                      f"{100 * budgeted.recompute / (3 * forward):>8.1f}%  budget "
                      f"{format_bytes(budget + ends)} ({note})", flush=True)


def _gap_note(result, forward: float) -> str:
    """How far a timed-out search's best set may be from the least recompute: relative, and
    absolute in % of the training flops (forward + backward, as in the recompute column)."""
    bound = result.recompute_lower_bound
    rel = 1 - bound / result.recompute if result.recompute > 0 else 0.0
    return (f"time limit hit: best found, within {100 * rel:.3g}% / "
            f"{100 * (result.recompute - bound) / (3 * forward):.3g} points of the lower bound "
            f"{100 * bound / (3 * forward):.3g}%")


if __name__ == "__main__":
    main()
