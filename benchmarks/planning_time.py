"""Planning time (issue 18.4): CPU seconds to make plans, in this checkout or another.

    python benchmarks/planning_time.py                      # this checkout
    python benchmarks/planning_time.py --root /work/main    # another checkout, same models
    python benchmarks/planning_time.py --part resnet --budgets 50% 60% 75% 90%
    python benchmarks/planning_time.py --part stack --policies ranked   # another menu
    python benchmarks/planning_time.py --part scan [--policies plus]    # remat_scan

Three parts, each timed with ``time.process_time`` (CPU of this process, all threads), so
that the numbers mean something on a shared machine:

* ``stack``: ``remat_sequence`` of 12 GPT-2 blocks (``benchmarks/policies.py``'s
  ``gpt_blocks_model``, width 128, the policy menu ``--policies``: a name of
  ``benchmarks/policies.py``'s ``MENUS``, ``default`` unless given): the first plan, a
  re-plan at new batch sizes (2, 1, 3) and a new sequence length (32), a re-plan at a new
  budget. Time two menus in two processes
  (the second menu in the same process would find JAX's caches warm).
* ``scan``: ``jaxremat.remat_scan`` of 12 GPT-2 blocks over stacked parameters at 25%: the
  first plan, re-plans at new batch sizes (2, 1, 3) and a new sequence length (32), a new
  budget (:func:`scan_rows`).
* ``resnet``: ``jaxremat.flax.RematModule`` on a 6-block ResNet (``examples/resnet_nnx.py``'s
  blocks, widths 16/32/64, batch 8 of 32x32x3): one plan per budget, in the order given,
  on one model (later budgets reuse what the earlier ones planned, as in a sweep).

The ResNet's budgeted searches stop at ``RematModule``'s ``work_limit`` (candidates examined,
:data:`jaxremat.graph.remat.MODULE_WORK_LIMIT` per search by default): deterministic, so the plans
are the same on every run and machine; only the times vary with the load. (Before, a 30 s
wall-time limit for all six made the plans depend on the load.)

For each ResNet budget the note also gives the plan's recompute and measured bytes, so that
runs of two checkouts can be compared plan for plan.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _timed(make):
    start = time.process_time()
    result = make()
    return time.process_time() - start, result


def stack_rows(n_layer: int = 12, menu: str = "default") -> list[tuple[str, float, str]]:
    from policies import MENUS, gpt_blocks_model
    from jaxremat import remat_sequence

    layers, params, x = gpt_blocks_model(n_layer=n_layer, batch=4, seq=64)
    policies = MENUS[menu]
    rows = []
    seconds, plan = _timed(lambda: remat_sequence(layers, "50%", policies=policies).plan(params, x))
    rows.append(("first plan (batch 4, 50%)", seconds,
                 f"{len(plan.rows())} layers, menu {menu}: options "
                 f"{', '.join(plan.layers[1].option_names)}"))
    half = x[:2]  # sliced before the clock starts: the slice compiles (0.02-0.04 s CPU)
    seconds, _ = _timed(lambda: remat_sequence(layers, "50%", policies=policies).plan(params, half))
    rows.append(("new batch size (2)", seconds, ""))
    one = x[:1]  # a batch of one: jnp.einsum squeezes it, a program laid out differently
    seconds, _ = _timed(lambda: remat_sequence(layers, "50%", policies=policies).plan(params, one))
    rows.append(("new batch size (1)", seconds, "costs estimated, not lowered"))
    three = x[:3]
    seconds, _ = _timed(lambda: remat_sequence(layers, "50%", policies=policies).plan(params, three))
    rows.append(("new batch size (3)", seconds, ""))
    short = x[:, :32]
    seconds, _ = _timed(lambda: remat_sequence(layers, "50%", policies=policies).plan(params, short))
    rows.append(("new sequence length (32)", seconds, ""))
    seconds, _ = _timed(lambda: remat_sequence(layers, "30%", policies=policies).plan(params, x))
    rows.append(("new budget (30%)", seconds, ""))
    return rows


def scan_rows(menu: str = "default") -> list[tuple[str, float, str]]:
    """``remat_scan`` of 12 GPT-2 blocks over stacked parameters (``scan_depth.py``'s
    ``gpt_stack``: width 128, 4 heads, batch 4, sequence 64) at 25%: the first plan, new
    batch sizes and a new sequence length, a new budget. ``default`` is remat_scan's own
    menu (:data:`jaxremat.scan.remat.SCAN_POLICIES`)."""
    from policies import MENUS
    from scan_depth import gpt_stack
    from jaxremat import remat_scan

    layer, params, x = gpt_stack(12, 128, 4, 4, 64)
    policies = MENUS[menu]
    rows = []
    cases = (("first plan (batch 4, 25%)", x, "25%"), ("new batch size (2)", x[:2], "25%"),
             ("new batch size (1)", x[:1], "25%"), ("new batch size (3)", x[:3], "25%"),
             ("new sequence length (32)", x[:, :32], "25%"), ("new budget (50%)", x, "50%"))
    for what, h, budget in cases:
        seconds, plan = _timed(
            lambda: remat_scan(layer, budget, policies=policies).plan(params, h))
        rows.append((f"scan: {what}", seconds, f"{plan.member}; {plan.option_name}"))
    return rows


def resnet_rows(budgets: list[str]) -> list[tuple[str, float, str]]:
    import jax.numpy as jnp
    from flax import nnx
    from resnet_nnx import Head, ResidualBlock, Stem
    from jaxremat.flax import RematModule

    class ResNet(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.stem = Stem(16, rngs=rngs)
            blocks, cin = [], 16
            for stage, cout in enumerate((16, 32, 64)):
                for block in range(2):
                    stride = 2 if stage and block == 0 else 1
                    blocks.append(ResidualBlock(cin, cout, stride, rngs=rngs))
                    cin = cout
            self.blocks = nnx.List(blocks)
            self.head = Head(cin, 10, rngs=rngs)

        def __call__(self, x):
            x = self.stem(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    net, x = ResNet(nnx.Rngs(0)), jnp.ones((8, 32, 32, 3))
    rows = []
    for budget in budgets:
        try:
            seconds, plan = _timed(lambda: RematModule(net, budget).plan(x))
            note = f"recompute +{100 * plan.recompute:.1f}%, measured {plan.measured} B"
        except ValueError as error:  # InfeasibleBudget
            seconds, note = float("nan"), f"infeasible: {str(error)[:60]}"
        rows.append((f"RematModule at {budget}", seconds, note))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(HERE, ".."),
                        help="the checkout whose jaxremat and solver are timed")
    parser.add_argument("--part", choices=("stack", "scan", "resnet", "both"), default="both")
    parser.add_argument("--policies", default="default",
                        help="the stack's policy menu (benchmarks/policies.py MENUS)")
    parser.add_argument("--budgets", nargs="+", default=["50%", "60%", "75%", "90%"])
    args = parser.parse_args()
    sys.path[:0] = [os.path.abspath(args.root), HERE,
                    os.path.join(os.path.abspath(args.root), "examples")]
    import jaxremat

    print(f"jaxremat from {os.path.dirname(jaxremat.__file__)}")
    rows = []
    if args.part in ("stack", "both"):
        rows += stack_rows(menu=args.policies)
    if args.part == "scan":
        rows += scan_rows(menu=args.policies)
    if args.part in ("resnet", "both"):
        rows += resnet_rows(args.budgets)
    print("| what | CPU s | note |\n|---|---|---|")
    for what, seconds, note in rows:
        print(f"| {what} | {seconds:.2f} | {note} |", flush=True)


if __name__ == "__main__":
    main()
