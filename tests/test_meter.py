"""The program-order memory meter, on programs whose peaks are derived by hand.

Notation (``dense_chain``): float32 everywhere; ``A = B * D * 4`` bytes is one activation
of the dense chains (batch ``B``, width ``D``), ``W = D * D * 4`` one weight. With
``B = 64, D = 32``: ``W = A/2``. Each derivation follows the jaxpr that
``jax.make_jaxpr(jax.grad(...))`` prints (jax 0.10). Calls, control flow and nested
checkpoints are in ``test_meter_calls.py``. Where the derivation differs between JAX 0.10
and 0.11+ it counts ``Y`` (``dense_chain``: 1 where tanh's tape holds its output, JAX 0.10,
whose tape is ``y`` and ``1 - y``; 0 where it is ``one_minus_square(y)`` alone, JAX 0.11+).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import AbstractToken

from dense_chain import (A, B, D, W, X, Y, all_eqns, layer, per_layer_checkpoint, plain, segments,
                         sin_loss, weights)
from jaxremat import activation_memory
from jaxremat.measure.meter import MemoryReport, aval_nbytes, program_memory


# --- a single op chain ---------------------------------------------------------------


@pytest.mark.parametrize("n", [1000, 4096])
def test_sin_chain_by_hand(n):
    # grad jaxpr: c = convert(p) [scalar]; d = x*c; e = sin d; f = cos d; _ = sum e;
    # g = broadcast 1.0; h = g*f; i = x*h; j = sum i; k = convert j [output].
    # p is a parameter (never counted), x (n floats) is counted while live.
    # Live at each candidate (in arrays of n floats, + scalars):
    #   convert: x + c(4 B); mul: x, c, d -> 2n + 4 B; sin: x, d, e = 3n; cos: x, d, e, f = 4n
    #   (d dies after cos); sum e: x, e, f + 4 B; broadcast: x, f, g = 3n; h = g*f:
    #   x, f, g, h = 4n (g, f die); i = x*h: x, h, i = 3n; sum: i + 4 B.
    # Peak: 4n floats = 16 n bytes (reached at cos and again at h = g*f).
    x = jnp.ones(n, jnp.float32)
    assert activation_memory(sin_loss, 2.0, x) == 16 * n
    report = activation_memory(sin_loss, 2.0, x, detail=True)
    assert report.peak == 16 * n
    assert report.location == ((3, "cos"),)  # the first time the peak is reached
    where = sorted(v.where for v in report.live)
    assert where == ["eqn 1 mul", "eqn 2 sin", "eqn 3 cos", "input 1"]
    assert sum(v.nbytes for v in report.live) == report.peak


def test_program_memory_of_one_layer():
    # layer(w, x) = tanh(x @ w): d = dot(x, w) [A]; y = tanh d [A, the output].
    closed = jax.make_jaxpr(layer)(weights(1)[0], X)
    # Defaults (inputs and outputs not counted): only d, the forward temporary.
    assert program_memory(closed) == A
    # Output counted: d and y both live at tanh.
    assert program_memory(closed, count_outputs=True) == 2 * A
    # Inputs counted: at dot, w + x + d (x and w die after it); at tanh, d (+ y uncounted).
    assert program_memory(closed, exclude_inputs=False) == W + 2 * A
    # Only x counted (w = input 0 excluded): x + d at dot.
    assert program_memory(closed, exclude_inputs=[0]) == 2 * A
    assert program_memory(closed.jaxpr, exclude_inputs=(0,)) == 2 * A  # a bare Jaxpr too


# --- checkpointing is seen ---------------------------------------------------------------


@pytest.mark.parametrize("n_layers", [1, 4, 16])
def test_plain_versus_checkpoint_per_layer(n_layers):
    L = n_layers
    # Plain: layer i's forward is d = x_i @ w (temporary), y_i = tanh d, f_i = its tape
    # (1 - y_i; JAX 0.11+: 1 - y_i^2). The layer inputs x_1..x_{L-1} are the y_i, stored
    # for the next layer's dW; y_L is stored only where the tape holds it (Y). After the
    # forward: x_0..x_{L-1}, f_1..f_L, Y y_L = 2L + Y arrays; the seed g adds 1. Backward
    # of the last layer: k = g*f_L -> (2L+2+Y) A; then each layer frees its arrays before
    # the next one starts, and the dW temporary (2iA + W) stays below that while W <= 3A.
    assert activation_memory(plain, weights(L), X) == (2 * L + 2 + Y) * A
    # Checkpoint per layer: the forward keeps only the layer inputs x_0..x_{L-1}
    # (y_L dies after the loss), the seed g makes it (L+1) A. The last layer's backward is
    # a remat equation whose body recomputes d, y (1A), then its tape, g*tape, ... with
    # at most 2 + Y arrays live inside (W <= 2A): peak (L+1) A + (2+Y) A = (L+3+Y) A.
    assert activation_memory(per_layer_checkpoint, weights(L), X) == (L + 3 + Y) * A
    # The saving is one array per layer (the tape f_i) minus the recomputation's 1 A.
    saving = activation_memory(plain, weights(L), X) - activation_memory(
        per_layer_checkpoint, weights(L), X
    )
    assert saving == (L - 1) * A


@pytest.mark.parametrize(
    "n_layers, size", [(16, 1), (16, 2), (16, 4), (16, 8), (16, 16), (36, 6), (36, 4)]
)
def test_sqrt_segments(n_layers, size):
    # k = L / size segments. Forward: x_0 and the k - 1 segment outputs that feed the next
    # segment (the last one dies after the loss) = k arrays, + the seed g. The backward of
    # the last segment recomputes its forward inside its remat body, keeping the size - 1
    # inputs of its inner layers; the inner remat of its last layer adds (2+Y) A (as above).
    # Peak: (k + 1) A + (size - 1) A + (2+Y) A = (k + size + 2 + Y) A, minimal
    # (2 sqrt(L) + 2 + Y) A at size = sqrt(L), against (L + 3 + Y) A for a checkpoint per layer.
    k = n_layers // size
    measured = activation_memory(lambda ws, x: segments(ws, x, size), weights(n_layers), X)
    assert measured == (k + size + 2 + Y) * A
    if size * size == n_layers:
        assert measured == (2 * math.isqrt(n_layers) + 2 + Y) * A
        assert measured < activation_memory(per_layer_checkpoint, weights(n_layers), X)


def test_checkpoint_policies():
    # The per-layer options of Rockmate's model, as jax.checkpoint policies.
    L = 8

    def chain(policy):
        def loss(ws, x):
            for w in ws:
                x = jax.checkpoint(layer, prevent_cse=True, policy=policy)(w, x)
            return jnp.sum(x)

        return loss

    policies = jax.checkpoint_policies
    nothing = activation_memory(chain(policies.nothing_saveable), weights(L), X)
    dots = activation_memory(chain(policies.dots_saveable), weights(L), X)
    everything = activation_memory(chain(policies.everything_saveable), weights(L), X)
    # nothing_saveable is the default: a checkpoint per layer, (L + 3 + Y) A.
    assert nothing == (L + 3 + Y) * A
    # dots_saveable keeps each pre-activation d_i = x_i @ w besides the layer inputs: after
    # the loss, x_0..x_{L-1} and d_1..d_L + the seed g = (2L + 1) A. The last layer's remat
    # gets d_L, x_{L-1}, g, all used last there, so it owns them (3 A of the 2L + 1): its
    # body q = tanh d_L (d_L then dies), r = its tape, s = g * r holds x_{L-1}, g, q, r, s =
    # 5 A at s (JAX 0.10: and 5 A again at u = s + s * q; JAX 0.11+ frees q at r: 4 + Y).
    # Peak (2L - 2) A + (4 + Y) A = (2L + 2 + Y) A. (The old rule, operands live until the
    # remat returns, gave (2L + 1) A + 3 A = (2L + 4) A.)
    assert dots == (2 * L + 2 + Y) * A
    assert nothing < dots <= everything


def test_checkpoint_recomputes_in_the_backward():
    L = 5
    closed_plain = jax.make_jaxpr(jax.grad(plain))(weights(L), X)
    closed_ck = jax.make_jaxpr(jax.grad(per_layer_checkpoint))(weights(L), X)
    tanh = lambda j: sum(e.primitive.name == "tanh" for e in all_eqns(j))
    assert tanh(closed_plain.jaxpr) == L
    assert tanh(closed_ck.jaxpr) == 2 * L  # every layer's forward runs twice
    top = closed_ck.jaxpr.eqns
    seed = next(i for i, e in enumerate(top) if e.primitive.name == "broadcast_in_dim")
    remats = [i for i, e in enumerate(top) if e.primitive.name == "remat2"]
    assert len(remats) == L and min(remats) > seed  # recomputation happens in the backward
    for i in remats:
        assert top[i].params["prevent_cse"] and tanh(top[i].params["jaxpr"]) == 1


# --- parameters and their gradients are not counted ---------------------------------------


def biased_loss(params, x):
    return jnp.sum(jnp.tanh(x @ params["w"])) + jnp.sum(params["b"])


@pytest.mark.parametrize("n_bias", [10, 100_000])
def test_params_and_gradients_not_counted(n_bias):
    # b enters only through sum(b): nothing of b's size is created except b's gradient,
    # a broadcast of the scalar cotangent that the program returns. With b 100_000
    # floats (~49 A) the peak would move if either b or its gradient were counted.
    params = {"w": weights(1)[0], "b": jnp.ones(n_bias, jnp.float32)}
    measured = activation_memory(biased_loss, params, X)
    assert measured == activation_memory(lambda p, x: plain([p["w"]], x), params, X)
    assert measured == (4 + Y) * A  # (2L + 2 + Y) A with L = 1
    # The same program with every input and output counted sees b (4 n_bias bytes).
    closed = jax.make_jaxpr(jax.grad(biased_loss))(params, X)
    everything = program_memory(closed, exclude_inputs=False, count_outputs=True)
    assert everything >= 4 * n_bias + W + A


def test_batch_is_counted():
    # x is not a parameter: doubling the batch doubles every activation, so the peak.
    x2 = jnp.ones((2 * B, D), jnp.float32)
    assert activation_memory(plain, weights(3), x2) == 2 * activation_memory(plain, weights(3), X)


# --- sizes -----------------------------------------------------------------------------------


def test_value_sizes():
    keys = jax.random.split(jax.random.key(0), 10)
    rbg = jax.random.split(jax.random.key(0, impl="rbg"), 10)
    for k in (keys, rbg):
        # one key in (8 or 16 B: threefry keeps 2 uint32, rbg 4), ten out
        closed = jax.make_jaxpr(lambda k: jax.random.split(k, 10))(k[0])
        assert program_memory(closed, count_outputs=True) == jax.random.key_data(k).nbytes
        assert program_memory(closed, exclude_inputs=False, count_outputs=True) == (
            jax.random.key_data(k).nbytes * 11 // 10
        )
    assert aval_nbytes(jax.core.ShapedArray((3, 5), jax.dtypes.float0)) == 0
    assert aval_nbytes(AbstractToken()) == 0
    assert aval_nbytes(jax.core.ShapedArray((3, 5), jnp.bfloat16)) == 30
    assert aval_nbytes(jax.core.ShapedArray((), jnp.int64)) == 8


def test_literals_and_unused_outputs():
    # _ = sum(x) is unused: allocated and freed by its equation (x + 4 B = 44 B); then
    # y = x + 1.0: x and y, 80 B (a counted literal would make it 84 B).
    closed = jax.make_jaxpr(lambda x: (jnp.sum(x), x + 1.0)[1])(jnp.ones(10, jnp.float32))
    assert [e.primitive.name for e in closed.jaxpr.eqns] == ["reduce_sum", "add"]
    assert program_memory(closed, exclude_inputs=False, count_outputs=True) == 80
    # in the other order the unused scalar is allocated while x and y are live: 84 B.
    closed = jax.make_jaxpr(lambda x: (x + 1.0, jnp.sum(x))[0])(jnp.ones(10, jnp.float32))
    assert program_memory(closed, exclude_inputs=False, count_outputs=True) == 84


# --- reports and errors ----------------------------------------------------------------------


def test_detail_report():
    report = activation_memory(lambda ws, x: segments(ws, x, 4), weights(16), X, detail=True)
    assert isinstance(report, MemoryReport)
    assert report.peak == activation_memory(lambda ws, x: segments(ws, x, 4), weights(16), X)
    assert sum(v.nbytes for v in report.live) == report.peak
    # the peak: the innermost remat's g * tape (JAX 0.10), or its tanh (0.11+, whose tape
    # is made from y right after it)
    assert [name for _, name in report.location] == ["remat2", "remat2", "mul" if Y else "tanh"]
    assert report.where().startswith("eqn ") and " > " in report.where()
    text = str(report)
    assert "peak" in text and "float32[64,32]" in text


def test_errors():
    closed = jax.make_jaxpr(layer)(weights(1)[0], X)
    with pytest.raises(IndexError, match="has 2 inputs"):
        program_memory(closed, exclude_inputs=[2])
    with pytest.raises(TypeError, match="make_jaxpr"):
        program_memory(layer)
    with pytest.raises(TypeError, match="make_jaxpr"):
        program_memory(np.ones(3))
    (n,) = jax.export.symbolic_shape("n")
    with pytest.raises(TypeError, match="concrete shapes"):
        aval_nbytes(jax.ShapeDtypeStruct((n, 3), jnp.float32))


def test_leading_axis_reshape_and_squeeze_are_views():
    # The same gradient program with x regrouped on its leading axis, or given a unit axis
    # and squeezed, measures what it measures on x itself: the views are x's buffer (XLA
    # bitcasts them). A reshape of the trailing axes is counted as a copy.
    n = 1024
    x = jnp.ones((8, n // 8), jnp.float32)

    def uses(view):
        return lambda p, x: jnp.sum(jnp.sin(p * view(x)) * view(x) * view(x))

    plain = activation_memory(uses(lambda x: x), 2.0, x)
    assert activation_memory(uses(lambda x: x.reshape(2, 4, n // 8)), 2.0, x) == plain
    assert activation_memory(uses(lambda x: x.reshape(1, 8, n // 8).squeeze(0)), 2.0, x) == plain
    assert activation_memory(uses(lambda x: x.reshape(n // 8, 8)), 2.0, x) > plain
