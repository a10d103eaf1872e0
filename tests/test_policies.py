"""Checkpoint-policy options per layer (issue 17): the menu, the profile of each option, and
applying ``Layer(i, option=k)``; gradients equal plain autodiff for every option."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

import solver
from jaxremat import activation_memory, remat_sequence
from jaxremat.sequence.apply import apply_plan
from jaxremat.sequence.plan import chosen_options
from jaxremat.sequence.policies import DEFAULT_POLICIES, check_policies, layer_menu, marked_names
from jaxremat.sequence.profile import profile_sequence
from solver import Checkpoint, Layer

D, T, B = 16, 8, 2


def mlp_block(p, x):
    """Pre-norm residual MLP with two marked values."""
    h = x - jnp.mean(x, axis=-1, keepdims=True)
    h = checkpoint_name(jax.nn.gelu(h @ p["w1"]), "mlp_hidden")
    return x + checkpoint_name(h @ p["w2"], "mlp_out")


def attention_block(p, x):
    """Causal self-attention (batched dots: the scores) with a residual."""
    q, k, v = jnp.split(x @ p["qkv"], 3, axis=-1)
    scores = jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(D)
    scores = jnp.where(jnp.tril(jnp.ones((T, T), bool)), scores, -1e9)
    out = jnp.einsum("bts,bsd->btd", jax.nn.softmax(scores, axis=-1), v)
    return x + jnp.tanh(checkpoint_name(out, "attn_out") @ p["o"])


def init(seed=0):
    keys = jax.random.split(jax.random.key(seed), 5)
    mlp = {"w1": jax.random.normal(keys[0], (D, 4 * D)) / 4, "w2": jax.random.normal(keys[1], (4 * D, D)) / 8}
    attn = {"qkv": jax.random.normal(keys[2], (D, 3 * D)) / 4, "o": jax.random.normal(keys[3], (D, D)) / 4}
    x = jax.random.normal(keys[4], (B, T, D))
    return mlp, attn, x


def stack():
    mlp, attn, x = init()
    layers = [attention_block, mlp_block, attention_block, mlp_block]
    params = [attn, mlp, dict(attn), dict(mlp)]
    return layers, params, x


def loss_of(fn):
    return lambda params, x: jnp.sum(jnp.sin(fn(params, x)))


def plain(layers):
    def run(params, x):
        for layer, p in zip(layers, params):
            x = layer(p, x)
        return x
    return run


def grads_of(fn, params, x):
    return jax.grad(loss_of(fn), argnums=(0, 1))(params, x)


def assert_same_grads(fn, reference, params, x, want=None):
    """``fn``'s gradients equal ``reference``'s (or ``want``: those, computed once)."""
    got = grads_of(fn, params, x)
    want = grads_of(reference, params, x) if want is None else want
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


# --------------------------------------------------------------------------- the menu


def test_check_policies_names_and_defaults():
    assert check_policies(None) == DEFAULT_POLICIES
    assert check_policies(()) == ()
    assert check_policies("dots") == ("dots",)
    assert check_policies(["dots_saveable", "dots", "everything_saveable"]) == ("dots",)
    policy = jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    assert check_policies(("names", policy)) == ("names", policy)


def test_unknown_policy_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown policy name 'dot'.*'dots_no_batch'"):
        check_policies(["dot"])
    with pytest.raises(ValueError, match="not an option.*checkpoint"):
        check_policies(["nothing_saveable"])
    with pytest.raises(TypeError, match="policy name or a callable"):
        check_policies([3])
    layers, params, x = stack()
    with pytest.raises(ValueError, match="Valid names"):
        remat_sequence(layers, "50%", policies=("dots", "bogus"))


def test_marked_names_in_program_order_and_nested():
    mlp, attn, x = init()
    assert marked_names(mlp_block, mlp, x) == ("mlp_hidden", "mlp_out")
    nested = jax.jit(lambda p, x: attention_block(p, x))
    assert marked_names(nested, attn, x) == ("attn_out",)
    names = [o.name for o in layer_menu(DEFAULT_POLICIES, ("a", "b"))]
    assert names == ["everything", "dots", "dots_no_batch", "names:a,b", "names:a", "names:b"]
    assert [o.name for o in layer_menu(("names",), ())] == ["everything"]


# ------------------------------------------------------------------------ the profile


def test_profile_options_smaller_tapes_dearer_backward():
    layers, params, x = stack()
    profile = profile_sequence(layers, params, x)
    for layer in profile.layers:
        assert layer.options, layer.dropped
        for option in layer.options:
            assert option.tape_bytes < layer.tape_bytes
            assert option.fwd_time == layer.fwd_time
            assert option.fwd_tape_time <= layer.fwd_time
        names = layer.option_names
        assert names[0] == "everything" and len(set(names)) == len(names)
    # dots and dots_no_batch keep the same values in the MLP (no batched dot): merged
    mlp = profile.layers[1]
    assert "dots_no_batch" not in mlp.option_names
    assert any(name == "dots_no_batch" for name, _ in mlp.dropped)
    # the attention block's scores are a batched dot: the two dot policies differ
    attn = dict((o.name, o) for o in profile.layers[0].options)
    assert attn["dots_no_batch"].tape_bytes < attn["dots"].tape_bytes
    # () restores the single-option profile, field for field
    bare = profile_sequence(layers, params, x, policies=())
    assert all(not layer.options for layer in bare.layers)
    np.testing.assert_array_equal(bare.chain.xbar_size, profile.chain.xbar_size)
    np.testing.assert_array_equal(bare.chain.bwd_time, profile.chain.bwd_time)


@pytest.mark.parametrize("block", [mlp_block, attention_block])
def test_options_share_the_layers_forward_costs(block, monkeypatch):
    # Options take the layer's plain forward costs, lowered once (sequence/layer.py:
    # forward_costs): exact, as an undifferentiated jax.checkpoint lowers to the layer's ops.
    import dataclasses

    from jaxremat.sequence import layer as layer_module

    mlp, attn, x = init()
    p = mlp if block is mlp_block else attn
    base = layer_module.forward_costs(block, p, x)
    menu = layer_menu(DEFAULT_POLICIES, marked_names(block, p, x))[1:]
    assert len(menu) >= 3
    for option in menu:
        saved = jax.checkpoint(block, policy=option.policy, prevent_cse=True)
        assert layer_module.forward_costs(saved, p, x) == base, option.name

    def numbers(profile):  # the profile without the policy functions (new objects per call)
        return [dataclasses.replace(layer, options=tuple(
            dataclasses.replace(o, policy=None) for o in layer.options)) for layer in profile.layers]

    # the profile is the one made when each option lowers its own forward
    shared = numbers(profile_sequence([block], [p], x))
    lowered = []
    original = layer_module.layer_costs

    def unshared(*args, forward=None, **kwargs):
        lowered.append(1)
        return original(*args, **kwargs)
    monkeypatch.setattr(layer_module, "layer_costs", unshared)
    from jaxremat.sequence import options as options_module, profile as profile_module
    monkeypatch.setattr(options_module, "layer_costs", unshared)
    monkeypatch.setattr(profile_module, "layer_costs", unshared)
    profile_module.profile_cache().clear()
    assert numbers(profile_sequence([block], [p], x)) == shared and len(lowered) > 1


def test_option_peak_is_what_the_meter_sees():
    """Every option stored on every layer: the simulator's peak with the option's sizes is
    the meter's (program order) peak of the applied plan, within the profile's tolerance."""
    layers, params, x = stack()
    profile = profile_sequence(layers, params, x)
    policies = tuple((None,) + tuple(o.policy for o in layer.options) for layer in profile.layers)
    for option in range(1, max(len(p) for p in policies)):
        chosen = [min(option, len(p) - 1) for p in policies]
        plan = tuple(Layer(i, k) for i, k in enumerate(chosen))
        predicted = solver.make_schedule(profile.chain, plan).peak
        measured = activation_memory(
            loss_of(lambda ps, x: apply_plan(plan, layers, ps, x, policies=policies)), params, x)
        assert 0.85 * predicted <= measured <= predicted * 1.02, (chosen, measured, predicted)


def test_rejected_policy_is_dropped_and_reported():
    def refuses(prim, *args, **params):
        raise ValueError("this policy refuses")

    def saves_nothing(prim, *args, **params):
        return False

    layers, params, x = stack()
    seq = remat_sequence(layers[:2], "90%", policies=("dots", refuses, saves_nothing))
    plan = seq.plan(params[:2], x)
    for layer in plan.layers:
        reasons = dict(layer.dropped)
        assert reasons["refuses"].startswith("rejected: ValueError: this policy refuses")
        assert "refuses" not in layer.option_names and "saves_nothing" in layer.option_names
    assert "option 'refuses' dropped on layers 0-1: rejected" in plan.report()


# --------------------------------------------------------------------------- applying


@pytest.mark.parametrize("backend", ["checkpoint", "custom_vjp"])
def test_every_option_applied_gives_plain_gradients(backend):
    layers, params, x = stack()
    profile = profile_sequence(layers, params, x)
    policies = tuple((None,) + tuple(o.policy for o in layer.options) for layer in profile.layers)
    most = max(len(p) for p in policies)
    want = grads_of(plain(layers), params, x)
    for option in range(1, most):
        chosen = [min(option, len(p) - 1) for p in policies]
        stored = tuple(Layer(i, k) for i, k in enumerate(chosen))
        nested = (Checkpoint(0, 4, (Checkpoint(0, 2, (Layer(0), Layer(1, chosen[1]))),
                                    Layer(2, chosen[2]), Layer(3, chosen[3]))),)
        for plan in (stored, nested):
            run = lambda params, x, plan=plan: apply_plan(plan, layers, params, x,
                                                          backend=backend, policies=policies)
            assert_same_grads(run, plain(layers), params, x, want)


def test_option_without_policies_is_an_error():
    layers, params, x = stack()
    with pytest.raises(ValueError, match="pass policies=plan.policies"):
        apply_plan((Layer(0, 1),) + tuple(Layer(i) for i in range(1, 4)), layers, params, x)
    with pytest.raises(ValueError, match="has 1 options"):
        apply_plan(tuple(Layer(i, 1 if i == 0 else 0) for i in range(4)), layers, params, x,
                   policies=((None,),) * 4)


@pytest.mark.parametrize("policies", [None, (), ("dots",), ("dots_no_batch",), ("names",)])
def test_remat_sequence_policies_plain_gradients(policies):
    layers, params, x = stack()
    seq = remat_sequence(layers, "50%", policies=policies)
    assert_same_grads(seq, plain(layers), params, x)
    plan = seq.cached_plans[0]
    assert len(plan.options) == 4
    if policies == ():
        assert set(plan.options) == {"everything"}
    assert all("policy" in d for d, o in zip(plan.decisions(), plan.options) if o != "everything")


# ------------------------------------------------------------------------------- Flax


def _hand_plan(policy, calls):
    """Every layer of three under ``policy`` (option 1), the last two in a checkpoint; the
    policy's calls are counted in ``calls``."""

    def counted(*args, **kwargs):
        calls.append(args[0])
        return policy(*args, **kwargs)

    plan = (Layer(0, 1), Checkpoint(1, 3, (Layer(1, 1), Layer(2, 1))))
    return plan, ((None, counted),) * 3


