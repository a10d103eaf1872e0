"""Time overhead of every method on realistic chains, and the persistent-schedule gap.

Run: ``python benchmarks/schedules.py [--quick]``.

1. For ``resnet_like`` (ResNet-34, batch 32, 224x224), ``transformer_like`` (12 blocks,
   batch 8, seq 1024, hidden 768, bf16) and ``random_chain(30)``: 8 budgets from Rotor's
   smallest feasible budget to the no-remat peak; each method's overhead ``time / no-remat
   time - 1``; ``—`` where the method does not fit. Asserts that Rotor is never slower than
   a baseline that fits.
2. On random integer chains of 1 to 4 layers, every integer budget between the least
   budget any sequence fits and the no-remat peak: how often, and by how much, the
   exhaustive optimum (any op sequence, early frees allowed) beats Rotor (persistent
   schedules; ``slots`` = budget so the DP is exact on integer sizes). ALGORITHMS.md quotes
   about 5% of pairs, up to 30%. Also checks Rotor against a brute force over every plan
   (every persistent schedule the DP searches).
3. Revolve on a 1000-layer chain: the cost of choosing the snapshot count.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solver import (  # noqa: E402
    BASELINE_METHODS,
    Chain,
    Checkpoint,
    InfeasibleBudget,
    Layer,
    baseline_schedule,
    exhaustive_search,
    make_schedule,
    random_chain,
    resnet_like,
    transformer_like,
)
from solver.chain.baselines import revolve_costs  # noqa: E402
from solver.compare import budget_range, compare_methods, format_table  # noqa: E402
from solver.solve import solve  # noqa: E402


def overhead_tables() -> None:
    chains = {
        "resnet_like (ResNet-34, batch 32, 224x224, fp32)": resnet_like(),
        "transformer_like (12 blocks, batch 8, seq 1024, hidden 768, bf16)": transformer_like(),
        "random_chain(30, seed=0, max_size=1000)": random_chain(30, seed=0, max_size=1000),
    }
    for name, chain in chains.items():
        start = time.perf_counter()
        rows = compare_methods(chain, budget_range(chain, 8))
        seconds = time.perf_counter() - start
        print(f"\n{name}: L = {chain.length}  ({seconds:.2f} s for all methods and budgets)")
        print(format_table(rows, units="bytes"))
        for row in rows:
            rotor = row.time("rotor")
            assert rotor is not None, f"rotor must fit its own min_budget range ({row.budget})"
            for method in BASELINE_METHODS:
                other = row.time(method)
                assert other is None or rotor <= other, (name, row.budget, method, rotor, other)


@functools.lru_cache(maxsize=None)
def _items(start: int, stop: int) -> tuple:
    """Every plan item covering layers ``start .. stop-1``."""
    layer = (Layer(start),) if stop == start + 1 else ()
    return layer + tuple(Checkpoint(start, stop, body) for body in _plans(start, stop, True))


@functools.lru_cache(maxsize=None)
def _plans(start: int, stop: int, body: bool) -> tuple:
    """Every plan over ``start .. stop-1``. A body never ends with a checkpoint (it would
    leave that checkpoint's output stored for good) nor is one checkpoint of its own span."""
    if start == stop:
        return ((),)
    out = []
    for cut in range(start + 1, stop + 1):
        if body and cut == stop:  # not one checkpoint of the body's own span
            heads = (Layer(start),) if stop == start + 1 else ()
        else:
            heads = _items(start, cut)
        for head in heads:
            for rest in _plans(cut, stop, False):
                plan = (head,) + rest
                if not (body and isinstance(plan[-1], Checkpoint)):
                    out.append(plan)
    return tuple(out)


def best_plan_time(chain: Chain, budget: float, cache: dict) -> float:
    """The fastest persistent schedule by brute force over every plan (small chains)."""
    if chain not in cache:
        schedules = []
        for plan in _plans(0, chain.length, False):
            try:
                schedules.append(make_schedule(chain, plan))
            except ValueError:  # a plan the simulator rejects (a value stored twice)
                pass
        cache[chain] = schedules
    return min((s.time for s in cache[chain] if s.peak <= budget), default=math.inf)


def persistent_gap(chains: int) -> None:
    pairs = faster = rotor_misses = not_best = 0
    by_length = {length: [0, 0] for length in range(1, 5)}  # pairs, exhaustive faster
    plan_cache: dict = {}
    gaps = []
    worst = None
    start = time.perf_counter()
    for seed in range(chains):
        length = 1 + seed % 4
        chain = random_chain(length, seed, max_size=10, max_time=10)
        top = int(baseline_schedule(chain, "none", math.inf).peak)
        for budget in range(int(chain.x_size[0]), top + 1):
            best = exhaustive_search(chain, budget)
            if best is None:
                continue
            pairs += 1
            by_length[length][0] += 1
            try:
                rotor = solve(chain, budget, method="rotor", slots=max(500, budget)).time
            except InfeasibleBudget:
                rotor = math.inf
            if rotor != best_plan_time(chain, budget, plan_cache):
                not_best += 1
            if rotor == math.inf:
                rotor_misses += 1
                continue
            assert best.time <= rotor, (seed, budget, best.time, rotor)
            if best.time < rotor:
                faster += 1
                by_length[length][1] += 1
                gap = rotor / best.time - 1.0
                gaps.append(gap)
                if worst is None or gap > worst[0]:
                    worst = (gap, seed, length, budget, best.time, rotor, best.drops)
    seconds = time.perf_counter() - start
    print(f"\nPersistent-schedule gap: {chains} random integer chains, L = 1..4 "
          f"(random_chain(L, seed, max_size=10, max_time=10)), every integer budget up to "
          f"the no-remat peak; {seconds:.1f} s")
    print(f"  (chain, budget) pairs where some sequence fits: {pairs}")
    print(f"  rotor differs from the best of all plans (brute force over every plan): "
          f"{not_best} pairs")
    print(f"  exhaustive fits but no persistent schedule does: {rotor_misses} "
          f"({100 * rotor_misses / max(pairs, 1):.1f}%)")
    print(f"  exhaustive strictly faster than rotor: {faster} "
          f"({100 * faster / max(pairs, 1):.1f}%); by L: " + ", ".join(
              f"L={n}: {k}/{m} ({100 * k / max(m, 1):.0f}%)" for n, (m, k) in by_length.items()))
    if gaps:
        gaps.sort()
        print(f"  gap rotor/exhaustive - 1 on those: median {100 * gaps[len(gaps) // 2]:.1f}%, "
              f"mean {100 * sum(gaps) / len(gaps):.1f}%, max {100 * gaps[-1]:.1f}%")
        gap, seed, length, budget, best, rotor, drops = worst
        print(f"  largest: seed {seed} (L = {length}), budget {budget}: exhaustive {best:g} "
              f"({drops} early frees) vs rotor {rotor:g}")


def revolve_speed() -> None:
    chain = random_chain(1000, seed=1, max_size=1000)
    start = time.perf_counter()
    counts, _, peaks = revolve_costs(chain)
    table = time.perf_counter() - start
    start = time.perf_counter()
    built = [baseline_schedule(chain, "revolve", float(budget))
             for budget in (peaks.max(), (peaks.min() + peaks.max()) / 2, peaks.min())]
    picked = time.perf_counter() - start
    print(f"\nRevolve, L = 1000: costs of {len(counts)} snapshot counts in {table:.2f} s "
          f"(first call, cached per chain); loose, middle and tightest schedules built and "
          f"simulated in {picked:.2f} s ({', '.join(str(len(s.ops)) for s in built)} ops)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer random chains for the gap")
    args = parser.parse_args()
    overhead_tables()
    persistent_gap(40 if args.quick else 400)
    revolve_speed()


if __name__ == "__main__":
    main()
