"""Tests of jaxremat.flax (NNX): gradients, state updates and RNG streams equal the plain
model's, the plan is really applied, and the decorator form leaves the model unchanged."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import solver
from recomputed import count_primitive, expected_marks
import jaxremat.flax.nnx as jnnx
from threads import call_together
from jaxremat.flax import RematSequential, remat_blocks

DIM, BATCH, DEPTH = 24, 16, 5


class Block(nnx.Module):
    """Linear -> BatchNorm -> tanh -> Dropout; ``tanh`` marks each forward in the jaxpr
    (its derivative needs its output, so a recomputation keeps it). The Linear has no bias:
    before a BatchNorm its gradient is zero up to rounding, and Adam turns that rounding
    into steps of the learning rate, so a remat'd and a plain step whose products fuse
    differently (a GPU) would part ways by 1e-2 on it."""

    def __init__(self, dim: int, rngs: nnx.Rngs, dropout: float = 0.25):
        self.linear = nnx.Linear(dim, dim, use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(dim, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x):
        return x + self.dropout(jnp.tanh(self.norm(self.linear(x))))


def blocks(seed: int = 0, depth: int = DEPTH) -> list[Block]:
    rngs = nnx.Rngs(seed, dropout=seed + 100)
    return [Block(DIM, rngs) for _ in range(depth)]


def make(budget=None, method="rotor", seed=0):
    """The same weights and RNG streams as a plain nnx.Sequential or a RematSequential."""
    layers = blocks(seed) + [nnx.relu]
    if budget is None:
        return nnx.Sequential(*layers)
    return RematSequential(*layers, budget=budget, method=method)


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(0), (BATCH, DIM))


def loss_fn(model, x):
    return jnp.mean(model(x) ** 2)


def train_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x)
    optimizer.update(model, grads)
    return loss, grads


def run_steps(model, x, steps=2):
    """Two optimizer steps under nnx.jit: losses, first gradients, final state."""
    optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    step = nnx.jit(train_step)
    losses, first_grads = [], None
    for _ in range(steps):
        loss, grads = step(model, optimizer, x)
        losses.append(loss)
        first_grads = grads if first_grads is None else first_grads
    return losses, first_grads, nnx.state(model)


def leaves_close(a, b, rtol=1e-6, atol=1e-6):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        if jnp.issubdtype(u.dtype, jax.dtypes.prng_key):
            u, v = jax.random.key_data(u), jax.random.key_data(v)
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol)


@pytest.fixture(scope="module")
def plain_run(x):
    return run_steps(make(None), x)


@pytest.mark.parametrize("budget,method", [
    ("40%", "rotor"), ("70%", "rotor"), ("100%", "rotor"), ("100%", "every_layer"),
])
def test_training_equals_the_plain_model(x, plain_run, budget, method):
    """Loss, gradients (dropout on), BatchNorm statistics, RNG counters and parameters
    after two adamw steps equal those of the plain nnx.Sequential with the same seeds."""
    model = make(budget, method)
    plan = model.plan(x)
    if budget == "40%":  # the test must exercise recomputation (at 45% the searched options
        # store every layer in part)
        assert max(plan.forward_counts) > 1
    losses, grads, state = run_steps(model, x)
    plain_losses, plain_grads, plain_state = plain_run
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    leaves_close(grads, plain_grads)
    # Parameters, BatchNorm statistics, RNG keys and counters (same state tree).
    assert [p for p, _ in nnx.to_flat_state(state)] == [
        p for p, _ in nnx.to_flat_state(plain_state)]
    leaves_close(state, plain_state)


def test_batch_stats_updated_once_and_rngs_advanced_once(x):
    """One step changes the running statistics exactly as one plain forward does, and each
    Dropout's RNG counter advances by one (the recomputation draws no new keys)."""
    model = make("40%")
    assert max(model.plan(x).forward_counts) > 1
    plain = make(None)
    run_steps(model, x, steps=1)
    nnx.jit(lambda m, x: m(x))(plain, x)  # one plain forward in train mode
    leaves_close(nnx.state(model, nnx.BatchStat), nnx.state(plain, nnx.BatchStat))
    counts = [int(c) for c in jax.tree.leaves(nnx.state(model, nnx.RngCount))]
    assert counts == [1] * DEPTH


