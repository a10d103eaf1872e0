"""Measured over predicted memory of ``remat_sequence`` plans on random heterogeneous stacks
(issue 17.5), with both backends.

    python benchmarks/random_stacks.py [--seeds 0:40]

Each seed draws a stack of ``tests/test_random_stacks.py`` (3-7 layers of the kinds dense,
mlp, attention, relu2; width 8-24, batch 1-3, sequence 4 or 8), a menu (the default, the
whole tape only, ``dots_plus``) and a budget share between each backend's least budget and no
remat; it plans with ``backend="checkpoint"`` and ``"custom_vjp"`` and prints, per backend,
``activation_memory`` (program order, the sum of the outputs as the loss) over the plan's
predicted peak, which must be at most 1 (the target: 0.98-1.00). Plans depend on the static
costs' calibration (an earlier shape of a layer scales a later one's), so a seed's plan can
differ with the seeds run before it: compare runs over the same seeds in the same order.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import jax.numpy as jnp  # noqa: E402

from jaxremat import activation_memory, remat_sequence  # noqa: E402
from test_random_stacks import KINDS, _budget, build  # noqa: E402

MENUS = {"default": None, "tape": (), "plus": ("dots_plus",)}
BACKENDS = ("checkpoint", "custom_vjp")


def draw(seed: int) -> tuple:
    """``(kinds, widths, batch, length, seed, share, menu name)`` of a seed."""
    rng = np.random.default_rng(1000 + seed)
    kinds = tuple(str(rng.choice(KINDS)) for _ in range(rng.integers(3, 8)))
    widths = [int(rng.choice((8, 16, 24)))]
    for kind in kinds:
        widths.append(int(rng.choice((8, 16, 24))) if kind == "dense" else widths[-1])
    return (kinds, tuple(widths), int(rng.choice((1, 2, 3))), int(rng.choice((4, 8))), seed,
            float(rng.random()), list(MENUS)[rng.integers(3)])


def run(seed: int) -> list[tuple[str, int, float, int]]:
    """Per backend: ``(backend, budget, predicted peak, measured)``."""
    kinds, widths, batch, length, _, share, menu = draw(seed)
    layers, params, x = build(kinds, widths, batch, length, seed)
    rows = []
    for backend in BACKENDS:
        budget = _budget(layers, params, x, share, MENUS[menu], backend)
        seq = remat_sequence(layers, budget, policies=MENUS[menu], backend=backend)
        plan = seq.plan(params, x)
        measured = activation_memory(lambda p, x: jnp.sum(seq(p, x)), params, x)
        rows.append((backend, budget, plan.predicted_peak, measured))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:40", help="first:stop")
    args = parser.parse_args()
    first, stop = map(int, args.seeds.split(":"))
    ratios = {backend: [] for backend in BACKENDS}
    for seed in range(first, stop):
        kinds, widths, batch, length, _, share, menu = draw(seed)
        cells = []
        for backend, budget, predicted, measured in run(seed):
            ratios[backend].append(measured / predicted)
            flag = "" if measured <= predicted <= budget else " OVER"
            cells.append(f"{backend} {measured / predicted:.4f} ({measured}/{int(predicted)}){flag}")
        print(f"{seed:3d} {'/'.join(k[:3] for k in kinds):28s} w{widths[0]:<2d} b{batch} t{length} "
              f"{share:.2f} {menu:7s} " + "  ".join(cells), flush=True)
    for backend, values in ratios.items():
        below = sum(r < 1 for r in values)
        print(f"{backend}: {len(values)} plans, {len(values) - below} exact, least "
              f"{min(values):.4f}, mean {np.mean(values):.4f}, above 1: "
              f"{sum(r > 1 for r in values)}")


if __name__ == "__main__":
    main()
