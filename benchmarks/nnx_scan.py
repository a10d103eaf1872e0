"""A scanned NNX GPT (issue 18.2): uniform remat in the scan body against ``remat_blocks``.

A GPT-style model (examples/gpt_nnx.py's pre-norm block: causal attention, a 4x MLP,
dropout) whose 8 blocks are built the Flax way -- ``nnx.split_rngs`` + ``nnx.vmap``, their
variables stacked -- and run with ``nnx.scan``:

* ``scan``: the plain scan (every residual stored);
* ``scan+nnx.remat <policy>``: ``nnx.remat(policy=...)`` around the block in the scan body,
  ``nothing_saveable`` (``nnx.remat``'s default) and ``dots_saveable``;
* ``remat_blocks <budget>``: the same model decorated with ``jaxremat.flax.remat_blocks``
  (the scan line becomes ``self.run_blocks(h)``; whole-step budget, ``scope="model"``) at
  the measured memory of each uniform policy and at 50%.

Memory: the whole training step (embeddings, blocks, head, cross-entropy; parameters and
their gradients excluded) in program order, ``jaxremat.flax.activation_memory``. Flops:
counted on the gradient's jaxpr, a scan body times its length (benchmarks/scan_depth.py;
``Lowered.cost_analysis()`` counts a loop body once). CPU figures: XLA's CPU compiler undoes
remat, so memory is the meter's.

    python benchmarks/nnx_scan.py [--costs flops|static]

``--costs`` is the cost model remat_blocks plans with (default ``flops``: the table ranks plans
by flops; the ``static`` roofline ranks them by unfused bytes, and on this narrow block prefers
recomputing a whole layer to ``dots_saveable``).
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import optax
from flax import nnx

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

import jaxremat  # noqa: E402
import jaxremat.flax  # noqa: E402
import solver  # noqa: E402
from gpt_nnx import Block  # noqa: E402
from jaxremat.flax.meter import pure_step  # noqa: E402
from scan_depth import _flops  # noqa: E402

DEPTH, DIM, HEADS, CONTEXT, VOCAB, BATCH = 8, 64, 4, 64, 256, 8
POLICIES = ("nothing_saveable", "dots_saveable")


class ScannedGPT(nnx.Module):
    """The GPT with its blocks stacked by ``nnx.vmap`` and run by ``nnx.scan``; ``policy``:
    ``None`` (plain) or a ``jax.checkpoint_policies`` name for ``nnx.remat`` in the body."""

    def __init__(self, policy: str | None = None, seed: int = 0):
        rngs = nnx.Rngs(seed, dropout=seed + 1)
        self.tokens = nnx.Embed(VOCAB, DIM, rngs=rngs)
        self.positions = nnx.Embed(CONTEXT, DIM, rngs=rngs)

        @nnx.split_rngs(splits=DEPTH)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs):
            return Block(DIM, HEADS, 0.1, rngs=rngs)
        self.blocks = create(rngs)
        self.norm = nnx.LayerNorm(DIM, rngs=rngs)
        self.out = nnx.Linear(DIM, VOCAB, rngs=rngs)
        self.policy = policy

    def run(self, h):
        policy = None if self.policy is None else getattr(jax.checkpoint_policies, self.policy)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(h, block):
            if policy is None:
                return block(h)
            return nnx.remat(lambda b, x: b(x), policy=policy)(block, h)
        return forward(h, self.blocks)

    def __call__(self, tokens):
        h = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[-1]))
        return self.out(self.norm(self.run(h)))


def remat_gpt(budget, costs="flops"):
    """``ScannedGPT`` with ``remat_blocks``: the scan line becomes ``self.run_blocks(h)``."""

    @jaxremat.flax.remat_blocks("blocks", budget=budget, costs=costs)
    class RematGPT(ScannedGPT):
        def run(self, h):
            return self.run_blocks(h)
    return RematGPT()


def loss_fn(model, tokens):
    logits = model(tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def step_flops(model, tokens) -> float:
    """Flops of the gradient of the step, on its jaxpr (scan bodies times their length)."""
    step, params, rest = pure_step(model, loss_fn)
    return _flops(jax.make_jaxpr(jax.grad(step))(params, rest, tokens).jaxpr)


def measure(model, tokens) -> tuple[int, float]:
    return jaxremat.flax.activation_memory(model, loss_fn, tokens), step_flops(model, tokens)


def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--costs", default="flops", choices=("flops", "static"))
    costs = parser.parse_args().costs
    tokens = jax.random.randint(jax.random.key(0), (BATCH, CONTEXT + 1), 0, VOCAB)
    print(f"backend {jax.default_backend()}, JAX {jax.__version__}: GPT with {DEPTH} scanned "
          f"blocks (dim {DIM}, {HEADS} heads, context {CONTEXT}, batch {BATCH}); whole-step "
          f"memory (activation_memory, program order) and flops (gradient jaxpr); costs={costs!r}")
    plain_memory, plain_flops = measure(ScannedGPT(), tokens)
    print(f"{'model':<34} {'memory':>10} {'/plain':>7} {'flops':>10} {'/plain':>7}  plan")
    row = lambda name, mem, fl, note="": print(  # noqa: E731
        f"{name:<34} {mem:>10} {mem / plain_memory:>7.3f} {fl:>10.4g} {fl / plain_flops:>7.3f}"
        f"  {note}")
    row("scan (no remat)", plain_memory, plain_flops)
    budgets = []
    for policy in POLICIES:
        memory, fl = measure(ScannedGPT(policy), tokens)
        row(f"scan+nnx.remat {policy}", memory, fl)
        budgets.append((f"= {policy} ({memory})", memory))
    budgets.append(("50%", "50%"))
    for label, budget in budgets:
        model = remat_gpt(budget, costs)
        try:
            plan = model.plan_blocks(tokens[:, :-1])
        except solver.InfeasibleBudget as error:
            print(f"{'remat_blocks ' + label:<34} infeasible (least measured step "
                  f"{error.min_budget:.0f})")
            continue
        memory, fl = measure(model, tokens)
        row(f"remat_blocks {label}", memory, fl,
            f"[{plan.scan.member}; step budget {plan.scope.budget}]")


if __name__ == "__main__":
    main()
