"""Ranked dot policies (issue 17.6): ``"dots_ranked"`` keeps the matmul and convolution
outputs whose contraction is at least a threshold read from the layer's jaxpr; every option
it generates gives plain gradients and fits the meter, merges with equal options, and a
layer without matmuls gets none (with the reason)."""

from __future__ import annotations

import blocks
import jax
import jax.numpy as jnp
import pytest
from blocks import assert_same_grads, loss_of, plain_grads

from jaxremat import activation_memory, remat_sequence
from jaxremat.measure.trace import trace_layer
from jaxremat.sequence.apply import apply_plan
from jaxremat.sequence.policies import check_policies, layer_menu, menu_for
from jaxremat.sequence.profile import profile_sequence
from jaxremat.sequence.ranked import (
    Dot,
    RankedDots,
    contraction,
    layer_dots,
    thresholds,
)
from solver import Checkpoint, Layer

RANKED = ("dots_ranked",)


def chain_layer(p, x):
    """Three matmuls of contractions 3, 5 and 7 with outputs of distinct shapes, each read
    by the backward (``sin``), a batched one of contraction 11, and a last one (contraction
    4) whose output the backward never reads."""
    h = jnp.sin(x @ p["w1"])                    # (2, 4, 5), K = 3
    h = jnp.sin(h @ p["w2"])                    # (2, 4, 7), K = 5
    h = jnp.sin(h @ p["w3"])                    # (2, 4, 11), K = 7
    g = jnp.einsum("bik,bjk->bij", h, h)        # (2, 4, 4), K = 11, batched
    return jnp.sin(g) @ p["w4"]                 # (2, 4, 3), K = 4


def chain_case():
    keys = iter(jax.random.split(jax.random.key(1), 5))
    normal = lambda *shape: jax.random.normal(next(keys), shape) / 2  # noqa: E731
    p = {"w1": normal(3, 5), "w2": normal(5, 7), "w3": normal(7, 11), "w4": normal(4, 3)}
    return chain_layer, p, normal(2, 4, 3)


DOT_SHAPES = {3: (2, 4, 5), 5: (2, 4, 7), 7: (2, 4, 11), 11: (2, 4, 4), 4: (2, 4, 3)}





# --------------------------------------------------------------------- the contraction


def test_contraction_of_dots_and_convolutions():
    layer, p, x = blocks.case("attention")
    d, t = blocks.D, blocks.T
    sizes = [(dot.size, dot.batched) for dot in layer_dots(jax.make_jaxpr(layer)(p, x))]
    # qkv projection, scores (contract the width), weighted values (contract the tokens), out
    assert sizes == [(d, False), (d, True), (t, True), (d, False)]
    # the MLP's second matmul reaches the output through an addition only: never read
    mlp, p, x = blocks.case("mlp")
    assert [(dot.size, dot.read) for dot in layer_dots(jax.make_jaxpr(mlp)(p, x))] == [
        (d, True), (4 * d, False)]
    conv, p, x = blocks.case("conv")
    assert [(dot.size, dot.batched) for dot in layer_dots(jax.make_jaxpr(conv)(p, x))] == [
        (3 * 3 * 4, True)]
    # grouped: the kernel's input features are per group
    lhs, rhs = jax.ShapeDtypeStruct((1, 8, 8, 6), jnp.float32), jnp.ones((5, 5, 3, 4))
    grouped = jax.make_jaxpr(lambda k: jax.lax.conv_general_dilated(
        jnp.zeros(lhs.shape), k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=2))(rhs)
    assert [dot.size for dot in layer_dots(grouped)] == [5 * 5 * 3]
    assert contraction(jax.lax.add_p, lhs, lhs) is None


def test_policy_keeps_exactly_the_dots_at_or_above_the_threshold():
    layer, p, x = chain_case()
    dots = layer_dots(jax.make_jaxpr(layer)(p, x))
    assert sorted((dot.size, dot.read) for dot in dots) == [
        (3, True), (4, False), (5, True), (7, True), (11, True)]
    other = {jax.ShapeDtypeStruct(a.shape, a.dtype) for a in jax.tree.leaves((p, x))}
    for threshold in (1, 5, 8, 12):
        saved = jax.checkpoint(layer, policy=RankedDots(threshold), prevent_cse=True)
        traced = trace_layer(saved, p, x, 0)
        kept = sorted(r.shape for r, used in zip(traced.residuals, traced.residual_used)
                      if used and r not in other)
        # the last matmul's output (contraction 4) is not kept: the backward never reads it
        want = sorted(shape for k, shape in DOT_SHAPES.items() if k >= threshold and k != 4)
        assert kept == want, threshold


