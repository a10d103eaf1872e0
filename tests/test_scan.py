"""remat_scan: values and gradients of the plain lax.scan, a program flat in depth, the exact
choice within the nested-scan family (brute force), bad input."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jaxremat
import solver
from jaxremat.scan.checks import program_size
from jaxremat.scan.family import (NestedScan, chain_options, choose, family, member_schedule,
                                  loop_margin, member_time, solver_plan)
from jaxremat.scan.family import _Search as family_state, _search as family_search
from jaxremat.scan.simulate import simulate_member
from jaxremat.scan.loops import ScanBody
from solver import Chain, Layer
from solver.chain.options import LayerOptions


def layer(p, h):
    return h + jnp.tanh(h @ p["w"] + p["b"])


def dots_layer(p, h):  # two matmuls: dots_saveable keeps a smaller tape (JAX 0.10 and 0.12)
    return h + jnp.tanh(h @ p["w"] + p["b"]) @ p["w"].T


def pair_layer(p, h):  # a pytree activation
    a, b = h
    return b, a + jnp.tanh(b @ p["w"] + p["b"])


def stack(L, D=8, seed=0):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"w": jax.random.normal(k1, (L, D, D)) / np.sqrt(D),
            "b": 0.1 * jax.random.normal(k2, (L, D))}


def scale_layer(p, h):  # activations dominate: the stacked parameters are small
    return h + jnp.tanh(h * p["a"] + p["b"])


def scale_stack(L, D=32, B=128):
    params = {"a": jnp.linspace(0.5, 1.5, L * D).reshape(L, D), "b": jnp.zeros((L, D))}
    return params, jax.random.normal(jax.random.PRNGKey(0), (B, D))


def plain(fn):
    return lambda p, x: jax.lax.scan(lambda h, q: (fn(q, h), None), x, p)[0]


def assert_close(a, b):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("L", [1, 2, 7, 13, 16])
@pytest.mark.parametrize("budget", ["40%", "75%"])
def test_value_and_gradient_equal_plain_scan(L, budget):
    params, x = stack(L), jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    f = jaxremat.remat_scan(layer, budget)
    try:
        f.plan(params, x)
    except solver.InfeasibleBudget:
        budget = "100%"
        f = jaxremat.remat_scan(layer, budget)
    loss = lambda fn: (lambda p, x: jnp.sum(fn(p, x) ** 2))
    assert_close(f(params, x), plain(layer)(params, x))
    assert_close(jax.grad(loss(f), (0, 1))(params, x),
                 jax.grad(loss(plain(layer)), (0, 1))(params, x))


@pytest.mark.parametrize("sizes", [  # the two deepest members (7 s of CPU each) in the slow tier
    (), (1,), (3,), pytest.param((5, 2), marks=pytest.mark.slow),
    pytest.param((6, 3, 1), marks=pytest.mark.slow)])
def test_every_member_shape_applies_exactly(sizes):
    """Members forced through max_levels and prime L: remainders at every level."""
    L = 11
    params, x = stack(L), (jnp.ones((2, 8)), jnp.zeros((2, 8)))
    f = jaxremat.remat_scan(pair_layer, "100%")
    plan = f.plan(params, x)
    f._cache[next(iter(f._cache))] = type(plan)(**{**plan.__dict__, "member": NestedScan(sizes)})
    loss = lambda fn: (lambda p, x: jnp.sum(fn(p, x)[0] * fn(p, x)[1]))
    assert_close(jax.grad(loss(f))(params, x), jax.grad(loss(plain(pair_layer)))(params, x))


@pytest.mark.parametrize("member", [  # reshaped top levels (12 = 3 x 4 ...), layers under "dots"
    NestedScan((4,)), NestedScan((1,), 1), NestedScan((), 1),
    pytest.param(NestedScan((6, 4), 1), marks=pytest.mark.slow)])
def test_reshaped_and_policy_members_apply_exactly(member):
    L = 12
    params = jax.tree.map(lambda a: 0.5 * a, stack(L))  # gradients of order one
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 8))
    f = jaxremat.remat_scan(dots_layer, "100%", policies=("dots",))
    plan = f.plan(params, x)
    assert [o.name for o in plan.layer.options] == ["dots"]
    f._cache[next(iter(f._cache))] = type(plan)(**{**plan.__dict__, "member": member})
    loss = lambda fn: (lambda p, x: jnp.sum(fn(p, x) ** 2))
    assert_close(jax.grad(loss(f), (0, 1))(params, x),
                 jax.grad(loss(plain(dots_layer)), (0, 1))(params, x))
    jaxpr = str(jax.make_jaxpr(jax.grad(loss(f)))(params, x))
    if member.levels <= 1:  # no copies (below the top, 4 does not divide 6: a remainder)
        assert "split" not in jaxpr and "concatenate" not in jaxpr
    else:
        splits = re.findall(r"split\[axis=0 sizes=\(([\d, ]+)\)", jaxpr)
        assert splits and all(sum(map(int, s.split(","))) < L for s in splits)  # not the stack


def uniform(policy):
    body = jax.checkpoint(dots_layer, policy=policy, prevent_cse=False)
    return lambda p, x: jax.lax.scan(lambda h, q: (body(q, h), None), x, p)[0]


def test_memory_and_flops_at_the_uniform_policies():
    """At the measured memory of jax.checkpoint per layer (nothing_saveable) and of the layer
    under dots_saveable in one scan, remat_scan fits and computes no more (flops cost
    model: it takes those very programs); its least memory is no more than
    nothing_saveable's."""
    from jaxremat.measure.costs import lowered_costs
    L, D, B = 16, 32, 64
    params, x = stack(L, D), jax.random.normal(jax.random.PRNGKey(4), (B, D))
    loss = lambda fn: (lambda p, x: jnp.sum(fn(p, x) ** 2))
    policies = jax.checkpoint_policies
    for policy in (policies.nothing_saveable, policies.dots_saveable):
        memory = jaxremat.activation_memory(loss(uniform(policy)), params, x)
        f = jaxremat.remat_scan(dots_layer, memory, costs="flops", policies=("dots",))
        plan = f.plan(params, x)
        assert plan.measured_peak == jaxremat.activation_memory(loss(f), params, x) <= memory
        assert plan.schedule.time <= member_schedule(
            plan.chain, NestedScan((1,) if policy is policies.nothing_saveable else (), 1)
        ).time * (1 + 1e-12)
        if policy is policies.nothing_saveable:
            least = memory
    with pytest.raises(solver.InfeasibleBudget) as error:
        jaxremat.remat_scan(dots_layer, 1000, policies=("dots",))(params, x)
    assert error.value.min_budget <= least


