"""``"dots_plus"`` (issue 17.6): ``dots_saveable`` and the values a measured greedy search
finds make it cheaper (:mod:`jaxremat.sequence.searched`). The option it adds keeps about
``dots_saveable``'s tape for fewer recomputed flops, gives plain gradients, fits the meter,
is found once per program structure, and a layer it cannot improve gets none, with the
reason."""

from __future__ import annotations

import blocks
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from blocks import assert_same_grads, loss_of, plain_grads

from jaxremat import activation_memory, remat_sequence
from jaxremat.sequence import searched
from jaxremat.sequence.apply import apply_plan
from jaxremat.sequence.policies import check_policies, menu_for
from jaxremat.sequence.profile import profile_sequence
from jaxremat.sequence.searched import SearchedPolicy, candidates, equation_key, search
from jaxremat.trees import tree_bytes
from solver import Checkpoint, Layer

PLUS = ("dots", "dots_plus")





def found_policy(name):
    layer, p, x = blocks.case(name)
    found = search(layer, p, x, jax.make_jaxpr(layer)(p, x), tree_bytes(x))
    return (found[0][1] if found else None), (layer, p, x)


def test_check_policies_takes_the_name():
    assert check_policies(("dots", "dots_plus")) == PLUS
    with pytest.raises(ValueError, match="'dots_plus'"):
        check_policies(("dots_pluss",))


def test_policy_keeps_its_base_and_the_chosen_equations_only():
    policy = SearchedPolicy(frozenset({equation_key(jax.lax.exp_p, [jax.ShapeDtypeStruct((2, 3),
                                                                                   jnp.float32)])}))
    f32 = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    assert policy(jax.lax.exp_p, f32)
    assert not policy(jax.lax.exp_p, jax.ShapeDtypeStruct((3, 3), jnp.float32))
    assert not policy(jax.lax.tanh_p, f32)
    a, b = jax.ShapeDtypeStruct((2, 3), jnp.float32), jax.ShapeDtypeStruct((3, 4), jnp.float32)
    assert policy(jax.lax.dot_general_p, a, b,
                  dimension_numbers=(((1,), (0,)), ((), ())))
    assert hash(policy) == hash(SearchedPolicy(policy.keys)) and policy == SearchedPolicy(policy.keys)
    # over "nothing" a matmul is kept only by its key, over "dots_no_batch" not with a batch
    lean = SearchedPolicy(policy.keys, "nothing")
    assert lean(jax.lax.exp_p, f32)
    assert not lean(jax.lax.dot_general_p, a, b, dimension_numbers=(((1,), (0,)), ((), ())))
    assert SearchedPolicy(frozenset({equation_key(jax.lax.dot_general_p, [a, b])}), "nothing")(
        jax.lax.dot_general_p, a, b, dimension_numbers=(((1,), (0,)), ((), ())))
    batched = jax.ShapeDtypeStruct((5, 2, 3), jnp.float32), jax.ShapeDtypeStruct((5, 3, 4),
                                                                                 jnp.float32)
    numbers = (((2,), (1,)), ((0,), (0,)))
    assert SearchedPolicy(frozenset())(jax.lax.dot_general_p, *batched, dimension_numbers=numbers)
    assert not SearchedPolicy(frozenset(), "dots_no_batch")(jax.lax.dot_general_p, *batched,
                                                            dimension_numbers=numbers)
    with pytest.raises(ValueError, match="'dots', 'dots_no_batch', 'nothing'"):
        SearchedPolicy(frozenset(), "dots_only")


def test_attention_keeps_the_softmax_not_the_scores_for_fewer_flops_at_the_same_tape():
    policy, (layer, p, x) = found_policy("attention")
    assert policy is not None
    # the softmax's exp has the scores' shape: kept instead of them, its chain is not redone
    names = {key[0] for key in policy.keys}
    assert "exp" in names
    dots_tape, dots_flops = searched._measure(layer, p, x, SearchedPolicy(frozenset()))
    tape, flops = searched._measure(layer, p, x, policy)
    assert flops < dots_flops
    assert tape <= dots_tape * (1 + searched.SLACKS[0])
    # every chosen key is a candidate, and each one counts: without it the flops rise
    found = candidates(jax.make_jaxpr(layer)(p, x), tree_bytes(x))
    assert policy.keys <= set(found)
    assert not any(key[0] in searched.LAYOUT for key in found)
    assert not any(key[0] == "dot_general" for key in found)
    for key in policy.keys:
        assert searched._measure(layer, p, x, SearchedPolicy(policy.keys - {key}))[1] > flops


