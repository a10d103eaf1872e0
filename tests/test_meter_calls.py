"""The meter on sub-programs: calls, custom derivatives, control flow, nested checkpoints.

Notation as in ``test_meter.py`` (``dense_chain``). Every call is measured as if its body
were inlined into the caller; peaks are derived by hand from the printed jaxprs (jax 0.10).
"""

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.extend.core import ClosedJaxpr, Literal

from dense_chain import (A, X, Y, all_eqns, layer, per_layer_checkpoint, plain, segments, sin_loss,
                         weights)
from jaxremat import activation_memory
from jaxremat.sequence.apply import apply_plan
from jaxremat.measure.meter import inputs_read, program_memory
from solver import Checkpoint, Layer


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
    g.defvjp(lambda *args: (f(*args), args), lambda args, ct: jax.vjp(f, *args)[1](ct))
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
    # carry even though nothing uses it) + the body's remat peak (2 + Y) A = (L + 4 + Y) A:
    # one array more than the unrolled chain's (L + 3 + Y) A, the double-buffered carry.
    # (Y: dense_chain; 1 on JAX 0.10, whose tanh tape holds y, 0 on JAX 0.11+.)
    assert activation_memory(lambda w, x: scanned(w, x, ck), stacked, X) == (L + 4 + Y) * A
    # Plain: the scan's residuals are stacked per iteration: input x_i and the tape (y_i
    # and 1 - y_i on JAX 0.10, 1 - y_i^2 on 0.11+): (2 + Y) L A; the unrolled chain shares
    # x_{i+1} = y_i. Backward: (2 + Y) L A + g + carry buffer + body peak (2 + Y) A
    # = ((2 + Y) L + 4 + Y) A.
    assert activation_memory(lambda w, x: scanned(w, x, layer), stacked, X) == (
        (2 + Y) * L + 4 + Y) * A


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

# eval_jaxpr: what closed_call and call became in JAX 0.11 (also emitted by custom_vjp)
_INLINED = ("jit", "pjit", "remat2", "closed_call", "custom_jvp_call", "custom_vjp_call",
            "eval_jaxpr")


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
    assert not any(e.primitive.name in _INLINED for e in all_eqns(inlined.jaxpr))
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
    # down to S_1 = ck(layer 0): x_0, g_1 + 3 = 5 A. Peak 6 A whatever the depth. That is
    # JAX 0.10; on 0.11+ the tape s = 1 - y^2 replaces y (freed at s): (5 + Y) A, at tanh.
    # The old rule kept each level's incoming gradient until its remat returned, i.e.
    # through the whole backward of the levels below: at layer 1's backward, g_L..g_3 (L-2
    # of them) + x_0 + x_1, g_2 + 3 temporaries = (L + 4) A, one array more per level.
    measured = activation_memory(_summed(nested_prefix), weights(L), X, detail=True)
    assert measured.peak == (5 + Y) * A
    assert [name for _, name in measured.location] == ["remat2", "remat2", "mul" if Y else "tanh"]
    assert sum(v.nbytes for v in measured.live) == measured.peak
    # nested_suffix: S_k = checkpoint(plain layer, then S_{k-1}). Backward of level k:
    # recompute its layer (keeping y = x_{k+1} and the tape 1 - y), run S_{k-1}'s backward
    # (operands x_{k+1}, g: x_{k+1} is read again by the layer's backward, g is passed
    # down), then the layer's backward, which reads x_k, y and 1 - y. Nothing is used last
    # early, so the old rule agreed: at the innermost layer's backward, x_0..x_{L-1}, the
    # tapes of the L - 1 levels above, g and 2 + Y temporaries = (2L + 2 + Y) A.
    assert activation_memory(_summed(nested_suffix), weights(L), X) == (2 * L + 2 + Y) * A
    # The nesting of a solver plan (jaxremat.apply_plan), whose checkpoint bodies end with a
    # plain layer: checkpoint(0..k) = [checkpoint(0..k-1), Layer(k)], depth L - 1. The
    # backward of level k owns x_0 and g_{k+1}: it recomputes x_1..x_k (JAX inlines the
    # inner checkpoint's forward), layer k with its tape, layer k's backward (g_{k+1} dies
    # there, at most 6 A), then level k-1's backward remat, owning x_0 and g_k. The deepest
    # level, [Layer(0), Layer(1)], holds x_0, g_2, x_1, layer 0's tape 1 - x_1 (made during
    # the recomputation) and layer 1's y, 1 - y and g_2 * (1 - y): 7 A at any depth, on both
    # backends (JAX 0.10; 6 A on 0.11+, whose tape 1 - y^2 replaces y: (6 + Y) A). The old
    # rule kept g_3..g_L on top: (L + 5) A.
    for backend in ("checkpoint", "custom_vjp"):
        assert activation_memory(_plan_loss(L, backend), weights(L), X) == (6 + Y) * A


def _plan_loss(L, backend):
    return _summed(lambda ws, x: apply_plan(nested_plan(L), [layer] * L, ws, x, backend=backend))


PROGRAMS = {
    "per_layer_checkpoint": (per_layer_checkpoint, 4),
    "segments": (lambda ws, x: segments(ws, x, 3), 9),
    "nested_prefix": (_summed(nested_prefix), 5),
    "nested_suffix": (_summed(nested_suffix), 5),
    "plan_checkpoint": (_plan_loss(5, "checkpoint"), 5),
    # custom_vjp_call inside (a custom_vjp closing over a traced weight, as an earlier entry
    # did, is not a valid program: JAX 0.11+ leaks the tracer into the jaxpr's constants)
    "plan_custom_vjp": (_plan_loss(5, "custom_vjp"), 5),
    "jit_layers": (lambda ws, x: jnp.sum(jax.jit(lambda ws, x: plain(ws, x) * x)(ws, x)), 3),
}


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_calls_measure_as_inlined(name):
    # The same gradient program with every call re-traced inline (no jit, remat2 or
    # custom_*_call left) measures the same, under each counting rule.
    fn, L = PROGRAMS[name]
    closed = jax.make_jaxpr(jax.grad(fn))(weights(L), X)
    assert any(e.primitive.name in _INLINED for e in all_eqns(closed.jaxpr))
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
