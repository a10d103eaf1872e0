"""Scanned stacks: compile time, program size, memory and flops against depth (issue 18).

For a residual MLP block scanned over stacked parameters, L in {8, 16, 32, 64, 128}
(``--quick``: {8, 16, 32}):

1. trace + compile time of the gradient and its program size (jaxpr equations, scan and
   checkpoint bodies included) for a plain ``lax.scan``, a scan with ``jax.checkpoint``
   per layer (``nothing_saveable``, what ``nnx.remat`` does by default), ``remat_scan`` at
   50% (planning included; and again with the plan cached) and the unrolled
   ``remat_sequence`` at 50%;
2. memory (``jaxremat.activation_memory``: program order on the jaxpr) and flops of
   ``remat_scan`` at
   25/50/75% budgets and at the measured memory of each uniform policy (``nothing_saveable``,
   ``dots_saveable``, ``dots_with_no_batch_dims_saveable`` in the scan).

Flops are counted on the gradient's jaxpr (``jaxremat.measure.dataflow.equation_flops`` per equation,
a scan body times its length): ``Lowered.cost_analysis()`` counts a loop body once, whatever
its trip count (a plain scan of 8 or 32 layers reports the same flops). CPU figures: XLA's
CPU compiler undoes remat, so memory is the meter's, never XLA's.
    python benchmarks/scan_depth.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jaxremat  # noqa: E402
import solver  # noqa: E402
from jax.extend.core import ClosedJaxpr, Jaxpr  # noqa: E402

from jaxremat.measure.dataflow import equation_flops  # noqa: E402
from jaxremat.scan.remat import program_size  # noqa: E402

WIDTH, BATCH = 64, 256
POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")


def block(p, h):
    return h + jnp.tanh(h @ p["w1"] + p["b"]) @ p["w2"]


def stack(L):
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    scale = 1 / np.sqrt(WIDTH)
    return {"w1": scale * jax.random.normal(k1, (L, WIDTH, WIDTH)),
            "w2": scale * jax.random.normal(k2, (L, WIDTH, WIDTH)),
            "b": jnp.zeros((L, WIDTH))}


def scanned(policy=None):
    body = block if policy is None else jax.checkpoint(
        block, policy=getattr(jax.checkpoint_policies, policy), prevent_cse=False)
    return lambda p, x: jax.lax.scan(lambda h, q: (body(q, h), None), x, p)[0]


def unrolled(L):
    seq = jaxremat.remat_sequence([block] * L, "50%")
    return lambda p, x: seq([jax.tree.map(lambda a: a[i], p) for i in range(L)], x)


def loss_of(fn):
    return lambda p, x: jnp.sum(fn(p, x) ** 2)


def compile_seconds(fn, params, x):
    start = time.perf_counter()
    jax.jit(jax.grad(loss_of(fn))).lower(params, x).compile()
    return time.perf_counter() - start


def size(fn, params, x):
    return program_size(jax.make_jaxpr(jax.grad(loss_of(fn)))(params, x))


def _flops(jaxpr):
    total = 0.0
    for eqn in jaxpr.eqns:
        subs = [sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
                for param in eqn.params.values()
                for sub in (param if isinstance(param, (tuple, list)) else (param,))
                if isinstance(sub, (ClosedJaxpr, Jaxpr))]
        if not subs:
            total += equation_flops(eqn)
        elif eqn.primitive.name == "cond":
            total += max(_flops(sub) for sub in subs)
        else:
            total += eqn.params.get("length", 1) * sum(_flops(sub) for sub in subs)
    return total


def flops(fn, params, x):
    return _flops(jax.make_jaxpr(jax.grad(loss_of(fn)))(params, x).jaxpr)


def memory(fn, params, x):
    return jaxremat.activation_memory(loss_of(fn), params, x)


def at_least(budget, params, x):
    """remat_scan at ``budget``, or at the smallest budget that works when that is less."""
    try:
        jaxremat.remat_scan(block, budget).plan(params, x)
        return jaxremat.remat_scan(block, budget), budget
    except solver.InfeasibleBudget as error:
        return jaxremat.remat_scan(block, int(error.min_budget)), "min"


def depth_table(depths):
    print("L    method                 compile s   equations   (remat_scan at 50%, or at its "
          "smallest budget where 50% does not fit: 'min')")
    for L in depths:
        params, x = stack(L), jnp.ones((BATCH, WIDTH))
        f, used = at_least("50%", params, x)
        rows = [("scan", scanned()), ("scan+nothing_saveable", scanned("nothing_saveable")),
                (f"remat_scan {used}", f), (f"remat_scan {used} cached", f),
                ("remat_sequence 50%", unrolled(L))]
        for name, fn in rows:
            if name.startswith("remat_sequence") and L > 64:
                print(f"{L:<4} {name:<22} {'skipped (unrolled, > 64 layers)':>21}")
                continue
            print(f"{L:<4} {name:<22} {compile_seconds(fn, params, x):>9.3f}   "
                  f"{size(fn, params, x):>9}")


def budget_table(depths):
    print("\nL    method                            memory (meter)   pred/budget      flops  "
          "flops / policy's")
    for L in depths:
        params, x = stack(L), jnp.ones((BATCH, WIDTH))
        policy_rows = [(p, memory(scanned(p), params, x), flops(scanned(p), params, x))
                       for p in POLICIES]
        budgets = [(share, share) for share in ("25%", "50%", "75%")]
        budgets += [(f"= {name}", mem) for name, mem, _ in policy_rows]
        base = dict((name, fl) for name, _, fl in policy_rows)
        for name, mem, fl in policy_rows:
            print(f"{L:<4} scan+{name:<29} {mem:>14}   {'':>11} {fl:>10.3g}")
        for label, budget in budgets:
            f = jaxremat.remat_scan(block, budget)
            try:
                plan = f.plan(params, x)
            except solver.InfeasibleBudget as error:
                print(f"{L:<4} remat_scan {label:<23} infeasible (needs {error.min_budget:.0f})")
                continue
            fl = flops(f, params, x)
            ratio = fl / base[label[2:]] if label.startswith("=") else float("nan")
            print(f"{L:<4} remat_scan {label:<23} {memory(f, params, x):>14}   "
                  f"{plan.predicted_peak:>7.0f}/{plan.budget:<7} {fl:>10.3g}  {ratio:>6.3f}  "
                  f"[{plan.member}; gap to Rotor {plan.gap_to_rotor:+.1%}]")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="L in {8, 16, 32} only")
    args = parser.parse_args()
    depths = (8, 16, 32) if args.quick else (8, 16, 32, 64, 128)
    print(f"backend {jax.default_backend()} (memory from the meter, flops counted on the "
          f"jaxpr), JAX {jax.__version__}, width {WIDTH}, batch {BATCH}")
    depth_table(depths)
    budget_table(depths)


if __name__ == "__main__":
    main()