def test_over_nothing_the_options_lie_between_the_input_and_dots_no_batch():
    layer, p, x = blocks.case("attention")
    jaxpr = jax.make_jaxpr(layer)(p, x)
    # over "nothing" the matmuls are candidates too, their outputs being what it lacks
    assert any(key[0] == "dot_general" for key in candidates(jaxpr, tree_bytes(x), "nothing"))
    named = search(layer, p, x, jaxpr, tree_bytes(x), "nothing")
    found = [policy for _, policy in named]
    assert found and all(policy.base == "nothing" for policy in found)
    # named by the first limit each is the cheapest within, distinct, narrowest first
    suffixes = [suffix for suffix, _ in named]
    assert suffixes == sorted(set(suffixes), key=searched.SUFFIXES.index)
    measure = lambda policy: searched._measure(layer, p, x, policy)  # noqa: E731
    low_tape, low_flops = measure(SearchedPolicy(frozenset(), "nothing"))
    top_tape, _ = measure(SearchedPolicy(frozenset(), "dots_no_batch"))
    measured = [measure(policy) for policy in found]
    limit = low_tape + searched.LEAN_SHARES[-1] * (top_tape - low_tape)
    assert all(low_tape < tape <= limit and flops < low_flops for tape, flops in measured)
    # a wider option (more tape) is one that recomputes less
    assert measured == sorted(measured, key=lambda m: (m[0], -m[1]))
    assert all(a[1] > b[1] for a, b in zip(measured, measured[1:]))
    # and its gradients are plain autodiff's
    want = jax.grad(lambda p, x: jnp.sum(layer(p, x) ** 2), argnums=(0, 1))(p, x)
    for policy in found:
        checked = jax.checkpoint(layer, policy=policy)
        got = jax.grad(lambda p, x: jnp.sum(checked(p, x) ** 2), argnums=(0, 1))(p, x)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            assert jnp.allclose(g, w, rtol=1e-5, atol=1e-6)


def test_each_limit_gets_its_own_greedy_union(monkeypatch):
    """A knapsack's greedy per capacity: the narrowest limit is filled with what fits it
    (here B and C), not left empty because the best value per byte (A) is too wide for it;
    A joins at the first limit it fits."""
    tapes, savings = {"A": 15, "B": 5, "C": 5}, {"A": 30, "B": 9, "C": 8}
    measure = lambda policy: (  # noqa: E731
        sum(tapes[k] for k in policy.keys), 100 - sum(savings[k] for k in policy.keys))
    monkeypatch.setattr(searched, "_limits", lambda *args: [10, 20, 30])
    found = searched._greedy(measure, ("A", "B", "C"), "nothing")
    assert found == ((0, (1, 2)), (2, (0, 1, 2)))


def test_the_profile_gets_the_option_cheaper_than_dots():
    layer, p, x = blocks.case("attention")
    (found,) = profile_sequence([layer], [p], x, policies=PLUS).layers
    options = {o.name: o for o in found.options}
    assert {"dots", "dots_plus"} <= set(options)
    assert set(options) <= {"dots", "dots_plus", "dots_plus:wide", "dots_no_batch_plus",
                            "dots_no_batch_plus:wide", "nothing_plus", "nothing_plus:wide",
                            "nothing_plus:wider"}
    dots, plus = options["dots"], options["dots_plus"]
    assert plus.bwd_flops < dots.bwd_flops
    assert plus.tape_bytes <= dots.tape_bytes * (1 + searched.SLACKS[0])
    # the second search keeps what dots_with_no_batch_dims_saveable keeps, plus its keys
    for _, policy in search(layer, p, x, jax.make_jaxpr(layer)(p, x), tree_bytes(x),
                            "dots_no_batch"):
        assert policy.base == "dots_no_batch"


