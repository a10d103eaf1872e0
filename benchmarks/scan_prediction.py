"""remat_scan's prediction against the meter, per member of the nested-scan family.

For each block of ``benchmarks/scan_depth.py`` (``block_stack``) and each depth ``L``, a
few members of each kind (the plain scan, ``jax.checkpoint`` per layer, reshaped segments of
2 and of ``L/2`` layers, segments of 3 with a remainder, two levels ``4 > 2`` and ``4 > 1``)
under every option of the layer's policy menu: the measured peak
(``jaxremat.activation_memory`` of the member's program, program order) and the predicted
one (the chain simulator's peak plus ``jaxremat.scan.family.loop_margin``), in bytes, and
measured / predicted, which issue 17.5 asks in 0.98-1.00 and never above 1.00.

    python benchmarks/scan_prediction.py [--blocks mlp,gpt] [--depths 8] [--unroll auto]
        [--members "(),(1,),(2,),(H,),(3,),(4,2),(4,1)"]

``H`` in ``--members`` stands for ``L // 2``; ``--unroll auto`` takes what ``remat_scan``'s
``unroll="auto"`` takes for the block (MLP: 2, GPT-2 block: 0). CPU: memory is the
meter's (XLA's CPU compiler undoes remat).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

import jaxremat  # noqa: E402
from jaxremat.scan.family import loop_margin, member_schedule  # noqa: E402
from jaxremat.scan.members import NestedScan  # noqa: E402
from jaxremat.scan.plan import option_policies  # noqa: E402
from jaxremat.scan.margins import margin_bytes  # noqa: E402
from jaxremat.scan.realize import measured_memory as _measured  # noqa: E402
from scan_depth import block_stack  # noqa: E402


def member_rows(kind: str, L: int, unroll: str | int, sizes: list[tuple[int, ...]]):
    """``(member, option name, measured, predicted)`` for each of ``sizes`` (members that do
    not fit ``L`` left out) under every option of block ``kind`` at depth ``L``."""
    layer, params, x = block_stack(kind, L)
    plan = jaxremat.remat_scan(layer, 1 << 50, unroll=unroll).plan(params, x)
    chain, policies = plan.chain, option_policies(plan.layer)
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), params)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, x))
    sizes_bytes = margin_bytes(layer, one, abstract[1], policies)
    for option in range(len(policies)):
        name = "everything" if not option else plan.layer.options[option - 1].name
        for member_sizes in sizes:
            if member_sizes and member_sizes[0] >= L:
                continue
            member = NestedScan(member_sizes, option)
            predicted = (member_schedule(chain, member).peak
                         + loop_margin(chain, member, unroll=plan.unroll, **sizes_bytes))
            measured = _measured(layer, *abstract, L, policies, plan.unroll, member)
            yield member, name, plan.unroll, measured, predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="mlp,gpt")
    parser.add_argument("--depths", default="8")
    parser.add_argument("--unroll", default="auto")
    parser.add_argument("--members", default="(),(1,),(2,),(H,),(3,),(4,2),(4,1)")
    args = parser.parse_args()
    unroll = args.unroll if args.unroll == "auto" else int(args.unroll)
    print(f"JAX {jax.__version__}")
    print("| block | L | unroll | member | option | measured B | predicted B | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in args.blocks.split(","):
        for L in map(int, args.depths.split(",")):
            sizes = ast.literal_eval("[" + args.members.replace("H", str(L // 2)) + "]")
            for member, name, used, measured, predicted in member_rows(kind, L, unroll, sizes):
                flag = " **over**" if measured > predicted else ""
                print(f"| {kind} | {L} | {used} | {' > '.join(map(str, member.sizes)) or 'plain'}"
                      f" | {name} | {measured} | {predicted:.0f} | {measured / predicted:.4f}"
                      f"{flag} |", flush=True)


if __name__ == "__main__":
    main()