def test_eval_mode_is_honoured(x):
    model, plain = make("45%"), make(None)
    model.eval()
    plain.eval()
    before = nnx.state(model, nnx.BatchStat)
    out = nnx.jit(lambda m, x: m(x))(model, x)
    np.testing.assert_allclose(out, plain(x), rtol=1e-6, atol=1e-6)
    leaves_close(nnx.state(model, nnx.BatchStat), before)  # running stats untouched
    # Deterministic: two calls agree (dropout off).
    np.testing.assert_allclose(model(x), model(x))
    grads = nnx.grad(loss_fn)(model, x)
    leaves_close(grads, nnx.grad(loss_fn)(plain, x))
    model.train()
    assert not np.allclose(model(x), model(x)), "dropout is back on in train mode"


@pytest.mark.parametrize("budget", ["40%", "60%", "100%"])
def test_the_schedule_is_applied(x, budget):
    """Each block's forward runs as often in the differentiated program as the plan says."""
    model = make(budget)
    plan = model.plan(x)
    graphdef, state = nnx.split(model)

    def grads(state, x):
        return nnx.grad(loss_fn)(nnx.merge(graphdef, state), x)

    jaxpr = jax.make_jaxpr(grads)(state, x)
    expected = sum(plan.forward_counts[:DEPTH])
    assert count_primitive(jaxpr, "tanh") == expected_marks(plan, DEPTH)  # (its docstring)
    if budget == "100%":
        assert expected == DEPTH


def test_split_merge_and_static_budget(x):
    model = make("45%")
    graphdef, state = nnx.split(model)
    clone = nnx.merge(graphdef, state)
    assert isinstance(clone, RematSequential) and clone.budget == "45%"
    clone.eval()
    model.eval()
    np.testing.assert_allclose(clone(x), model(x), rtol=1e-6)
    # A different budget is a different graph definition (a new trace under nnx.jit).
    model.budget = "80%"
    assert nnx.split(model)[0] != graphdef


def count_profiles(monkeypatch) -> list:
    """A list that grows by one at each ``profile_sequence`` call of the NNX wrapper."""
    calls = []
    real = jnnx.profile_sequence

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jnnx, "profile_sequence", counting)
    return calls


def test_profile_once_across_steps_and_budgets(x, monkeypatch):
    calls = count_profiles(monkeypatch)
    model = make("55%", seed=7)  # fresh shapes key: a batch size not used elsewhere
    y = x[:12]
    run_steps(model, y, steps=2)
    model.budget = "75%"
    model.plan(y)
    model.budget = 400_000
    plan = model.plan(y)
    assert len(calls) == 1
    assert plan.budget == 400_000


def test_concurrent_calls_plan_once_and_caches_stay_bounded(x, monkeypatch):
    """Four threads plan the same model and shapes at once: one profile, one plan object;
    the module-wide caches are bounded LRUs (jaxremat.lru.LRU)."""
    calls = count_profiles(monkeypatch)
    model = make("45%", seed=11)
    y = x[:11]  # a batch size no other test plans: nothing cached yet
    plans = call_together(lambda: model.plan(y))
    assert len(calls) == 1
    assert all(plan is plans[0] for plan in plans)
    for cache in (jnnx._profiles, jnnx._plans, jnnx._pure_fns):
        assert len(cache) <= cache.maxsize == jnnx._CACHE_SIZE


def test_relative_budget_is_a_share_of_no_remat_memory(x):
    model = make("50%")
    plan = model.plan(x)
    assert plan.budget == int(0.5 * plan.no_remat_peak)
    assert plan.predicted_peak <= plan.budget


