"""Where a re-plan at a new input shape spends its CPU (issue 18.4, branch meterfast).

    python benchmarks/replan_passes.py                      # this checkout
    python benchmarks/replan_passes.py --root /work/main    # another checkout, same model

``remat_sequence`` of 12 GPT-2 blocks (``benchmarks/policies.py``'s ``gpt_blocks_model``,
width 128, sequence 64, budget 50%) is planned at batch 4, then re-planned at 8 new batch
sizes; the table gives the mean CPU seconds (``time.process_time``) per re-plan, in total and
in each of jaxremat's passes over jaxprs (the outermost call of each is timed: a pass called
inside another counts in both). Python's garbage collector is off while timing, so that a
full collection landing in one re-plan or another (0.1 s here) does not hide the passes'
differences; ``planning_time.py`` gives the times with it on.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PASSES = (("measure.trace", "program_memory"), ("measure.trace", "inputs_read"),
          ("measure.trace", "input_deps"), ("sequence.calibration", "count_terms"),
          ("sequence.profile", "trace_once"), ("sequence.derive", "without_input_grad"))


def _timed_passes(spent: collections.Counter) -> None:
    import importlib

    depth = [0]
    for module_name, name in PASSES:
        module = importlib.import_module(f"jaxremat.{module_name}")
        original = getattr(module, name)

        @functools.wraps(original)
        def timed(*args, _original=original, _name=name, **kwargs):
            if depth[0]:
                return _original(*args, **kwargs)
            depth[0] += 1
            start = time.process_time()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_name] += time.process_time() - start
                depth[0] -= 1

        setattr(module, name, timed)


def gpt_stack(description: str) -> tuple:
    """``--root`` parsed and that checkout put first on ``sys.path``; returns ``(jaxremat,
    layers, params, x)``: that checkout's package and 12 GPT-2 blocks of width 128 at batch
    4, sequence 64 (``policies.py``'s ``gpt_blocks_model``), the model both re-plan scripts
    time."""
    parser = argparse.ArgumentParser(description=description.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(HERE, ".."),
                        help="the checkout whose jaxremat is timed")
    args = parser.parse_args()
    sys.path[:0] = [os.path.abspath(args.root), HERE]
    import jaxremat  # first: policies.py puts this checkout's root first on sys.path
    from policies import gpt_blocks_model

    return (jaxremat, *gpt_blocks_model(n_layer=12, batch=4, seq=64))


def main() -> None:
    jaxremat, layers, params, x = gpt_stack(__doc__)
    import jax.numpy as jnp

    remat_sequence = jaxremat.remat_sequence
    spent: collections.Counter = collections.Counter()
    _timed_passes(spent)
    remat_sequence(layers, "50%").plan(params, x)
    inputs = [jnp.ones((b, 64, 128)) for b in (2, 3, 5, 6, 7, 8, 9, 10)]
    spent.clear()
    gc.disable()
    total = 0.0
    for h in inputs:
        start = time.process_time()
        remat_sequence(layers, "50%").plan(params, h)
        total += time.process_time() - start
    gc.enable()
    n = len(inputs)
    print(f"jaxremat from {os.path.dirname(jaxremat.__file__)}")
    print("| re-plan | " + " | ".join(name for _, name in PASSES) + " |")
    print("|---" * (len(PASSES) + 1) + "|")
    print(f"| {total / n:.3f} | " + " | ".join(f"{spent[name] / n:.4f}" for _, name in PASSES)
          + " |")


if __name__ == "__main__":
    main()
