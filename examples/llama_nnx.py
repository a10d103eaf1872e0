"""Train a Llama-style decoder (Flax NNX) whose blocks rematerialize under a budget.

The model is written as a Flax NNX user writes one today, with nothing for jaxremat in it:
a token embedding (``nnx.Embed``), ``self.blocks`` (an ``nnx.List`` of pre-norm blocks:
``nnx.RMSNorm``, grouped-query attention with rotary position embeddings applied in the
block and ``jax.nn.dot_product_attention(..., is_causal=True)``, a SwiGLU MLP of three
bias-free ``nnx.Linear``), a final ``nnx.RMSNorm`` and an untied output head. jaxremat adds
the decorator line ``@jaxremat.flax.remat_blocks("blocks", ...)`` and one changed line in
``__call__``: ``h = self.run_blocks(h)`` instead of ``for block in self.blocks: h = block(h)``.

The budget bounds the whole training step (``remat_blocks``' default ``scope="model"``):
``model.fit_blocks(loss_fn, tokens, labels)`` fits the blocks' budget to the measured step
before training. The example then checks what it claims against :class:`PlainLlama` (the
same class with the plain loop, the same initial parameters):

* the fitted step's ``jaxremat.flax.activation_memory`` is within the budget;
* its loss and gradients equal the plain model's (allclose);
* training with ``optax.adamw`` under ``nnx.jit`` gives the plain model's loss at every step,
  and the loss goes down (synthetic sequences: each an arithmetic progression modulo the
  vocabulary, so the next token follows from the two before it).

The blocks run as Flax's ``Sequential`` runs layers: the first gets ``run_blocks``'
arguments, each later one the previous block's output. Blocks that take side inputs (Llama
implementations often pass the rotary tables or positions to every block) must return them
with their output (``return h, positions``; the model unpacks the last block's) or, as here,
compute them themselves.

    python examples/llama_nnx.py                 # small, < 1 minute on a CPU
    python examples/llama_nnx.py --budget 30%    # 30% of the whole step's no-remat memory
    python examples/llama_nnx.py --large         # GPU size; budget from the device, and
                                                 # no plain model beside (--check to add it)
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxremat
from jaxremat.flax import remat_blocks


def rotary(x: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotary position embedding (Su et al. 2021, RoFormer) of ``x`` of shape
    ``(batch, length, heads, head_dim)``, position ``k`` at index ``k`` of axis 1; the
    halves of the last axis are rotated as pairs (Llama's ``rotate_half`` layout)."""
    length, dim = x.shape[1], x.shape[-1]
    inverse = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inverse  # (length, dim / 2)
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class Attention(nnx.Module):
    """Causal grouped-query attention: ``heads`` query heads share ``kv_heads`` key/value
    heads (``jax.nn.dot_product_attention`` takes the grouped keys as they are)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, *, rngs: nnx.Rngs):
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nnx.Linear(dim, heads * self.head_dim, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(dim, kv_heads * self.head_dim, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(dim, kv_heads * self.head_dim, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(heads * self.head_dim, dim, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, _ = x.shape
        q = rotary(self.q(x).reshape(b, t, self.heads, self.head_dim))
        k = rotary(self.k(x).reshape(b, t, self.kv_heads, self.head_dim))
        v = self.v(x).reshape(b, t, self.kv_heads, self.head_dim)
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.reshape(b, t, self.heads * self.head_dim))


class SwiGLU(nnx.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020), three bias-free projections."""

    def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(dim, hidden, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(hidden, dim, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(nnx.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    """Pre-norm Llama block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, *, rngs: nnx.Rngs):
        self.attn_norm = nnx.RMSNorm(dim, rngs=rngs)
        self.attn = Attention(dim, heads, kv_heads, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(dim, rngs=rngs)
        self.mlp = SwiGLU(dim, hidden, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


@remat_blocks("blocks", budget="50%")
class Llama(nnx.Module):
    """A Llama-style decoder; ``run_blocks`` comes from ``remat_blocks``."""

    def __init__(self, vocab: int, dim: int, heads: int, kv_heads: int, depth: int,
                 hidden: int, *, rngs: nnx.Rngs):
        self.embed = nnx.Embed(vocab, dim, rngs=rngs)
        self.blocks = nnx.List([Block(dim, heads, kv_heads, hidden, rngs=rngs)
                                for _ in range(depth)])
        self.norm = nnx.RMSNorm(dim, rngs=rngs)
        self.head = nnx.Linear(dim, vocab, use_bias=False, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        h = self.embed(tokens)
        h = self.run_blocks(h)  # was: for block in self.blocks: h = block(h)
        return self.head(self.norm(h))


class PlainLlama(Llama):
    """The same model with the plain loop over its blocks: the reference of the checks."""

    def run_blocks(self, h: jax.Array) -> jax.Array:
        for block in self.blocks:
            h = block(h)
        return h


def progressions(seed: int, n: int, length: int, vocab: int) -> tuple[jax.Array, jax.Array]:
    """``(tokens, labels)``, ``n`` sequences of ``length`` tokens and the next token of each:
    ``t[k] = (start + stride * k) mod vocab``, start and stride (1 to 8) random per sequence."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab, (n, 1))
    stride = rng.integers(1, 9, (n, 1))
    seq = (start + stride * np.arange(length + 1)) % vocab
    return jnp.asarray(seq[:, :-1], jnp.int32), jnp.asarray(seq[:, 1:], jnp.int32)


def loss_fn(model: Llama, tokens: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model(tokens)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@nnx.jit
def train_step(model, optimizer, tokens, labels):
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens, labels)
    optimizer.update(model, grads)
    return loss


def check_gradients(model: Llama, plain: PlainLlama, tokens, labels, rtol: float = 1e-4) -> float:
    """The largest gradient difference between ``model`` and ``plain`` (same parameters)
    relative to the largest gradient, after asserting the losses and every gradient allclose."""
    loss, grads = nnx.value_and_grad(loss_fn)(model, tokens, labels)
    plain_loss, plain_grads = nnx.value_and_grad(loss_fn)(plain, tokens, labels)
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-5)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(plain_grads))
    gap = max(float(jnp.max(jnp.abs(a - b)))
              for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)))
    assert gap <= rtol * scale, f"gradients differ by {gap:.3g} (largest gradient {scale:.3g})"
    return gap / scale


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="GPU-sized model and batch")
    parser.add_argument("--budget", default=None,
                        help="bytes ('256MiB') or a share of the no-remat memory ('50%%')")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=None,
                        help="compare gradients and losses with the plain model (default: "
                        "unless --large, where the plain model needs the memory remat saves)")
    args = parser.parse_args(argv)
    check = not args.large if args.check is None else args.check

    if args.large:  # vocab, width, heads, kv heads, blocks, MLP width, length, batch, steps
        sizes = 4096, 1024, 16, 4, 16, 2816, 1024, 16, 30
    else:
        sizes = 256, 64, 4, 2, 4, 176, 32, 4, 30
    vocab, dim, heads, kv_heads, depth, hidden, length, batch, steps = sizes
    steps = args.steps or steps

    make = lambda cls: cls(vocab, dim, heads, kv_heads, depth, hidden,  # noqa: E731
                           rngs=nnx.Rngs(0))
    model = make(Llama)
    tokens, labels = progressions(0, 4 * batch, length, vocab)  # 4 batches, in turn
    first = tokens[:batch], labels[:batch]
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    if args.budget is not None:
        model.remat_budget = args.budget
    elif jax.devices()[0].platform == "gpu":
        model.remat_budget = jaxremat.budget_from_device(model, optimizer)
    # The budget covers the whole training step (embedding, blocks, head, loss): fit the
    # blocks' budget to the measured step once, before training; the step then uses it.
    plan = model.fit_blocks(loss_fn, *first)
    print(plan)
    memory = jaxremat.flax.activation_memory(model, loss_fn, *first)
    assert memory <= plan.scope.budget, (memory, plan.scope.budget)
    print(f"whole step: {jaxremat.format_bytes(memory)} measured, budget "
          f"{jaxremat.format_bytes(plan.scope.budget)}, no remat "
          f"{jaxremat.format_bytes(plan.scope.no_remat)}")
    if check:
        plain = make(PlainLlama)
        plain_optimizer = nnx.Optimizer(plain, optax.adamw(1e-2), wrt=nnx.Param)
        gap = check_gradients(model, plain, *first)
        print(f"loss and gradients equal the plain model's (largest gap {gap:.1e} of the "
              "largest gradient)")

    losses, plain_losses, start = [], [], time.perf_counter()
    for step in range(steps):
        lo = (step % 4) * batch
        batch_of = lambda a: a[lo:lo + batch]  # noqa: E731
        losses.append(float(train_step(model, optimizer, batch_of(tokens), batch_of(labels))))
        if check:
            plain_losses.append(float(train_step(plain, plain_optimizer, batch_of(tokens),
                                                 batch_of(labels))))
        if step % 5 == 0 or step == steps - 1:
            beside = f"  (plain model {plain_losses[-1]:.4f})" if check else ""
            print(f"step {step:3d}  loss {losses[-1]:.4f}{beside}")
    if check:
        np.testing.assert_allclose(losses, plain_losses, rtol=1e-4)
    assert losses[-1] < losses[0], losses
    print(f"{steps} steps in {time.perf_counter() - start:.1f} s"
          + (" with the plain model beside" if check else "")
          + f" (first includes compilation); loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return {"initial_loss": losses[0], "final_loss": losses[-1], "losses": losses,
            "plain_losses": plain_losses, "budget": plan.budget,
            "predicted_peak": plan.predicted_peak, "no_remat_peak": plan.no_remat_peak,
            "plan": plan, "scope": plan.scope, "measured": memory}


if __name__ == "__main__":
    main()
