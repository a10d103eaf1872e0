"""The dense test chain of the meter tests: ``tanh(x @ w)`` layers, float32.

``A = B * D * 4`` bytes is one activation (batch ``B``, width ``D``), ``W = D * D * 4`` one
weight. With ``B = 64, D = 32``: ``W = A/2``.

``Y`` (0 or 1) is the one fact of the hand derivations that depends on the JAX version,
read from the program rather than from the version number: whether tanh's derivative
keeps its output ``y`` besides its tape. JAX 0.10 saves ``y`` and ``1 - y`` and computes
``g * (1 - y) * (1 + y)`` in the backward (``Y = 1``: a tape of two arrays, one of them
the output); JAX 0.11+ saves ``one_minus_square(y)`` alone, computed in the forward
(``Y = 0``: a tape of one array, the output not in it). The derivations count ``Y`` where
that array is live.
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


def _tanh_keeps_output() -> int:
    """1 if a residual of ``jax.vjp(layer)`` is the layer's output (the same jaxpr
    variable), else 0."""
    closed = jax.make_jaxpr(lambda w, x: jax.vjp(layer, w, x))(weights(1)[0], X)
    output, *residuals = closed.jaxpr.outvars
    return int(any(v is output for v in residuals))


Y = _tanh_keeps_output()


def sin_loss(p, x):
    return jnp.sum(jnp.sin(x * p))



def all_eqns(jaxpr):
    """All equations of ``jaxpr`` and its sub-jaxprs, in program order (depth first)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from all_eqns(sub)
