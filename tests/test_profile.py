"""``profile_layers``: the chain's sizes are the bytes JAX keeps, its costs come from XLA.

Tapes are checked on layers whose residuals are known by hand, transients on a layer with a
large temporary, and the whole chain against the program-order meter: the chain simulator's
peak of a schedule equals :func:`jaxremat.activation_memory` of that schedule applied in JAX.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import solver
from jaxremat import activation_memory, profile_layers
from jaxremat.sequence.apply import apply_plan
from jaxremat.sequence.profile import PEAK_BANDWIDTH, PEAK_FLOPS, profile_sequence, roofline_time
from jaxremat.measure.costs import lowered_costs
from solver.chain.baselines import every_layer_plan, none_plan, sqrt_plan

B, D_IN, D_OUT = 8, 16, 32
F32 = 4


def _array(seed, shape, scale=0.5):
    rng = np.random.default_rng(seed)
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def linear(p, x):  # residuals: W (a parameter) and x (the input): the tape is the output
    return x @ p


def exp_layer(p, x):  # residual: exp(x), the output itself: the tape is the output
    return jnp.exp(x * p)


def sin_layer(p, x):  # residual: cos(x * p), a new value, plus the output
    return jnp.sin(x * p)


def test_tapes_follow_the_residual_rules():
    w = _array(0, (D_IN, D_OUT))
    x = _array(1, (B, D_IN))
    scale = jnp.float32(1.5)
    profile = profile_sequence([linear, exp_layer, sin_layer], [w, scale, scale], x)
    chain = profile.chain
    out = B * D_OUT * F32
    assert list(chain.x_size) == [B * D_IN * F32, out, out, out]
    assert list(chain.xbar_size) == [out, out, 2 * out]
    # a single matmul needs no temporary beyond its result; x * p is one for exp and sin
    assert list(chain.fwd_tmp) == [0, out, out]


def test_pytree_activations_count_every_leaf():
    def split(p, x):
        return {"h": jnp.tanh(x @ p), "count": jnp.zeros((B,), jnp.int32), "half": x.astype(jnp.float16)}

    def merge(p, xs):
        return xs["h"] * p + xs["half"].astype(jnp.float32).sum() + xs["count"][:, None]

    x = _array(2, (B, D_IN))
    chain = profile_layers([split, merge], [_array(3, (D_IN, D_IN)), jnp.float32(2.0)], x)
    pytree_bytes = B * D_IN * F32 + B * 4 + B * D_IN * 2
    assert chain.x_size[1] == pytree_bytes
    assert chain.x_size[2] == B * D_IN * F32


def test_transients_cover_a_large_temporary():
    k = 64

    def wide(p, x):  # an (B, D_IN, k) temporary that the backward does not keep
        big = jnp.sin(x[:, :, None] * jnp.ones((1, 1, k)))
        return x @ p + jax.lax.stop_gradient(jnp.sum(big, axis=-1))

    x = _array(4, (B, D_IN))
    w = _array(5, (D_IN, D_IN))
    chain = profile_layers([wide], [w], x, input_grad=False)
    assert chain.fwd_tmp[0] >= B * D_IN * k * F32
    plan = none_plan(1)
    predicted = solver.make_schedule(chain, plan).peak
    measured = activation_memory(lambda p, x: jnp.sum(apply_plan(plan, [wide], p, x)), [w], x)
    assert abs(measured - predicted) <= 0.1 * predicted


def test_static_costs_are_the_roofline_of_cost_analysis():
    w = _array(6, (D_IN, D_OUT))
    x = _array(7, (B, D_IN))
    (layer,) = profile_sequence([linear], [w], x).layers
    matmul = 2 * B * D_IN * D_OUT
    assert layer.fwd_flops == pytest.approx(matmul, rel=0.05)
    # the backward of x @ W is two matmuls of the same size (dW and dx)
    assert layer.bwd_flops == pytest.approx(2 * matmul, rel=0.05)
    analysis = lowered_costs(linear, w, x)  # XLA's on CPU; counted on the jaxpr on a GPU
    assert layer.fwd_time == roofline_time(analysis["flops"], analysis["bytes accessed"])
    assert layer.fwd_time == max(analysis["flops"] / PEAK_FLOPS,
                                 analysis["bytes accessed"] / PEAK_BANDWIDTH)
    # without the input's gradient (jax.grad with respect to parameters only) one matmul
    (first,) = profile_sequence([linear], [w], x, input_grad=False).layers
    assert first.bwd_flops == pytest.approx(matmul, rel=0.05)
    bigger = profile_sequence([linear], [_array(8, (D_IN, 4 * D_OUT))], x).layers[0]
    assert bigger.fwd_time > layer.fwd_time and bigger.bwd_time > layer.bwd_time


def _dense(p, x):
    return jnp.tanh(x @ p["w"] + p["b"])


def _layer_norm(p, x):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(jnp.var(x, axis=-1, keepdims=True) + 1e-5) * p


def _conv(p, x):
    y = jax.lax.conv_general_dilated(x, p, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.tanh(y)


def _attention(p, x):
    q, k, v = jnp.split(x @ p, 3, axis=-1)
    att = jax.nn.softmax(jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(q.shape[-1]), axis=-1)
    return x + jnp.einsum("bts,bsd->btd", att, v)


def _stacks():
    dense = [_dense] * 4, [{"w": _array(i, (a, b)), "b": _array(10 + i, (b,), 0.1)}
                           for i, (a, b) in enumerate([(16, 48), (48, 24), (24, 64), (64, 16)])]
    yield "dense", dense[0], dense[1], _array(20, (8, 16))
    norm = [_dense, _layer_norm, _dense, _layer_norm]
    yield "layernorm", norm, [{"w": _array(1, (16, 32)), "b": jnp.zeros(32)}, jnp.ones(32),
                              {"w": _array(2, (32, 32)), "b": jnp.zeros(32)}, jnp.ones(32)], _array(21, (8, 16))
    yield "conv", [_conv] * 3, [_array(i, (3, 3, c, d), 0.3) for i, (c, d) in
                                enumerate([(3, 8), (8, 8), (8, 4)])], _array(22, (2, 8, 8, 3))
    yield "attention", [_attention] * 3, [_array(i, (16, 48), 0.3) for i in range(3)], _array(23, (2, 8, 16))


@pytest.mark.parametrize("name, layers, params, x", list(_stacks()), ids=lambda v: v if isinstance(v, str) else "")
def test_simulated_peak_equals_the_meter(name, layers, params, x):
    """The chain's sizes are what the meter sees: exact for the dense stack, and otherwise
    never below the meter by more than 2% and within 15% of it. The chain is conservative
    where Rotor's model is: ``B(i)`` holds its inputs until ``g[i]`` exists and a layer's
    input until its backward ends, where JAX may free them earlier (the layer-norm stack's
    ``every_layer``, 0.885: JAX frees a layer norm's input after ``x - mean``). Outputs that
    a backward does not read (layer norm, attention with its residual add) are flagged
    (``output_in_tape``) and not held: before the flag the layer-norm stack measured 0.79
    of the prediction. The plans run under the ``custom_vjp`` backend, which recomputes a
    segment's last layer with its whole forward (``Chain.with_full_forwards``)."""
    chain = profile_layers(layers, params, x, input_grad=False).with_full_forwards()
    length = len(layers)
    for plan_name, plan in (("none", none_plan(length)), ("every_layer", every_layer_plan(length)),
                            ("sqrt", sqrt_plan(length))):
        predicted = solver.make_schedule(chain, plan).peak
        measured = activation_memory(
            lambda p, x: jnp.sum(apply_plan(plan, layers, p, x, backend="custom_vjp")), params, x)
        assert measured <= predicted * 1.02, (plan_name, measured, predicted)
        assert measured >= predicted * 0.85, (plan_name, measured, predicted)
        if name == "dense" or (name, plan_name) == ("attention", "every_layer"):
            assert measured == predicted


def test_abstract_traced_and_concrete_inputs_give_the_same_chain():
    layers = [_dense] * 3
    params = [{"w": _array(i, (16, 16)), "b": jnp.zeros(16)} for i in range(3)]
    x = _array(30, (4, 16))
    concrete = profile_layers(layers, params, x)
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (params, x))
    assert profile_layers(layers, *shapes) == concrete
    seen = []

    @jax.jit
    def traced(params, x):
        seen.append(profile_layers(layers, params, x))
        return x

    traced(params, x)
    assert seen == [concrete]


