"""Applying plans: gradients equal plain autodiff, and the schedule is really what runs.

Heterogeneous stacks (dense layers of changing widths, convolutions with downsampling,
layer norms, attention blocks, ``(hidden, skip)`` pytree activations, dropout driven by PRNG
keys) are run through every method and both backends, and their gradients compared with
``jax.grad`` of the plain sequence. The number of forward runs of each layer in the
differentiated program is counted and compared with ``schedule.forward_counts``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

import solver
from jaxremat.sequence.apply import apply_plan
from jaxremat.sequence.remat import remat_sequence
from solver import Checkpoint, Layer

METHODS = ("rotor", "none", "every_layer", "sqrt", "revolve")
BACKENDS = ("checkpoint", "custom_vjp")


# ------------------------------------------------------------------------------ layers


def dense(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def layer_norm(p, x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def conv(stride):
    def layer(p, x):  # NHWC
        y = jax.lax.conv_general_dilated(
            x, p["k"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jax.nn.relu(y + p["b"])

    return layer


def flatten_dense(p, x):
    return jnp.tanh(x.reshape(x.shape[0], -1) @ p["w"])


def attention_block(p, carry):
    """``(hidden, skip) -> (hidden', skip')``: causal self-attention with a residual."""
    h, skip = carry
    t, d = h.shape[-2], h.shape[-1]
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    scores = jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(d)
    mask = jnp.tril(jnp.ones((t, t), bool))
    att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = jnp.einsum("bts,bsd->btd", att, v) @ p["o"]
    return layer_norm(p["ln"], h + out), skip + 0.5 * h


def mlp_block(p, carry):
    h, skip = carry
    return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"], skip * 0.9 + h


def dropout_block(p, carry):
    """``(key, h) -> (key', h')``: dropout from the key carried in the activations."""
    key, h = carry
    key, sub = jax.random.split(key)
    keep = jax.random.bernoulli(sub, 0.7, h.shape)
    h = jnp.where(keep, jnp.tanh(h @ p["w"]) / 0.7, 0.0)
    return key, h


def noisy_block(p, carry):
    """A key inside the parameters: noise drawn from it must be the same when recomputed."""
    key, h = carry
    noise = jax.random.normal(p["key"], h.shape)
    return key, jnp.sin(h @ p["w"]) + 0.1 * noise


def _ln_params(d):
    return {"scale": jnp.ones(d), "bias": jnp.zeros(d)}


def _normal(seed, i, shape, scale):
    """Test data from numpy (eager jax.random would compile a kernel per shape)."""
    rng = np.random.default_rng(1000 * seed + i)
    return jnp.asarray(scale * rng.standard_normal(shape), dtype=jnp.float32)


def mlp_stack(seed):
    widths = [12, 24, 16, 32, 8, 20, 12]
    layers, params = [], []
    for i in range(len(widths) - 1):
        layers.append(dense)
        params.append({"w": _normal(seed, i, (widths[i], widths[i + 1]), 0.5),
                       "b": _normal(seed, 100 + i, (widths[i + 1],), 0.1)})
        if i % 2 == 1:
            layers.append(layer_norm)
            params.append(_ln_params(widths[i + 1]))
    return layers, params, _normal(seed, 999, (5, widths[0]), 1.0)


def conv_stack(seed):
    chans = [3, 8, 8, 16, 16]
    strides = [1, 2, 1, 2]
    layers, params = [], []
    for i, stride in enumerate(strides):
        layers.append(conv(stride))
        params.append({"k": _normal(seed, i, (3, 3, chans[i], chans[i + 1]), 0.3),
                       "b": jnp.zeros(chans[i + 1])})
    layers.append(flatten_dense)
    params.append({"w": _normal(seed, 50, (2 * 2 * 16, 10), 0.2)})
    return layers, params, _normal(seed, 999, (2, 8, 8, 3), 1.0)


def attention_stack(seed, blocks=2, d=16, t=6):
    layers, params = [], []
    for i in range(blocks):
        layers.append(attention_block)
        params.append({"qkv": _normal(seed, 2 * i, (d, 3 * d), 0.3),
                       "o": _normal(seed, 2 * i + 1, (d, d), 0.3), "ln": _ln_params(d)})
        layers.append(mlp_block)
        params.append({"w1": _normal(seed, 50 + i, (d, 4 * d), 0.3),
                       "w2": _normal(seed, 80 + i, (4 * d, d), 0.3)})
    h = _normal(seed, 999, (2, t, d), 1.0)
    return layers, params, (h, jnp.zeros_like(h))


def dropout_stack(seed, depth=6, d=16):
    layers, params = [], []
    for i in range(depth):
        if i % 2:
            layers.append(noisy_block)
            params.append({"w": _normal(seed, i, (d, d), 0.4), "key": jax.random.key(i)})
        else:
            layers.append(dropout_block)
            params.append({"w": _normal(seed, i, (d, d), 0.4)})
    return layers, params, (jax.random.key(7), _normal(seed, 999, (4, d), 1.0))


STACKS = {"mlp": mlp_stack, "conv": conv_stack, "attention": attention_stack,
          "dropout": dropout_stack}


# ------------------------------------------------------------------------------ helpers


def plain(layers, params, x):
    for layer, p in zip(layers, params):
        x = layer(p, x)
    return x


def scalar(y):
    """A loss on any activation pytree: sums of its float leaves, weighted."""
    leaves = [leaf for leaf in jax.tree.leaves(y) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    return sum(jnp.sum(jnp.sin(leaf) * (k + 1)) for k, leaf in enumerate(leaves))


def float_grads(tree):
    return [g for g in jax.tree.leaves(tree) if g.dtype != jax.dtypes.float0]


def assert_trees_close(a, b):
    """Equal to float32 rounding (recomputation may fuse and round differently)."""
    la, lb = float_grads(a), float_grads(b)
    assert len(la) == len(lb) and la
    for u, v in zip(la, lb):
        u, v = np.asarray(u), np.asarray(v)
        scale = max(1.0, float(np.max(np.abs(v)))) if v.size else 1.0
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5 * scale)


def run_jitted(fn, *args):
    """``jax.jit(fn)(*args)``, compiled at XLA's lowest optimisation level to keep the
    tests fast on CPU (numerics are unchanged up to rounding)."""
    compiled = jax.jit(fn).lower(*args).compile({"xla_backend_optimization_level": 0})
    return compiled(*args)


def min_budget(layers, params, x, backend="checkpoint"):
    """The least budget of ``backend``'s plans (``custom_vjp`` recomputes whole forwards)."""
    with pytest.raises(solver.InfeasibleBudget) as info:
        remat_sequence(layers, 1, backend=backend).plan(params, x)
    return info.value.min_budget


