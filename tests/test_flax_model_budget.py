"""remat_blocks(scope="model"): the budget bounds the whole training step (embedding, blocks,
head, loss) as jaxremat.flax.activation_memory measures it, on the GPT and ResNet examples."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxremat
import jaxremat.flax
import solver
from jaxremat.measure.costs import lowered_costs
from jaxremat.flax import model_scope, remat_blocks

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    if f"example_{name}" not in sys.modules:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules[f"example_{name}"]


gpt = _example("gpt_nnx")
resnet = _example("resnet_nnx")
llama = _example("llama_nnx")


def _every_block(cls, before, after):
    """``cls`` with each block under its own nnx.remat (what a user writes by hand)."""
    return _under_policy(cls, before, after, None)


def _plain(cls, before, after):
    class Plain(cls):
        def __call__(self, *args):
            h = before(self, *args)
            for block in self.blocks:
                h = block(h)
            return after(self, h)

    return Plain


def _gpt_before(self, tokens):
    return self.tokens(tokens) + self.positions(jnp.arange(tokens.shape[-1]))


def _gpt_after(self, h):
    return self.out(self.norm(h))


ResNet = resnet.ResNet  # its residual blocks under remat_blocks (scope="model")


def _resnet_before(self, images):
    return self.stem(images)


def _resnet_after(self, h):
    return self.head(h)


def _gpt_case(depth=4, context=16, batch=8, dim=32):
    data = gpt.synthetic_sequences(jax.random.key(0), batch, context, 32)
    def make(cls):
        with jax.threefry_partitionable(False):  # quicker to compile on CPU
            return cls(32, dim, 4, depth, context, rngs=nnx.Rngs(0, dropout=1))

    return (make, gpt.GPT, _gpt_before, _gpt_after, gpt.loss_fn, (data,))


def _resnet_case():
    images, labels = resnet.synthetic_cifar(0, 8)
    images = images[:, :16, :16]

    def make(cls):
        with jax.threefry_partitionable(False):
            return cls((8, 16), 2, 10, rngs=nnx.Rngs(0))

    return (make, ResNet, _resnet_before, _resnet_after, resnet.loss_fn, (images, labels))


CASES = {"gpt": _gpt_case, "resnet": _resnet_case}


def _flops(model, loss_fn, *batch):
    step, params, rest = jaxremat.flax.meter.pure_step(model, loss_fn)
    return lowered_costs(jax.grad(step), params, rest, *batch)["flops"]


def _build(name):
    make, cls, before, after, loss_fn, batch = CASES[name]()
    plain = jaxremat.flax.activation_memory(make(_plain(cls, before, after)), loss_fn, *batch)
    every_model = make(_every_block(cls, before, after))
    every = jaxremat.flax.activation_memory(every_model, loss_fn, *batch)
    fits = {}

    def fit(share):
        """The model fitted at ``share`` of the plain step, and its plan: fitted once per
        module (a fit measures the whole step many times), for every test that reads it."""
        if share not in fits:
            model = make(cls)
            model.remat_budget = int(share * plain)
            fits[share] = model, model.fit_blocks(loss_fn, *batch)
        return fits[share]

    return dict(name=name, make=lambda: make(cls), loss_fn=loss_fn, batch=batch,
                plain=plain, every=every, every_flops=_flops(every_model, loss_fn, *batch),
                fit=fit)


@pytest.fixture(scope="module")
def cases():
    """``cases(name)``: the model's case, built once per module on first use."""
    built = {}
    return lambda name: built[name] if name in built else built.setdefault(name, _build(name))


@pytest.fixture(scope="module", params=[  # the GPT's case builds in 12 s: slow tier
    pytest.param(name, marks=pytest.mark.slow) if name == "gpt" else name for name in CASES])
def case(request, cases):
    return cases(request.param)


