"""remat_scan with the searched policies on its menu (``"dots_plus"``, opt-in: not on
:data:`jaxremat.scan.remat.SCAN_POLICIES`): a scan runs one policy in every layer, so the
searched unions between ``nothing_saveable`` and ``dots_with_no_batch_dims_saveable`` are
what a budget between those two policies' memories can use."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import pytest

import jaxremat

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
MENU = ("dots", "dots_no_batch", "names", "dots_plus")


@pytest.fixture(scope="module")
def gpt():
    """``benchmarks/scan_depth.py``'s scanned GPT-2 block (6 layers, width 32, 4 heads,
    batch 2, sequence 16) and its helpers."""
    sys.path.insert(0, BENCHMARKS)
    try:
        import scan_depth
    finally:
        sys.path.remove(BENCHMARKS)
    layer, params, x = scan_depth.gpt_stack(6, 32, 4, 2, 16)
    return scan_depth, layer, params, x


@pytest.mark.slow  # 8-10 s: three plans, each measured, and the search
def test_a_budget_between_uniform_policies_takes_a_searched_union(gpt):
    """Halfway between the memories of the scan under ``nothing_saveable`` and under
    ``dots_with_no_batch_dims_saveable`` no uniform policy but the first fits; the default
    menu takes checkpointing per layer there (``nothing_saveable``'s flops), the searched
    menu a union of its own: measured within the budget, fewer flops (measured: 0.970x),
    gradients those of the plain scan."""
    bench, layer, params, x = gpt
    nothing, no_batch = (bench.memory(bench.scanned(p, layer), params, x)
                         for p in ("nothing_saveable", "dots_with_no_batch_dims_saveable"))
    budget = (nothing + no_batch) // 2
    least_flops = bench.flops(bench.scanned("nothing_saveable", layer), params, x)
    default = jaxremat.remat_scan(layer, budget, costs="flops")
    assert bench.flops(default, params, x) == pytest.approx(least_flops, rel=1e-9)
    f = jaxremat.remat_scan(layer, budget, costs="flops", policies=MENU)
    plan = f.plan(params, x)
    assert plan.option_name.startswith("nothing_plus")
    assert plan.room_hint() is None and "room" not in plan.report()
    assert plan.measured_peak == bench.memory(f, params, x) <= budget
    assert bench.flops(f, params, x) < 0.99 * least_flops
    loss = lambda fn: (lambda p, h: jnp.sum(jnp.sin(fn(p, h))))  # noqa: E731
    got = jax.grad(loss(f), (0, 1))(params, x)
    want = jax.grad(loss(bench.scanned(None, layer)), (0, 1))(params, x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert jnp.allclose(a, b, rtol=2e-4, atol=2e-5)


def test_a_plan_that_leaves_room_names_the_searched_menu(gpt):
    """Halfway between the memories of ``nothing_saveable`` and
    ``dots_with_no_batch_dims_saveable`` the default menu checkpoints every layer and leaves
    a third of the budget unused: the plan's report says so and names the menu that uses it;
    a plan that uses its budget, or recomputes nothing, says nothing of it."""
    bench, layer, params, x = gpt
    nothing, no_batch = (bench.memory(bench.scanned(p, layer), params, x)
                         for p in ("nothing_saveable", "dots_with_no_batch_dims_saveable"))
    plan = jaxremat.remat_scan(layer, (nothing + no_batch) // 2, costs="flops").plan(params, x)
    assert plan.measured_peak == nothing
    assert '"dots_plus")' in plan.room_hint() and plan.room_hint() in plan.report()
    assert plan.room_hint().startswith(f"{1 - nothing / plan.budget:.0%} of the budget unused")
    tight = jaxremat.remat_scan(layer, nothing, costs="flops").plan(params, x)
    assert tight.measured_peak == nothing and tight.room_hint() is None
    assert jaxremat.remat_scan(layer, "100%").plan(params, x).room_hint() is None


def test_under_vmap_the_searched_options_are_left_out_and_the_plan_says_why(gpt):
    """Under ``jax.vmap`` the shape-keyed searched policies would not recognise the batched
    equations: the scan's profile leaves them out, says so, and the gradients are the plain
    scan's."""
    _, layer, params, x = gpt
    f = jaxremat.remat_scan(layer, "50%", policies=MENU)
    batched = jnp.stack([x, 2 * x])
    loss = lambda fn: (lambda p, h: jnp.sum(jnp.sin(jax.vmap(lambda e: fn(p, e))(h))))  # noqa: E731
    plain = lambda p, h: jax.lax.scan(lambda c, q: (layer(q, c), None), h, p)[0]  # noqa: E731
    got = jax.grad(loss(f))(params, batched)
    want = jax.grad(loss(plain))(params, batched)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert jnp.allclose(a, b, rtol=2e-4, atol=2e-5)
    plans = list(f._cache.values())
    assert [p.batch_size for p in plans] == [2]
    assert not any("_plus" in name for name in plans[0].layer.option_names)
    assert any("jax.vmap" in reason for _, reason in plans[0].layer.dropped)
