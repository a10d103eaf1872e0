"""Uniform ``jax.checkpoint`` policies against jaxremat's per-layer choice, at equal memory.

    python benchmarks/policies.py [--models gpt,mlp,conv] [--costs flops|static]
        [--fractions 0.25,0.4,0.6,0.8] [--policies default|none]

For each model of ``benchmarks/jax_memory.py`` (its builders are reused) it measures

* every uniform policy: ``jax.checkpoint(layer, policy=P, prevent_cse=True)`` around every
  layer, for P in ``nothing_saveable``, ``dots_with_no_batch_dims_saveable``,
  ``dots_saveable`` and ``everything_saveable`` (no remat: the plain stack);
* then ``remat_sequence(layers, budget=M)`` with the default policy menu (issue 17) at the
  measured memory ``M`` of each uniform policy, and at ``--fractions`` of the plain stack's.

Memory is :func:`jaxremat.activation_memory` (program-order peak of the ``jax.grad``
program, parameters and their gradients excluded); flops are
:func:`jaxremat.measure.costs.lowered_costs` of the jitted ``jax.value_and_grad`` (before XLA's
optimisations, so recomputation counts), both relative to the plain stack. The target:
at every budget, jaxremat's flops are at most those of the cheapest uniform policy whose
measured memory fits the budget ("cheapest fitting" column). Rows "predicted P" use as
budget the chain's predicted peak of the uniform plan P (what the dynamic program believes
P needs): where the chain overestimates a plan's memory, the DP cannot take that plan at
P's measured memory, and those rows show what it does once the budget covers it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import solver  # noqa: E402
from jax_memory import MODELS, _flops, _loss, _plain  # noqa: E402
from jaxremat import activation_memory, remat_sequence  # noqa: E402
from solver.chain.baselines import baseline_schedule  # noqa: E402

UNIFORM = {
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "everything": None,  # the plain stack
}


def uniform(layers, policy):
    """The stack with every layer under ``jax.checkpoint(policy=policy)`` (plain: ``None``)."""
    if policy is None:
        return lambda params, x: _plain(layers, params, x)
    wrapped = [jax.checkpoint(layer, policy=policy, prevent_cse=True) for layer in layers]
    return lambda params, x: _plain(wrapped, params, x)


def uniform_prediction(plan, name):
    """The chain's predicted peak of the uniform policy ``name`` (from a jaxremat plan's
    profile): every layer stored with that option, or, for ``nothing``, every layer
    checkpointed. ``None`` where a layer has no option equal to it (dropped as dominated)."""
    chain = plan.chain
    if name == "nothing":
        return baseline_schedule(chain, "every_layer", float("inf")).peak
    items = []
    for layer in plan.layers:
        names = layer.option_names
        merged = dict(layer.dropped).get(name, "")
        if name not in names and merged.startswith("same tape as "):
            name_here = merged[len("same tape as "):].strip("'")
        else:
            name_here = name
        if name_here not in names:
            return None
        items.append(solver.Layer(layer.index, names.index(name_here)))
    return solver.make_schedule(chain, tuple(items)).peak


def measure(run, params, x):
    """``(activation memory, flops)`` of the training step through ``run``."""
    loss = _loss(run)
    return activation_memory(loss, params, x), _flops(loss, params, x)


def _without_options(layers, budget, args, params, x, plain_flops) -> str:
    """jaxremat's flops (x plain) at ``budget`` with the whole tape only (before issue 17)."""
    try:
        seq = remat_sequence(layers, int(budget), costs=args.costs, policies=())
        return f"{measure(seq, params, x)[1] / plain_flops:.3f}"
    except solver.InfeasibleBudget:
        return "infeasible"


