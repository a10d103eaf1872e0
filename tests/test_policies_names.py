"""The ``"names"`` options of a layer marking several names (issue 17): besides all of them,
each alone, the program-order prefixes and all but one (:func:`name_groups`), so that a
block marked with MaxText's names (``query_proj`` ... ``mlpwo``) is offered its presets'
nested groups (``save_qkv_proj`` ⊂ ``save_dot_with_context_except_mlp`` ⊂
``minimal_with_context``; ``minimal``: all but ``context``); gradients equal plain
autodiff for each, and plans fit the meter."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from test_policies import assert_same_grads, loss_of, plain

from jaxremat import activation_memory, remat_sequence
from jaxremat.sequence.apply import apply_plan
from jaxremat.sequence.policies import layer_menu, marked_names, name_groups
from jaxremat.sequence.profile import profile_sequence
from solver import Layer

D, T, B = 16, 8, 2
NAMES = ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi", "mlpwo")


def norm(x):
    return x - jnp.mean(x, axis=-1, keepdims=True)


FOUR = ("value_proj", "context", "out_proj", "mlpwi")  # marked by block4: 11 groups to profile


def block(p, x, marked=NAMES):
    """A pre-norm transformer block marked with those of MaxText's seven names in ``marked``."""
    mark = lambda value, name: checkpoint_name(value, name) if name in marked else value  # noqa: E731
    h = norm(x)
    q, k, v = (mark(h @ p[n], n) for n in NAMES[:3])
    scores = jnp.einsum("btd,bsd->bts", q, k) / math.sqrt(D)
    context = mark(jnp.einsum("bts,bsd->btd", jax.nn.softmax(scores, -1), v), "context")
    x = x + mark(context @ p["out_proj"], "out_proj")
    wi = mark(norm(x) @ p["mlpwi"], "mlpwi")
    return x + mark(jax.nn.gelu(wi) @ p["mlpwo"], "mlpwo")


def block4(p, x):
    return block(p, x, FOUR)


def init(layers=3, layer=block4):
    shapes = {"query_proj": (D, D), "key_proj": (D, D), "value_proj": (D, D),
              "out_proj": (D, D), "mlpwi": (D, 4 * D), "mlpwo": (4 * D, D)}
    keys = iter(jax.random.split(jax.random.key(0), layers * len(shapes) + 1))
    params = [{n: jax.random.normal(next(keys), s) / math.sqrt(s[0]) for n, s in shapes.items()}
              for _ in range(layers)]
    return [layer] * layers, params, jax.random.normal(next(keys), (B, T, D))


def test_name_groups_hold_the_maxtext_presets():
    groups = name_groups(NAMES)
    assert len(groups) == len(set(groups)) == 1 + 7 + 5 + 6  # all; alone; prefixes; all but one
    assert groups[0] == NAMES
    assert all((n,) in groups for n in NAMES)
    assert NAMES[:3] in groups  # save_qkv_proj
    assert NAMES[:5] in groups  # save_dot_with_context_except_mlp
    assert tuple(n for n in NAMES if n != "context") in groups  # minimal
    # two names: as before; three: every non-empty subset; beyond seven: all of them only
    assert name_groups(("a", "b")) == [("a", "b"), ("a",), ("b",)]
    assert sorted(map(sorted, name_groups("abc"))) == sorted(
        [["a"], ["b"], ["c"], ["a", "b"], ["a", "c"], ["b", "c"], ["a", "b", "c"]])
    assert name_groups("abcdefgh") == [tuple("abcdefgh")] and name_groups(()) == []
    menu = [o.name for o in layer_menu(("names",), NAMES[:4])]
    assert menu[:3] == ["everything", "names:" + ",".join(NAMES[:4]), "names:query_proj"]
    assert "names:query_proj,key_proj,value_proj" in menu and len(menu) == 1 + 1 + 4 + 2 + 3


def test_every_name_group_gives_plain_gradients():
    layers, params, x = init(1)
    assert marked_names(block, params[0], x) == NAMES and marked_names(block4, params[0], x) == FOUR
    profile = profile_sequence(layers, params, x, policies=("names",), costs="flops")
    offered = {o.name for o in profile.layers[0].options} | {n for n, _ in profile.layers[0].dropped}
    assert offered == {"names:" + ",".join(g) for g in name_groups(FOUR)}
    options = profile.layers[0].options
    assert len(options) > 1, "more than all names kept as an option"
    policies = ((None,) + tuple(o.policy for o in options),)
    grad = lambda fn: jax.grad(loss_of(fn), argnums=(0, 1))  # noqa: E731
    runs = [lambda params, x, k=k: apply_plan((Layer(0, k),), layers, params, x, policies=policies)
            for k in range(1, len(options) + 1)]
    every = jax.jit(lambda params, x: [grad(run)(params, x) for run in runs])  # one compile
    want = grad(plain(layers))(params, x)
    for got in every(params, x):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_plans_with_name_groups_fit_the_meter():
    layers, params, x = init(3)
    seq = remat_sequence(layers, "50%", policies=("names",), costs="flops")
    plan = seq.plan(params, x)
    groups = {o for o in plan.options if o.startswith("names:")}
    assert groups - {"names:" + ",".join(FOUR)}, f"a group other than all names: {plan.options}"
    assert activation_memory(loss_of(seq), params, x) <= plan.budget
    assert_same_grads(seq, plain(layers), params, x)