def test_the_default_menu_takes_the_widest_union_of_each_base():
    """``"searched"`` (on the default menu): of the search's unions, the last (widest) per
    base, named as ``"dots_plus"`` names it; a menu with both profiles each option once."""
    layer, p, x = blocks.case("attention")
    assert "searched" in check_policies(None)
    menu, _ = menu_for(check_policies(("dots_plus",)), layer, p, x)
    every = [o for o in menu if isinstance(o.policy, SearchedPolicy)]
    widest = {o.policy.base: o.name for o in every}
    assert len(every) > len(widest) >= 2  # a base with more than one union: a real choice
    default, _ = menu_for(check_policies(None), layer, p, x)
    assert [o.name for o in default if isinstance(o.policy, SearchedPolicy)] == list(
        widest.values())
    both, _ = menu_for(check_policies(("searched", "dots_plus")), layer, p, x)
    assert sorted(o.name for o in both) == sorted(o.name for o in menu)
    (found,) = profile_sequence([layer], [p], x).layers
    assert set(found.option_names) & set(widest.values())


def test_under_vmap_the_searched_options_are_left_out_and_the_plan_says_why():
    """``jax.checkpoint`` calls a policy with vmap's batched shapes, which a searched policy
    (keyed by the shapes profiled per example) does not recognise: under a vmap the sequence
    sees, the default menu profiles without them, and the gradients are the plain ones."""
    layer, p, x = blocks.case("attention")
    seq = remat_sequence([layer, layer], "90%")
    xs = jnp.stack([x, 2 * x])
    plans = []
    jax.vmap(lambda x: plans.append(seq.plan([p, p], x)) or x)(xs)
    (plan,) = plans
    searched_names = ("dots_plus", "dots_no_batch_plus", "nothing_plus")
    for found in plan.layers:
        assert not any(name.startswith(searched_names) for name in found.option_names)
        assert "jax.vmap" in dict(found.dropped)["searched"]
    assert "'searched' dropped" in str(plan)
    unbatched = seq.plan([p, p], x)  # the same sequence outside vmap keeps them
    assert any(name.startswith(searched_names) for name in unbatched.layers[0].option_names)

    def loss(f):
        return lambda p, xs: jnp.sum(jax.vmap(lambda x: f([p, p], x))(xs) ** 2)

    got = jax.jit(jax.grad(loss(seq)))(p, xs)
    want = jax.jit(jax.grad(loss(lambda ps, x: layer(ps[1], layer(ps[0], x)))))(p, xs)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_layer_without_dots_gets_no_option_and_says_why():
    layers = [lambda p, x: jnp.sin(x) * p]
    profile = profile_sequence(layers, [jnp.float32(2.0)], jnp.ones((4, 8)), policies=PLUS)
    (first,) = profile.layers
    assert "dots_plus" not in first.option_names
    assert dict(first.dropped)["dots_plus"].startswith("no value kept beside the matmul")


def test_a_later_shape_of_the_same_program_reuses_the_choice(monkeypatch):
    layer, p, x = blocks.case("attention")
    first = search(layer, p, x, jax.make_jaxpr(layer)(p, x), tree_bytes(x))
    calls = []
    monkeypatch.setattr(searched, "_measure", lambda *a: calls.append(a) or (0, 0.0))
    # nor are the candidates read: they may differ at another shape (which sizes coincide
    # with a matmul's), the chosen equations' positions do not
    monkeypatch.setattr(searched, "candidates", lambda *a: calls.append(a) or ())
    wider = jnp.concatenate([x, x])  # batch 16: same program, other shapes
    later = search(layer, p, wider, jax.make_jaxpr(layer)(p, wider), tree_bytes(wider))
    assert calls == []
    assert len(later) == len(first)
    assert [suffix for suffix, _ in later] == [suffix for suffix, _ in first]
    later, first = later[0][1], first[0][1]
    assert {k[0] for k in later.keys} == {k[0] for k in first.keys}
    assert later.keys != first.keys  # mapped to the new shapes
    batch_16 = [key for key in later.keys if key[0] == "exp"]
    assert batch_16 and batch_16[0][1][0][0][0] == 16



