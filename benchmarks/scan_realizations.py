"""Realizations of remat_scan's nested members, and ``unroll`` at one budget (issue 18.5).

1. For members of the nested-scan family on ``scan_depth.py``'s residual MLP block, the
   gradient's compile CPU seconds (least of 3) and ``jaxremat.activation_memory``, both over
   the scan with ``jax.checkpoint(nothing_saveable)`` per layer, with the inner runs of
   layers realized four ways: nested ``lax.scan`` (``unroll=0``), unrolled in Python,
   ``lax.scan(..., unroll=True)`` and ``lax.fori_loop`` over dynamic slices of the
   parameters ("eqns": the gradient's program size).
2. ``--same-budget``: ``remat_scan`` with ``unroll`` "auto", 2 and 0 at the least budget that
   ``unroll=0`` names (one budget for the three): member, measured memory, compile.

CPU figures (XLA's CPU compiler undoes remat: memory is the meter's).
    python benchmarks/scan_realizations.py [--depths 16,64] [--same-budget]
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jaxremat  # noqa: E402
import jaxremat.scan.realize as realization  # noqa: E402
from jaxremat.scan.plan import option_policies  # noqa: E402
from jaxremat.scan.members import NestedScan  # noqa: E402

import scan_depth as sd  # noqa: E402

MEMBERS = (((2,), 1), ((4,), 1), ((8,), 1), ((8, 2), 1))  # option 1: dots_saveable here
_SCANNED = realization.scan_layers


def _unrolled_scan(layer, params, x, unroll=0):
    """Inner runs as ``lax.scan(..., unroll=True)``: the body repeated, no loop for XLA."""
    length = jax.tree.leaves(params)[0].shape[0]
    return jax.lax.scan(lambda h, p: (layer(p, h), None), x, params,
                        unroll=bool(unroll and length <= unroll))[0]


def _fori(layer, params, x, unroll=0):
    """Inner runs as ``lax.fori_loop`` over dynamic slices of the stacked parameters."""
    length = jax.tree.leaves(params)[0].shape[0]
    if not (unroll and length <= unroll):
        return _SCANNED(layer, params, x, unroll)

    def body(i, h):
        return layer(jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), params), h)
    return jax.lax.fori_loop(0, length, body, x)


REALIZATIONS = (("inner scans", _SCANNED, 0), ("Python unroll", _SCANNED, 8),
                ("scan(unroll=True)", _unrolled_scan, 8), ("fori_loop", _fori, 8))


def realizations(L):
    params, x = sd.stack(L), jnp.ones((sd.BATCH, sd.WIDTH))
    base = sd.compile_seconds(sd.scanned("nothing_saveable"), params, x)
    nothing = sd.memory(sd.scanned("nothing_saveable"), params, x)
    print(f"L={L}: scan+nothing_saveable {base:.3f} CPU s, memory {nothing} B")
    policy = jaxremat.remat_scan(sd.block, "50%").plan(params, x)
    for sizes, option in MEMBERS:
        member = NestedScan(sizes, option)
        assert member.option < len(policy.layer.options) + 1, "the block lost its dots option"
        for name, realize, unroll in REALIZATIONS:
            realization.scan_layers = realize
            try:
                fn = (lambda p, h, member=member, unroll=unroll: realization.run_member(
                    sd.block, member.sizes, p, h, L,
                    option_policies(policy.layer)[member.option], unroll=unroll))
                seconds, mem = sd.compile_seconds(fn, params, x), sd.memory(fn, params, x)
                print(f"  {str(member):<48} {name:<18} compile {seconds / base:5.2f}x  "
                      f"memory {mem:>9} ({mem / nothing:.3f})  eqns {sd.size(fn, params, x)}",
                      flush=True)
            finally:
                realization.scan_layers = _SCANNED


def same_budget(L):
    params, x = sd.stack(L), jnp.ones((sd.BATCH, sd.WIDTH))
    base = sd.compile_seconds(sd.scanned("nothing_saveable"), params, x)
    budget = sd.least_budget(params, x, unroll=0)
    for unroll in ("auto", 2, 0):
        f = jaxremat.remat_scan(sd.block, budget, unroll=unroll)
        plan = f.plan(params, x)
        print(f"{L:<4} budget {budget} unroll {unroll!s:<5} {str(plan.member):<48} "
              f"(unroll {plan.unroll})  measured {sd.memory(f, params, x):>9}  compile "
              f"{sd.compile_seconds(f, params, x) / base:.2f}x", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default=None,
                        type=lambda s: tuple(int(v) for v in s.split(",")))
    parser.add_argument("--same-budget", action="store_true")
    args = parser.parse_args()
    print(f"backend {jax.default_backend()}, JAX {jax.__version__}")
    for L in args.depths or ((64, 128) if args.same_budget else (16, 64)):
        (same_budget if args.same_budget else realizations)(L)


if __name__ == "__main__":
    main()
