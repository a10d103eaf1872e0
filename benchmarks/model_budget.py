"""Whole-step budgets of ``remat_blocks`` (scope="model") against ``nnx.remat`` on every block.

For the GPT of ``examples/gpt_nnx.py`` and the ResNet of ``examples/resnet_nnx.py`` (its
residual blocks under ``remat_blocks``, stem and head outside), prints the whole training
step's program-order memory (``jaxremat.flax.activation_memory``: parameters and their
gradients excluded) as a share of the plain model's, and the gradient's flops
(``cost_analysis`` before XLA optimises) against ``nnx.remat`` on every block:

* ``every block``: each block under its own ``nnx.remat``;
* ``fitted @ every``: ``model.fit_blocks(loss_fn, *batch)`` with the memory that
  ``every block`` measures as the budget;
* ``fitted @ s``: the same at a share ``s`` of the plain step.

    python benchmarks/model_budget.py            # small sizes, about a minute on 2 CPU cores
    python benchmarks/model_budget.py --issue    # adds the GPT of issue 16 (width 128, 8 blocks)
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jaxremat.flax  # noqa: E402
from jaxremat.measure.costs import lowered_costs  # noqa: E402
from jaxremat.flax.meter import pure_step  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpt = _example("gpt_nnx")
resnet = _example("resnet_nnx")


def _variants(cls, before, after):
    """``cls`` with its blocks looped plainly, and each under its own ``nnx.remat``."""

    def loop(remat: bool):
        def __call__(self, *args):
            h = before(self, *args)
            for block in self.blocks:
                h = nnx.remat(lambda b, h: b(h))(block, h) if remat else block(h)
            return after(self, h)
        return type(cls.__name__ + ("Every" if remat else "Plain"), (cls,), {"__call__": __call__})

    return loop(False), loop(True)


ResNet = resnet.ResNet  # its residual blocks under remat_blocks (scope="model")


def _flops(model, loss_fn, *batch) -> float:
    step, params, rest = pure_step(model, loss_fn)
    return lowered_costs(jax.grad(step), params, rest, *batch)["flops"]


def compare(name: str, make, cls, before, after, loss_fn, batch, shares) -> None:
    plain_cls, every_cls = _variants(cls, before, after)
    measure = lambda model: jaxremat.flax.activation_memory(model, loss_fn, *batch)  # noqa: E731
    plain_model, every_model = make(plain_cls), make(every_cls)
    plain, every = measure(plain_model), measure(every_model)
    plain_flops, every_flops = _flops(plain_model, loss_fn, *batch), _flops(every_model, loss_fn, *batch)
    print(f"\n== {name}: whole step without remat {jaxremat.format_bytes(plain)} ==")
    print(f"{'':>16} {'memory':>11} {'of plain':>9} {'flops/plain':>12} {'flops/every':>12}  plan")
    print(f"{'every block':>16} {jaxremat.format_bytes(every):>11} {every / plain:>9.3f} "
          f"{every_flops / plain_flops:>12.3f} {1:>12.3f}  nnx.remat on each block")
    for label, budget in [("fitted @ every", every)] + [(f"fitted @ {s}", s) for s in shares]:
        model = make(cls)
        model.remat_budget = budget
        plan = model.fit_blocks(loss_fn, *batch)
        memory, flops = measure(model), _flops(model, loss_fn, *batch)
        assert memory <= plan.scope.budget
        print(f"{label:>16} {jaxremat.format_bytes(memory):>11} {memory / plain:>9.3f} "
              f"{flops / plain_flops:>12.3f} {flops / every_flops:>12.3f}  {plan.method}: "
              f"{plan.decisions().count('store tape')} of {len(plan.decisions())} tapes stored")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--issue", action="store_true", help="add the width-128, 8-block GPT")
    args = parser.parse_args(argv)
    gpt_before = lambda self, t: self.tokens(t) + self.positions(jnp.arange(t.shape[-1]))  # noqa: E731
    gpt_after = lambda self, h: self.out(self.norm(h))  # noqa: E731
    configs = [(32, 32, 4, 6, 32, 16)] + ([(256, 128, 4, 8, 128, 8)] if args.issue else [])
    for vocab, dim, heads, depth, context, batch in configs:
        data = gpt.synthetic_sequences(jax.random.key(0), batch, context, vocab)

        def make(cls, vocab=vocab, dim=dim, heads=heads, depth=depth, context=context):
            with jax.threefry_partitionable(False):
                return cls(vocab, dim, heads, depth, context, rngs=nnx.Rngs(0, dropout=1))

        compare(f"GPT (examples/gpt_nnx.py): width {dim}, {depth} blocks, context {context}, "
                f"batch {batch}", make, gpt.GPT, gpt_before, gpt_after, gpt.loss_fn, (data,),
                ["50%", "30%"])
    images, labels = resnet.synthetic_cifar(0, 16)

    def make_resnet(cls):
        with jax.threefry_partitionable(False):
            return cls((8, 16, 32), 2, 10, rngs=nnx.Rngs(0))

    compare("ResNet (examples/resnet_nnx.py blocks): widths (8, 16, 32), 6 residual blocks, "
            "batch 16 of 32x32x3", make_resnet, ResNet, lambda self, x: self.stem(x),
            lambda self, h: self.head(h), resnet.loss_fn, (images, labels), ["80%", "60%"])


if __name__ == "__main__":
    main()
