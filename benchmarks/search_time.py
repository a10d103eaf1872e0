"""The ``"dots_plus"`` search's CPU time, per layer and base, with each candidate policy traced
(``jax.vjp`` of the checkpointed layer and its pullback, as before session 17) and split from
the layer's JVP program (:mod:`jaxremat.measure.policy_costs`), and whether the two find the
same options (issue 17.6).

    python benchmarks/search_time.py                          # gpt_blocks, gpt, mlp, conv
    python benchmarks/search_time.py --models gpt_blocks
    python benchmarks/search_time.py --local      # and the greedy against a local search

The models are ``benchmarks/policies.py``'s; each distinct layer of a model is searched once
per base (:data:`jaxremat.sequence.searched.BASES`) with each measure, the search's memo
cleared before each. CPU seconds (``time.process_time``): compare the columns of one run.

``--local`` then checks each option the greedy found against a local search from it: adding,
removing or swapping one candidate while the tape stays within the option's limit, as long as
that lowers the flops (or keeps them and the tape shrinks). Cheap now that a measure is a
split, it tells whether the greedy leaves flops behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import jax  # noqa: E402

from jaxremat.lru import LRU  # noqa: E402
from jaxremat.measure.trace import trace_once  # noqa: E402
from jaxremat.sequence import searched  # noqa: E402
from jaxremat.trees import tree_bytes  # noqa: E402


def traced_measure(layer, p, x, policy, program=None):
    """The search's measure as it was: the vjp and its pullback traced under ``policy``
    (``policies.py``'s ``_tape_and_flops``)."""
    from policies import _tape_and_flops

    del program
    return _tape_and_flops(layer, p, x, policy)


def _search(measure, layer, p, x, jaxpr, base):
    searched._measure, saved = measure, searched._measure
    searched._CHOSEN = LRU(256)
    try:
        start = time.process_time()
        found = searched.search(layer, p, x, jaxpr, tree_bytes(x), base)
        return found, time.process_time() - start
    finally:
        searched._measure = saved


def _distinct_layers(name: str):
    """``(index, layer traced once, its params, its input, its jaxpr)`` of each distinct
    layer of ``policies.py``'s model ``name`` (layers with equal jaxprs once)."""
    from policies import BUILDERS

    layers, params, x = BUILDERS[name]()
    seen = set()
    for index, (layer, p) in enumerate(zip(layers, params)):
        replay, jaxpr = trace_once(layer, p, x, index)
        if str(jaxpr) not in seen:
            seen.add(str(jaxpr))
            yield index, replay, p, x, jaxpr
        x = jax.eval_shape(layer, p, x)


def rows(name: str):
    for index, replay, p, x, jaxpr in _distinct_layers(name):
        for base in searched.BASES:
            traced, traced_s = _search(traced_measure, replay, p, x, jaxpr, base)
            split, split_s = _search(searched._measure, replay, p, x, jaxpr, base)
            yield (name, index, base, len(split), traced == split, traced_s, split_s)


def _improved(measure, keys, base, chosen, limit):
    """``(tape, flops)`` of the best union a 1-add/remove/swap local search reaches from
    ``chosen`` within ``limit``."""
    tape, flops = measure(searched.SearchedPolicy(frozenset(chosen), base))
    while True:
        best = (flops, tape, chosen)
        for key in keys:
            if key in chosen:
                trials = [chosen - {key}]
            else:
                trials = [chosen | {key}] + [(chosen - {c}) | {key} for c in chosen]
            for trial in trials:
                t, f = measure(searched.SearchedPolicy(frozenset(trial), base))
                if t <= limit and (f, t) < best[:2]:
                    best = (f, t, trial)
        if best[2] is chosen:
            return tape, flops
        flops, tape, chosen = best


def local_rows(name: str):
    from jaxremat.measure.policy_costs import jvp_program, policy_costs

    for index, replay, p, x, jaxpr in _distinct_layers(name):
        program = jvp_program(replay, p, x)
        measure = lambda policy: policy_costs(program, policy)  # noqa: E731
        for base in searched.BASES:
            keys = searched.candidates(jaxpr, tree_bytes(x), base)
            low = measure(searched.SearchedPolicy(frozenset(), base))
            limits = searched._limits(measure, base, low[0])
            for level, union in searched._greedy(measure, keys, base):
                chosen = frozenset(keys[k] for k in union)
                greedy = measure(searched.SearchedPolicy(chosen, base))
                local = _improved(measure, keys, base, chosen, limits[level])
                yield name, index, base, searched.SUFFIXES[level], low, greedy, local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt_blocks,gpt,mlp,conv")
    parser.add_argument("--local", action="store_true",
                        help="also check the greedy's options against a local search")
    args = parser.parse_args()
    print(f"JAX {jax.__version__}, CPU seconds per search")
    print("| model | layer | base | options | same options | traced (s) | split (s) | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    totals = [0.0, 0.0]
    for name in args.models.split(","):
        for model, index, base, count, same, traced_s, split_s in rows(name):
            totals[0] += traced_s
            totals[1] += split_s
            print(f"| {model} | {index} | {base} | {count} | {'yes' if same else 'NO'} | "
                  f"{traced_s:.2f} | {split_s:.2f} | {traced_s / max(split_s, 1e-9):.1f}x |")
    print(f"| all | | | | | {totals[0]:.2f} | {totals[1]:.2f} | "
          f"{totals[0] / max(totals[1], 1e-9):.1f}x |")
    if not args.local:
        return
    print("\nThe greedy's options against a local search from each (tape bytes, flops of the split):")
    print("| model | layer | base | option | base alone | greedy | local search | flops it saves more |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for model, index, base, suffix, low, greedy, local in local_rows(name):
            more = (greedy[1] - local[1]) / max(low[1] - greedy[1], 1.0)
            print(f"| {model} | {index} | {base} | {suffix or '(narrow)'} | {low[0]}, {low[1]:.4g} | "
                  f"{greedy[0]}, {greedy[1]:.4g} | {local[0]}, {local[1]:.4g} | {more:.1%} |")


if __name__ == "__main__":
    main()