def test_infeasible_budget_says_how_much_is_needed(x):
    model = make(1000)
    with pytest.raises(solver.InfeasibleBudget, match="smallest budget") as info:
        model.plan(x)
    assert info.value.min_budget > 1000
    with pytest.raises(ValueError, match="no budget"):
        RematSequential(*blocks(), budget=None)
    with pytest.raises(ValueError, match="percentage"):
        make("-5%").plan(x)


def test_iterating_a_remat_sequential_is_an_error():
    model = make("50%")
    with pytest.raises(TypeError, match="call it instead"):
        for _ in model:
            pass
    assert len(model) == DEPTH + 1 and isinstance(model[0], Block)


def test_tuple_activations_follow_sequential_convention():
    class Split(nnx.Module):
        def __init__(self, rngs):
            self.a = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, x):
            return self.a(x), x  # (hidden, skip)

    class Merge(nnx.Module):
        def __init__(self, rngs):
            self.b = nnx.Linear(8, 8, rngs=rngs)

        def __call__(self, h, skip):
            return jnp.tanh(self.b(h)) + skip

    def build(remat):
        rngs = nnx.Rngs(3)
        layers = [Split(rngs), Merge(rngs), Split(rngs), Merge(rngs)]
        if not remat:
            return nnx.Sequential(*layers)
        # every_layer: each layer under its own nnx.remat, tuples crossing the boundaries.
        return RematSequential(*layers, budget="100%", method="every_layer")

    x = jax.random.normal(jax.random.key(1), (4, 8))
    remat, plain = build(True), build(False)
    np.testing.assert_allclose(remat(x), plain(x), rtol=1e-6)
    leaves_close(nnx.grad(loss_fn)(remat, x), nnx.grad(loss_fn)(plain, x))


class Dense(nnx.Module):
    """Linear -> tanh, no BatchNorm or Dropout: a block that ``nnx.vmap`` can map over."""

    def __init__(self, dim: int, rngs: nnx.Rngs):
        self.linear = nnx.Linear(dim, dim, rngs=rngs)

    def __call__(self, x):
        return jnp.tanh(self.linear(x))


def test_budget_under_vmap_refers_to_the_whole_batch(x):
    rngs = nnx.Rngs(4)
    layers = [Dense(DIM, rngs) for _ in range(8)]
    examples = jnp.stack([x, -x, 0.5 * x])  # an nnx.vmap batch of 3 inputs
    no_remat = jnnx.plan_modules(layers, x, budget="100%").predicted_peak
    # under the vmap the menu has no searched options (their policies are keyed by shapes)
    per_example = jnnx.plan_modules(layers, x, budget=int(0.5 * no_remat),
                                    policies=("dots", "dots_no_batch", "names"))
    assert max(per_example.forward_counts) >= 2  # the half budget forces recomputation
    seen = []

    def one(modules, x):
        seen.append(jnnx.plan_modules(list(modules), x, budget=int(1.5 * no_remat)))
        return jnnx.run_modules(list(modules), x, budget=int(1.5 * no_remat))

    def remat_loss(modules, xs):
        return jnp.mean(nnx.vmap(one, in_axes=(None, 0))(modules, xs) ** 2)

    def plain_loss(modules, xs):
        run = lambda modules, x: nnx.Sequential(*modules)(x)
        return jnp.mean(nnx.vmap(run, in_axes=(None, 0))(modules, xs) ** 2)

    grads = nnx.grad(remat_loss)(nnx.List(layers), examples)
    want = nnx.grad(plain_loss)(nnx.List(layers), examples)
    leaves_close(grads, want, rtol=1e-5, atol=1e-6)
    batched = [p for p in seen if p.batch_size == 3]
    assert batched, [p.batch_size for p in seen]
    # budget / 3 per example: the same schedule as the per-example plan at half the memory
    assert batched[0].schedule.plan == per_example.schedule.plan
    assert batched[0].predicted_peak <= 1.5 * no_remat


