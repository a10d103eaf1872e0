"""Small layers ``layer(p, x) -> y`` of the kinds the profile meets (a pre-norm MLP, causal
attention, a convolution), shared by the tests of re-profiling at a new input shape
(``test_calibration.py``, ``test_derive.py``): width ``D``, ``T`` tokens."""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

D, T = 16, 8


def mlp_block(p, x):
    """Pre-norm residual MLP (layer norm with jnp.var, gelu)."""
    h = (x - jnp.mean(x, -1, keepdims=True)) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + 1e-5)
    return x + jax.nn.gelu(h * p["g"] + p["b1"]) @ p["w1"] @ p["w2"]


def _attention(p, x, name: str | None):
    q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
    scores = jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(D)
    scores = jnp.where(jnp.tril(jnp.ones((x.shape[1],) * 2, bool)), scores, -1e9)
    if name is not None:
        scores = jax.ad_checkpoint.checkpoint_name(scores, name)
    out = jnp.einsum("bts,bsd->btd", jax.nn.softmax(scores, axis=-1), v)
    return x + jnp.tanh(out @ p["o"])


def attention_block(p, x):
    """Causal self-attention with a residual (a mask that does not grow with the batch)."""
    return _attention(p, x, None)


def marked_attention_block(p, x):
    """:func:`attention_block` with its scores marked ``checkpoint_name(..., "scores")`` (the
    ``names`` option of the policy menu)."""
    return _attention(p, x, "scores")


def conv_block(p, x):
    """A residual 3x3 convolution (NHWC)."""
    y = jax.lax.conv_general_dilated(x, p["k"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return x + jax.nn.relu(y + p["b"])


def case(name: str) -> tuple[Callable, Any, Any]:
    """``(layer, params, x)`` for ``name`` in ``"mlp"``, ``"attention"``, ``"marked
    attention"`` and ``"conv"``: random parameters (key 0) and a batch of 8."""
    keys = iter(jax.random.split(jax.random.key(0), 8))
    normal = lambda *shape: jax.random.normal(next(keys), shape) / 4  # noqa: E731
    if name == "mlp":
        return mlp_block, {"g": normal(D), "b1": normal(D), "w1": normal(D, 4 * D),
                           "w2": normal(4 * D, D)}, normal(8, T, D)
    if name in ("attention", "marked attention"):
        block = attention_block if name == "attention" else marked_attention_block
        return block, {"qkv": normal(D, 3 * D), "o": normal(D, D)}, normal(8, T, D)
    if name == "conv":
        return conv_block, {"k": normal(3, 3, 4, 4), "b": normal(4)}, normal(8, 6, 6, 4)
    raise ValueError(f"unknown block {name!r}")


def loss_of(fn: Callable) -> Callable:
    """A scalar loss of ``fn(params, x)`` whose gradient reads every output element."""
    return lambda params, x: jnp.sum(jnp.sin(fn(params, x)))


def plain_grads(layers, params, x):
    """The gradients of :func:`loss_of` the plain stack ``layers`` (jitted)."""
    def plain(params, x):
        for layer, p in zip(layers, params):
            x = layer(p, x)
        return x

    return jax.jit(jax.grad(loss_of(plain), argnums=(0, 1)))(params, x)


def assert_same_grads(fn, params, x, want) -> None:
    """``fn``'s gradients of :func:`loss_of` (jitted: eager takes 3x the CPU) equal ``want``."""
    got = jax.jit(jax.grad(loss_of(fn), argnums=(0, 1)))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