def test_identical_layers_are_profiled_once():
    calls = []

    def make_counted():  # a new function object: no JAX trace cache hit across cases
        def counted(p, x):
            calls.append(1)
            return jnp.tanh(x @ p)
        return counted

    params = [_array(i, (8, 8)) for i in range(12)]
    x = _array(40, (4, 8))
    profile_layers([make_counted()], params[:1], x)
    one = len(calls)
    calls.clear()
    chain = profile_layers([make_counted()] * 12, params, x, progress=False)
    assert len(calls) == one
    assert len(set(chain.xbar_size)) == 1 and chain.length == 12


def test_measured_costs_time_each_layer():
    layers = [_dense] * 2
    params = [{"w": _array(0, (32, 256)), "b": jnp.zeros(256)},
              {"w": _array(1, (256, 32)), "b": jnp.zeros(32)}]
    x = _array(2, (64, 32))
    static = profile_layers(layers, params, x)
    seen = []

    @jax.jit
    def traced(params, x):  # timing runs while jit traces (ensure_compile_time_eval)
        seen.append(profile_layers(layers, params, x, costs="measured", progress=False))
        return x

    traced(params, x)
    (measured,) = seen
    assert np.all(measured.fwd_time > 0) and np.all(measured.bwd_time > 0)
    # same sizes; on CPU the transients stay the static program-order ones
    assert np.array_equal(measured.x_size, static.x_size)
    assert np.array_equal(measured.xbar_size, static.xbar_size)
    if jax.devices()[0].platform == "cpu":
        assert np.array_equal(measured.fwd_tmp, static.fwd_tmp)
        assert np.array_equal(measured.bwd_tmp, static.bwd_tmp)