def test_jit_grad_vmap():
    L = 9
    params, x = stack(L), jax.random.normal(jax.random.PRNGKey(2), (3, 5, 8))
    f = jaxremat.remat_scan(layer, "100%")  # parameter-dominated: only the plain scan fits
    loss = lambda fn: (lambda p, x: jnp.sum(jax.vmap(lambda xi: fn(p, xi))(x) ** 2))
    assert_close(jax.jit(jax.grad(loss(f)))(params, x), jax.grad(loss(plain(layer)))(params, x))
    assert f.plan(params, x[0]).batch_size == 1
    assert {p.batch_size for p in f._cache.values()} == {1, 3}  # vmap seen: budget / batch


def at_least_half(L):
    """remat_scan at 50%, or at the smallest budget that works where 50% does not fit."""
    try:
        jaxremat.remat_scan(scale_layer, "50%").plan(*scale_stack(L))
        return jaxremat.remat_scan(scale_layer, "50%")
    except solver.InfeasibleBudget as error:
        return jaxremat.remat_scan(scale_layer, int(error.min_budget))


def program(f, L):
    params, x = scale_stack(L)
    return program_size(jax.make_jaxpr(jax.grad(lambda p, x: jnp.sum(f(p, x))))(params, x))


def test_program_size_flat_in_depth():
    shaped = jaxremat.remat_scan(scale_layer, "100%")
    for L in (12, 64):  # the same member on both: (4,) divides 12 and 64
        shaped.plan(*scale_stack(L))
    for key, plan in list(shaped._cache.items()):
        shaped._cache[key] = type(plan)(**{**plan.__dict__, "member": NestedScan((4,))})
    assert program(shaped, 12) == program(shaped, 64)
    plain_scan = program(lambda p, x: plain(scale_layer)(p, x), 8)
    chosen = [program(at_least_half(L), L) for L in (8, 16, 32, 64)]
    # whatever member (plain scan: 22-30 equations; remainders and the inline last segment: up
    # to three loops per level, two levels: 222 equations for 6 > 2 at L = 8, 277 for 3 > 2
    # with unrolled pieces on JAX 0.12): bounded, not ~L
    assert max(chosen) <= 13 * plain_scan, chosen
    unrolled = [program(lambda p, x: jaxremat.remat_sequence([scale_layer] * L, "50%")(
        [jax.tree.map(lambda a: a[i], p) for i in range(L)], x), L) for L in (8, 32)]
    assert unrolled[1] > 3 * unrolled[0]  # the unrolled program grows with L