# ------------------------------------------------------------------------------ the menu


def test_check_policies_takes_the_ranked_names_and_rejects_typos():
    assert check_policies(("dots", "dots_ranked")) == ("dots", "dots_ranked")
    assert check_policies("dots_ranked") == ("dots_ranked",)
    with pytest.raises(ValueError, match="unknown policy name 'dots_rank'.*'dots_ranked'"):
        check_policies(["dots_rank"])


def test_thresholds_split_the_dot_bytes_evenly():
    dots = [Dot(1, 100, False), Dot(2, 100, False), Dot(3, 100, False), Dot(4, 100, False),
            Dot(5, 400, False), Dot(6, 100, True)]
    assert thresholds(dots[:3]) == (3, 2, 1)
    assert thresholds(dots[:3], keep_all=False) == (3, 2)
    # kept bytes from the top: 6 -> 100, 5 -> 500, 4 -> 600, 3 -> 700, 2 -> 800, 1 -> 900
    assert thresholds(dots) == (6, 5, 3)  # levels 0/100/500/700/900: steps of at most 400
    # without the last dot, (5, 4, 3), (5, 4, 2) and (5, 3, 2) tie (largest step 400,
    # squares 22e4): the larger thresholds win
    assert thresholds(dots[:5]) == (5, 4, 3)
    assert thresholds(dots, most=1) == (5,)
    # an unread output does not count; >= 2 keeps exactly the unbatched dots: 'dots_no_batch'
    small = [Dot(4, 1, False), Dot(2, 1, False), Dot(1, 1, True), Dot(8, 1, False, read=False)]
    assert thresholds(small) == (4, 2, 1)
    assert thresholds(small, not_as_no_batch=True) == (4, 1)
    assert thresholds([]) == ()


def test_menu_expands_per_layer_and_leaves_out_the_plain_dots():
    layer, p, x = chain_case()
    dots = layer_dots(jax.make_jaxpr(layer)(p, x))
    names = lambda menu: [o.name for o in layer_menu(menu, (), dots)]  # noqa: E731
    # read outputs' bytes by contraction: 11: 128, 7: 352, 5: 224, 3: 160 (864 in all; the
    # last matmul's output is not read); kept from the top 128/480/704/864: (11, 7, 5) has
    # the least largest step (352)
    ranked = ["dots_ranked:>=11", "dots_ranked:>=7", "dots_ranked:>=5"]
    assert names(("dots_ranked",))[1:] == ranked
    assert names(("dots", "dots_ranked"))[2:] == ranked
    # >= 7 keeps 7 and 11, >= 5 keeps 5, 7 and 11; neither is the unbatched 3, 5 and 7
    assert names(("dots_no_batch", "dots_ranked"))[2:] == ranked
    layer, p, x = blocks.case("mlp")  # contractions D (read) and 4D (not read)
    options, notes = menu_for(("dots", "dots_ranked"), layer, p, x)
    assert [o.name for o in options] == ["everything", "dots"]
    assert notes == (("dots_ranked", f"contraction sizes {blocks.D} in the layer: every ranked "
                                     "option is 'dots' or 'dots_no_batch'"),)
    options, notes = menu_for(("dots_ranked",), layer, p, x)
    assert [o.policy for o in options[1:]] == [RankedDots(blocks.D)] and notes == ()


def test_layer_without_dots_gets_no_ranked_option_and_says_why():
    layers = [lambda p, x: jnp.sin(x) * p, blocks.conv_block]
    _, conv_p, x = blocks.case("conv")
    profile = profile_sequence(layers, [jnp.float32(2.0), conv_p], x,
                               policies=("dots", "dots_ranked"))
    first, conv = profile.layers
    assert not any(name.startswith("dots_ranked") for name in first.option_names)
    reasons = dict(first.dropped)
    assert reasons["dots_ranked"] == ("no dot_general or conv_general_dilated whose output the "
                                      "backward reads in the layer")
    reasons = dict(conv.dropped)  # one convolution: the option would be 'dots'
    assert reasons["dots_ranked"] == ("contraction sizes 36 in the layer: every ranked option "
                                      "is 'dots' or 'dots_no_batch'")
    assert not any(name.startswith("dots_ranked") for name in conv.option_names)
    plan = remat_sequence(layers, "100%", policies=("dots", "dots_ranked")).plan(
        [jnp.float32(2.0), conv_p], x)
    assert "option 'dots_ranked' dropped on layers 0: no dot_general" in plan.report()


