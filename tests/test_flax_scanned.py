"""remat_blocks on a scanned NNX stack (``nnx.vmap``-built, run with ``nnx.scan``): outputs,
gradients, BatchNorm statistics, Dropout masks and RNG counters equal the plain ``nnx.scan``
model's; the measured step is within the budget; bad stacks get errors naming the fix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxremat
from jaxremat.flax import model_scope, remat_blocks
from jaxremat.flax.scanned import ScannedPlan, is_scanned_stack, plan_scanned, run_scanned
from jaxremat.scan.members import UNROLL

DIM, BATCH, DEPTH = 16, 96, 6


class Block(nnx.Module):
    """Linear -> BatchNorm -> tanh -> Dropout, residual (as tests/test_flax_nnx.py's)."""

    def __init__(self, dim: int, rngs: nnx.Rngs, deterministic: bool = False):
        self.linear = nnx.Linear(dim, dim, use_bias=False, rngs=rngs)
        self.norm = nnx.BatchNorm(dim, rngs=rngs)
        self.dropout = nnx.Dropout(0.25, rngs=rngs, deterministic=deterministic)

    def __call__(self, x):
        return x + self.dropout(jnp.tanh(self.norm(self.linear(x))))


def stack(seed: int, depth: int = DEPTH, deterministic: bool = False) -> Block:
    """``depth`` blocks with stacked variables, the Flax way."""
    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
        return Block(DIM, rngs, deterministic)
    return create(nnx.Rngs(seed, dropout=seed + 100))


class Plain(nnx.Module):
    """The plain scanned model: an embedding, the stack under ``nnx.scan``, a head."""

    def __init__(self, seed: int = 0, deterministic: bool = False):
        self.embed = nnx.Linear(DIM, DIM, rngs=nnx.Rngs(seed))
        self.blocks = stack(seed, deterministic=deterministic)

    def __call__(self, x):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def forward(h, block):
            return block(h)
        return jnp.tanh(forward(self.embed(x), self.blocks))


def remat_model(budget, scope="model", method="rotor", loss=None):
    """The same model, decorated: the scan line becomes ``self.run_blocks(h)``."""

    @remat_blocks("blocks", budget=budget, scope=scope, method=method, loss=loss)
    class Model(Plain):
        def __call__(self, x):
            return jnp.tanh(self.run_blocks(self.embed(x)))

    return Model


def squares(out):
    """The training step's loss of the model's outputs (``remat_blocks(..., loss=squares)``
    makes the whole-step fit measure the step that ``loss_fn`` trains)."""
    return jnp.mean(out ** 2)


def loss_fn(model, x):
    return squares(model(x))


@nnx.jit
def train_step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(loss_fn)(model, x)
    optimizer.update(model, grads)
    return loss, grads


@pytest.fixture(scope="module")
def x():
    return jax.random.normal(jax.random.key(0), (BATCH, DIM))


def assert_trees_equal(a, b, rtol=1e-5, atol=1e-6):
    def same(u, v):
        if jax.dtypes.issubdtype(u.dtype, jax.dtypes.prng_key):
            u, v = jax.random.key_data(u), jax.random.key_data(v)
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(same, a, b)


def train_both(remat, plain, x, steps=2):
    """Two training steps of each; losses, gradients and the whole state must agree."""
    opt_r = nnx.Optimizer(remat, optax.adam(1e-2), wrt=nnx.Param)
    opt_p = nnx.Optimizer(plain, optax.adam(1e-2), wrt=nnx.Param)
    for _ in range(steps):
        loss_r, grads_r = train_step(remat, opt_r, x)
        loss_p, grads_p = train_step(plain, opt_p, x)
        np.testing.assert_allclose(loss_r, loss_p, rtol=1e-5)
        assert_trees_equal(grads_r, grads_p)
    assert_trees_equal(nnx.state(remat), nnx.state(plain))


def test_is_scanned_stack():
    assert is_scanned_stack(stack(0, depth=2))
    assert not is_scanned_stack(nnx.List([Block(DIM, nnx.Rngs(0))]))


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [False, True])
def test_training_equals_the_plain_scan_and_fits_the_whole_step(x, deterministic):
    """Dropout on (the same masks from each layer's own stream, step after step) and off;
    BatchNorm statistics and RNG counters written back as nnx.scan writes them; the
    measured whole step within the budget and below the plain model's. The fit measures
    with the step's loss (``loss=squares``): what it probes is what trains."""
    remat = remat_model("80%", loss=squares)(deterministic=deterministic)
    plain = Plain(deterministic=deterministic)
    train_both(remat, plain, x)
    counts = nnx.state(remat.blocks)["dropout"]["rngs"]["count"].get_value()
    np.testing.assert_array_equal(counts, 0 if deterministic else 2)  # advanced once a step
    plain_memory = jaxremat.flax.activation_memory(plain, loss_fn, x)
    measured = jaxremat.flax.activation_memory(remat, loss_fn, x)
    plan = remat.plan_blocks(x)
    assert isinstance(plan, ScannedPlan) and plan.scope.scope == "model"
    assert measured == plan.scope.measured <= plan.scope.budget
    # "80%" of the step without remat (carrying the state updates costs L rows of the
    # non-parameter state: 0.4% here)
    assert plan.scope.budget == pytest.approx(0.8 * plain_memory, rel=1e-2)
    assert measured < plain_memory
    assert plan.scan.member.levels >= 1  # something is recomputed
    assert "whole training step" in str(plan) and "nested scans" in str(plan)


