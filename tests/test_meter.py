"""The program-order memory meter, on programs whose peaks are derived by hand.

Notation: float32 everywhere; ``A = B * D * 4`` bytes is one activation of the dense chains
(batch ``B``, width ``D``), ``W = D * D * 4`` one weight. With ``B = 64, D = 32``: ``W = A/2``.
Each derivation follows the jaxpr that ``jax.make_jaxpr(jax.grad(...))`` prints (jax 0.10).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import AbstractToken, ClosedJaxpr, Literal

from jaxremat import activation_memory
from jaxremat.apply import apply_plan
from jaxremat.meter import MemoryReport, aval_nbytes, inputs_read, program_memory
from solver import Checkpoint, Layer

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
    # Plain: layer i's forward is d = x_i @ w (temporary), y_i = tanh d, f_i = 1 - y_i; its
    # tape is y_i and f_i (2A; x_i is y_{i-1}, already stored). After the forward: x_0 + 2L
    # arrays; the seed g adds 1. Backward of the last layer: k = g*f_L -> (2L+3) A; then
    # each layer frees two arrays before the next one starts, and the dW temporary
    # (2iA + W) stays below that while W <= 3A. Peak (2L+3) A.
    assert activation_memory(plain, weights(L), X) == (2 * L + 3) * A
    # Checkpoint per layer: the forward keeps only the layer inputs x_0..x_{L-1}
    # (y_L dies after the loss), the seed g makes it (L+1) A. The last layer's backward is
    # a remat equation whose body recomputes d, y (1A), then 1 - y, g*(1-y), ... with
    # at most 3 arrays live inside (W <= 2A): peak (L+1) A + 3 A = (L+4) A.
    assert activation_memory(per_layer_checkpoint, weights(L), X) == (L + 4) * A
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
    # inputs of its inner layers; the inner remat of its last layer adds 3 A (as above).
    # Peak: (k + 1) A + (size - 1) A + 3 A = (k + size + 3) A, minimal (2 sqrt(L) + 3) A at
    # size = sqrt(L), against (L + 4) A for a checkpoint per layer.
    k = n_layers // size
    measured = activation_memory(lambda ws, x: segments(ws, x, size), weights(n_layers), X)
    assert measured == (k + size + 3) * A
    if size * size == n_layers:
        assert measured == (2 * math.isqrt(n_layers) + 3) * A
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
    # nothing_saveable is the default: a checkpoint per layer, (L + 4) A.
    assert nothing == (L + 4) * A
    # dots_saveable keeps each pre-activation d_i = x_i @ w besides the layer inputs: after
    # the loss, x_0..x_{L-1} and d_1..d_L + the seed g = (2L + 1) A. The last layer's remat
    # gets d_L, x_{L-1}, g, all used last there, so it owns them (3 A of the 2L + 1): its
    # body q = tanh d_L (d_L then dies), r = 1 - q, s = g * r holds x_{L-1}, g, q, r, s =
    # 5 A at s, and 5 A again at u = s + s * q. Peak (2L - 2) A + 5 A = (2L + 3) A. (The
    # old rule, operands live until the remat returns, gave (2L + 1) A + 3 A = (2L + 4) A.)
    assert dots == (2 * L + 3) * A
    assert nothing < dots <= everything


def _eqns(jaxpr):
    """All equations of ``jaxpr`` and its sub-jaxprs, in program order (depth first)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def test_checkpoint_recomputes_in_the_backward():
    L = 5
    closed_plain = jax.make_jaxpr(jax.grad(plain))(weights(L), X)
    closed_ck = jax.make_jaxpr(jax.grad(per_layer_checkpoint))(weights(L), X)
    tanh = lambda j: sum(e.primitive.name == "tanh" for e in _eqns(j))
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
    assert measured == 5 * A  # (2L + 3) A with L = 1
    # The same program with every input and output counted sees b (4 n_bias bytes).
    closed = jax.make_jaxpr(jax.grad(biased_loss))(params, X)
    everything = program_memory(closed, exclude_inputs=False, count_outputs=True)
    assert everything >= 4 * n_bias + W + A


def test_batch_is_counted():
    # x is not a parameter: doubling the batch doubles every activation, so the peak.
    x2 = jnp.ones((2 * B, D), jnp.float32)
    assert activation_memory(plain, weights(3), x2) == 2 * activation_memory(plain, weights(3), X)


