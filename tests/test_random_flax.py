"""The Flax NNX wrappers end to end on random small models (issue 18, branch ``fuzz``).

Each example draws a model of 2-5 residual blocks of width 8 or 16, each block a random run
of ``nnx.Linear`` (then ``tanh``), ``nnx.LayerNorm``, ``nnx.BatchNorm`` (train mode) and
``nnx.Dropout`` (an ``rngs`` stream), between an embedding ``Linear`` and a head, a batch,
a wrapper and a budget share ("30%".."90%"):

* ``remat_blocks`` on a list of blocks (``nnx.List``), the whole step as the budget's scope;
* ``remat_blocks`` on a scanned stack (one block ``nnx.vmap``-built, run by ``nnx.scan`` in
  the plain model, by ``run_blocks`` in the wrapped one);
* ``RematModule`` around the plain list model.

Then one training step of each from the same state checks what the wrappers promise: the
gradients of the plain model (Dropout: the same rng stream), its updated state (BatchNorm
statistics, RNG counters), and the measured memory within the budget as the wrapper
defines it: ``jaxremat.flax.activation_memory`` of the step (sum of the outputs as the
loss) against the share of the plain step's for ``remat_blocks``; the plan's own
measurement (``activation_memory`` of its pure function, the module's whole state as its
parameters) against the share of the plain module's for ``RematModule``. A share the
wrapper cannot fit must raise ``solver.InfeasibleBudget`` whose ``min_budget`` fits.

About 150 such models on JAX 0.10.2 and 0.12 (benchmarks/RESULTS.md, "random scanned
blocks and Flax models") found no step over its budget and no state or gradient that
differs. A scanned stack's share is of the wrapper's own step without remat, which
measured up to 1.067 of the plain ``nnx.scan`` model's step on these tiny models (the
stacked BatchNorm statistics and RNG counters its scan carries, documented in
``jaxremat.flax.scanned``), so the budget is read from the plan's scope note.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings, strategies as st

import jaxremat
import jaxremat.flax
import solver
from jaxremat.flax import RematModule, remat_blocks

PARTS = ("linear", "layernorm", "batchnorm", "dropout")
WRAPPERS = ("list", "scanned", "module")


class Block(nnx.Module):
    """``x + f(x)``, ``f`` the run of ``parts`` (a Linear is followed by ``tanh``)."""

    def __init__(self, parts: tuple[str, ...], width: int, rngs: nnx.Rngs):
        made = []
        for part in parts:
            if part == "linear":
                made.append(nnx.Linear(width, width, rngs=rngs))
            elif part == "layernorm":
                made.append(nnx.LayerNorm(width, rngs=rngs))
            elif part == "batchnorm":
                made.append(nnx.BatchNorm(width, rngs=rngs))
            else:
                made.append(nnx.Dropout(0.3, rngs=rngs))
        self.parts = nnx.List(made)

    def __call__(self, x):
        h = x
        for part in self.parts:
            h = part(h)
            if isinstance(part, nnx.Linear):
                h = jnp.tanh(h)
        return x + h


class Plain(nnx.Module):
    """Embedding, blocks, head. ``scanned``: one block kind, ``nnx.vmap``-built, run by
    ``nnx.scan``; else an ``nnx.List`` of the blocks."""

    def __init__(self, blocks, width: int, scanned: bool, seed: int):
        rngs = nnx.Rngs(seed, dropout=seed + 1)
        self.embed = nnx.Linear(6, width, rngs=rngs)
        self.scanned = scanned
        if scanned:
            @nnx.split_rngs(splits=len(blocks))
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def create(rngs):
                return Block(blocks[0], width, rngs)
            self.blocks = create(rngs)
        else:
            self.blocks = nnx.List([Block(parts, width, rngs) for parts in blocks])
        self.head = nnx.Linear(width, 3, rngs=rngs)

    def run(self, h):
        if self.scanned:
            @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
            def forward(h, block):
                return block(h)
            return forward(h, self.blocks)
        for block in self.blocks:
            h = block(h)
        return h

    def __call__(self, x):
        return self.head(self.run(self.embed(x)))


def wrapped(budget):
    @remat_blocks("blocks", budget=budget)
    class Remat(Plain):
        def __call__(self, x):
            return self.head(self.run_blocks(self.embed(x)))
    return Remat


@st.composite
def specs(draw):
    """``(blocks, width, batch, wrapper, seed, percent)``: the blocks' parts (one block's,
    repeated, for a scanned stack), width, batch, wrapper, seed and budget share."""
    wrapper = draw(st.sampled_from(WRAPPERS))
    block = st.lists(st.sampled_from(PARTS), min_size=1, max_size=4).map(tuple)
    depth = draw(st.integers(2, 5))
    blocks = ((draw(block),) * depth if wrapper == "scanned" else
              tuple(draw(block) for _ in range(depth)))
    return (blocks, draw(st.sampled_from((8, 16))), draw(st.sampled_from((4, 8, 16))), wrapper,
            draw(st.integers(0, 2**16)), draw(st.integers(30, 90)))


def summed(model, x):
    return jnp.sum(model(x))


def step(model, x):
    """One gradient step's loss and gradients (the model's state is updated in place)."""
    return nnx.value_and_grad(summed)(model, x)


def assert_trees_close(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)

    def close(u, v):
        if jax.dtypes.issubdtype(u.dtype, jax.dtypes.prng_key):
            u, v = jax.random.key_data(u), jax.random.key_data(v)
        u, v = np.asarray(u), np.asarray(v)
        np.testing.assert_allclose(u, v, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(v).max())))
    jax.tree.map(close, a, b)


def build(blocks, width, batch, wrapper, seed, percent):
    """The plain model, the wrapped one (the same state) and the input."""
    plain = Plain(blocks, width, wrapper == "scanned", seed)
    x = jax.random.normal(jax.random.key(seed), (batch, 6))
    if wrapper == "module":
        return plain, RematModule(Plain(blocks, width, False, seed), budget=f"{percent}%"), x
    model = wrapped(f"{percent}%")(blocks, width, wrapper == "scanned", seed)
    return plain, model, x


def measured_and_budget(plain, model, x, wrapper):
    """The measured memory of the wrapped model's step, the bytes its budget means, and
    the no-remat memory the wrapper takes a share of, as the wrapper defines them:
    ``remat_blocks`` measures the whole step (``jaxremat.flax.activation_memory``) against a
    share of its own step with the blocks unrematerialized (the plan's scope note);
    ``RematModule`` measures its pure function against a share of the plain module's."""
    if wrapper == "module":
        plan = model.plan(x)
        return plan.measured, plan.budget, None
    note = model.plan_blocks(x).scope
    measured = jaxremat.flax.activation_memory(model, summed, x)
    assert measured == note.measured, (measured, note)
    return measured, note.budget, note.no_remat


def check(spec):
    """Run one example; return its figures: measured / budget, and the no-remat step the
    share is of against the plain model's step (``None`` where the share is infeasible:
    then the least budget named was planned and measured instead)."""
    blocks, width, batch, wrapper, seed, percent = spec
    plain, model, x = build(*spec)
    try:
        measured, budget, no_remat = measured_and_budget(plain, model, x, wrapper)
    except solver.InfeasibleBudget as error:
        least = int(np.ceil(error.min_budget))
        if wrapper == "module":
            model = RematModule(Plain(blocks, width, False, seed), budget=least)
        else:
            model.remat_budget = least
        measured, _, _ = measured_and_budget(plain, model, x, wrapper)
        assert measured <= least, (measured, least)
        return {"least": measured / least}
    assert measured <= budget, (measured, budget)
    full = jaxremat.flax.activation_memory(plain, summed, x)
    loss_r, grads_r = step(model, x)
    loss_p, grads_p = step(plain, x)
    np.testing.assert_allclose(loss_r, loss_p, rtol=1e-4)  # float32 sums (1.2e-5 seen)
    inner = model.module if wrapper == "module" else model
    assert_trees_close(grads_r["module"] if wrapper == "module" else grads_r, grads_p)
    assert_trees_close(nnx.state(inner, nnx.Not(nnx.Param)), nnx.state(plain, nnx.Not(nnx.Param)))
    figures = {"budget": measured / budget, "plain": measured / full,
               "reference": None if no_remat is None else no_remat / full}
    if wrapper == "module":  # the whole step as jaxremat.flax.activation_memory measures it
        figures["step"] = jaxremat.flax.activation_memory(model, summed, x) / budget
    return figures


@pytest.mark.slow  # about 4 s an example
@settings(max_examples=12, deadline=None)
@given(specs())
def test_random_flax_models_fit_their_budget_and_train_as_the_plain_model(spec):
    check(spec)