def model_table(name, args):
    layers, params, x = MODELS[name]()
    plain_mem, plain_flops = measure(uniform(layers, None), params, x)
    print(f"\n## {name}: {len(layers)} layers; plain: activation memory {plain_mem / 2**20:.2f} "
          f"MiB, flops {plain_flops:.4g}")
    rows = {}
    for policy_name, policy in UNIFORM.items():
        mem, flops = measure(uniform(layers, policy), params, x)
        rows[policy_name] = (mem, flops / plain_flops)
    budgets = [(f"= {n}", rows[n][0]) for n in UNIFORM]
    policies = None if args.policies == "default" else ()
    # the chain's own prediction of each uniform plan: at that budget the DP can take it
    profiled = remat_sequence(layers, int(plain_mem * 10), costs=args.costs, policies=policies)
    plan = profiled.plan(params, x)
    predictions = {n: uniform_prediction(plan, n) if policies is None or n in (
        "nothing", "everything") else None for n in UNIFORM}
    budgets += [(f"predicted {n}", int(p)) for n, p in predictions.items()
                if p is not None and n != "everything"]
    budgets += [(f"{f:.0%} of plain", int(f * plain_mem)) for f in args.fractions]
    print(f"\n| budget | memory (% plain) | cheapest fitting uniform policy | its flops x plain "
          f"| jaxremat memory (% plain) | jaxremat flops x plain | jaxremat options used "
          f"| target met | without options: flops x plain |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, budget in sorted(budgets, key=lambda b: b[1]):
        fitting = [(f, n) for n, (m, f) in rows.items() if m <= budget]
        best = min(fitting) if fitting else None
        start = time.perf_counter()
        seq = remat_sequence(layers, int(budget), costs=args.costs, policies=policies)
        try:
            mem, flops = measure(seq, params, x)
        except solver.InfeasibleBudget as error:
            print(f"| {label} | {budget / plain_mem:.1%} | {best[1] if best else '-'} | "
                  f"{f'{best[0]:.3f}' if best else '-'} | infeasible (min "
                  f"{error.min_budget / plain_mem:.1%}) | - | - | - | - |")
            continue
        ratio = flops / plain_flops
        plan = seq.cached_plans[-1]
        used = sorted({o for o in plan.options if o != "everything"}) or ["-"]
        met = "yes" if best is None or (ratio <= best[0] + 1e-9 and mem <= budget) else "NO"
        bare = "-" if policies is not None else _without_options(layers, budget, args, params,
                                                                  x, plain_flops)
        print(f"| {label} | {budget / plain_mem:.1%} | {best[1] if best else '-'} | "
              f"{f'{best[0]:.3f}' if best else '-'} | {mem / plain_mem:.1%} | {ratio:.3f} | "
              f"{', '.join(used)} | {met} | {bare} |   ({time.perf_counter() - start:.1f} s)")
    print("\nuniform policies: measured memory and flops, and the chain's predicted peak of "
          "the same plan (why jaxremat may not reach it at that budget):")
    for policy_name, (mem, flops) in rows.items():
        predicted = predictions[policy_name]
        text = "n/a" if predicted is None else f"{predicted / plain_mem:6.1%} ({predicted / mem:.3f}x measured)"
        print(f"  {policy_name:>14}: memory {mem / plain_mem:6.1%} of plain, flops {flops:.3f}x; "
              f"predicted {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,mlp,conv")
    parser.add_argument("--costs", default="flops", choices=("flops", "static"))
    parser.add_argument("--fractions", default="0.25,0.4,0.6,0.8",
                        type=lambda s: [float(v) for v in s.split(",") if v])
    parser.add_argument("--policies", default="default", choices=("default", "none"),
                        help="jaxremat's menu: the default, or none (the whole tape only)")
    args = parser.parse_args()
    print(f"JAX {jax.__version__}, backend {jax.default_backend()}; costs={args.costs!r}, "
          f"menu={args.policies}; memory: activation_memory (program order), flops: "
          "lowered cost_analysis of value_and_grad")
    for name in args.models.split(","):
        model_table(name, args)


if __name__ == "__main__":
    main()