# --- sub-programs --------------------------------------------------------------------------


def _body(x):
    # a = sin x; b = cos x; c = a*b (a, b die) -> 3 arrays at c; d = exp x; e = c + d -> 3.
    return jnp.sum(jnp.sin(x) * jnp.cos(x) + jnp.exp(x))


def _custom_jvp(f):
    g = jax.custom_jvp(f)
    g.defjvp(lambda primals, tangents: jax.jvp(f, primals, tangents))
    return g


def _custom_vjp(f):
    g = jax.custom_vjp(f)
    g.defvjp(lambda x: (f(x), x), lambda x, ct: jax.vjp(f, x)[1](ct))
    return g


WRAPPERS = {
    "plain": lambda f: f,
    "jit": jax.jit,
    "custom_jvp": _custom_jvp,
    "custom_vjp": _custom_vjp,
    "checkpoint": lambda f: jax.checkpoint(f, prevent_cse=True),
}


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("inputs_counted", [False, True])
def test_calls_are_entered(wrapper, inputs_counted):
    # A call adds nothing of its own: the peak of the body (3 arrays of n floats, + x when
    # counted, which stays live during the call as it would in the body) is found inside.
    n = 1000
    x = jnp.ones(n, jnp.float32)
    closed = jax.make_jaxpr(WRAPPERS[wrapper](_body))(x)
    if wrapper != "plain":
        assert len(closed.jaxpr.eqns) == 1  # the body is inside one call equation
    expected = 4 * n * (4 if inputs_counted else 3)
    assert program_memory(closed, exclude_inputs=not inputs_counted) == expected


def test_jit_inside_grad_measures_as_inlined():
    # Under grad, a jit splits into a forward jit (returning sin and the residual cos) and a
    # backward jit with operands x, cos, g. Forward: x (used again later, so live outside)
    # + inner {f = x*p, sin, cos} = 4n at cos. Backward: x, cos and g are used last by the
    # call, which owns them: 3n at its start, i = g*cos makes 4n, then g and cos die; j =
    # x*i: x, i, j = 3n. Peak 4n floats = 16 n bytes, the inlined program's
    # (test_sin_chain_by_hand). The old rule (operands live until the call returns) kept
    # g and cos during j: 5n = 20 n bytes.
    n = 1000
    x = jnp.ones(n, jnp.float32)
    jitted = lambda p, x: jnp.sum(jax.jit(lambda p, x: jnp.sin(x * p))(p, x))
    assert activation_memory(jitted, 2.0, x) == 16 * n
    assert activation_memory(sin_loss, 2.0, x) == 16 * n


def test_custom_vjp_under_grad():
    # jax.grad inlines the custom rule: the forward saves cos(x*p) exactly like autodiff of
    # sin does, so the program and its measure (16 n, test_sin_chain_by_hand) are the same.
    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (g * c,))
    n = 1000
    x = jnp.ones(n, jnp.float32)
    assert activation_memory(lambda p, x: jnp.sum(f(x * p)), 2.0, x) == 16 * n


def test_cond_takes_the_largest_branch():
    # switch: c = convert(i) [4 B]; d = clamp c [4 B, live during the cond]. Branch 0 keeps
    # 1 array (its output, uncounted) -> 0; branch 1: sin, cos live (mul = the output) -> 2n.
    n = 1000
    x = jnp.ones(n, jnp.float32)
    branches = [jnp.sin, lambda x: jnp.sin(x) * jnp.cos(x)]
    closed = jax.make_jaxpr(lambda i, x: lax.switch(i, branches, x))(1, x)
    assert program_memory(closed) == 4 + 8 * n
    alone = [program_memory(jax.make_jaxpr(b)(x)) for b in branches]
    assert alone == [0, 8 * n]


