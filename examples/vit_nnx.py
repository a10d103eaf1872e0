"""Train a Vision Transformer (Flax NNX) whose encoder blocks rematerialize under a budget.

A ViT as in Dosovitskiy et al., "An Image is Worth 16x16 Words" (ICLR 2021): the image is cut
into patches by a strided convolution, a learned class token and position embeddings are
added, pre-norm encoder blocks (bidirectional multi-head attention and a GELU MLP, with
dropout) run over the tokens, and a linear head reads the class token. It is written as usual,
with one decorator line, ``@jaxremat.flax.remat_blocks("blocks", ...)``, and one changed line
in ``__call__``: ``h = self.run_blocks(h)`` instead of ``for block in self.blocks: h =
block(h)``.

The budget bounds the whole training step (patch embedding, blocks, head and loss), as
``jaxremat.flax.activation_memory`` measures it; ``model.fit_blocks(loss_fn, images, labels)``
fits the blocks' budget to it once, before training, and returns the plan.

It trains with ``optax.adamw`` on synthetic images: noise with one bright square whose
position on a 3x3 grid (and, for the tenth class, its absence) is the label.

    python examples/vit_nnx.py                 # small, < 1 minute on a CPU
    python examples/vit_nnx.py --budget 30%    # 30% of the whole step's no-remat memory
    python examples/vit_nnx.py --large         # GPU size (ViT-S/16 on 224x224); budget from the device
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
    """``nnx.dot_product_attention`` with MaxText's ``checkpoint_name`` marks on its inputs
    (``query_proj``, ``key_proj``, ``value_proj``) and output (``context``); nothing else
    changes."""
    marked = [checkpoint_name(t, n) for t, n in zip((query, key, value), _QKV)]
    return checkpoint_name(nnx.dot_product_attention(*marked, **kwargs), "context")


_QKV = ("query_proj", "key_proj", "value_proj")


class EncoderBlock(nnx.Module):
    """Pre-norm encoder block: multi-head self-attention and a GELU MLP, with dropout; its
    projections marked with MaxText's names (:func:`named_attention`, ``out_proj``,
    ``mlpwi``, ``mlpwo``) for ``save_only_these_names`` policies."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int, dropout: float, *,
                 rngs: nnx.Rngs):
        self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, dim, decode=False,
                                           attention_fn=named_attention, rngs=rngs)
        self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
        self.fc1 = nnx.Linear(dim, mlp_ratio * dim, rngs=rngs)
        self.fc2 = nnx.Linear(mlp_ratio * dim, dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.dropout(checkpoint_name(self.attn(self.norm1(x), deterministic=True),
                                             "out_proj"))
        h = self.dropout(nnx.gelu(checkpoint_name(self.fc1(self.norm2(x)), "mlpwi")))
        return x + self.dropout(checkpoint_name(self.fc2(h), "mlpwo"))


@remat_blocks("blocks", budget="50%")
class ViT(nnx.Module):
    """Vision Transformer classifier; ``run_blocks`` comes from ``remat_blocks``."""

    def __init__(self, image: int, patch: int, dim: int, heads: int, depth: int, classes: int,
                 mlp_ratio: int = 4, dropout: float = 0.1, *, rngs: nnx.Rngs):
        tokens = (image // patch) ** 2 + 1
        self.patches = nnx.Conv(3, dim, (patch, patch), strides=(patch, patch),
                                padding="VALID", rngs=rngs)
        self.cls = nnx.Param(jnp.zeros((1, 1, dim)))
        self.positions = nnx.Param(0.02 * jax.random.normal(rngs.params(), (1, tokens, dim)))
        self.blocks = nnx.List([EncoderBlock(dim, heads, mlp_ratio, dropout, rngs=rngs)
                                for _ in range(depth)])
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.head = nnx.Linear(dim, classes, rngs=rngs)

    def embed(self, images: jax.Array) -> jax.Array:
        h = self.patches(images)
        h = h.reshape(h.shape[0], -1, h.shape[-1])
        cls = jnp.broadcast_to(self.cls[...], (h.shape[0], 1, h.shape[-1]))
        return jnp.concatenate([cls, h], axis=1) + self.positions[...]

    def classify(self, h: jax.Array) -> jax.Array:
        return self.head(self.norm(h[:, 0]))

    def __call__(self, images: jax.Array) -> jax.Array:
        h = self.embed(images)
        h = self.run_blocks(h)  # was: for block in self.blocks: h = block(h)
        return self.classify(h)


def synthetic_images(seed: int, n: int, size: int = 32) -> tuple[jax.Array, jax.Array]:
    """``n`` noisy ``size x size x 3`` images and labels: a bright square at one of the 3x3
    grid positions is the label 0-8; label 9 has no square."""
    k_noise, k_label = jax.random.split(jax.random.key(seed))
    labels = jax.random.randint(k_label, (n,), 0, 10)
    images = 0.3 * jax.random.normal(k_noise, (n, size, size, 3))
    cell, side = size // 3, size // 6
    rows = jnp.arange(size)[:, None]
    cols = jnp.arange(size)[None, :]

    def square(label):
        r, c = (label // 3) * cell + cell // 2, (label % 3) * cell + cell // 2
        inside = (jnp.abs(rows - r) <= side // 2) & (jnp.abs(cols - c) <= side // 2)
        return jnp.where(label < 9, inside, False).astype(jnp.float32)

    return images + jax.vmap(square)(labels)[..., None], labels


def loss_fn(model: ViT, images: jax.Array, labels: jax.Array) -> jax.Array:
    logits = model(images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


@nnx.jit
def train_step(model, optimizer, images, labels):
    loss, grads = nnx.value_and_grad(loss_fn)(model, images, labels)
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

    if args.large:  # ViT-S/16
        image, patch, dim, heads, depth, batch, steps = 224, 16, 384, 6, 12, 64, 30
    else:
        image, patch, dim, heads, depth, batch, steps = 32, 4, 32, 4, 6, 16, 40
    steps = args.steps or steps

    images, labels = synthetic_images(0, 16 * batch, image)
    model = ViT(image, patch, dim, heads, depth, 10, rngs=nnx.Rngs(0, dropout=1))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    if args.budget is not None:
        model.remat_budget = args.budget
    elif jax.devices()[0].platform == "gpu":
        model.remat_budget = jaxremat.budget_from_device(model, optimizer)
    # The budget covers the whole step (patch embedding, blocks, head, loss): fit the blocks'
    # budget to the measured step once, before training; the step then uses it.
    plan = model.fit_blocks(loss_fn, images[:batch], labels[:batch])
    print(plan)
    if args.plot:
        print("plot:", plan.plot(args.plot))

    losses, start = [], time.perf_counter()
    for step in range(steps):
        lo = (step * batch) % len(images)
        loss = float(train_step(model, optimizer, images[lo:lo + batch], labels[lo:lo + batch]))
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