def test_profile_errors_name_the_layer():
    x = _array(0, (4, 8))
    w = _array(1, (8, 8))
    with pytest.raises(ValueError, match="2 entries but there are 3 layers"):
        profile_layers([linear] * 3, [w, w], x)
    with pytest.raises(TypeError, match=r"layers\[0\]"):
        profile_layers([3], [w], x)
    with pytest.raises(TypeError, match=r"params\[1\]"):
        profile_layers([linear, linear], [w, [w, "x"]], x)
    with pytest.raises((ValueError, TypeError), match="layer 2 failed .* output of layer 1"):
        profile_layers([linear, linear, linear], [w, _array(2, (8, 5)), w], x)
    with pytest.raises((ValueError, TypeError), match="layer 0 failed .* sequence input"):
        profile_layers([linear], [_array(3, (5, 8))], x)
    with pytest.raises(ValueError, match="costs"):
        profile_layers([linear], [w], x, costs="guess")


def test_output_in_tape_says_whether_the_backward_reads_the_output():
    flags = {name: profile_layers(layers, params, x).output_in_tape.tolist()
             for name, layers, params, x in _stacks()}
    # tanh's derivative reads its output on JAX 0.10 (tape y, 1 - y), not on 0.11+ (tape
    # one_minus_square(y)): the flag follows the program (test_output_in_tape_per_kind)
    assert flags["dense"] == [_dense_reads_output()] * 4
    assert flags["layernorm"][1::2] == [False, False]  # a norm keeps its statistics
    assert flags["attention"] == [False] * 3  # x + f(x): the add's backward reads nothing


def _layer_norm_kind(p, x):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * p


KINDS = {  # layer kind: (layer, whether its backward reads its output, or None: per version)
    "tanh": (lambda w, x: jnp.tanh(x @ w), None),
    "relu": (lambda w, x: jax.nn.relu(x @ w), False),
    "layer_norm": (_layer_norm_kind, False),
    "softmax": (lambda w, x: jax.nn.softmax(x @ w, axis=-1), False),  # keeps exp and its sum
    "exp": (lambda w, x: jnp.exp(x @ w), True),
    "matmul": (lambda w, x: x @ w, False),
    "residual": (lambda w, x: x + jax.nn.gelu(x @ w), False),
}


