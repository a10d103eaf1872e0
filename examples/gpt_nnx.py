"""Train a GPT-style transformer (Flax NNX) whose blocks rematerialize under a budget.

The model is written as usual -- token and position embeddings, ``self.blocks`` (an
``nnx.List`` of pre-norm transformer blocks: causal self-attention and an MLP, with dropout),
a final norm and an output projection -- with one decorator line,
``@jaxremat.flax.remat_blocks("blocks", ...)``, and one changed line in ``__call__``:
``h = self.run_blocks(h)`` instead of ``for block in self.blocks: h = block(h)``. The state
tree is unchanged, so checkpoints of the plain model load into it.

The budget bounds the whole training step -- embeddings, blocks, head and loss -- as
``jaxremat.flax.activation_memory`` measures it (``remat_blocks``' default
``scope="model"``); ``model.fit_blocks(loss_fn, batch)`` fits the blocks' budget to it
before training and returns the plan, which prints the whole step's measured memory.

It trains with ``optax.adamw`` on synthetic sequences (each a random start token followed by
a fixed random permutation applied repeatedly, so the next token is predictable), prints the
plan and the loss.

    python examples/gpt_nnx.py                 # small, < 1 minute on a CPU
    python examples/gpt_nnx.py --budget 30%    # 30% of the whole step's no-remat memory
    python examples/gpt_nnx.py --large         # GPU size; budget from the device
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

import jaxremat
from jaxremat.flax import remat_blocks


def named_attention(query, key, value, **kwargs):
    """``nnx.dot_product_attention`` with its inputs and output marked by
    ``checkpoint_name`` under MaxText's names (``query_proj``, ``key_proj``, ``value_proj``,
    ``context``), so that ``save_only_these_names`` policies can keep them. Marks change
    nothing else."""
    query, key, value = (checkpoint_name(t, n) for t, n in
                         ((query, "query_proj"), (key, "key_proj"), (value, "value_proj")))
    return checkpoint_name(nnx.dot_product_attention(query, key, value, **kwargs), "context")


class Block(nnx.Module):
    """Pre-norm transformer block: causal multi-head attention and a 4x MLP, with dropout.

    Its projections are marked with MaxText's ``checkpoint_name`` names (:func:`named_attention`,
    ``out_proj``, ``mlpwi``, ``mlpwo``): ``jaxremat`` offers ``save_only_these_names`` of them
    as options per block, and MaxText's ``remat_policy`` presets can be applied to it as is."""

    def __init__(self, dim: int, heads: int, dropout: float, *, rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, dim, decode=False,
                                           attention_fn=named_attention, rngs=rngs)
        self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
        self.up = nnx.Linear(dim, 4 * dim, rngs=rngs)
        self.down = nnx.Linear(4 * dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.norm1(x)
        attn = checkpoint_name(self.attn(h, is_causal=True, deterministic=True), "out_proj")
        x = x + self.dropout(attn)
        h = nnx.gelu(checkpoint_name(self.up(self.norm2(x)), "mlpwi"))
        return x + self.dropout(checkpoint_name(self.down(h), "mlpwo"))


@remat_blocks("blocks", budget="50%")
class GPT(nnx.Module):
    """A GPT-style language model; ``run_blocks`` comes from ``remat_blocks``."""

    def __init__(self, vocab: int, dim: int, heads: int, depth: int, context: int,
                 dropout: float = 0.1, *, rngs: nnx.Rngs):
        self.tokens = nnx.Embed(vocab, dim, rngs=rngs)
        self.positions = nnx.Embed(context, dim, rngs=rngs)
        self.blocks = nnx.List([Block(dim, heads, dropout, rngs=rngs) for _ in range(depth)])
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.out = nnx.Linear(dim, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        h = self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[-1]))
        h = self.run_blocks(h)  # was: for block in self.blocks: h = block(h)
        return self.out(self.norm(h))


def synthetic_sequences(key: jax.Array, n: int, length: int, vocab: int) -> jax.Array:
    """``n`` sequences of ``length + 1`` tokens: t[k+1] = perm[t[k]] for a fixed permutation."""
    k_perm, k_start = jax.random.split(key)
    perm = jax.random.permutation(k_perm, vocab)
    start = jax.random.randint(k_start, (n,), 0, vocab)

    def advance(token, _):
        return perm[token], token

    _, seq = jax.lax.scan(advance, start, None, length=length + 1)
    return seq.T


def loss_fn(model: GPT, batch: jax.Array) -> jax.Array:
    logits = model(batch[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()


@nnx.jit
def train_step(model, optimizer, batch):
    loss, grads = nnx.value_and_grad(loss_fn)(model, batch)
    optimizer.update(model, grads)
    return loss


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="GPU-sized model and batch")
    parser.add_argument("--budget", default=None,
                        help="bytes ('256MiB') or a share of the no-remat memory ('50%%')")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--plot", default=None, help="write the plan's PNG here")
    args = parser.parse_args(argv)

    if args.large:
        vocab, dim, heads, depth, context, batch, steps = 512, 768, 12, 12, 512, 32, 50
    else:
        vocab, dim, heads, depth, context, batch, steps = 32, 32, 4, 6, 32, 16, 40
    steps = args.steps or steps

    data = synthetic_sequences(jax.random.key(0), 16 * batch, context, vocab)
    model = GPT(vocab, dim, heads, depth, context, rngs=nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    if args.budget is not None:
        model.remat_budget = args.budget
    elif jax.devices()[0].platform == "gpu":
        model.remat_budget = jaxremat.budget_from_device(model, optimizer)
    # The budget covers the whole training step (embeddings, blocks, head, loss): fit the
    # blocks' budget to the measured step once, before training; the step then uses it.
    plan = model.fit_blocks(loss_fn, data[:batch])
    print(plan)
    if args.plot:
        print("plot:", plan.plot(args.plot))

    losses, start = [], time.perf_counter()
    for step in range(steps):
        lo = (step * batch) % len(data)
        loss = float(train_step(model, optimizer, data[lo:lo + batch]))
        losses.append(loss)
        if step % 5 == 0 or step == steps - 1:
            print(f"step {step:3d}  loss {loss:.4f}")
    print(f"{steps} steps in {time.perf_counter() - start:.1f} s "
          f"(first includes compilation); loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return {"initial_loss": losses[0], "final_loss": losses[-1], "losses": losses,
            "budget": plan.budget, "predicted_peak": plan.predicted_peak,
            "no_remat_peak": plan.no_remat_peak, "plan": plan, "scope": plan.scope}


if __name__ == "__main__":
    main()
