"""The dense test chain of the meter tests: ``tanh(x @ w)`` layers, float32.

``A = B * D * 4`` bytes is one activation (batch ``B``, width ``D``), ``W = D * D * 4`` one
weight. With ``B = 64, D = 32``: ``W = A/2``.
"""

import jax
import jax.numpy as jnp

B, D = 64, 32
A = B * D * 4
W = D * D * 4


def layer(w, x):
    return jnp.tanh(x @ w)


def plain(ws, x):
    for w in ws:
        x = layer(w, x)
    return jnp.sum(x)


def per_layer_checkpoint(ws, x):
    for w in ws:
        x = jax.checkpoint(layer, prevent_cse=True)(w, x)
    return jnp.sum(x)


def segments(ws, x, size):
    """Chen's scheme: a checkpoint per segment of ``size`` layers, one per layer inside."""

    def segment(ws, x):
        for w in ws:
            x = jax.checkpoint(layer, prevent_cse=True)(w, x)
        return x

    for start in range(0, len(ws), size):
        x = jax.checkpoint(segment, prevent_cse=True)(ws[start : start + size], x)
    return jnp.sum(x)


def weights(n):
    return [jnp.full((D, D), 0.01, jnp.float32) for _ in range(n)]


X = jnp.ones((B, D), jnp.float32)


def sin_loss(p, x):
    return jnp.sum(jnp.sin(x * p))



def all_eqns(jaxpr):
    """All equations of ``jaxpr`` and its sub-jaxprs, in program order (depth first)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from all_eqns(sub)