def _dense_reads_output():
    return _pullback_reads_output(_dense, {"w": _array(62, (D_IN, D_IN)), "b": jnp.zeros(D_IN)},
                                  _array(61, (B, D_IN)))


def _kind_args(layer):
    w = _array(60, (D_IN, D_IN)) if layer is not KINDS["layer_norm"][0] else _array(60, (D_IN,))
    return w, _array(61, (B, D_IN))


def _pullback_reads_output(layer, w, x):
    """Whether ``jax.vjp(layer)``'s pullback reads the output, found by running it: the
    residuals equal to the output are replaced by NaN, and the pullback reads the output iff
    its result turns NaN. Independent of how the profile decides (jaxpr variables)."""
    y, pullback = jax.vjp(layer, w, x)
    leaves, treedef = jax.tree.flatten(pullback)
    is_output = [isinstance(r, jax.Array) and r.shape == y.shape and r.dtype == y.dtype
                 and bool(jnp.array_equal(r, y)) for r in leaves]
    poisoned = [jnp.full_like(r, jnp.nan) if hit else r for r, hit in zip(leaves, is_output)]
    grads = jax.tree.unflatten(treedef, poisoned)(jnp.ones_like(y))
    return any(hit for hit in is_output) and any(
        bool(jnp.isnan(g).any()) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("kind", list(KINDS))
def test_output_in_tape_per_kind(kind):
    """``output_in_tape`` is what the pullback actually reads, on every JAX version, and
    with it the chain's predicted peaks bound what the meter measures: equal where Rotor's
    model is exact, above it where JAX frees sooner than the model (a norm's input after
    ``x - mean``; a residual block's residuals before ``g[i]`` exists)."""
    layer, expected = KINDS[kind]
    w, x = _kind_args(layer)
    chain = profile_layers([layer] * 4, [w] * 4, x)
    reads = _pullback_reads_output(layer, w, x)
    if expected is not None:
        assert reads == expected
    assert chain.output_in_tape.tolist() == [reads] * 4
    for plan in (none_plan(4), every_layer_plan(4), sqrt_plan(4)):
        predicted = solver.make_schedule(chain, plan).peak
        measured = activation_memory(lambda ws, x: jnp.sum(apply_plan(plan, [layer] * 4, ws, x)),
                                     [w] * 4, x)
        assert measured <= predicted, (plan, measured, predicted)
        if kind not in ("layer_norm", "residual"):
            assert measured == predicted, (plan, measured, predicted)


ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu",
                            reason="compares with Lowered.cost_analysis(), which only the CPU gives")


@ON_CPU
def test_static_costs_fall_back_to_the_jaxpr_count(monkeypatch):
    # What a GPU backend does (JAX 0.11, H100): the lowering gives no cost analysis.
    from jax._src import stages

    from jaxremat.measure import costs
    from jaxremat.sequence.profile import profile_cache

    w = _array(11, (D_IN, D_OUT))
    x = _array(12, (B, D_IN))
    expected = profile_sequence([linear], [w], x).layers[0]
    assert costs.LAST_SOURCE == "lowered"
    calls = []
    monkeypatch.setattr(stages.Lowered, "cost_analysis", lambda self: calls.append(self))
    profile_cache().clear()  # profiles are cached across calls
    layer = profile_sequence([linear], [w], x).layers[0]
    assert calls and costs.LAST_SOURCE == "jaxpr"  # the patched analysis ran: nothing cached
    assert layer.fwd_time > 0
    assert layer.fwd_flops == pytest.approx(expected.fwd_flops, rel=0.05)
    assert layer.bwd_flops == pytest.approx(expected.bwd_flops, rel=0.05)