def _heads(p, x):
    """Attention over heads without a softmax's stabiliser: a 4-D matmul, which
    ``jnp.matmul`` lowers with the batch axis squeezed when it has size one."""
    k = jnp.swapaxes(x @ p["wk"], -1, -2)
    return x + jax.nn.softmax(x @ k, axis=-1) @ jnp.tanh(x @ p["wv"])


def test_a_batch_of_one_reuses_the_choice(monkeypatch):
    key = jax.random.PRNGKey(0)
    p = {"wk": jax.random.normal(key, (16, 16)) / 4, "wv": jax.random.normal(key, (16, 16)) / 4}
    x = jax.random.normal(key, (4, 2, 8, 16))
    first = search(_heads, p, x, jax.make_jaxpr(_heads)(p, x), tree_bytes(x), "nothing")
    assert first
    one = x[:1]
    assert len(jax.make_jaxpr(_heads)(p, one).eqns) != len(jax.make_jaxpr(_heads)(p, x).eqns)
    calls = []
    monkeypatch.setattr(searched, "_measure", lambda *a: calls.append(a) or (0, 0.0))
    monkeypatch.setattr(searched, "candidates", lambda *a: calls.append(a) or ())
    later = search(_heads, p, one, jax.make_jaxpr(_heads)(p, one), tree_bytes(one), "nothing")
    assert calls == []
    assert [suffix for suffix, _ in later] == [suffix for suffix, _ in first]
    for (_, was), (_, now) in zip(first, later):
        assert sorted(k[0] for k in now.keys) == sorted(k[0] for k in was.keys)
        assert all(shape[0] == 1 for k in now.keys for shape, _ in k[1] if len(shape) == 4)


def _stack():
    mlp, mlp_p, _ = blocks.case("mlp")
    attention, attention_p, hx = blocks.case("attention")
    return [attention, mlp], [attention_p, mlp_p], hx


@pytest.mark.parametrize("every_option, backend", [
    (False, "checkpoint"), pytest.param(True, "checkpoint", marks=pytest.mark.slow),
    pytest.param(True, "custom_vjp", marks=pytest.mark.slow)])
def test_the_options_give_plain_gradients_stored_and_recomputed(every_option, backend):
    layers, params, x = _stack()
    policies, h = [], x
    for layer, p in zip(layers, params):
        options = menu_for(("dots_plus",), layer, p, h)[0]
        assert [o.name for o in options][:2] == ["everything", "dots_plus"]
        policies.append(tuple(o.policy for o in options))
        h = layer(p, h)
    want = plain_grads(layers, params, x)
    # every option the menu generates: stored in the forward, then in a recomputed segment
    for option in range(1, max(len(p) for p in policies) if every_option else 3):
        chosen = [min(option, len(p) - 1) for p in policies]
        plan = (Checkpoint(0, 2, (Layer(0, chosen[0]), Layer(1, chosen[1]))),) if option % 2 \
            else (Layer(0, chosen[0]), Layer(1, chosen[1]))
        run = lambda params, x, plan=plan: apply_plan(plan, layers, params, x, backend=backend,
                                                      policies=tuple(policies))
        assert_same_grads(run, params, x, want)


@pytest.mark.parametrize("budget", [0.8, pytest.param(0.9, marks=pytest.mark.slow)])
def test_the_menu_fits_the_meter_with_plain_gradients(budget):
    layers, params, x = _stack()
    plain_memory = activation_memory(loss_of(remat_sequence(layers, "100%", policies=())),
                                     params, x)
    seq = remat_sequence(layers, int(budget * plain_memory), policies=("dots", "dots_no_batch",
                                                                       "dots_plus"))
    assert_same_grads(seq, params, x, plain_grads(layers, params, x))
    assert activation_memory(loss_of(seq), params, x) <= budget * plain_memory