# The ResNet's share by default (the whole step measured within the budget, the blocks
# rematerialized to fit), the others in the slow tier (the GPT's fits: 13-16 s each).
@pytest.mark.parametrize("name, share", [
    pytest.param("gpt", 0.8, marks=pytest.mark.slow),
    pytest.param("gpt", 0.6, marks=pytest.mark.slow),
    pytest.param("resnet", 0.8, marks=pytest.mark.slow), ("resnet", 0.6)])
def test_the_measured_whole_step_is_within_the_budget(cases, name, share):
    case = cases(name)
    model, plan = case["fit"](share)
    budget = int(share * case["plain"])
    measured = jaxremat.flax.activation_memory(model, case["loss_fn"], *case["batch"])
    assert measured == plan.scope.measured <= budget == plan.scope.budget
    assert plan.scope.no_remat == case["plain"]
    # the blocks are rematerialized to fit: a block's forward again, or a checkpoint policy's
    # recomputation in its backward (the GPT's blocks fit by name groups alone)
    assert max(plan.forward_counts) > 1 or set(plan.options) != {"everything"}
    text = str(plan)
    assert "the whole training step (loss_fn(model, *batch))" in text and "blocks budget" in text


@pytest.mark.parametrize("name", [pytest.param("gpt", marks=pytest.mark.slow), "resnet"])
def test_at_the_memory_of_nnx_remat_on_every_block_the_plan_fits(cases, name):
    """(The GPT's fit: 22 s in CI's default tier, slow.)"""
    case = cases(name)
    model = case["make"]()
    model.remat_budget = case["every"]
    plan = model.fit_blocks(case["loss_fn"], *case["batch"])
    measured = jaxremat.flax.activation_memory(model, case["loss_fn"], *case["batch"])
    assert measured <= case["every"] < case["plain"]
    # never more flops than nnx.remat on every block at its own memory
    assert _flops(model, case["loss_fn"], *case["batch"]) <= case["every_flops"] * (1 + 1e-6)
    assert plan.scope.measured == measured


@pytest.mark.slow  # about 8 s
def test_the_head_at_the_turn_is_charged_to_the_last_block():
    """The head and the loss run between the last block's forward and its backward, beside
    the last block's tape: the blocks' chain charges their memory there
    (jaxremat.flax.nnx.with_turn). Before, Rotor kept the last block's whole tape (nearly free
    in the chain: its backward follows at once) and the measured step paid the head on top,
    so at the memory of nnx.remat on every block of this Llama-style model (its logits 4x its
    width) only every-layer checkpointing fitted; now a plan with fewer flops does."""
    vocab, dim, heads, kv_heads, depth, hidden, length, n = 128, 32, 4, 2, 3, 64, 16, 2
    batch = llama.progressions(0, n, length, vocab)
    make = lambda cls: cls(vocab, dim, heads, kv_heads, depth, hidden,  # noqa: E731
                           rngs=nnx.Rngs(0))
    every = make(_every_block(llama.Llama, lambda self, t: self.embed(t),
                              lambda self, h: self.head(self.norm(h))))
    memory = jaxremat.flax.activation_memory(every, llama.loss_fn, *batch)
    model = make(llama.Llama)
    model.remat_budget = memory
    plan = model.fit_blocks(llama.loss_fn, *batch)
    assert jaxremat.flax.activation_memory(model, llama.loss_fn, *batch) <= memory
    assert plan.method == "rotor"
    assert _flops(model, llama.loss_fn, *batch) < 0.95 * _flops(every, llama.loss_fn, *batch)
    llama.check_gradients(model, make(llama.PlainLlama), *batch)


def test_shares_are_of_the_whole_step_and_over_100_percent_is_no_remat(case):
    model = case["make"]()
    model.remat_budget = "150%"
    plan = model.fit_blocks(case["loss_fn"], *case["batch"])
    assert plan.forward_counts == [1] * len(plan.forward_counts)
    assert plan.scope.budget == int(1.5 * case["plain"]) and plan.scope.measured == case["plain"]
    assert "the budget exceeds what the plain model needs" in str(plan)
    model.remat_budget = "1%"
    with pytest.raises(solver.InfeasibleBudget, match=r"whole step.*scope='blocks'"):
        model.fit_blocks(case["loss_fn"], *case["batch"])