@ON_CPU
def test_jaxpr_costs_count_recomputation_like_xla():
    from jaxremat.measure import costs

    w1, w2 = _array(13, (D_IN, D_IN)), _array(14, (D_IN, D_IN))
    x = _array(15, (B, D_IN))
    block = lambda w, h: jnp.tanh(h @ w)  # noqa: E731
    saved = jax.checkpoint(block)
    plain = lambda ws, x: jnp.sum(block(ws[1], block(ws[0], x)))  # noqa: E731
    remat = lambda ws, x: jnp.sum(saved(ws[1], saved(ws[0], x)))  # noqa: E731
    counts = {}
    for name, fn in (("plain", plain), ("remat", remat)):
        counts[name] = costs.jaxpr_costs(jax.grad(fn), (w1, w2), x)["flops"]
        xla = jax.jit(jax.grad(fn)).lower((w1, w2), x).cost_analysis()["flops"]
        assert counts[name] == pytest.approx(xla, rel=0.1)
    # the first block's matmul runs again in the backward (the second's forward is only
    # recomputed: its first run feeds nothing the gradient needs and is dead code)
    assert counts["remat"] - counts["plain"] == pytest.approx(2 * B * D_IN * D_IN, rel=0.1)


def _residual_mlp(p, x):  # x + W2 gelu(W1 x): the backward reads neither the output nor W2 x
    return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]


def test_tape_forward_leaves_out_what_only_the_output_needs():
    w1, w2 = _array(30, (D_IN, 4 * D_IN)), _array(31, (4 * D_IN, D_IN))
    (layer,) = profile_sequence([_residual_mlp], [{"w1": w1, "w2": w2}], _array(32, (B, D_IN))).layers
    second_matmul = 2 * B * 4 * D_IN * D_IN
    assert not layer.output_in_tape
    # (the vjp forward also computes gelu's derivative, which the plain forward does not)
    assert layer.fwd_flops - layer.fwd_tape_flops == pytest.approx(second_matmul, rel=0.15)
    assert layer.fwd_tape_time <= layer.fwd_time  # (this small layer is bandwidth-bound)
    (dense,) = profile_sequence([_dense], [{"w": w1, "b": jnp.zeros(4 * D_IN)}],
                                _array(32, (B, D_IN))).layers
    # the tape-only forward of tanh(x @ w + b) is the whole forward when the backward reads
    # the output (JAX 0.10) and also when it reads 1 - y**2 instead (0.11+): either needs y
    assert dense.output_in_tape == _dense_reads_output()
    assert dense.fwd_tape_flops == pytest.approx(dense.fwd_flops, rel=0.05)


def _flop_stacks():
    mlp = [{"w1": _array(40 + i, (D_IN, 4 * D_IN)), "w2": _array(50 + i, (4 * D_IN, D_IN))}
           for i in range(6)]
    yield "residual_mlp", [_residual_mlp] * 6, mlp, _array(33, (B, D_IN))
    yield from ((name, *rest) for name, *rest in _stacks() if name in ("dense", "attention"))