def homogeneous(L, fwd, tape, bwd, x, extra, tmp, inside, option=None):
    """A chain of ``L`` equal layers; ``option``: ``(tape share, backward factor)`` of one
    more option per layer (a policy keeping part of the tape, recomputing in the backward)."""
    chain = Chain(fwd_time=[fwd] * L, bwd_time=[bwd] * L, x_size=[x] * (L + 1),
                  xbar_size=[x + extra] * L, fwd_tmp=[tmp] * L, bwd_tmp=[tmp] * L,
                  output_in_tape=[inside] * L, fwd_tape_time=[fwd * tape] * L)
    if option is None:
        return chain
    share, slower = option
    extra_option = dict(xbar_size=x + share * extra, bwd_time=bwd * slower, fwd_time=fwd,
                        fwd_tape_time=fwd * tape, output_in_tape=inside, name="part")
    return chain.with_options(LayerOptions.from_columns(chain, [[extra_option]] * L))


options = st.none() | st.tuples(st.floats(0.1, 0.9), st.floats(1.0, 2.0))


@settings(max_examples=25, deadline=None)
@given(L=st.integers(2, 12), fwd=st.floats(0.1, 5), tape=st.floats(0.2, 1.0),
       bwd=st.floats(0.1, 10), x=st.integers(1, 5), extra=st.integers(0, 8),
       tmp=st.integers(0, 4), inside=st.booleans(), share=st.floats(0.2, 1.0), option=options)
def test_choice_is_the_best_member_by_brute_force(L, fwd, tape, bwd, x, extra, tmp, inside,
                                                  share, option):
    chain = homogeneous(L, fwd, tape, bwd, x, extra, tmp, inside, option)
    members = list(family(L, 2, chain_options(chain)))
    schedules = [member_schedule(chain, m) for m in members]
    full = member_schedule(chain, NestedScan()).peak
    budget = share * full
    fits = [s for s in schedules if s.peak <= budget * (1 + 1e-9)]
    if not fits:
        with pytest.raises(solver.InfeasibleBudget) as error:
            choose(chain, budget, max_levels=2)
        assert error.value.min_budget == pytest.approx(min(s.peak for s in schedules), rel=1e-12)
        return
    best = min(fits, key=lambda s: (s.time, s.peak))
    got = choose(chain, budget, max_levels=2)
    assert got.schedule.peak <= budget * (1 + 1e-9)
    # the lazy search (members costed when they come first) picks what costing all does
    assert got.member == family_search(family_state(chain, lambda m: 0.0, None), budget, 2,
                                       lazy=False).member
    assert got.schedule.time == pytest.approx(best.time, rel=1e-12)
    # a descendant (one more level) is never faster: the bound the search prunes with
    for m, s in zip(members, schedules):
        if m.levels == 2:
            parent = member_schedule(chain, NestedScan(m.sizes[:1], m.option))
            assert s.time >= parent.time - 1e-9


@settings(max_examples=20, deadline=None)
@example(L=4, fwd=1.0, bwd=1.0, x=3, extra=0, tmp=0, params=0, unroll=1, share=0.375,
         option=None, body=(0, 0, 8, 10, 0, 0))  # a root pruned whose child fits (found)
@given(L=st.integers(2, 10), fwd=st.floats(0.1, 5), bwd=st.floats(0.1, 10),
       x=st.integers(1, 5), extra=st.integers(0, 8), tmp=st.integers(0, 4),
       params=st.integers(0, 12), unroll=st.integers(0, 3), share=st.floats(0.1, 1.0),
       option=options, body=st.none() | st.tuples(*[st.integers(0, 12)] * 6))
