"""Static costs at a new input shape without lowering (issue 18.4): how far they are.

    python benchmarks/newshape_costs.py [--models gpt,mlp,conv,gpt_blocks] [--axis 0] [--length N]

For each model of ``benchmarks/policies.py``:

1. the jaxpr count (:func:`jaxremat.measure.costs.jaxpr_costs`) against
   ``Lowered.cost_analysis()`` on every piece a profile lowers (plain forward; per option the
   tape-only forward, the vjp forward and the pullback), as lowered / counted, min-max per
   kind of piece: why the count is scaled from a lowering rather than used alone;
2. the profile at the input cut in half along ``--axis`` (0: the batch; 1: the sequence of
   the GPT models), or to ``--length`` along it, made after a profile at the full input
   (costs scaled from it, :mod:`jaxremat.sequence.calibration`), against a fresh profile
   at the cut input (every piece lowered): the worst relative difference of each layer's
   and option's times and flops, whether sizes and transients are equal, and how many
   pieces were scaled, estimated (a program laid out differently: ``--length 1`` on the
   batch axis, where ``jnp.einsum`` squeezes it) and lowered.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

from jaxremat.measure.costs import jaxpr_costs, lowered_costs  # noqa: E402
from jaxremat.sequence import calibration  # noqa: E402
from jaxremat.measure.trace import tape_forward, trace_layer  # noqa: E402
from jaxremat.sequence.policies import check_policies, layer_menu, marked_names  # noqa: E402
from jaxremat.sequence.profile import profile_cache, profile_sequence  # noqa: E402
from jaxremat.trees import abstractify  # noqa: E402
from policies import BUILDERS  # noqa: E402

TIMES = ("fwd_time", "bwd_time", "fwd_tape_time", "fwd_flops", "bwd_flops", "fwd_tape_flops")
SIZES = ("tape_bytes", "fwd_tmp", "bwd_tmp", "output_in_tape")


def _pieces(layer, p, x, index):
    yield "forward", layer, (p, x)
    for option in layer_menu(check_policies(None), marked_names(layer, p, x)):
        fn = layer if option.policy is None else jax.checkpoint(
            layer, policy=option.policy, prevent_cse=True)
        try:
            traced = trace_layer(fn, p, x, index)
        except Exception:  # noqa: BLE001 - a policy JAX rejects: not profiled either
            continue
        yield "tape", tape_forward(traced), (p, x)
        yield "vjp", tape_forward(traced, with_output=True), (p, x)
        yield "backward", traced.pullback, (list(traced.residuals), traced.cotangent)


def count_ratios(name: str) -> list[str]:
    layers, params, x = BUILDERS[name]()
    current, seen = abstractify(x, "x"), set()
    ratios = collections.defaultdict(list)
    for i, layer in enumerate(layers):
        p = abstractify(params[i], f"params[{i}]")
        key = (id(layer), str(jax.tree.map(lambda s: s.shape, (p, current))))
        if key not in seen:
            seen.add(key)
            for piece, fn, args in _pieces(layer, p, current, i):
                low, count = lowered_costs(fn, *args), jaxpr_costs(fn, *args)
                ratios[piece].append([low[k] / max(count[k], 1.0)
                                      for k in ("flops", "bytes accessed")])
        current = jax.eval_shape(layer, p, current)
    return [f"| {name} | {piece} | {len(r)} | {min(a for a, _ in r):.3f}-{max(a for a, _ in r):.3f}"
            f" | {min(b for _, b in r):.3f}-{max(b for _, b in r):.3f} |"
            for piece, r in ratios.items()]


def _worst(scaled, lowered, worst):
    for field in (f for f in TIMES if hasattr(lowered, f)):
        a, b = getattr(scaled, field), getattr(lowered, field)
        worst[field] = max(worst.get(field, 0.0), abs(a - b) / abs(b) if b else abs(a))
    return all(getattr(scaled, f) == getattr(lowered, f) for f in SIZES)


def _counting(ways: collections.Counter):
    """Wrap calibration's three ways to a piece's costs to count which answered."""
    originals = {k: getattr(calibration, k) for k in
                 ("scaled_costs", "estimated_costs", "lowered_costs")}

    def wrapped(name):
        def call(*args):
            found = originals[name](*args)
            if found is not None:
                ways[name.split("_")[0]] += 1
            return found
        return call

    for name in originals:
        setattr(calibration, name, wrapped(name))
    return originals


def scaled_errors(name: str, axis: int, length: int | None = None) -> str:
    layers, params, x = BUILDERS[name]()
    half = jax.tree.map(lambda a: jax.lax.slice_in_dim(
        a, 0, length or a.shape[axis] // 2, axis=axis), x)
    profile_cache().clear()
    profile_sequence(layers, params, x)
    ways: collections.Counter = collections.Counter()
    originals = _counting(ways)
    try:
        scaled = profile_sequence(layers, params, half).layers
    finally:
        for key, value in originals.items():
            setattr(calibration, key, value)
    profile_cache().clear()
    fresh = profile_sequence(layers, params, half).layers
    worst: dict[str, float] = {}
    sizes = True
    for a, b in zip(scaled, fresh):
        sizes &= _worst(a, b, worst) and a.option_names == b.option_names
        for oa, ob in zip(a.options, b.options):
            sizes &= _worst(oa, ob, worst)
    cells = " | ".join(f"{worst.get(f, 0.0):.1e}" for f in TIMES)
    counts = f"{ways['scaled']} / {ways['estimated']} / {ways['lowered']}"
    return f"| {name} | {axis} | {cells} | {'equal' if sizes else 'DIFFER'} | {counts} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,mlp,conv,gpt_blocks")
    parser.add_argument("--axis", type=int, default=0)
    parser.add_argument("--length", type=int, default=None,
                        help="cut the input to this length along --axis (default: half)")
    parser.add_argument("--skip-ratios", action="store_true",
                        help="only the profile at the cut input (part 2)")
    args = parser.parse_args()
    names = args.models.split(",")
    if not args.skip_ratios:
        print("| model | piece | pieces | flops lowered/counted | bytes lowered/counted |")
        print("|---|---|---|---|---|")
        for name in names:
            print("\n".join(count_ratios(name)), flush=True)
    cut = "halved" if args.length is None else f"cut to {args.length}"
    print(f"\n| model | axis {cut} | {' | '.join(TIMES)} | sizes, transients, options "
          "| pieces scaled / estimated / lowered |")
    print("|---|---|" + "---|" * (len(TIMES) + 2))
    for name in names:
        print(scaled_errors(name, args.axis, args.length), flush=True)


if __name__ == "__main__":
    main()