@pytest.mark.parametrize("policy", ["dots", "names"])
def test_nnx_option_transform_gives_plain_gradients(policy, monkeypatch):
    from types import SimpleNamespace

    from flax import nnx

    import jaxremat.flax.nnx as jnnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(D, 4 * D, rngs=rngs)
            self.down = nnx.Linear(4 * D, D, rngs=rngs)

        def __call__(self, x):
            return x + self.down(checkpoint_name(jax.nn.gelu(self.up(x)), "hidden"))

    chosen = (jax.checkpoint_policies.dots_saveable if policy == "dots"
              else jax.checkpoint_policies.save_only_these_names("hidden"))
    calls = []
    plan, policies = _hand_plan(chosen, calls)
    monkeypatch.setattr(jnnx, "plan_modules", lambda *args, **kwargs: SimpleNamespace(
        schedule=SimpleNamespace(plan=plan), policies=policies))
    x = jax.random.normal(jax.random.key(1), (B, D))
    remat = jnnx.RematSequential(*[Block(nnx.Rngs(i)) for i in range(3)], budget=1 << 20)
    reference = nnx.Sequential(*[Block(nnx.Rngs(i)) for i in range(3)])
    loss = lambda model, x: jnp.sum(jnp.sin(model(x)))  # noqa: E731
    got = nnx.grad(loss)(remat, x)
    want = nnx.grad(loss)(reference, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    assert calls  # the policy really decided what the layers keep


def test_linen_option_transform_gives_plain_gradients(monkeypatch):
    from types import SimpleNamespace

    import flax.linen as nn

    from jaxremat.flax.linen import RematSequential

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.Dense(D)(checkpoint_name(jax.nn.gelu(nn.Dense(4 * D)(x)), "hidden"))

    calls = []
    plan, policies = _hand_plan(jax.checkpoint_policies.dots_saveable, calls)
    monkeypatch.setattr(RematSequential, "plan", lambda self, *args: SimpleNamespace(
        schedule=SimpleNamespace(plan=plan), policies=policies))
    x = jax.random.normal(jax.random.key(1), (B, D))
    remat = RematSequential(layers=[Block(), Block(), Block()], budget=1 << 20)
    reference = nn.Sequential([Block(), Block(), Block()])
    variables = reference.init(jax.random.key(0), x)
    remat_vars = {"params": {f"layers_{i}": variables["params"][f"layers_{i}"] for i in range(3)}}
    got = jax.grad(lambda v: jnp.sum(jnp.sin(remat.apply(v, x))))(remat_vars)
    want = jax.grad(lambda v: jnp.sum(jnp.sin(reference.apply(v, x))))(variables)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    assert calls


def test_wrappers_take_policies():
    from flax import nnx

    from jaxremat.flax import RematSequential, remat_blocks
    from jaxremat.flax.linen import RematSequential as LinenSequential

    with pytest.raises(ValueError, match="Valid names"):
        RematSequential(nnx.relu, budget="50%", policies=("everything_but_dots",))
    with pytest.raises(ValueError, match="Valid names"):
        remat_blocks(budget="50%", policies=("nope",))
    with pytest.raises(ValueError, match="Valid names"):
        LinenSequential(layers=[jnp.tanh], budget="50%", policies=("nope",))
    assert RematSequential(nnx.relu, budget="50%", policies="dots").policies == ("dots",)


# --------------------------------------------------------------- plans with options


def test_options_never_slower_and_fit_the_meter(tmp_path):
    """Rotor over options is never slower than without them at the same budget (the menu
    only adds choices); where it picks options, the applied plan's measured memory is
    within the profile's tolerance of its predicted peak and the gradients are plain."""
    layers, params, x = stack()
    # flop costs: at this toy width the roofline is bandwidth-bound and (JAX 0.12) no
    # option pays off; by flops they do
    with_options = profile_sequence(layers, params, x, costs="flops").chain
    bare = profile_sequence(layers, params, x, policies=(), costs="flops").chain
    no_remat = solver.make_schedule(bare, tuple(Layer(i) for i in range(4))).peak
    used = []
    for fraction in (0.5, 0.65, 0.8, 0.9, 0.95):
        budget = fraction * no_remat
        fast = solver.solve(with_options, budget)
        slow = solver.solve(bare, budget)
        assert fast.time <= slow.time * (1 + 1e-9)
        if any(chosen_options(fast.plan).values()):
            used.append(fraction)
    assert used, "no budget used an option"
    seq = remat_sequence(layers, int(used[-1] * no_remat), costs="flops")
    plan = seq.plan(params, x)
    assert plan.policy_summary() and "policies " in plan.report()
    measured = activation_memory(loss_of(seq), params, x)
    assert measured <= plan.predicted_peak * 1.02
    assert_same_grads(seq, plain(layers), params, x)
    pytest.importorskip("matplotlib")
    assert (tmp_path / "plan.png").exists() is False
    plan.plot(tmp_path / "plan.png")
    assert (tmp_path / "plan.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["checkpoint", "custom_vjp"])
@pytest.mark.parametrize("policies", [("dots",), ("dots_no_batch",), ("names",), None])
def test_policy_sweep_fits_the_meter_with_plain_gradients(policies, backend):
    """Every policy on its own and the default menu, both backends, budgets from tight to
    loose: the measured memory stays within the profile's tolerance of the prediction and the
    gradients are plain autodiff's."""
    layers, params, x = stack()
    layers, params = layers * 2, params * 2
    for share in ("55%", "70%", "85%", "95%"):
        seq = remat_sequence(layers, share, policies=policies, backend=backend, costs="flops")
        try:
            plan = seq.plan(params, x)
        except solver.InfeasibleBudget:
            continue
        measured = activation_memory(loss_of(seq), params, x)
        assert measured <= plan.predicted_peak * 1.02, (share, measured, plan.predicted_peak)
        assert_same_grads(seq, plain(layers), params, x)


@pytest.mark.parametrize("name, policy", [
    ("dots", jax.checkpoint_policies.dots_saveable),
    ("dots_no_batch", jax.checkpoint_policies.dots_with_no_batch_dims_saveable)])
def test_method_uniform_is_the_policy_on_every_layer(name, policy):
    """``method="uniform:<policy>"`` runs every layer under that policy: the memory of
    ``jax.checkpoint(layer, policy=...)`` on every layer, and plain gradients."""
    layers, params, x = stack()
    seq = remat_sequence(layers, "100%", method=f"uniform:{name}")
    assert_same_grads(seq, plain(layers), params, x)
    plan = seq.cached_plans[0]
    assert plan.schedule.method == f"uniform:{name}"
    assert name in plan.options and "everything" not in plan.options  # (or an option merged with it)
    by_hand = plain([jax.checkpoint(layer, policy=policy) for layer in layers])
    assert activation_memory(loss_of(seq), params, x) == activation_memory(loss_of(by_hand),
                                                                           params, x)
    with pytest.raises(ValueError, match="uniform:<policy name>"):
        remat_sequence(layers, "100%", method="uniform")