def test_equal_ranked_options_merge_and_dominated_ones_drop():
    layer, p, x = blocks.case("attention")  # contractions D (qkv, scores, out) and T (values)
    profile = profile_sequence([layer], [p], x, policies=(
        "dots", "dots_no_batch", "dots_ranked"))
    (found,) = profile.layers
    reasons = dict(found.dropped)
    assert "dots_ranked" not in reasons  # >= D keeps qkv, scores and out: neither plain option
    kept = set(found.option_names)
    for name, reason in found.dropped:
        assert name not in kept
        assert reason.startswith(("same tape as", "dominated by", "no smaller",
                                  "contraction sizes"))
    names = [o.name for o in layer_menu(("dots", "dots_ranked"), (),
                                        layer_dots(jax.make_jaxpr(layer)(p, x)))]
    assert names[2:] == [f"dots_ranked:>={blocks.D}"]
    assert f"dots_ranked:>={blocks.D}" in kept | set(reasons)
    # the same option twice on the menu (a callable equal to the ranked one) merges into it
    profile = profile_sequence([layer], [p], x, policies=("dots_ranked", RankedDots(blocks.D)))
    reasons = dict(profile.layers[0].dropped)
    assert reasons["policy1"] == f"same tape as 'dots_ranked:>={blocks.D}'"


# ------------------------------------------------------------------------------ applying


def _stack():
    mlp, mlp_p, _ = blocks.case("mlp")
    attention, attention_p, hx = blocks.case("attention")
    return [attention, mlp], [attention_p, mlp_p], hx


@pytest.mark.parametrize("backend", ["checkpoint", pytest.param("custom_vjp", marks=pytest.mark.slow)])
def test_every_ranked_option_gives_plain_gradients(backend):
    layers, params, x = _stack()
    # every option the menu generates, also those the profile merges or drops as dominated
    policies, h = [], x
    for layer, p in zip(layers, params):
        policies.append(tuple(o.policy for o in menu_for(RANKED, layer, p, h)[0]))
        h = layer(p, h)
    policies = tuple(policies)
    assert [len(p) for p in policies] == [3, 2]  # attention: >= D and >= T; MLP: >= D
    want = plain_grads(layers, params, x)
    for option in range(1, max(len(p) for p in policies)):
        # each layer's option-th option, stored in the forward, then in a recomputed segment
        chosen = [min(option, len(p) - 1) for p in policies]
        plan = (Checkpoint(0, 2, (Layer(0, chosen[0]), Layer(1, chosen[1]))),) if option % 2 \
            else (Layer(0, chosen[0]), Layer(1, chosen[1]))
        run = lambda params, x, plan=plan: apply_plan(plan, layers, params, x,
                                                      backend=backend, policies=policies)
        assert_same_grads(run, params, x, want)


def test_every_ranked_option_of_a_chain_of_dots_gives_plain_gradients():
    layer, p, x = chain_case()
    options = menu_for(RANKED, layer, p, x)[0][1:]
    assert len(options) == 3
    want = plain_grads([layer], [p], x)
    for option in options:
        run = lambda params, x, policy=option.policy: apply_plan(
            (Layer(0, 1),), [layer], params, x, policies=((None, policy),))
        assert_same_grads(run, [p], x, want)


@pytest.mark.parametrize("budget", [0.8, pytest.param(0.9, marks=pytest.mark.slow)])
def test_ranked_menu_fits_the_meter_with_plain_gradients(budget):
    layers, params, x = _stack()
    menu = ("dots", "dots_no_batch", "dots_ranked")
    plain_memory = activation_memory(loss_of(remat_sequence(layers, "100%", policies=())),
                                     params, x)
    seq = remat_sequence(layers, int(budget * plain_memory), policies=menu)
    assert_same_grads(seq, params, x, plain_grads(layers, params, x))
    assert activation_memory(loss_of(seq), params, x) <= budget * plain_memory