@pytest.mark.parametrize("name, layers, params, x", list(_flop_stacks()),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_simulated_flops_equal_the_jaxpr_count_of_every_plan(name, layers, params, x):
    """With flop counts as times, the simulator's time of a plan is the gradient's flops
    (``jaxpr_costs`` of ``value_and_grad``: with ``grad`` alone the last layers' primal
    outputs are dead code). The last layer of each recomputed segment costs its tape-only
    forward: charged the whole forward, every_layer on the residual MLP stack was predicted
    at 1.19 of its measured flops."""
    from jaxremat.measure.costs import jaxpr_costs

    # grad of params only; one option per layer (tests/test_policies.py covers options)
    profile = profile_sequence(layers, params, x, input_grad=False, policies=())
    flops = dataclasses.replace(
        profile.chain, fwd_time=[p.fwd_flops for p in profile.layers],
        bwd_time=[p.bwd_flops for p in profile.layers],
        fwd_tape_time=[p.fwd_tape_flops for p in profile.layers])
    length = len(layers)
    plans = {"none": none_plan(length), "every_layer": every_layer_plan(length),
             "sqrt": sqrt_plan(length)}
    low, high = solver.rotor_min_budget(flops), solver.make_schedule(flops, plans["none"]).peak
    for share in (0.0, 0.5):
        plans[f"rotor {share}"] = solver.solve(flops, low + share * (high - low)).plan
    predicted, measured = {}, {}
    for plan_name, plan in plans.items():
        predicted[plan_name] = solver.make_schedule(flops, plan).time
        loss = lambda p, x: jnp.sum(apply_plan(plan, layers, p, x))  # noqa: E731
        measured[plan_name] = jaxpr_costs(jax.value_and_grad(loss), params, x)["flops"]
    for plan_name in plans:
        assert measured[plan_name] == pytest.approx(predicted[plan_name], rel=0.05)
        # the recomputation itself, the difference from the plain step, within 2% of that
        # step (a vjp forward also computes derivative factors, e.g. gelu's, which a plain
        # forward does not: the chain's one forward time cannot say which one runs)
        extra = measured[plan_name] - measured["none"]
        assert extra == pytest.approx(predicted[plan_name] - predicted["none"],
                                      abs=0.02 * measured["none"]), (plan_name, measured, predicted)


def test_flop_costs_plan_the_least_recomputed_flops():
    """``costs="flops"`` times are ``flops / PEAK_FLOPS``; planning with them, Rotor's plan
    measures no more flops than every-layer or sqrt checkpointing at the same budget
    (the static roofline is bandwidth-bound at this width and need not)."""
    from jaxremat import remat_sequence
    from jaxremat.measure.costs import jaxpr_costs

    layers, params, x = next(_flop_stacks())[1:]
    chain = profile_layers(layers, params, x, costs="flops")
    (first, *_), = [profile_sequence(layers, params, x, costs="flops").layers]
    assert chain.fwd_time[0] == first.fwd_flops / PEAK_FLOPS
    assert chain.fwd_tape_time[0] == first.fwd_tape_flops / PEAK_FLOPS
    assert chain.bwd_time[0] == first.bwd_flops / PEAK_FLOPS
    measured = {}
    for method in ("every_layer", "sqrt"):
        seq = remat_sequence(layers, 10**9, method=method)
        budget = int(seq.plan(params, x).predicted_peak)
        rotor = remat_sequence(layers, budget, costs="flops")
        for name, run in ((method, seq), ("rotor", rotor)):
            loss = lambda p, x: jnp.sum(run(p, x))  # noqa: E731
            measured[name] = jaxpr_costs(jax.value_and_grad(loss), params, x)["flops"]
        assert measured["rotor"] <= measured[method] * 1.01, (method, measured)


def test_key_bytes_are_counted_only_by_plans_that_wrap_a_layer():
    """``solve_plan(key_bytes=)`` (Linen's RNG keys held by recomputed segments): the plain
    sequence at its own peak is still planned without remat and without the keys; a
    tighter budget gets a plan whose peak with the keys fits; the least budget named for a
    budget too small includes them."""
    from jaxremat.sequence.plan import recomputes, solve_plan

    layers = [_dense] * 4
    params = [{"w": _array(i, (16, 16)), "b": _array(i + 9, (16,))} for i in range(4)]
    profile = profile_sequence(layers, params, _array(20, (8, 16)), policies=())
    settings = dict(method="rotor", slots=500, backend="checkpoint")
    plain = solve_plan(profile, "100%", **settings, key_bytes=64)
    assert not recomputes(plain.schedule.plan) and plain.predicted_peak == plain.no_remat_peak
    with pytest.raises(solver.InfeasibleBudget) as error:
        solve_plan(profile, 1, **settings)
    least = error.value.min_budget
    with pytest.raises(solver.InfeasibleBudget) as error:
        solve_plan(profile, 1, **settings, key_bytes=64)
    assert error.value.min_budget == least + 64
    tight = solve_plan(profile, int(least) + 64, **settings, key_bytes=64)
    assert recomputes(tight.schedule.plan)
    assert tight.predicted_peak == tight.schedule.peak + 64 <= tight.budget
    with pytest.raises(solver.InfeasibleBudget):
        solve_plan(profile, int(least) + 63, **settings, key_bytes=64)
