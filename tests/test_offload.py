"""Host offload as a layer option (issue 17, deliverable 4): the menu entries, the meter
counting host residuals off the device, the option's profile and cost model
(:mod:`jaxremat.measure.offload`), plans applied in both backends and the Flax wrapper with
plain gradients, and the path where the device has no host memory space."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

import jaxremat.measure.offload as offload
from jaxremat import activation_memory, remat_sequence
from jaxremat.jax_compat import host_memory_kind, in_host_memory
from jaxremat.measure.liveness import device_nbytes
from jaxremat.sequence.policies import (OFFLOAD_POLICIES, check_policies, layer_menu,
                                        offload_policy)
from jaxremat.sequence.profile import profile_sequence

from test_policies import assert_same_grads, loss_of, plain, stack

pytestmark = pytest.mark.skipif(host_memory_kind() is None,
                                reason="the default device has no pinned_host memory")


@pytest.fixture
def free_transfers(monkeypatch):
    """A bandwidth so high that transfers cost nothing: offload options then beat the
    others and the plan takes them."""
    monkeypatch.setattr(offload, "NOMINAL_HOST_BANDWIDTH", 1e18)


@pytest.fixture
def no_host(monkeypatch):
    """A device without a host memory space."""
    monkeypatch.setattr(offload, "host_memory_kind", lambda device=None: None)


# ------------------------------------------------------------------------ the menu


def test_offload_names_on_the_menu():
    assert check_policies(("offload_dots_no_batch", "save_and_offload_only_these_names")) == \
        OFFLOAD_POLICIES
    assert check_policies("offload_dot_with_no_batch_dims") == ("offload_dots_no_batch",)
    assert not set(OFFLOAD_POLICIES) & set(check_policies(None))  # not on the default menu
    menu = layer_menu(("dots", "offload_dots_no_batch", "offload_names"), ("a", "b"))
    assert [(o.name, o.offload) for o in menu] == [
        ("everything", False), ("dots", False), ("offload_dots_no_batch", True),
        ("offload_names:a,b", True), ("offload_names:a", True), ("offload_names:b", True)]
    with pytest.raises(ValueError, match="not an offload policy"):
        offload_policy("dots")


def test_unknown_policy_name_lists_offload_ones():
    layers, _, _ = stack()
    with pytest.raises(ValueError, match="Valid names.*'offload_dots_no_batch'.*'offload_names'"):
        remat_sequence(layers, "50%", policies=("offload_dots_no_batch", "offload_everything"))


# ------------------------------------------------------------------------ the meter


def _two_layers(policy):
    """A layer under ``policy`` whose named value ``h`` is its residual, then a layer with
    big transients while that residual is held."""

    def first(w, x):
        return jnp.sin(checkpoint_name(x @ w, "h"))

    def second(w, x):
        return jnp.sum(jnp.tanh(jnp.tile(x, (1, 4)) @ jnp.tile(w, (4, 4))))

    first = jax.checkpoint(first, policy=policy, prevent_cse=True)
    return lambda w, x: second(w, first(w, x))


def test_meter_counts_host_residuals_off_the_device():
    w, x = jnp.ones((64, 64)) / 64, jnp.ones((128, 64))
    policies = jax.checkpoint_policies
    saved = activation_memory(_two_layers(policies.save_only_these_names("h")), w, x)
    moved = activation_memory(_two_layers(offload_policy("offload_names", ("h",))), w, x)
    residual = 128 * 64 * 4
    assert moved == saved - residual
    forward = jax.make_jaxpr(lambda w, x: jax.vjp(_two_layers(
        offload_policy("offload_names", ("h",))), w, x))(w, x)
    host = [v.aval for v in jax.tree.leaves(forward.jaxpr.outvars) if in_host_memory(v.aval)]
    assert len(host) == 1 and device_nbytes(host[0]) == 0
    assert not in_host_memory(jax.core.ShapedArray((2,), jnp.float32))


# ------------------------------------------------------------------ profile and costs


def test_offload_option_profile():
    """The offloaded bytes leave the device tape and cost a positive transfer time,
    overlapped with the forward and the backward."""
    layers, params, x = stack()
    menu = ("dots_no_batch", "offload_dots_no_batch")
    profile = profile_sequence(layers[:2], params[:2], x, policies=menu, costs="flops")
    for layer in profile.layers:
        options = {o.name: o for o in layer.options}
        assert set(options) == set(menu), layer.dropped
        on_device, moved = options["dots_no_batch"], options["offload_dots_no_batch"]
        assert moved.host_bytes > 0 and on_device.host_bytes == 0
        assert moved.tape_bytes == on_device.tape_bytes - moved.host_bytes
        assert moved.transfer_time == pytest.approx(
            moved.host_bytes / offload.NOMINAL_HOST_BANDWIDTH)
        assert moved.fwd_time == max(layer.fwd_time, moved.transfer_time)
        assert moved.bwd_time >= moved.transfer_time > 0
        assert moved.fwd_tape_time <= moved.fwd_time
        # the copy back to the device is in the backward's transients
        assert moved.bwd_tmp >= on_device.bwd_tmp + moved.host_bytes - moved.tape_bytes
    names = profile_sequence(layers[:1], params[:1], x, policies=("offload_names",))
    (option,) = names.layers[0].options
    assert option.name == "offload_names:attn_out"
    assert option.host_bytes == int(np.prod(x.shape)) * 4 and option.transfer_time > 0


def test_offload_times_and_bandwidth():
    assert offload.offload_times(2.0, 1.0, 3.0, 100, 50.0) == (2.0, 2.0, 3.0, 2.0)
    assert offload.offload_times(2.0, 1.0, 3.0, 500, 50.0) == (10.0, 10.0, 10.0, 10.0)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        offload.offload_times(1.0, 1.0, 1.0, 1, 0.0)
    assert offload.host_bandwidth("static") == offload.NOMINAL_HOST_BANDWIDTH
    measured = offload.host_bandwidth("measured")
    assert measured > 0 and offload.host_bandwidth("measured") == measured  # cached


def test_host_memory_kind_reads_the_device_memories():
    def device(*kinds):
        return SimpleNamespace(platform="fake", id=0, addressable_memories=lambda: [
            SimpleNamespace(kind=k) for k in kinds])

    assert host_memory_kind(device("device", "pinned_host")) == "pinned_host"
    assert host_memory_kind(SimpleNamespace(platform="old")) is None  # no memories API
    assert host_memory_kind(device("device", "unpinned_host")) is None
    assert "no 'pinned_host' memory on fake device 0" in offload.offload_unavailable(
        device("device"))


# ------------------------------------------------------------------- plans, applied


def dense(p, x):
    """A layer whose tape is its matmul output (named ``z``) and its output."""
    return jnp.tanh(checkpoint_name(x @ p, "z"))


def dense_stack(n=6):
    ws = [jax.random.normal(jax.random.key(i), (32, 32)) / 6 for i in range(n)]
    return [dense] * n, ws, jax.random.normal(jax.random.key(n), (16, 32))


def summed(fn):
    return lambda params, x: jnp.sum(fn(params, x))


@pytest.mark.parametrize("backend", ["checkpoint", "custom_vjp"])
@pytest.mark.parametrize("policy", ["offload_dots_no_batch", "offload_names"])
def test_offload_plan_fits_with_plain_gradients(policy, backend, free_transfers):
    layers, params, x = dense_stack()
    seq = remat_sequence(layers, "55%", policies=(policy,), backend=backend, costs="flops")
    plan = seq.plan(params, x)
    assert sum(o.startswith(policy) for o in plan.options) >= 3, plan.options
    assert sum(plan.host_bytes) > 0
    assert [row["host_bytes"] for row in plan.rows()] == plan.host_bytes
    report = plan.report()
    assert "on host" in report and "host offload" in report
    measured = activation_memory(summed(seq), params, x)
    assert measured <= plan.predicted_peak <= plan.budget
    assert_same_grads(seq, plain(layers), params, x)


def test_offload_at_nominal_bandwidth_fits_with_plain_gradients():
    """At the nominal bandwidth these small layers' transfers cost more than recomputing:
    the plan may or may not offload, but it fits under the meter and its gradients are
    plain."""
    layers, params, x = dense_stack()
    seq = remat_sequence(layers, "55%", policies=("dots_no_batch", "offload_dots_no_batch"))
    plan = seq.plan(params, x)
    assert activation_memory(summed(seq), params, x) <= plan.predicted_peak <= plan.budget
    assert_same_grads(seq, plain(layers), params, x)


@pytest.mark.slow
def test_nnx_wrapper_offloads_with_plain_gradients(free_transfers):
    from flax import nnx

    from jaxremat.flax import RematSequential

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(16, 64, rngs=rngs)
            self.down = nnx.Linear(64, 16, rngs=rngs)

        def __call__(self, x):
            return x + self.down(jax.nn.gelu(self.up(x)))

    x = jax.random.normal(jax.random.key(1), (8, 16))
    remat = RematSequential(*[Block(nnx.Rngs(i)) for i in range(3)], budget="60%",
                            policies=("offload_dots_no_batch",), costs="flops")
    assert "offload_dots_no_batch" in remat.plan(x).options
    reference = nnx.Sequential(*[Block(nnx.Rngs(i)) for i in range(3)])
    loss = lambda model, x: jnp.sum(jnp.sin(model(x)))  # noqa: E731
    got, want = nnx.grad(loss)(remat, x), nnx.grad(loss)(reference, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.slow
def test_linen_wrapper_offloads_with_plain_gradients(free_transfers):
    import flax.linen as nn

    from jaxremat.flax.linen import RematSequential

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.Dense(16)(jax.nn.gelu(nn.Dense(64)(x)))

    x = jax.random.normal(jax.random.key(1), (8, 16))
    remat = RematSequential(layers=[Block(), Block(), Block()], budget="60%",
                            policies=("offload_dots_no_batch",), costs="flops")
    reference = nn.Sequential([Block(), Block(), Block()])
    variables = reference.init(jax.random.key(0), x)
    remat_vars = {"params": {f"layers_{i}": variables["params"][f"layers_{i}"] for i in range(3)}}
    assert "offload_dots_no_batch" in remat.apply(remat_vars, x, method="plan").options
    got = jax.grad(lambda v: jnp.sum(jnp.sin(remat.apply(v, x))))(remat_vars)
    want = jax.grad(lambda v: jnp.sum(jnp.sin(reference.apply(v, x))))(variables)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------- no host memory space


def test_no_host_memory_drops_offload_options(no_host):
    layers, params, x = dense_stack()
    seq = remat_sequence(layers, "55%", policies=("dots", "offload_dots_no_batch",
                                                  "offload_names"))
    plan = seq.plan(params, x)
    for layer in plan.layers:
        assert not any(o.name.startswith("offload") or o.host_bytes for o in layer.options)
        reasons = dict(layer.dropped)
        assert "no 'pinned_host' memory" in reasons["offload_dots_no_batch"]
        assert any(n.startswith("offload_names:") for n in reasons)
    assert "no 'pinned_host' memory" in plan.report()
    assert_same_grads(seq, plain(layers), params, x)


@pytest.mark.slow  # a subprocess run of the benchmark script
def test_offload_benchmark_runs():
    from test_benchmarks import _run

    out = _run("benchmarks/offload.py", "--fractions", "0.6")
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 60%")]
    assert [row[1] for row in rows] == ["default", "+ offload", "+ offload, 450 GB/s",
                                        "+ offload, free transfers"]
    free = rows[-1]
    assert "offload_dots_no_batch" in free[-1] and not free[4].startswith("0.00")

