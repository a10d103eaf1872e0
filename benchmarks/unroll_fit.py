"""Scanned NNX stacks with unrolled runs: what the whole-step fit probes against the step.

``remat_blocks`` on an ``nnx.vmap``-built stack (``scope="model"``) fits the blocks' budget
by measuring the whole step (:mod:`jaxremat.flax.model_scope`); the step then trains with
its own loss. For each model and budget this prints the nested-scan member the fit chose,
the step the fit probed (its measured bytes), the training step's bytes and flops:

* ``tests/test_flax_scanned.py``'s model (Linear, BatchNorm, tanh, Dropout; 6 blocks) at
  "80%", trained with ``mean(out ** 2)``, fitted with the default loss (the sum of the
  outputs) and with ``loss=`` that loss;
* ``benchmarks/nnx_scan.py``'s GPT (8 scanned blocks, cross-entropy) at a 14000000-byte
  step budget, fitted with the default loss and with ``fit_blocks(loss_fn, tokens)``.

``--unroll 0`` runs the stacks as ``jaxremat.flax.scanned`` did before branch ``unrollfit``
(every inner run a scan); the default is ``remat_scan``'s (runs of <= 2 layers unrolled).
Memory: ``jaxremat.flax.activation_memory`` (program order; CPU figures, XLA's CPU compiler
undoes remat). Flops: the gradient's jaxpr, scan bodies times their length.

    python benchmarks/unroll_fit.py [--unroll 0]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Any

import jax

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import jaxremat  # noqa: E402
import jaxremat.flax  # noqa: E402
from jaxremat.flax import scanned  # noqa: E402
import nnx_scan  # noqa: E402
import test_flax_scanned as small  # noqa: E402
from jaxremat.scan.members import UNROLL  # noqa: E402


def row(name: str, plan: Any, step: int, flops: float | None = None) -> None:
    """One line: the fit's member, what it probed, the step and their difference."""
    note = "" if flops is None else f" {flops:>10.4g}"
    print(f"{name:<44} {plan.scan.member!s:<34} {plan.scope.measured:>9} {step:>9} "
          f"{step - plan.scope.measured:>+7}{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--unroll", type=int, default=UNROLL,
                        help="remat_scan's unroll for the stacks (0: every run a scan)")
    unroll = parser.parse_args().unroll
    if unroll != UNROLL:  # the stacks as they ran before: remat_scan(..., unroll=0)
        scanned.remat_scan = functools.partial(jaxremat.remat_scan, unroll=unroll)
    print(f"backend {jax.default_backend()}, JAX {jax.__version__}, unroll={unroll}")
    print(f"{'model, fit':<44} {'member':<34} {'probed':>9} {'step':>9} {'diff':>7} "
          f"{'flops':>10}")
    x = jax.random.normal(jax.random.key(0), (small.BATCH, small.DIM))
    for name, loss in (("test model 80%, default loss", None),
                       ("test model 80%, loss=mean(out ** 2)", small.squares)):
        model = small.remat_model("80%", loss=loss)(deterministic=False)
        plan = model.plan_blocks(x)
        row(name, plan, jaxremat.flax.activation_memory(model, small.loss_fn, x))
    tokens = jax.random.randint(jax.random.key(0), (nnx_scan.BATCH, nnx_scan.CONTEXT + 1), 0,
                                nnx_scan.VOCAB)
    budget = 14_000_000
    model = nnx_scan.remat_gpt(budget)
    row(f"GPT {budget} B, default loss", model.plan_blocks(tokens[:, :-1]),
        *nnx_scan.measure(model, tokens))
    model = nnx_scan.remat_gpt(budget)
    row(f"GPT {budget} B, fit_blocks(loss_fn, tokens)",
        model.fit_blocks(nnx_scan.loss_fn, tokens), *nnx_scan.measure(model, tokens))


if __name__ == "__main__":
    main()
