"""Measured memory over the chain's predicted peak, for the uniform checkpoint policies of
``benchmarks/policies.py`` (the chain's schedule of each uniform plan against
``activation_memory`` of the stack under that policy), on its models.

    python benchmarks/prediction.py [--models gpt,mlp,conv,gpt_blocks]

Prints per model and policy: measured and predicted memory (MiB) and measured/predicted,
which must be at most 1 (the plan fits) and is the issue 17.5 target at 0.98-1.00.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from policies import (BUILDERS, UNIFORM, measure, remat_sequence, uniform,  # noqa: E402
                      uniform_predictions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,mlp,conv,gpt_blocks")
    args = parser.parse_args()
    for name in args.models.split(","):
        layers, params, x = BUILDERS[name]()
        plain = measure(uniform(layers, None), params, x)[0]
        plan = remat_sequence(layers, int(plain * 10), costs="flops").plan(params, x)
        predictions = uniform_predictions(plan)
        for policy_name, policy in UNIFORM.items():
            measured = measure(uniform(layers, policy), params, x)[0]
            predicted = predictions[policy_name].peak
            print(f"{name:10s} {policy_name:14s} measured {measured / 2**20:7.2f} MiB  predicted "
                  f"{predicted / 2**20:7.2f} MiB  measured/predicted {measured / predicted:.3f}")


if __name__ == "__main__":
    main()