def test_cond_frees_an_operand_inside_the_branch():
    # y = sin x (n floats) is used last by the switch, so each branch owns it. Branch 1:
    # j = exp y (y, j: 2n; y dies), k = exp j (j, k: 2n; j dies), l = exp k (the uncounted
    # output). Branch 0: h = 2y, the output: n. Largest branch 2n, + the clamped index e
    # (4 B, live during the cond): 8n + 4 bytes. Kept outside, y would make it 12n + 4.
    n = 1000
    x = jnp.ones(n, jnp.float32)
    branches = [lambda y: y * 2.0, lambda y: jnp.exp(jnp.exp(jnp.exp(y)))]
    closed = jax.make_jaxpr(lambda i, x: lax.switch(i, branches, jnp.sin(x)))(1, x)
    assert [e.primitive.name for e in closed.jaxpr.eqns][-1] == "cond"
    assert program_memory(closed) == 8 * n + 4


def test_cond_under_grad_is_at_least_each_branch():
    n = 1000
    x = jnp.ones(n, jnp.float32)
    cheap = lambda p, x: jnp.sum(jnp.sin(x * p))
    costly = lambda p, x: jnp.sum(jnp.sin(jnp.sin(jnp.sin(x * p))))
    both = lambda p, x: lax.cond(jnp.sum(x) > 0, cheap, costly, p, x)
    measured = activation_memory(both, 2.0, x)
    assert measured >= max(activation_memory(cheap, 2.0, x), activation_memory(costly, 2.0, x))


def test_scan_chain():
    # A chain scanned over stacked weights, L iterations.
    L = 8
    stacked = jnp.stack(weights(L))

    def scanned(wstack, x, layer_fn):
        x, _ = lax.scan(lambda c, w: (layer_fn(w, c), None), x, wstack)
        return jnp.sum(x)

    ck = jax.checkpoint(layer, prevent_cse=True)
    # Checkpointed: the forward scan stacks the L layer inputs (L A). Backward scan: that
    # stack + the seed g + the scan's carry buffer (1 A; JAX returns the final cotangent
    # carry even though nothing uses it) + the body's remat peak 3 A = (L + 5) A: one
    # array more than the unrolled chain's (L + 4) A, the double-buffered carry.
    assert activation_memory(lambda w, x: scanned(w, x, ck), stacked, X) == (L + 5) * A
    # Plain: the scan's residuals are stacked per iteration: input x_i, y_i and 1 - y_i
    # (3 L A; the unrolled chain shares x_{i+1} = y_i, so it stores 2 L A). Backward:
    # 3 L A + g + carry buffer + body peak 3 A (k, l, m) = (3 L + 5) A.
    assert activation_memory(lambda w, x: scanned(w, x, layer), stacked, X) == (3 * L + 5) * A


def test_peak_inside_a_scan_body():
    # Body: b = c[:, None], c2 = c[None, :] (n floats each), m = b * c2 (n^2), new carry =
    # sum(m, 0) (the program's output: not counted). Peak in the body at m: n^2 + 2n floats.
    n = 100

    def f(v):
        step = lambda c, _: (jnp.sum(c[:, None] * c[None, :], 0), None)
        return lax.scan(step, v, None, length=3)[0]

    closed = jax.make_jaxpr(f)(jnp.ones(n, jnp.float32))
    report = program_memory(closed, detail=True)
    assert report.peak == 4 * (n * n + 2 * n)
    assert report.location == ((0, "scan"), (2, "mul"))
    # Under grad: the forward scan stacks the residuals c[None, :] and c[:, None] (3n
    # each); the backward scan runs with x (used again at the end), both stacks, the seed
    # (n) and its carry buffer (n) live, and its body broadcasts the cotangent to r (n^2),
    # s = r * c[:, None] (n^2), t = sum(s, 0) (n): peak 2 n^2 + 10 n floats, at t.
    loss = lambda p, v: jnp.sum(f(v * p))
    report = activation_memory(loss, 2.0, jnp.ones(n, jnp.float32), detail=True)
    assert report.peak == 4 * (2 * n * n + 10 * n)
    assert [name for _, name in report.location] == ["scan", "reduce_sum"]


def test_while_loop():
    # fori_loop with a traced bound is a while: outputs (i, n, x): i and n unused (4 B each,
    # allocated by the loop), x is the output (uncounted). Body: i + 1 (4 B), sin c (n), the
    # new carry 2 sin c is the output (uncounted) -> body peak n + 4 B.
    n = 1000
    closed = jax.make_jaxpr(lambda x, k: lax.fori_loop(0, k, lambda i, c: jnp.sin(c) * 2, x))(
        jnp.ones(n, jnp.float32), 3
    )
    assert closed.jaxpr.eqns[0].primitive.name == "while"
    assert program_memory(closed) == 8 + 4 * n + 4


