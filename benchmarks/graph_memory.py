"""``remat_graph`` (Feng & Huang on the jaxpr) versus layer-level ``remat_sequence``.

    python benchmarks/graph_memory.py [--models mlp,conv,gpt]

For the models of ``benchmarks/jax_memory.py`` written as one function ``fn(params, x)``
(the layer loop inlined), it prints per plan:

* ops: top-level operations on ``x`` (graph vertices); solve: seconds to trace and search;
* model: Feng & Huang's predicted memory (kept tensors + largest rebuilt segment);
* measured: :func:`jaxremat.activation_memory` of ``jax.grad`` (program order, parameters
  excluded), and its share of the plain program's;
* flops: ``Lowered.cost_analysis()`` flops of the jitted gradient relative to the plain one.

Rows: ``graph`` (``remat_graph``: the least-memory checkpoints); ``graph @ s`` (``remat_graph``
with a budget a share ``s`` of the way from what ``graph`` measured to the plain program's
memory; ``solve`` includes the bisection and its measurements) and, for reference,
``seq rotor @ s`` (``remat_sequence`` on the layers at the same budget); ``seq every_layer``.

On a GPU (or with ``--device-columns on``) each row also gets the jitted gradient's compiled
memory, its temp part (``memory_analysis``) and the median step time: there XLA keeps the
recomputation, so these say what the plans save on the device (on CPU XLA undoes remat).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import solver  # noqa: E402
import jax  # noqa: E402
from jax_memory import MODELS, _flops, _loss, _plain, compiled_columns  # noqa: E402
from jaxremat import activation_memory, format_bytes, remat_graph, remat_sequence  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,conv,gpt")
    parser.add_argument("--shares", default="0,0.1,0.25,0.5",
                        help="budgets for remat_graph, as shares of the way from the least memory to plain")
    parser.add_argument("--scale", type=int, default=1, help="multiplies the batch size")
    parser.add_argument("--device-columns", choices=("auto", "on", "off"), default="auto",
                        help="compiled memory and step time: auto = on a GPU/TPU only")
    args = parser.parse_args()
    global _DEVICE
    _DEVICE = {"auto": jax.devices()[0].platform != "cpu", "on": True, "off": False}[args.device_columns]
    header = (f"{'model':<5} {'plan':<16} {'ops':>5} {'solve s':>7} {'model':>10} {'measured':>10} "
              f"{'meas/plain':>10} {'flops x':>7}")
    if _DEVICE:
        header += f" {'compiled':>10} {'temp':>10} {'step ms':>8}"
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        layers, params, x = MODELS[name](args.scale)
        fn = _loss(lambda p, x, layers=layers: _plain(layers, p, x))
        plain = activation_memory(fn, params, x)
        base = _flops(fn, params, x)
        print(f"{name:<5} {'plain':<16} {'':>5} {'':>7} {'':>10} {format_bytes(plain):>10} "
              f"{1:>10.3f} {1:>7.3f}" + _device_columns(fn, params, x))
        start = time.perf_counter()
        g = remat_graph(fn)
        plan = g.plan(params, x)
        solve = time.perf_counter() - start
        least = activation_memory(g, params, x)
        print(f"{name:<5} {'graph':<16} {len(plan.graph) - 2:>5} {solve:>7.2f} "
              f"{format_bytes(plan.predicted):>10} {format_bytes(least):>10} "
              f"{least / plain:>10.3f} {_flops(g, params, x) / base:>7.3f}" + _device_columns(g, params, x))
        for share in (float(s) for s in args.shares.split(",") if s):
            budget = int(least + share * (plain - least))
            start = time.perf_counter()
            g = remat_graph(fn, budget)
            label = f"graph @ {share:g}"
            try:
                plan = g.plan(params, x)
            except solver.InfeasibleBudget as error:
                print(f"{name:<5} {label:<16} infeasible (needs {format_bytes(error.min_budget)})")
            else:
                solve = time.perf_counter() - start
                measured = activation_memory(g, params, x)
                assert measured == plan.measured <= plan.budget
                print(f"{name:<5} {label:<16} {len(plan.graph) - 2:>5} {solve:>7.2f} "
                      f"{format_bytes(plan.predicted):>10} {format_bytes(measured):>10} "
                      f"{measured / plain:>10.3f} {_flops(g, params, x) / base:>7.3f}"
                      + _device_columns(g, params, x))
            _sequence_row(name, f"seq rotor @ {share:g}", layers, params, x, budget, "rotor", plain, base)
        _sequence_row(name, "seq every_layer", layers, params, x, plain, "every_layer", plain, base)


_DEVICE = False


def _device_columns(loss, params, x) -> str:
    """Compiled memory, its temp part and the median step time, when device columns are on."""
    if not _DEVICE:
        return ""
    total, temp, step = compiled_columns(loss, params, x)
    return f" {format_bytes(total):>10} {format_bytes(temp):>10} {step * 1e3:>8.2f}"


def _sequence_row(name, label, layers, params, x, budget, method, plain, base) -> None:
    """A row for ``remat_sequence`` on the layers at ``budget``."""
    seq = remat_sequence(layers, int(budget), method=method)
    try:
        seq.plan(params, x)
    except solver.InfeasibleBudget as error:
        print(f"{name:<5} {label:<16} infeasible (needs {format_bytes(error.min_budget)})")
        return
    loss = _loss(seq)
    measured = activation_memory(loss, params, x)
    print(f"{name:<5} {label:<16} {len(layers):>5} {'':>7} {'':>10} {format_bytes(measured):>10} "
          f"{measured / plain:>10.3f} {_flops(loss, params, x) / base:>7.3f}"
          + _device_columns(loss, params, x))


if __name__ == "__main__":
    main()