@pytest.mark.parametrize("name, share", [
    ("resnet", 0.6), pytest.param("gpt", 0.8, marks=pytest.mark.slow)])  # GPT: a 20 s fit
def test_the_training_step_uses_the_fitted_plan(cases, monkeypatch, name, share):
    # (gradients equal the plain loop's: tests/test_flax_nnx.py, whose towers use this scope)
    case = cases(name)
    model, fitted = case["fit"](share)  # shared with test_the_measured_whole_step_is_within...
    assert max(fitted.forward_counts) > 1 or set(fitted.options) != {"everything"}  # remats
    loss_fn, batch = case["loss_fn"], case["batch"]
    # the shared fit may have left model_scope's LRU since (other modules' fits in this
    # worker): fitting again is a cache hit, else the same plan made again
    assert model.fit_blocks(loss_fn, *batch).schedule.plan == fitted.schedule.plan
    calls = []
    monkeypatch.setattr(model_scope, "activation_memory",
                        lambda *a, **k: calls.append(a) or 0)  # would break a new fit
    grads = nnx.eval_shape(lambda m, *b: nnx.grad(loss_fn)(m, *b), model, *batch)  # traced
    assert jax.tree.leaves(grads) and not calls  # the step found the fitted plan
    call = batch[0][:, :-1] if name == "gpt" else batch[0]  # the model's argument
    assert model.plan_blocks(call).schedule.plan == fitted.schedule.plan
    assert not calls


BASIC = ("dots", "dots_no_batch", "names")  # the default menu but its searched options: tests
# of what a budget's scope means need no search (the default-menu tests above do one)


@pytest.mark.slow  # 13-17 s: a whole-step fit of the GPT
def test_without_a_fit_the_step_is_measured_with_a_loss_of_the_outputs():
    make, cls, _, _, loss_fn, (data,) = _gpt_case(depth=3, context=8, batch=4, dim=16)

    def cross_entropy(logits):  # labels do not change memory: zeros stand in for them
        return gpt.optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.zeros(logits.shape[:-1], jnp.int32)).mean()

    Measured = remat_blocks("blocks", budget="45%", loss=cross_entropy, name="run",
                            policies=BASIC)(
        type("GPTWithLoss", (cls,), {"__call__": lambda self, t: _gpt_after(
            self, self.run(_gpt_before(self, t)))}))
    model = make(Measured)
    plan = model.plan_blocks(data[:, :-1])  # the model's arguments, with scope="model"
    assert "cross_entropy(outputs)" in str(plan)
    measured = jaxremat.flax.activation_memory(model, loss_fn, data)
    assert measured <= plan.scope.budget


def test_scope_blocks_keeps_the_blocks_only_meaning():
    make, cls, before, after, loss_fn, (data,) = _gpt_case(depth=3, context=8, batch=4, dim=16)
    Blocks = remat_blocks("blocks", budget="50%", scope="blocks", name="run", policies=BASIC)(
        type("GPTBlocks", (cls,), {"__call__": lambda self, t: after(self, self.run(before(self, t)))}))
    model = make(Blocks)
    hidden = _gpt_before(model, data[:, :-1])
    plan = model.plan_blocks(hidden)  # the blocks' input, with scope="blocks"
    assert plan.budget == int(0.5 * plan.no_remat_peak)
    assert "the blocks only (scope='blocks')" in str(plan)
    with pytest.raises(ValueError, match="scope must be one of"):
        remat_blocks("blocks", budget="50%", scope="everything")
    with pytest.raises(ValueError, match="scope='blocks'"):
        model.fit_blocks(loss_fn, data)