# --- calls are measured as if inlined --------------------------------------------------------

_INLINED = ("jit", "pjit", "remat2", "closed_call", "custom_jvp_call", "custom_vjp_call")


def _eval_inlined(jaxpr, consts, args):
    """Evaluate ``jaxpr`` binding each primitive again, calls replaced by their bodies."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, Literal) else env[v]
    for eqn in jaxpr.eqns:
        operands = [read(v) for v in eqn.invars]
        if eqn.primitive.name in _INLINED:
            body = eqn.params["jaxpr" if "jaxpr" in eqn.params else "call_jaxpr"]
            if isinstance(body, ClosedJaxpr):
                outs = _eval_inlined(body.jaxpr, body.consts, operands)
            else:
                outs = _eval_inlined(body, [], operands)
        else:
            outs = eqn.primitive.bind(*operands, **eqn.params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _inlined(closed, *args):
    """``closed`` re-traced with every call inlined: the same equations, in the same order."""
    flat = jax.tree.leaves(args)
    inlined = jax.make_jaxpr(lambda *a: _eval_inlined(closed.jaxpr, closed.consts, a))(*flat)
    assert not any(e.primitive.name in _INLINED for e in _eqns(inlined.jaxpr))
    return inlined


def nested_prefix(ws, x):
    """A checkpoint nested per layer: the segment of layers 0..k is checkpoint(segment of
    0..k-1, then a checkpointed layer k): revolve with one free slot, depth len(ws)."""
    if len(ws) == 1:
        return jax.checkpoint(layer, prevent_cse=True)(ws[0], x)
    body = lambda ws, x: jax.checkpoint(layer, prevent_cse=True)(ws[-1], nested_prefix(ws[:-1], x))
    return jax.checkpoint(body, prevent_cse=True)(ws, x)


def nested_suffix(ws, x):
    """The other nesting: checkpoint(layer 0, then the checkpointed segment of the rest)."""
    if not ws:
        return x
    body = lambda ws, x: nested_suffix(ws[1:], layer(ws[0], x))
    return jax.checkpoint(body, prevent_cse=True)(ws, x)


def _summed(f):
    return lambda ws, x: jnp.sum(f(ws, x))


def nested_plan(L):
    """The solver plan of depth L - 1: checkpoint(0..k) = [checkpoint(0..k-1), Layer(k)]."""
    plan = (Layer(0),)
    for k in range(1, L):
        plan = (Checkpoint(0, k + 1, plan + (Layer(k),)),)
    return plan


@pytest.mark.parametrize("depth", [4, 6, 8])
def test_nested_checkpoints_do_not_accumulate(depth):
    L = depth
    # nested_prefix with L layers: S_L = checkpoint(S_{L-1} then ck(layer L-1)), depth L.
    # Forward: S_L's remat keeps x_0; its output dies after the loss; the seed g: 2 A.
    # Backward of S_L (owns x_0 and g, both used last there): it recomputes x_1..x_{L-1}
    # through S_{L-1}'s and the layers' forward remats (x_0, g, the previous x and one
    # dot: 4 A at most), then layer L-1's backward remat owns x_{L-1} and g: its body
    # d = x_{L-1} @ w, y = tanh d, s = 1 - y, m = g * s holds x_0 (live outside for
    # S_{L-1}), x_{L-1}, g, y, s, m = 6 A at m; after it g is dead. Then S_{L-1}'s
    # backward (owning x_0 and g_{L-1}) repeats this one level down, again 6 A at most,
    # down to S_1 = ck(layer 0): x_0, g_1 + 3 = 5 A. Peak 6 A whatever the depth.
    # The old rule kept each level's incoming gradient until its remat returned, i.e.
    # through the whole backward of the levels below: at layer 1's backward, g_L..g_3 (L-2
    # of them) + x_0 + x_1, g_2 + 3 temporaries = (L + 4) A, one array more per level.
    measured = activation_memory(_summed(nested_prefix), weights(L), X, detail=True)
    assert measured.peak == 6 * A
    assert [name for _, name in measured.location] == ["remat2", "remat2", "mul"]
    assert sum(v.nbytes for v in measured.live) == measured.peak
    # nested_suffix: S_k = checkpoint(plain layer, then S_{k-1}). Backward of level k:
    # recompute its layer (keeping y = x_{k+1} and the tape 1 - y), run S_{k-1}'s backward
    # (operands x_{k+1}, g: x_{k+1} is read again by the layer's backward, g is passed
    # down), then the layer's backward, which reads x_k, y and 1 - y. Nothing is used last
    # early, so the old rule agreed: at the innermost layer's backward, x_0..x_{L-1}, the
    # tapes 1 - y of the L - 1 levels above, g and 3 temporaries = (2L + 3) A.
    assert activation_memory(_summed(nested_suffix), weights(L), X) == (2 * L + 3) * A
    # The nesting of a solver plan (jaxremat.apply_plan), whose checkpoint bodies end with a
    # plain layer: checkpoint(0..k) = [checkpoint(0..k-1), Layer(k)], depth L - 1. The
    # backward of level k owns x_0 and g_{k+1}: it recomputes x_1..x_k (JAX inlines the
    # inner checkpoint's forward), layer k with its tape, layer k's backward (g_{k+1} dies
    # there, at most 6 A), then level k-1's backward remat, owning x_0 and g_k. The deepest
    # level, [Layer(0), Layer(1)], holds x_0, g_2, x_1, layer 0's tape 1 - x_1 (made during
    # the recomputation) and layer 1's y, 1 - y and g_2 * (1 - y): 7 A at any depth, on both
    # backends. The old rule kept g_3..g_L on top: (L + 5) A.
    for backend in ("checkpoint", "custom_vjp"):
        assert activation_memory(_plan_loss(L, backend), weights(L), X) == 7 * A


def _plan_loss(L, backend):
    return _summed(lambda ws, x: apply_plan(nested_plan(L), [layer] * L, ws, x, backend=backend))


PROGRAMS = {
    "per_layer_checkpoint": (per_layer_checkpoint, 4),
    "segments": (lambda ws, x: segments(ws, x, 3), 9),
    "nested_prefix": (_summed(nested_prefix), 5),
    "nested_suffix": (_summed(nested_suffix), 5),
    "plan_checkpoint": (_plan_loss(5, "checkpoint"), 5),
    "plan_custom_vjp": (_plan_loss(5, "custom_vjp"), 5),  # custom_vjp_call inside
    "jit_layers": (lambda ws, x: jnp.sum(jax.jit(lambda ws, x: plain(ws, x) * x)(ws, x)), 3),
    "custom_vjp": (lambda ws, x: jnp.sum(_custom_vjp(lambda x: jnp.tanh(x @ ws[0]))(x)), 1),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_calls_measure_as_inlined(name):
    # The same gradient program with every call re-traced inline (no jit, remat2 or
    # custom_*_call left) measures the same, under each counting rule.
    fn, L = PROGRAMS[name]
    closed = jax.make_jaxpr(jax.grad(fn))(weights(L), X)
    assert any(e.primitive.name in _INLINED for e in _eqns(closed.jaxpr))
    inlined = _inlined(closed, weights(L), X)
    for exclude, count in [(range(L), False), (False, True), (True, False)]:
        measured = program_memory(closed, exclude_inputs=exclude, count_outputs=count)
        assert measured == program_memory(inlined, exclude_inputs=exclude, count_outputs=count)
    assert activation_memory(fn, weights(L), X) == program_memory(inlined, exclude_inputs=range(L))


def test_unread_operand_is_no_use():
    # y = sin x is passed to a jit whose body never reads it: after inlining it is dead
    # code, so it is freed by its own equation. sin: y (n); cos: z (n); the jit owns z:
    # z, then the uncounted output. Peak n floats; were y live until the jit, 2n.
    n = 1000
    x = jnp.ones(n, jnp.float32)
    ignore_b = jax.jit(lambda a, b: a * 2.0)
    closed = jax.make_jaxpr(lambda x: (lambda y: ignore_b(jnp.cos(x), y))(jnp.sin(x)))(x)
    assert [e.primitive.name for e in closed.jaxpr.eqns] == ["sin", "cos", "jit"]
    assert len(closed.jaxpr.eqns[-1].invars) == 2  # y is an operand of the jit
    assert program_memory(closed) == 4 * n


def test_inputs_read_sees_through_calls():
    # jnp.where's pullback gets the mask and a zeros residual and passes both to a jit
    # (_where) that builds its own zeros: the residual is passed but never read.
    scores = jnp.ones((4, 4), jnp.float32)
    mask = jnp.tril(jnp.ones((4, 4), bool))
    out, pullback = jax.vjp(lambda s: jnp.where(mask, s, -1e9), scores)
    residuals, tree = jax.tree.flatten(pullback)
    assert [str(r.dtype) for r in residuals] == ["bool", "float32"]
    closed = jax.make_jaxpr(lambda res, ct: jax.tree.unflatten(tree, res)(ct))(residuals, out)
    assert closed.jaxpr.eqns[0].primitive.name == "jit"
    assert inputs_read(closed) == (True, False, True)  # mask, zeros (unread), cotangent
    # through nested calls and a cond (read only if some branch reads it); an output is read
    inner = jax.jit(lambda a, b: a * 2.0)
    branches = (lambda c, e: jnp.sin(c), lambda c, e: a_const)  # c read by one branch only
    a_const = jnp.zeros((4, 4), jnp.float32)

    def outer(a, b, c, e):
        return inner(a, b) + lax.cond(a[0, 0] > 0, *branches, c, e)

    outer = jax.checkpoint(outer)
    closed = jax.make_jaxpr(lambda a, b, c, e, d: (outer(a, b, c, e), d))(*[scores] * 5)
    assert [e.primitive.name for e in closed.jaxpr.eqns] == ["remat2"]
    assert inputs_read(closed) == (True, False, True, False, True)
    assert inputs_read(closed.jaxpr) == (True, False, True, False, True)


def test_operand_passed_twice_is_one_buffer():
    # y = sin x is passed as both a and b and used last by the jit: one buffer, freed
    # after the last use of either name. Body e = 2a (y, e), f = exp e (y, e, f: 3n; e
    # dies), c = f * b (the uncounted output; y dies). Peak 3n floats: counting y twice
    # would give 4n, freeing it after a's last use 2n.
    n = 1000
    x = jnp.ones(n, jnp.float32)
    twice = jax.jit(lambda a, b: jnp.exp(a * 2.0) * b)
    closed = jax.make_jaxpr(lambda x: (lambda y: twice(y, y))(jnp.sin(x)))(x)
    call = closed.jaxpr.eqns[-1]
    assert call.invars[0] is call.invars[1]
    assert program_memory(closed) == 12 * n


def test_passed_through_output_is_the_operand():
    # The jit returns its operand b = sin x unchanged (p) and q = exp b, which nothing
    # reads; b is used again after the call. After inlining p is b: sin: b (n); the jit:
    # b outside + q (freed at once, nothing reads it) = 2n; then p * b: b + the uncounted
    # output. Peak 2n floats; a new buffer for p would make it 3n.
    n = 1000
    x = jnp.ones(n, jnp.float32)
    passing = jax.jit(lambda a: (a, jnp.exp(a)))
    closed = jax.make_jaxpr(lambda x: (lambda b: passing(b)[0] * b)(jnp.sin(x)))(x)
    assert program_memory(closed) == 8 * n
    assert program_memory(closed) == program_memory(_inlined(closed, x))


def test_loop_operands_stay_live_through_the_body():
    # Loops keep the conservative rule: a scan constant is read by every iteration, so it
    # is not freed inside the body even when the scan is its last use. y = sin x (n),
    # c0 = cos x (n); the scan's final carry is the uncounted output; its body m = c * y
    # (n), e1 = exp m (m, e1: 2n; m dies), e2 = exp e1 (the uncounted new carry).
    # Peak y + c0 + 2n = 4n floats (freeing y inside the body would give 3n).
    n = 1000
    x = jnp.ones(n, jnp.float32)

    def f(x):
        y = jnp.sin(x)
        step = lambda c, _: (jnp.exp(jnp.exp(c * y)), None)
        return lax.scan(step, jnp.cos(x), None, length=3)[0]

    closed = jax.make_jaxpr(f)(x)
    assert closed.jaxpr.eqns[-1].primitive.name == "scan"
    assert program_memory(closed) == 16 * n


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
    assert [name for _, name in report.location] == ["remat2", "remat2", "mul"]
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
