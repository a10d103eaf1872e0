"""Issue 18.5's compile target: ``remat_scan``'s trace + compile time against the scan under a
uniform policy, with the loops and kernels that explain it (benchmarks/RESULTS.md)::

    python benchmarks/scan_compile.py [--block mlp,gpt] [--depths 8,16,32,64,128]

(``python benchmarks/scan_depth.py --compile`` before session 24; the blocks and helpers are
``scan_depth.py``'s.)

XLA's CPU compile time grows with the kernels it emits (fusions and dots, each code-generated
on its own) and with the loops: a nested scan adds a loop body per level with its slicing and
stacking of every parameter leaf, and the least-memory plans recompute pieces whose code the
uniform scan does not hold.
"""

from __future__ import annotations

import argparse
import time

import jax

import jaxremat
import solver
from jaxremat.scan.members import loop_bodies
from scan_depth import BLOCKS, block_stack, least_budget, loss_of, scanned


def compile_table(depths, kinds, rounds=3, shares=("25%",)):
    """Issue 18.5's compile target per block ``kinds`` (:func:`block_stack`) and depth: trace +
    compile CPU seconds of the gradient (the least of ``rounds``, the programs alternating
    within a round so that load from other jobs falls on all of them alike) of the plain
    scan, the scan under ``nothing_saveable`` (``nnx.remat``'s default) and under the
    policy of the member ``remat_scan`` takes at its least budget ("own": the uniform
    policy a user would write for those layers; the plain scan where it keeps the whole
    tape), and ``remat_scan`` (plan cached) at its least budget, at ``shares`` and at the
    measured memory of the scan under ``nothing_saveable`` (equal memory); per
    program its loops (:func:`jaxremat.scan.members.loop_bodies`: scans in the gradient),
    the kernels XLA compiles (fusions and dots of the optimized HLO) and the ratio to both
    uniform scans; ``remat_scan``'s measured peak (``activation_memory``) over its budget."""
    print("block  L    program                                          loops  kernels  "
          "compile s  x nothing  x own   (CPU s, least of %d alternating rounds)" % rounds)
    for kind in kinds:
        for L in depths:
            layer, params, x = block_stack(kind, L)
            least = least_budget(params, x, layer=layer)
            uniform = jaxremat.activation_memory(
                loss_of(scanned("nothing_saveable", layer)), params, x)
            made = []
            for label, budget in ([("least", least)] + [(share, share) for share in shares]
                                  + [("= nothing_saveable", uniform)]):
                f = jaxremat.remat_scan(layer, budget)
                try:
                    plan = f.plan(params, x)
                except solver.InfeasibleBudget:
                    continue
                assert plan.measured_peak <= plan.budget, (L, label)  # the meter's peak
                made.append((f"remat_scan {label}: {plan.member}",
                             loop_bodies(plan.member, L, plan.unroll), f, plan))
            policy = made[0][3].policy
            own = ("scan" if policy is None else f"scan+{made[0][3].option_name}")
            rows = [("scan", 2, scanned(layer=layer)),
                    ("scan+nothing_saveable", 2, scanned("nothing_saveable", layer))]
            if policy is not None:
                rows.append((own, 2, scanned(policy, layer)))
            rows += [(name, loops, f) for name, loops, f, _ in made]
            best = {name: float("inf") for name, _, _ in rows}
            kernels = {}
            for _ in range(rounds):
                for name, _, fn in rows:
                    start = time.process_time()
                    compiled = jax.jit(jax.grad(loss_of(fn))).lower(params, x).compile()
                    best[name] = min(best[name], time.process_time() - start)
                    if name not in kernels:
                        text = compiled.as_text()
                        kernels[name] = text.count(" fusion(") + text.count(" dot(")
            fits = {name: f"  memory {plan.measured_peak / plan.budget:.3f} of budget"
                    for name, _, _, plan in made}
            for name, loops, _ in rows:
                print(f"{kind:<6} {L:<4} {name:<48} {loops:>5} {kernels[name]:>8} "
                      f"{best[name]:>10.3f} {best[name] / best['scan+nothing_saveable']:>10.2f} "
                      f"{best[name] / best[own]:>6.2f}{fits.get(name, '')}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", default="mlp,gpt",
                        help=f"comma-separated blocks: {', '.join((*BLOCKS, 'gpt'))}")
    parser.add_argument("--depths", type=lambda s: tuple(int(v) for v in s.split(",")),
                        default=(8, 16, 32, 64, 128))
    args = parser.parse_args()
    kinds = args.block.split(",")
    if any(k not in (*BLOCKS, "gpt") for k in kinds):
        parser.error(f"--block: comma-separated names of {', '.join((*BLOCKS, 'gpt'))}, "
                     f"got {args.block!r}")
    compile_table(args.depths, kinds)


if __name__ == "__main__":
    main()
