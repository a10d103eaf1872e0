"""Re-planning at new input shapes with Python's garbage collector on (issue 18.4, branch replan6).

    python benchmarks/replan_gc.py                      # this checkout
    python benchmarks/replan_gc.py --root /work/main    # another checkout, same model

``remat_sequence`` of 12 GPT-2 blocks (``benchmarks/policies.py``'s ``gpt_blocks_model``,
width 128, sequence 64, budget 50%) is planned at batch 4, then re-planned at 12 new batch
sizes (2, 3, 5, ..., 14) in the same process, the collector left as Python sets it. Prints the
CPU seconds (``time.process_time``) of a re-plan (median, mean, least, most), the full
(generation 2) collections that ran during the re-plans with their CPU seconds, the
collections of each generation per re-plan with their CPU milliseconds (both through
``gc.callbacks``), and the objects the collector tracks that each re-plan adds for good
(counted after a full collection).
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from replan_passes import gpt_stack  # noqa: E402  (the same model, --root parsed alike)

BATCHES = (2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)


def main() -> None:
    jaxremat, layers, params, x = gpt_stack(__doc__)
    import jax.numpy as jnp

    remat_sequence = jaxremat.remat_sequence
    remat_sequence(layers, "50%").plan(params, x)
    inputs = [jnp.ones((b, 64, 128)) for b in BATCHES]
    full: list[float] = []
    count = [0, 0, 0]
    spent = [0.0, 0.0, 0.0]
    started = [0.0]

    def on_collect(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.process_time()
            return
        generation = info["generation"]
        took = time.process_time() - started[0]
        count[generation] += 1
        spent[generation] += took
        if generation == 2:
            full.append(took)

    gc.collect()
    objects = len(gc.get_objects())
    gc.callbacks.append(on_collect)
    times = []
    for h in inputs:
        start = time.process_time()
        remat_sequence(layers, "50%").plan(params, h)
        times.append(time.process_time() - start)
    gc.callbacks.remove(on_collect)
    gc.collect()
    added = (len(gc.get_objects()) - objects) / len(inputs)
    print(f"jaxremat from {os.path.dirname(jaxremat.__file__)}")
    print("| re-plans | median | mean | min | max | full collections | their s | objects kept / re-plan |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {len(times)} | {statistics.median(times):.3f} | {statistics.mean(times):.3f} | "
          f"{min(times):.3f} | {max(times):.3f} | {len(full)} | {sum(full):.3f} | {added:.0f} |")
    print("per re-plan:", " ".join(f"{t:.3f}" for t in times))
    n = len(inputs)
    print("collections per re-plan (generation: count, CPU ms):", ", ".join(
        f"{g}: {count[g] / n:.2f}, {1000 * spent[g] / n:.2f}" for g in range(3)))


if __name__ == "__main__":
    main()