class _TanhBlock(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.linear = nnx.Linear(16, 16, rngs=rngs)

    def __call__(self, h):
        return jnp.tanh(self.linear(h))


@remat_blocks("blocks", budget="60%")
class _Tower(nnx.Module):
    def __init__(self):
        rngs = nnx.Rngs(0)
        self.embed = nnx.Linear(16, 16, rngs=rngs)
        self.blocks = nnx.List([_TanhBlock(rngs) for _ in range(6)])
        self.head = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.head(self.run_blocks(self.embed(x)))


def test_under_nnx_vmap_the_budget_is_the_whole_batch_step():
    plain_cls = _plain(_Tower, lambda self, x: self.embed(x), lambda self, h: self.head(h))
    examples = jax.random.normal(jax.random.key(1), (5, 8, 16))

    def loss_fn(model, examples):
        return jnp.mean(nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(model, examples) ** 2)

    model, plain = _Tower(), plain_cls()
    got, want = nnx.grad(loss_fn)(model, examples), nnx.grad(loss_fn)(plain, examples)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    whole = jaxremat.flax.activation_memory(plain, loss_fn, examples)
    measured = jaxremat.flax.activation_memory(model, loss_fn, examples)
    assert measured <= int(0.6 * whole) < whole  # fitted per example, for the batch of 5


def _under_policy(cls, before, after, policy):
    """``cls`` with each block under ``nnx.remat(policy=...)``: MaxText's uniform remat_policy
    (``None``: nnx.remat's default, nothing saved)."""

    class Uniform(cls):
        def __call__(self, *args):
            h = before(self, *args)
            for block in self.blocks:
                h = nnx.remat(lambda b, h: b(h), policy=policy)(block, h)
            return after(self, h)

    return Uniform


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["dots_with_no_batch_dims_saveable", "dots_saveable"])
def test_at_the_memory_of_a_uniform_policy_the_fit_costs_no_more_flops(policy):
    """At the measured memory of one policy on every block, the fitted plan fits and costs
    no more flops than the policy (planned with flop costs): the uniform plans are candidates
    of the whole-step search (the bisection alone settled 0.4 % above dots_no_batch here)."""
    make, cls, before, after, loss_fn, batch = _gpt_case(depth=6, context=32, batch=16)
    uniform = make(_under_policy(cls, before, after, getattr(jax.checkpoint_policies, policy)))
    memory = jaxremat.flax.activation_memory(uniform, loss_fn, *batch)
    model = make(remat_blocks("blocks", costs="flops")(type("GPTFlops", (cls,), {})))
    model.remat_budget = memory
    plan = model.fit_blocks(loss_fn, *batch)
    assert jaxremat.flax.activation_memory(model, loss_fn, *batch) <= memory
    assert _flops(model, loss_fn, *batch) <= _flops(uniform, loss_fn, *batch) * (1 + 1e-6)
    assert plan.scope.measured <= memory


def test_the_fit_fills_the_room_the_bisection_leaves():
    """The bisection stops within 1% of the blocks' peak; the fit then probes the room the
    measured step leaves below the budget: with the step around the blocks constant (here
    50 kB) it lands on the largest blocks' budget that fits, to the byte."""
    top, least, around, budget = 1_000_000, 200_000, 50_000, 587_654

    class Probed:  # what the search reads of a plan: its budget, peak and predicted time
        def __init__(self, blocks):
            self.budget, self.no_remat_peak = blocks, top
            self.predicted_time = 2.0 - (blocks - least) / (top - least)

    def measured(choice):
        named = {model_scope.NO_REMAT: top, model_scope.LEAST: least}
        blocks = named.get(choice["budget"], choice["budget"])
        return blocks + around, {"plan": Probed(blocks)}

    choice, note, plan = model_scope._search(measured, budget, method="rotor", batch=1,
                                             step="loss_fn(model, *batch)")
    assert choice == {"budget": budget - around, "method": "rotor"}
    assert note.measured == budget and plan.budget == budget - around
