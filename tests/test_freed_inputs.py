"""A backward frees its input as it reads it (``LayerProfile.bwd_tmp_freed``, issue 17.5).

Under ``dots_saveable`` a pre-norm block's pullback reads its input to recompute the norm, then
never again: JAX frees the input there, before ``g[i]`` is whole, and the backward peaks below
what the chain charged when it held the input through ``B(i)`` (one activation too many on the
uniform plans of ``benchmarks/prediction.py``: 0.988-0.993 of the prediction, now 1.000). The
chain takes the freed transient only where nothing after ``B(i)`` reads the input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxremat import activation_memory, remat_sequence
from jaxremat.sequence.profile import profile_sequence


def _norm(x, p):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["g"]


def block(p, x):
    """A pre-norm GELU MLP block: its backward under ``dots_saveable`` reads ``x`` once."""
    return x + jax.nn.gelu(_norm(x, p) @ p["w1"]) @ p["w2"]


def squash(p, x):
    """A layer whose backward reads its output (``1 - tanh**2``)."""
    return jnp.tanh(x @ p["w"])


def _params(rng, width=16):
    weight = lambda *s: jnp.asarray(rng.standard_normal(s) * s[0] ** -0.5, jnp.float32)  # noqa: E731
    return {"g": jnp.ones(width), "w1": weight(width, 4 * width), "w2": weight(4 * width, width)}


def _stack(kinds, width=16, batch=2, length=8, seed=0):
    rng = np.random.default_rng(seed)
    layers = [block if k == "block" else squash for k in kinds]
    params = [_params(rng, width) if k == "block"
              else {"w": jnp.asarray(rng.standard_normal((width, width)) / 4, jnp.float32)}
              for k in kinds]
    return layers, params, jnp.asarray(rng.standard_normal((batch, length, width)), jnp.float32)


def test_the_uniform_dots_plan_of_pre_norm_blocks_is_predicted_to_the_byte():
    layers, params, x = _stack(["block"] * 4)
    seq = remat_sequence(layers, 10**12, method="uniform:dots", costs="flops")
    plan = seq.plan(params, x)
    measured = activation_memory(lambda p, x: jnp.sum(seq(p, x)), params, x)
    # Held through each backward, the prediction was one input above (8 x 16 x 2 floats).
    assert measured == plan.predicted_peak


def test_the_chain_frees_an_input_only_where_nothing_after_its_backward_reads_it():
    layers, params, x = _stack(["block", "block", "squash", "block"])
    profile = profile_sequence(layers, params, x, costs="flops")
    chain, found = profile.chain, profile.layers

    def dots(i):  # (the chain's bwd_tmp of layer i's dots option, that option's profile)
        k = found[i].option_names.index("dots")
        return chain.options.bwd_tmp[i, k], found[i].options[k - 1]

    # The blocks' dots backwards read their input, then free it before g[i] is whole.
    for i in (0, 1, 3):
        assert dots(i)[1].bwd_tmp_freed < dots(i)[1].bwd_tmp
    # Layer 1's input is freed; x[0] is the caller's: held. x[3] is the tanh's output: held
    # where the tanh's backward reads it after B(3) (JAX 0.10 keeps y for 1 - y**2; 0.11+
    # keeps 1 - y**2 itself, and x[3] is freed).
    assert dots(1)[0] == dots(1)[1].bwd_tmp_freed
    assert dots(0)[0] == dots(0)[1].bwd_tmp
    tanh_reads_y = found[2].output_in_tape or any(o.output_in_tape for o in found[2].options)
    assert dots(3)[0] == (dots(3)[1].bwd_tmp if tanh_reads_y else dots(3)[1].bwd_tmp_freed)
    # never below what a backward holds as it starts or ends
    for i in range(chain.length):
        assert min(chain.options.bwd_tmp[i]) >= -min(chain.x_size[i], chain.x_size[i + 1])


@pytest.mark.parametrize("backend", ["checkpoint", "custom_vjp"])
def test_plans_with_freed_inputs_fit_their_prediction(backend):
    layers, params, x = _stack(["block", "squash", "block", "block", "block"])
    full = remat_sequence(layers, 10**12, method="none").plan(params, x).predicted_peak
    seq = remat_sequence(layers, int(0.45 * full), backend=backend, costs="flops")
    plan = seq.plan(params, x)
    measured = activation_memory(lambda p, x: jnp.sum(seq(p, x)), params, x)
    assert measured <= plan.predicted_peak <= 0.45 * full
    assert measured >= 0.95 * plan.predicted_peak
    got = jax.grad(lambda p, x: jnp.sum(seq(p, x)))(params, x)

    def plain(p, x):
        for layer, q in zip(layers, p):
            x = layer(q, x)
        return jnp.sum(x)

    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(jax.grad(plain)(params, x))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["checkpoint", "custom_vjp"])
def test_a_segments_last_layer_is_recomputed_by_its_tape_only_forward(backend):
    """``jax.checkpoint`` recomputes a segment's last layer with the forward that builds
    only its tape (``Chain.fwd_tape_tmp``): no output, fewer transients. The chain charged
    the full forward there, 576 B (3.6%) above the measured peak of this plan (a stack of
    ``tests/test_random_stacks.py``); the ``custom_vjp`` backend runs ``jax.vjp``, the full
    forward, and keeps that charge."""
    from test_random_stacks import build

    layers, params, x = build(("mlp", "mlp", "attention", "relu2", "relu2"), (8,) * 6, 3, 4, 14)
    seq = remat_sequence(layers, 16670, policies=(), backend=backend)
    plan = seq.plan(params, x)
    measured = activation_memory(lambda p, x: jnp.sum(seq(p, x)), params, x)
    assert measured <= plan.predicted_peak <= 16670
    if backend == "checkpoint":
        assert measured == plan.predicted_peak and plan.chain.fwd_tape_tmp is not None
    else:
        assert plan.chain.fwd_tape_tmp is None  # the full forward's default