def test_choice_with_the_loop_margin_is_the_best_member_by_brute_force(
        L, fwd, bwd, x, extra, tmp, params, unroll, share, option, body):
    """With loop_margin (by phase for the plain scan and jax.checkpoint per layer; the
    unrolled runs' parameter slices growing with the pieces; loop invariants of ``tmp``
    bytes, taken in the recomputations of one level of scanned runs; or, with ``body``, the
    scans of stored runs by what their loops hold, jaxremat.scan.loops.ScanBody, any sizes,
    the same for every option), the search, which prunes with
    _floor's lower bound on the margins below a member (with loop_margin's cheaper
    ``floor=True`` bound, as remat_scan prunes, a lower bound on every member's margin),
    still finds the fastest member whose peak plus margin fits, and the least such peak
    when none does."""
    chain = homogeneous(L, fwd, 0.5, bwd, x, extra, tmp, False, option)
    bodies = None if body is None else (ScanBody(*body),) * chain_options(chain)
    margin = functools.partial(loop_margin, chain, param_bytes=params, unroll=unroll,
                               grad_bytes=params / 2, invariant_bytes=tmp, scan_bodies=bodies)
    floor = functools.partial(margin, floor=True)
    costed = [(m, member_schedule(chain, m)) for m in family(L, 2, chain_options(chain))]
    needs = [s.peak + margin(m) for m, s in costed]
    # a lower bound up to rounding (found: 3.5 against 3.4999999999999982 for 2 > 1)
    assert all(floor(m) <= margin(m) + 1e-9 * max(1.0, abs(margin(m))) for m, _ in costed)
    budget = share * max(needs)
    fits = [s.time for (m, s), need in zip(costed, needs) if need <= budget * (1 + 1e-9)]
    if not fits:
        with pytest.raises(solver.InfeasibleBudget) as error:
            choose(chain, budget, max_levels=2, margin=margin, margin_floor=floor)
        assert error.value.min_budget == pytest.approx(min(needs), rel=1e-12)
        return
    for pruning in (None, floor):
        got = choose(chain, budget, max_levels=2, margin=margin, margin_floor=pruning)
        assert got.schedule.peak + margin(got.member) <= budget * (1 + 1e-9)
        assert got.schedule.time == pytest.approx(min(fits), rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(L=st.integers(1, 10), fwd=st.floats(0.1, 5), tape=st.floats(0.2, 1.0),
       x=st.integers(1, 5), extra=st.integers(0, 8), tmp=st.integers(0, 4),
       inside=st.booleans(), option=options)
def test_replayed_simulation_equals_the_simulator(L, fwd, tape, x, extra, tmp, inside, option):
    chain = homogeneous(L, fwd, tape, 2 * fwd, x, extra, tmp, inside, option)
    memo = {}  # shared between members, as the search shares it
    for member in family(L, 3, chain_options(chain)):
        exact = member_schedule(chain, member)
        time, peak = simulate_member(chain, member, memo)
        assert time == pytest.approx(exact.time, rel=1e-12)
        assert peak == pytest.approx(exact.peak, rel=1e-12)
        # the search's lower bound on a member's time is its time
        assert member_time(chain, member) == pytest.approx(exact.time, rel=1e-12)


def test_solver_plan_is_the_nested_scan():
    # a top level that divides L checkpoints every segment (one scan, reshaped parameters)
    plan = solver_plan(NestedScan((4, 3), option=1), 12)
    assert [(i.start, i.stop) for i in plan] == [(0, 4), (4, 8), (8, 12)]
    assert [(i.start, i.stop) for i in plan[1].body] == [(4, 5), (5, 6), (6, 7), (7, 8)]
    assert plan[1].body[0].body == (Layer(4, 1),) and plan[1].body[-1] == Layer(7, 1)
    assert solver_plan(NestedScan((4, 2)), 9)[0].body == (Layer(0),)  # remainder 1 first
    plan = solver_plan(NestedScan((4, 2)), 9)
    assert [(i.start, i.stop) for i in plan[:3]] == [(0, 1), (1, 5), (5, 7)]
    assert plan[3:] == (Layer(7), Layer(8))
    solver.validate_plan(plan, 0, 9)


def test_plan_report_and_gap():
    f = jaxremat.remat_scan(scale_layer, "50%")
    plan = f.plan(*scale_stack(24))
    text = str(plan)
    assert "nested scans" in text and "Rotor unrolled" in text and "level 1" in text
    assert plan.predicted_peak <= plan.budget and plan.measured_peak <= plan.budget
    assert plan.gap_to_rotor is not None and plan.gap_to_rotor > -0.1


def test_infeasible_budget_names_the_family_minimum():
    params, x = stack(12), jnp.ones((4, 8))
    with pytest.raises(solver.InfeasibleBudget) as error:
        jaxremat.remat_scan(layer, 100)(params, x)
    need = error.value.min_budget
    jaxremat.remat_scan(layer, int(need))(params, x)  # the named budget works
    assert "smallest budget" in str(error.value)


def test_layer_that_changes_shape_points_to_remat_sequence():
    widen = lambda p, h: jnp.concatenate([h, h], axis=-1) * p["b"][0]
    with pytest.raises(ValueError, match="remat_sequence"):
        jaxremat.remat_scan(widen, "50%")(stack(4), jnp.ones((4, 8)))
    to_half = lambda p, h: (h @ p["w"]).astype(jnp.float16)
    with pytest.raises(ValueError, match="float16"):
        jaxremat.remat_scan(to_half, "50%")(stack(4), jnp.ones((4, 8)))


def test_stacked_params_with_disagreeing_axes_name_the_leaf():
    params = {"w": jnp.ones((6, 8, 8)), "b": jnp.ones((5, 8))}
    with pytest.raises(ValueError, match=r"\['b'\] has 5") as error:
        jaxremat.remat_scan(layer, "50%")(params, jnp.ones((4, 8)))
    assert "['w'] has 6" in str(error.value)
    with pytest.raises(ValueError, match="method"):
        jaxremat.remat_scan(layer, "50%", method="revolve")


@pytest.mark.parametrize("L", [16, 37])
def test_measured_memory_within_budget_and_near_prediction(L):
    params, x = scale_stack(L)
    feasible = 0
    for share in ("50%", "65%", "80%"):
        f = jaxremat.remat_scan(scale_layer, share)
        try:
            plan = f.plan(params, x)
        except solver.InfeasibleBudget:
            continue
        feasible += 1
        measured = jaxremat.activation_memory(lambda p, x: jnp.sum(f(p, x)), params, x)
        assert measured == plan.measured_peak <= plan.budget
        assert 0.75 * plan.predicted_peak <= measured <= 1.1 * plan.predicted_peak
        squared = jaxremat.activation_memory(lambda p, x: jnp.sum(f(p, x) ** 2), params, x)
        assert squared <= plan.budget + x.nbytes  # the loss's own square, outside the stack
    assert feasible >= 2


def _scans(jaxpr) -> int:
    """Number of ``scan`` equations in ``jaxpr``, nested bodies included."""
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "scan"
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    count += _scans(inner)
    return count


@pytest.mark.parametrize("sizes, scans", [((2,), 2), ((4,), 5)])
def test_two_layer_segments_are_unrolled(sizes, scans):
    """Segments of at most UNROLL layers run their layers one after the other inside the
    scan over segments (no inner loop: 2 scans in the gradient, not 5 as for segments of 4),
    which holds less memory than an inner scan, and the member's predicted peak (no inner
    loop margin) still bounds what the meter measures."""
    L = 8
    params, x = scale_stack(L)
    f, scanning = (jaxremat.remat_scan(scale_layer, "100%", policies=(), unroll=unroll)
                   for unroll in (2, 0))
    member = NestedScan(sizes)
    for g in (f, scanning):
        plan = g.plan(params, x)
        g._cache[next(iter(g._cache))] = type(plan)(**{**plan.__dict__, "member": member})
    loss = lambda fn: (lambda p, x: jnp.sum(fn(p, x) ** 2))
    assert_close(jax.grad(loss(f), (0, 1))(params, x),
                 jax.grad(loss(plain(scale_layer)), (0, 1))(params, x))
    assert _scans(jax.make_jaxpr(jax.grad(loss(f)))(params, x).jaxpr) == scans
    one = jax.tree.map(lambda a: a[0], params)
    predicted = (member_schedule(plan.chain, member).peak
                 + loop_margin(plan.chain, member, sum(a.nbytes for a in jax.tree.leaves(one))))
    measured = jaxremat.activation_memory(lambda p, x: jnp.sum(f(p, x)), params, x)
    assert measured <= predicted
    scanned = jaxremat.activation_memory(lambda p, x: jnp.sum(scanning(p, x)), params, x)
    assert measured < scanned if sizes[-1] <= 2 else measured == scanned


@pytest.mark.parametrize("unroll", [0, 2])
def test_loop_bodies_count_the_scans_of_the_gradient(unroll):
    """``loop_bodies`` (``ScanPlan.loop_bodies``, in the plan's report: the loops XLA compiles
    a body for) equals the scans of the gradient's jaxpr on every member of two levels or
    less of 7 layers (remainders) and 8 (reshaped tops), inner runs scanned or unrolled."""
    from jaxremat.scan.members import loop_bodies
    from jaxremat.scan.realize import run_member as _run

    for L in (7, 8):
        params, x = scale_stack(L, D=4, B=2)
        for member in family(L, 2):
            loss = lambda p, h: jnp.sum(_run(scale_layer, member.sizes, p, h, L, unroll=unroll))
            scans = _scans(jax.make_jaxpr(jax.grad(loss))(params, x).jaxpr)
            assert loop_bodies(member, L, unroll) == scans, member
    plan = jaxremat.remat_scan(scale_layer, "100%", policies=(), unroll=unroll).plan(params, x)
    assert plan.loop_bodies == loop_bodies(plan.member, 8, unroll)
    assert f"{plan.loop_bodies} loops in the gradient" in plan.report()


def deep_layer(p, h):  # 70 equations (7 per step): "auto" scans its runs
    for _ in range(10):
        h = h + 0.1 * jnp.tanh(h * p["a"] + p["b"])
    return h


def norm_layer(p, h):  # 27 equations: a LayerNorm and a GELU; "auto" unrolls (> 24, <= 44)
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    z = (h - mean) * jax.lax.rsqrt(var + 1e-5) * p["a"] + p["b"]
    return h + jax.nn.gelu(z) * p["a"]


@pytest.mark.parametrize("fn, unroll, scans",
                         [(scale_layer, 2, 2), (norm_layer, 2, 2), (deep_layer, 0, 5)])
def test_auto_unroll_follows_the_layer_size(fn, unroll, scans):
    """``unroll="auto"`` (the default) unrolls runs of <= 2 layers for a layer of at most
    UNROLL_MAX_EQUATIONS jaxpr equations and scans them for a larger one: segments of two
    layers give 2 loops in the gradient (unrolled) or 5 (inner scans); gradients equal the
    plain scan's either way, and the measured memory fits the budget."""
    from jaxremat.scan.members import UNROLL_MAX_EQUATIONS

    params, x = scale_stack(8)
    one = jax.tree.map(lambda a: a[0], params)
    equations = program_size(jax.make_jaxpr(fn)(one, x))
    assert (equations <= UNROLL_MAX_EQUATIONS) == (unroll == 2)
    f = jaxremat.remat_scan(fn, "100%", policies=())
    plan = f.plan(params, x)
    assert plan.unroll == unroll
    assert plan.measured_peak <= plan.budget
    f._cache[next(iter(f._cache))] = type(plan)(**{**plan.__dict__, "member": NestedScan((2,))})
    loss = lambda g: (lambda p, x: jnp.sum(g(p, x) ** 2))
    assert_close(jax.grad(loss(f), (0, 1))(params, x),
                 jax.grad(loss(plain(fn)), (0, 1))(params, x))
    assert _scans(jax.make_jaxpr(jax.grad(loss(f)))(params, x).jaxpr) == scans
    explicit = jaxremat.remat_scan(fn, "100%", policies=(), unroll=2 - unroll)
    assert explicit.plan(params, x).unroll == 2 - unroll  # an int overrides the rule


@pytest.mark.parametrize("bad", ["yes", "AUTO", -1, True, 1.5, None])
def test_bad_unroll_names_the_choices(bad):
    with pytest.raises(ValueError, match="auto.*integer >= 0"):
        jaxremat.remat_scan(layer, "50%", unroll=bad)


def test_a_new_budget_reuses_the_loop_margins_measurements(monkeypatch):
    """The margin's sizes (:func:`jaxremat.scan.remat.margin_bytes`, six traces) are measured
    once per layer, shapes and options: a second ``remat_scan`` of the same layer at another
    budget plans without measuring them again, and gets the same sizes."""
    from jaxremat.scan import remat as scan_remat

    params, x = stack(6), jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    fresh = lambda p, h: layer(p, h)  # noqa: E731 - a function no other test planned
    calls = []
    measure = scan_remat.margin_bytes
    monkeypatch.setattr(scan_remat, "margin_bytes",
                        lambda *args: calls.append(args) or measure(*args))
    first = jaxremat.remat_scan(fresh, "90%").plan(params, x)
    assert len(calls) == 1
    second = jaxremat.remat_scan(fresh, "100%").plan(params, x)
    assert len(calls) == 1
    assert first.member is not None and second.member is not None