# --- the decorator form ----------------------------------------------------------------


class Tower(nnx.Module):
    def __init__(self, depth: int, seed: int = 0):
        rngs = nnx.Rngs(seed, dropout=seed + 1)
        self.embed = nnx.Linear(DIM, DIM, rngs=rngs)
        self.blocks = nnx.List([Block(DIM, rngs) for _ in range(depth)])
        self.head = nnx.Linear(DIM, 1, rngs=rngs)

    def __call__(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


@remat_blocks("blocks", budget="45%")
class RematTower(Tower):
    def __call__(self, x):
        h = self.embed(x)
        h = self.run_blocks(h)
        return self.head(h)


def test_decorator_matches_the_loop_and_keeps_the_state_tree(x):
    plain, remat = Tower(DEPTH), RematTower(DEPTH)
    assert max(remat.plan_blocks(x).forward_counts) > 1  # scope="model": the model's input
    plain_paths = [p for p, _ in nnx.to_flat_state(nnx.state(plain))]
    assert [p for p, _ in nnx.to_flat_state(nnx.state(remat))] == plain_paths
    losses, grads, state = run_steps(remat, x)
    plain_losses, plain_grads, plain_state = run_steps(plain, x)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    leaves_close(grads, plain_grads)
    leaves_close(state, plain_state)


def test_decorator_budget_override_and_errors(x):
    tower = RematTower(3)  # scope="model": the budget is the whole step's
    assert tower.plan_blocks(x, budget=10**9).scope.budget == 10**9
    tower.remat_budget = "90%"
    whole = tower.plan_blocks(x).scope
    assert whole.budget == int(0.9 * whole.no_remat) and whole.measured <= whole.budget
    blocks_only = remat_blocks("blocks", budget="45%", scope="blocks", name="run")(
        type("BlocksTower", (Tower,), {"__call__": lambda self, x: self.head(
            self.run(self.embed(x)))}))(3)
    h = blocks_only.embed(x)
    assert blocks_only.plan_blocks(h, budget=10**9).budget == 10**9
    blocks_only.remat_budget = "90%"
    assert blocks_only.plan_blocks(h).budget == int(0.9 * blocks_only.plan_blocks(h).no_remat_peak)

    @remat_blocks("layers")
    class NoBudget(nnx.Module):
        def __init__(self):
            self.layers = nnx.List([nnx.Linear(4, 4, rngs=nnx.Rngs(0))])

    with pytest.raises(ValueError, match="no budget"):
        NoBudget().run_blocks(jnp.ones((2, 4)))
    with pytest.raises(TypeError, match="nnx.Module"):
        remat_blocks("blocks", budget=1)(object)
    with pytest.raises(TypeError, match="already defines"):
        remat_blocks("blocks", budget=1)(RematTower)


@pytest.mark.parametrize("ends_the_body", [True, False])
def test_a_policy_block_ending_a_checkpoint_loses_its_dead_recomputed_marker(ends_the_body):
    """What :func:`recomputed.expected_marks` subtracts, on plain JAX: a checkpoint whose body
    ends with a ``dots`` block recomputes that block's tanh only in the block's backward
    (2 runs); followed by another block, the recomputed forward's tanh is used (3 runs)."""
    block = lambda w, x: x + jnp.tanh(x @ w)
    dots = jax.checkpoint(block, policy=jax.checkpoint_policies.dots_saveable)
    plain = lambda w, x: x @ w  # no marker
    body = ((lambda ws, x: dots(ws[1], plain(ws[0], x))) if ends_the_body
            else (lambda ws, x: plain(ws[1], dots(ws[0], x))))
    outer = jax.checkpoint(body)
    w, x = jnp.full((4, 4), 0.1), jnp.ones((2, 4))
    jaxpr = jax.make_jaxpr(jax.grad(lambda ws: jnp.sum(outer(ws, x))))((w, w))
    assert count_primitive(jaxpr, "tanh") == (2 if ends_the_body else 3)