def mid_budget(layers, params, x):
    """A budget a quarter of the way from the least any schedule needs to storing everything
    (half-way, the default menu's searched options store every MLP layer in part)."""
    low = min_budget(layers, params, x)
    high = remat_sequence(layers, 10**15, method="none").plan(params, x).predicted_peak
    return int(low + (high - low) / 4)


def _forward_runs(jaxpr, names, counts):
    """Count per layer the eqns of primitive ``tanh`` under its named scope, recursively."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "tanh":
            stack = str(eqn.source_info.name_stack)
            for i, name in enumerate(names):
                if name in stack:
                    counts[i] += 1
        for sub in jaxprs_in_params(eqn.params):
            _forward_runs(getattr(sub, "jaxpr", sub), names, counts)
    return counts


# ------------------------------------------------------------------------------ tests


# Every stack under both backends; the default tier runs the custom_vjp backend on the MLP
# stack only (the other three compile for 10-17 s each), the slow tier runs them all.
@pytest.mark.parametrize("backend, stack", [
    pytest.param(backend, stack, marks=[pytest.mark.slow]
                 if backend == "custom_vjp" and stack != "mlp" else [])
    for backend in BACKENDS for stack in sorted(STACKS)
])
def test_gradients_equal_plain_for_every_method(stack, backend):
    layers, params, x = STACKS[stack](0)
    budget = mid_budget(layers, params, x)
    seqs = [remat_sequence(layers, budget if method == "rotor" else 10**15, method=method,
                           backend=backend) for method in METHODS]
    # The rotor plan at the mid budget does recompute something (else the test is weak).
    assert max(seqs[0].plan(params, x).forward_counts) >= 2
    runs = [lambda p, x: plain(layers, p, x)] + seqs

    def all_value_and_grads(p, x):  # one program: one compilation for all methods
        return [jax.value_and_grad(lambda p, x: scalar(f(p, x)), allow_int=True)(p, x)
                for f in runs]

    (want_value, want), *results = run_jitted(all_value_and_grads, params, x)
    for method, (value, got) in zip(METHODS, results):
        np.testing.assert_allclose(value, want_value, rtol=1e-5, err_msg=method)
        assert_trees_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_input_gradients_under_jit_and_vjp(backend):
    layers, params, x = attention_stack(1)
    seq = remat_sequence(layers, mid_budget(layers, params, x), backend=backend)
    cot = jax.tree.map(lambda a: jnp.cos(a), plain(layers, params, x))

    def outputs_and_pullbacks(p, x, cot):
        results = []
        for f in (lambda p, x: plain(layers, p, x), seq):
            out, pull = jax.vjp(f, p, x)
            grads = jax.grad(lambda p, x: scalar(f(p, x)), argnums=(0, 1))(p, x)
            results.append((out, pull(cot), grads))
        return results

    want, got = run_jitted(outputs_and_pullbacks, params, x, cot)
    for a, b in zip(got, want):
        assert_trees_close(a, b)


@pytest.mark.filterwarnings("ignore:backend='custom_vjp' under jax.vmap")  # falls back, by design
@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_of_grad_equals_plain(backend):
    layers, params, x = mlp_stack(2)
    xs = jnp.stack([x, 2 * x, -x])
    seq = remat_sequence(layers, 3 * mid_budget(layers, params, x), backend=backend)
    plain_fn = lambda p, x: plain(layers, p, x)
    batch_loss = lambda f: lambda p: jnp.sum(jax.vmap(lambda x: scalar(f(p, x)))(xs))

    def both(p, xs):  # vmap of grad, and grad of a vmapped (batch) loss
        return [(jax.vmap(jax.grad(lambda p, x: scalar(f(p, x))), in_axes=(None, 0))(p, xs),
                 jax.grad(batch_loss(f))(p)) for f in (plain_fn, seq)]

    want, got = run_jitted(both, params, xs)
    assert_trees_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_keys_reproduce_on_recomputation(backend):
    layers, params, x = dropout_stack(3)
    seqs = [remat_sequence(layers, budget, method=method, backend=backend)
            for method, budget in (("every_layer", 10**15),
                                   ("rotor", min_budget(layers, params, x, backend)))]
    # every_layer and the least-memory rotor plan recompute the dropout masks and noise
    for seq in seqs:
        assert max(seq.plan(params, x).forward_counts) >= 2
    fns = [lambda p, x: plain(layers, p, x)] + seqs
    want, *got = run_jitted(
        lambda p, x: [jax.grad(lambda p: scalar(f(p, x)), allow_int=True)(p) for f in fns],
        params, x)
    for g in got:
        assert_trees_close(g, want)


def _marked_tanh_stack(depth=9, width=16):
    def make(i):
        def layer(p, x):
            with jax.named_scope(f"layer{i:02d}"):
                return jnp.tanh(x @ p)
        return layer

    layers = [make(i) for i in range(depth)]
    params = [_normal(0, i, (width, width), 0.5) for i in range(depth)]
    return layers, params, jnp.ones((4, width))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["rotor-min", "rotor-mid", "every_layer", "sqrt", "revolve", "none"])
def test_forward_runs_in_program_match_schedule(backend, method):
    layers, params, x = _marked_tanh_stack()
    if method.startswith("rotor"):
        low = min_budget(layers, params, x, backend)
        budget = low if method == "rotor-min" else mid_budget(layers, params, x)
        seq = remat_sequence(layers, budget, backend=backend)
    else:
        seq = remat_sequence(layers, 10**15, method=method, backend=backend)
    plan = seq.plan(params, x)
    program = jax.make_jaxpr(jax.grad(lambda p, x: jnp.sum(seq(p, x))))(params, x)
    names = [f"layer{i:02d}" for i in range(len(layers))]
    assert _forward_runs(program.jaxpr, names, [0] * len(layers)) == plan.forward_counts
    if method == "rotor-min":
        assert sum(plan.forward_counts) > len(layers)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_plan_with_a_hand_written_nested_plan(backend):
    layers, params, x = _marked_tanh_stack(depth=6)
    inner = (Checkpoint(1, 3, (Layer(1), Layer(2))), Checkpoint(3, 5, (Layer(3), Layer(4))),
             Layer(5))
    plan = (Layer(0), Checkpoint(1, 6, inner))
    loss = lambda p: jnp.sum(apply_plan(plan, layers, p, x, backend=backend))
    assert_trees_close(run_jitted(jax.grad(loss), params),
                       jax.grad(lambda p: jnp.sum(plain(layers, p, x)))(params))
    program = jax.make_jaxpr(jax.grad(loss))(params)
    counts = _forward_runs(program.jaxpr, [f"layer{i:02d}" for i in range(6)], [0] * 6)
    chain = solver.Chain.homogeneous(6)
    assert counts == solver.make_schedule(chain, plan).forward_counts(6) == [1, 3, 3, 3, 3, 2]


def test_apply_plan_rejects_bad_input():
    layers, params, x = _marked_tanh_stack(depth=3)
    with pytest.raises(ValueError, match="backend"):
        apply_plan((Layer(0), Layer(1), Layer(2)), layers, params, x, backend="scan")
    with pytest.raises(ValueError, match="covers layers"):
        apply_plan((Layer(0), Layer(1)), layers, params, x)
    with pytest.raises(ValueError, match="2 entries"):
        apply_plan((Layer(0), Layer(1), Layer(2)), layers, params[:2], x)


def test_apply_plan_with_a_custom_segment_transform():
    """``transform`` makes each checkpointed segment (the Flax wrappers pass lifted remats)."""
    layers, params, x = _marked_tanh_stack(depth=4)
    plan = (Checkpoint(0, 2, (Layer(0), Layer(1))), Layer(2), Layer(3))
    made = []

    def transform(body):
        made.append(body)
        return jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)

    loss = lambda p: jnp.sum(apply_plan(plan, layers, p, x, transform=transform))
    program = jax.make_jaxpr(jax.grad(loss))(params)
    assert len(made) == 1
    assert _forward_runs(program.jaxpr, [f"layer{i:02d}" for i in range(4)], [0] * 4) == [2, 2, 1, 1]
    assert_trees_close(run_jitted(jax.grad(loss), params),
                       jax.grad(lambda p: jnp.sum(plain(layers, p, x)))(params))
    with pytest.raises(TypeError, match="transform"):
        apply_plan(plan, layers, params, x, transform="remat")


def _norm_block(p, x):
    """A pre-norm residual block: its input's gradient needs residuals (the normalised
    input, the inverse deviation) that the parameters' gradients do not."""
    mu = x.mean(-1, keepdims=True)
    h = (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["g"]
    return x + jnp.tanh(h @ p["w1"]) @ p["w2"]


def test_a_first_segment_without_input_gradient_keeps_no_tape_for_it():
    """With ``x`` not differentiated the ``custom_vjp`` backend's first segment
    differentiates the parameters alone, as ``jax.checkpoint`` does and as the plan
    assumes: both backends measure the same peak, in that segment's backward (before,
    ``custom_vjp`` kept the first layer's residuals for ``g[0]`` and computed it: 62848 B
    against a predicted 62208 B on a random stack), and the gradients are the plain ones."""
    from jaxremat import activation_memory

    rng = np.random.default_rng(0)
    widths = (64, 64, 4)  # the first segment's two layers dominate the peak
    params = [{"g": jnp.ones(16), "w1": jnp.asarray(rng.standard_normal((16, w)) / 4, jnp.float32),
               "w2": jnp.asarray(rng.standard_normal((w, 16)) / 8, jnp.float32)} for w in widths]
    layers = [_norm_block] * 3
    x = jnp.asarray(rng.standard_normal((2, 8, 16)), jnp.float32)
    plan = (Checkpoint(0, 2, (Layer(0), Layer(1))), Layer(2))

    def loss(backend):
        return lambda p, x: jnp.sum(apply_plan(plan, layers, p, x, backend=backend))

    peaks = {b: activation_memory(loss(b), params, x) for b in ("checkpoint", "custom_vjp")}
    assert peaks["custom_vjp"] == peaks["checkpoint"], peaks
    plain = (Layer(0), Layer(1), Layer(2))
    want = jax.grad(lambda p, x: jnp.sum(apply_plan(plain, layers, p, x)))(params, x)
    got = jax.grad(loss("custom_vjp"))(params, x)
    for got, ref in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
