"""``remat_sequence``: memory predicted versus measured, flops, caching, vmap, errors, plans.

Memory is measured with the program-order meter :func:`jaxremat.activation_memory` (on CPU
XLA undoes remat, ALGORITHMS.md section 7) and flops with ``Lowered.cost_analysis()`` of
the jitted gradient (taken before XLA removes recomputation).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import solver
from jaxremat import Plan, RematSequence, activation_memory, remat_sequence
from jaxremat.measure.costs import lowered_costs

WIDTHS = [32, 64, 48, 96, 32, 64, 80, 32, 64, 48, 96, 32, 64, 80, 32, 64, 32]


def dense(p, x):
    """Two tanh layers through a 3x wider hidden layer: tapes much larger than outputs."""
    h = jnp.tanh(x @ p["w1"])
    return jnp.tanh(h @ p["w2"] + p["b"])


def _array(rng, shape, scale):
    return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)


def dense_stack(widths=WIDTHS, batch=32, seed=0):
    """Blocks of changing widths (numpy data: eager jax.random would compile kernels)."""
    rng = np.random.default_rng(seed)
    params = [{"w1": _array(rng, (a, 3 * a), a**-0.5), "w2": _array(rng, (3 * a, b), (3 * a)**-0.5),
               "b": _array(rng, (b,), 0.1)} for a, b in zip(widths[:-1], widths[1:])]
    x = _array(rng, (batch, widths[0]), 1.0)
    return [dense] * (len(widths) - 1), params, x


def plain(layers, params, x):
    for layer, p in zip(layers, params):
        x = layer(p, x)
    return x


def mid_budget(layers, params, x):
    """Half-way between the least budget any schedule needs and storing everything."""
    with pytest.raises(solver.InfeasibleBudget) as info:
        remat_sequence(layers, 1).plan(params, x)
    high = remat_sequence(layers, 10**15, method="none").plan(params, x).predicted_peak
    return int((info.value.min_budget + high) / 2)


def grad_flops(loss, params, x):
    return lowered_costs(jax.grad(loss), params, x)["flops"]


def sum_loss(run):
    return lambda p, x: jnp.sum(run(p, x))


# ------------------------------------------------------------------------- memory, flops


# A sweep of 4 budgets x 4 methods: by default one backend on 8 layers (rotor's least budget
# 0.34 of the plain step's memory), in the slow tier the other on all 16 (least 0.17).
@pytest.mark.parametrize("backend, depth, fractions", [
    ("checkpoint", 8, (0.35, 0.45, 0.6, 0.8)),
    pytest.param("custom_vjp", 16, (0.2, 0.35, 0.5, 0.75), marks=pytest.mark.slow)])
def test_predicted_peak_matches_meter_and_flops_fall_with_budget(backend, depth, fractions):
    layers, params, x = dense_stack(WIDTHS[:depth + 1])
    plain_loss = sum_loss(lambda p, x: plain(layers, p, x))
    full = activation_memory(plain_loss, params, x)
    base_flops = grad_flops(plain_loss, params, x)
    rotor_flops, compared = {}, 0
    for fraction in fractions:
        budget = int(fraction * full)
        flops = {}
        for method in ("rotor", "sqrt", "every_layer", "revolve"):
            seq = remat_sequence(layers, budget, method=method, backend=backend)
            try:
                plan = seq.plan(params, x)
            except solver.InfeasibleBudget as error:
                assert error.min_budget > budget
                continue
            assert plan.predicted_peak <= budget
            loss = sum_loss(seq)
            measured = activation_memory(loss, params, x)
            assert abs(measured - plan.predicted_peak) <= 0.1 * plan.predicted_peak, (
                method, fraction, measured, plan.predicted_peak)
            assert measured <= 1.1 * budget
            flops[method] = grad_flops(loss, params, x)
        assert "rotor" in flops, f"rotor infeasible at {fraction}"
        assert "revolve" in flops, f"revolve infeasible at {fraction}"  # nested checkpoints
        for method in ("sqrt", "every_layer"):
            if method in flops:
                assert flops["rotor"] <= flops[method] * (1 + 1e-9), (fraction, flops)
                compared += 1
        rotor_flops[fraction] = flops["rotor"]
    ordered = [rotor_flops[f] for f in sorted(rotor_flops)]
    assert all(a >= b for a, b in zip(ordered, ordered[1:])), rotor_flops
    assert ordered[0] > ordered[-1] > base_flops
    assert len(rotor_flops) == 4 and compared >= 4


def test_every_feasible_budget_fits_and_the_least_one_is_exact():
    layers, params, x = dense_stack(WIDTHS[:9])
    with pytest.raises(solver.InfeasibleBudget) as info:
        remat_sequence(layers, 1000).plan(params, x)
    least = int(np.ceil(info.value.min_budget))
    message = str(info.value)
    assert f"{least} bytes" in message and "KiB)" in message and "1000 bytes" in message
    plan = remat_sequence(layers, least).plan(params, x)
    assert plan.predicted_peak <= least
    with pytest.raises(solver.InfeasibleBudget):
        remat_sequence(layers, least - 64).plan(params, x)


# ------------------------------------------------------------------------------- caching


def test_schedule_is_cached_per_input_signature():
    layers, params, x = dense_stack(WIDTHS[:7])
    seq = remat_sequence(layers, "2MiB")
    step = jax.jit(jax.grad(sum_loss(seq)))
    step(params, x)
    assert seq.profile_count == 1
    step(params, 2 * x)  # same signature, jit cache
    jax.make_jaxpr(jax.grad(sum_loss(seq)))(params, x + 1)  # new traces, same signature
    jax.make_jaxpr(jax.value_and_grad(sum_loss(seq)))(params, x)
    seq.plan(params, x)
    assert seq.profile_count == 1
    seq.plan(params, x[:16])  # a new batch size: profiled and solved again
    assert seq.profile_count == 2
    assert seq.plan(params, x[:16]) is seq.plan(params, x[:16])
    # differentiating the input too: the first layer's backward now computes g[0]
    jax.make_jaxpr(jax.grad(sum_loss(seq), argnums=(0, 1)))(params, x)
    assert seq.profile_count == 3
    by_grad = {plan.input_grad: plan for plan in seq.cached_plans if plan.chain.x_size[0] == x.nbytes}
    assert by_grad[True].layers[0].bwd_flops > by_grad[False].layers[0].bwd_flops
    assert by_grad[True].layers[1:] == by_grad[False].layers[1:]
    seq.cache_clear()
    seq.plan(params, x)
    assert seq.profile_count == 4


# --------------------------------------------------------------------------------- vmap


def test_budget_under_vmap_refers_to_the_whole_batch():
    layers, params, x = dense_stack(WIDTHS[:6], batch=4)
    examples = jnp.stack([x, -x, 0.5 * x])  # a vmap batch of 3 sequences inputs
    budget = 3 * mid_budget(layers, params, x)
    seq = remat_sequence(layers, budget)
    # under the vmap the menu has no searched options (their policies are keyed by shapes)
    single = remat_sequence(layers, budget // 3,
                            policies=("dots", "dots_no_batch", "names")).plan(params, x)
    loss = lambda p, xs: jnp.sum(jax.vmap(lambda x: jnp.sum(seq(p, x)))(xs))
    plain_loss = lambda p, xs: jnp.sum(jax.vmap(lambda x: jnp.sum(plain(layers, p, x)))(xs))
    grads, want = jax.jit(lambda p, xs: (jax.grad(loss)(p, xs), jax.grad(plain_loss)(p, xs)))(
        params, examples)
    (plan,) = seq.cached_plans
    assert plan.batch_size == 3
    assert plan.schedule.plan == single.schedule.plan
    assert plan.predicted_peak <= budget
    assert max(plan.forward_counts) >= 2
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    measured = activation_memory(loss, params, examples)
    assert measured <= 1.1 * budget


# ------------------------------------------------------------------------------- errors


def test_errors_name_the_problem():
    layers, params, x = dense_stack(WIDTHS[:4])
    with pytest.raises(TypeError, match=r"layers\[1\]"):
        remat_sequence([dense, "not a layer", dense], 10**9)
    with pytest.raises(TypeError, match="sequence of functions"):
        remat_sequence(dense, 10**9)
    with pytest.raises(ValueError, match="empty"):
        remat_sequence([], 10**9)
    for bad in (0, -5, float("nan"), "lots", "12 parsecs"):
        with pytest.raises((ValueError, TypeError)):
            remat_sequence(layers, bad)
    with pytest.raises(ValueError, match="method"):
        remat_sequence(layers, 10**9, method="magic")
    with pytest.raises(ValueError, match="non-persistent.*solver.solve"):
        remat_sequence(layers, 10**9, method="ilp")  # an oracle, not something to apply
    with pytest.raises(ValueError, match="backend"):
        remat_sequence(layers, 10**9, backend="scan")
    with pytest.raises(ValueError, match="costs"):
        remat_sequence(layers, 10**9, costs="guess")
    seq = remat_sequence(layers, 10**9)
    with pytest.raises(ValueError, match="2 entries but there are 3 layers"):
        seq(params[:2], x)
    with pytest.raises(TypeError, match="sequence"):
        seq({"a": params[0]}, x)
    with pytest.raises(TypeError, match=r"params\[1\]"):
        seq([params[0], dict(params[1], b=0.5), params[2]], x)
    with pytest.raises(TypeError, match="input x"):
        seq(params, [x, "text"])
    swapped = [params[0], params[2], params[1]]  # layer 1 gets a weight of the wrong shape
    with pytest.raises((ValueError, TypeError), match="layer 1 failed"):
        seq(swapped, x)


def test_mismatched_layer_outputs_name_the_layer():
    layers, params, x = dense_stack(WIDTHS[:5])
    to_pair = lambda p, h: (h, h)  # noqa: E731 - the next layer expects an array
    with pytest.raises((ValueError, TypeError), match="layer 2 failed .* output of layer 1"):
        remat_sequence([layers[0], to_pair, layers[1]], 10**9)(
            [params[0], None, params[1]], x)


# -------------------------------------------------------------------------------- plans


def test_plan_report_and_table():
    layers, params, x = dense_stack(WIDTHS[:9])
    least = remat_sequence(layers, 10**12, method="none").plan(params, x).predicted_peak
    seq = remat_sequence(layers, mid_budget(layers, params, x))
    plan = seq.plan(params, x)
    assert isinstance(plan, Plan) and isinstance(seq, RematSequence)
    assert plan.predicted_peak == plan.schedule.peak <= plan.budget
    assert plan.predicted_time >= plan.no_remat_time
    assert plan.no_remat_peak == least
    chain = plan.chain
    rows = plan.rows()
    assert [r["layer"] for r in rows] == list(range(len(layers)))
    assert [r["input_bytes"] for r in rows] == list(chain.x_size[:-1])
    assert [r["tape_bytes"] for r in rows] == list(chain.xbar_size)
    assert [r["forwards"] for r in rows] == plan.schedule.forward_counts(len(layers))
    for row in rows:
        assert row["decision"].startswith("store tape") == (row["forwards"] == 1)
        if row["forwards"] > 1:
            assert f"recompute x{row['forwards'] - 1}" in row["decision"]
    text = str(plan)
    assert text == plan.report()
    assert "predicted peak" in text and "budget" in text
    assert len(text.splitlines()) >= len(layers) + 5
    assert any("recompute" in line for line in text.splitlines())


def test_plan_plot_delegates_to_jaxremat_plot(tmp_path):
    pytest.importorskip("matplotlib")
    layers, params, x = dense_stack(WIDTHS[:6])
    plan = remat_sequence(layers, mid_budget(layers, params, x)).plan(params, x)
    path = tmp_path / "plan.png"
    plan.plot(path)
    assert path.exists() and path.stat().st_size > 0


# ------------------------------------------------------------------------------ sharding

_SHARDED = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import solver
    from jaxremat import remat_sequence
    assert len(jax.devices()) == 4, jax.devices()
    def dense(p, x):
        return jnp.tanh(x @ p["w"] + p["b"])
    rng = np.random.default_rng(0)
    widths = [16, 32, 24, 32, 16, 8]
    params = [{"w": jnp.asarray(rng.standard_normal((a, b)) / 4, jnp.float32),
               "b": jnp.zeros(b)} for a, b in zip(widths[:-1], widths[1:])]
    x = jnp.asarray(rng.standard_normal((32, 16)), jnp.float32)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    ps = jax.device_put(params, NamedSharding(mesh, P()))
    layers = [dense] * 5
    none = remat_sequence(layers, 10**9, method="none").plan(params, x).predicted_peak
    try:  # a tenth of the way from the least budget: a plan that recomputes on every JAX
        remat_sequence(layers, 1).plan(params, x)
    except solver.InfeasibleBudget as error:
        least = int(np.ceil(error.min_budget))
    for backend in ("checkpoint", "custom_vjp"):
        seq = remat_sequence(layers, least + (none - least) // 10, backend=backend)
        assert max(seq.plan(params, x).forward_counts) >= 2
        def loss(p, x, f):
            return jnp.sum(f(p, x) ** 2)
        got = jax.jit(jax.grad(lambda p, x: loss(p, x, seq)))(ps, xs)
        def plain(p, x):
            for q in p:
                x = dense(q, x)
            return x
        want = jax.jit(jax.grad(lambda p, x: loss(p, x, plain)))(params, x)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        assert seq.profile_count == 1
    print("SHARDED OK")
""")


@pytest.mark.slow  # a subprocess with 4 host devices
def test_sharded_inputs_on_four_host_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "-c", _SHARDED], env=env, cwd=root,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SHARDED OK" in result.stdout