@pytest.mark.slow
def test_the_fit_probes_the_step_that_trains_with_unrolled_runs(x):
    """The whole-step fit measures, byte for byte, the program the training step runs, for
    a member whose last run of layers is unrolled (not a scan). Its tapes then live at the
    top level, and the step peaks at the start of the backward, where the loss's cotangent
    is live too, so the fit must measure with the step's loss (``loss=`` or ``fit_blocks``):
    the default loss, the sum of the outputs, holds a broadcast of ones there and
    mean(out ** 2) that and ``2 * out``: up to one output more (6144 B on JAX 0.10; 5160 B
    on 0.12, where the default's step peaks a few equations earlier). With the blocks' runs
    scanned (unroll=0) the peak was inside a loop, where the loss's cotangents are dead."""
    model = remat_model("80%", loss=squares)(deterministic=False)
    plan = model.plan_blocks(x)
    step = jaxremat.flax.activation_memory(model, loss_fn, x, detail=True)
    assert step.peak == plan.scope.measured <= plan.scope.budget
    assert plan.scan.member.sizes[-1] <= UNROLL and step.location[0][1] != "scan"
    summed = jaxremat.flax.activation_memory(model, lambda m, x: model_scope.summed(m(x)), x)
    assert 0 < step.peak - summed <= BATCH * DIM * 4


@pytest.mark.slow
def test_blocks_scope_byte_budget_and_method(x):
    """scope="blocks": the blocks' program (measured independently) fits the byte budget;
    method="every_layer" checkpoints every block; run_scanned equals the plain scan."""
    plain = Plain(seed=1)
    h = plain.embed(x)
    no_remat = plan_scanned(plain.blocks, h, budget="100%", owner="blocks").measured_peak
    budget = int(0.7 * no_remat)
    remat = remat_model(budget, scope="blocks")(seed=1)
    train_both(remat, Plain(seed=1), x, steps=1)

    def blocks_loss(model, h):
        return jnp.sum(run_scanned(model.blocks, h, budget=budget))
    assert jaxremat.flax.activation_memory(remat, blocks_loss, h) <= budget
    every = plan_scanned(plain.blocks, h, budget="100%", method="every_layer")
    assert every.scan.member.sizes == (1,)


def test_carry_that_changes_shape_points_to_lists(x):
    class Widen(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(DIM, 2 * DIM, rngs=rngs)

        def __call__(self, h):
            return self.linear(h)

    @nnx.split_rngs(splits=3)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
        return Widen(rngs)
    with pytest.raises(ValueError, match=r"nnx\.List.*remat_blocks.*remat_sequence"):
        run_scanned(create(nnx.Rngs(0)), x, budget="50%", owner="self.blocks")


def test_stacks_of_different_lengths_name_the_leaf(x):
    blocks = stack(0, depth=3)
    blocks.norm.mean.set_value(blocks.norm.mean.get_value()[:2])
    with pytest.raises(ValueError, match=r"self\.blocks\.dropout\.rngs\.count.*L = 3.*"
                                         r"self\.blocks\.norm\.mean.*L = 2"):
        run_scanned(blocks, x, budget="50%", owner="self.blocks")


def test_policies_are_passed_to_remat_scan(x, monkeypatch):
    """remat_blocks passes its checked policy menu through to remat_scan."""
    import jaxremat.flax.scanned as scanned
    seen = []

    def remat_scan(layer, budget, **settings):
        seen.append(settings["policies"])
        return jaxremat.remat_scan(layer, budget, **settings)
    monkeypatch.setattr(scanned, "remat_scan", remat_scan)

    @remat_blocks("blocks", budget="100%", scope="blocks", policies="dots_saveable")
    class Model(nnx.Module):
        def __init__(self):
            self.blocks = stack(3, depth=2, deterministic=True)

        def __call__(self, h):
            return self.run_blocks(h)
    model = Model()
    out = model(x[:8])
    assert seen == [jaxremat.sequence.policies.check_policies("dots_saveable")]  # planned once
    plain = nnx.scan(lambda h, b: b(h), in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    np.testing.assert_allclose(out, plain(x[:8], stack(3, depth=2, deterministic=True)),
                               rtol=1e-5, atol=1e-6)
