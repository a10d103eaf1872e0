"""Whole-step budgets of ``remat_blocks`` (scope="model") against uniform policies on every block.

For the GPT of ``examples/gpt_nnx.py``, the ResNet of ``examples/resnet_nnx.py`` (its residual
blocks under ``remat_blocks``, stem and head outside), the ViT of ``examples/vit_nnx.py``
(patch embedding and head outside) and, with ``--models llama``, the Llama-style decoder of
``examples/llama_nnx.py`` (a model written without jaxremat in mind: RMSNorm, grouped-query
attention with rotary embeddings, SwiGLU; embedding, final norm and head outside), prints the whole training step's program-order memory
(``jaxremat.flax.activation_memory``: parameters and their gradients excluded) as a share of
the plain model's, and the gradient's flops (``cost_analysis`` before XLA optimises):

* ``every block``: each block under its own ``nnx.remat`` (``nothing_saveable``, what a user
  writes first; MaxText's ``remat_policy=full``); ``dots_no_batch`` / ``dots``: each block
  under ``nnx.remat(policy=...)`` with ``dots_with_no_batch_dims_saveable`` (MaxText's
  ``minimal`` before it named its values) / ``dots_saveable``;
* for the GPT and the ViT, whose blocks mark their projections with MaxText's
  ``checkpoint_name`` names, MaxText's ``remat_policy`` presets (:data:`MAXTEXT`:
  ``save_out_proj``, ``save_qkv_proj``, ``save_dot_except_mlp``, ...): each block under
  ``nnx.remat(policy=save_only_these_names(...))`` with the preset's names;
* ``fitted @ P``: ``model.fit_blocks(loss_fn, *batch)`` with the memory that the uniform
  policy ``P`` measures as the budget (one fit for policies of equal memory); its flops
  over ``P``'s (the target: at most 1);
* ``fitted @ s``: the same at a share ``s`` of the plain step, and at the midpoints between
  consecutive uniform memories (``fitted @ 0.232``: that share), its flops over those of the
  cheapest uniform policy whose measured memory fits ("-" where none fits) and whether its
  overhead over the plain step is at most half that policy's (:func:`_half`, issue 17.6).
  Each fitted row ends with the fit's CPU seconds (``time.process_time``; a menu's first fit
  profiles the blocks, later ones reuse the profiles).

    python benchmarks/model_budget.py            # small sizes, ~15 minutes on 2 CPU cores
    python benchmarks/model_budget.py --models gpt,vit --policies plus   # the MaxText table
    python benchmarks/model_budget.py --models vit
    python benchmarks/model_budget.py --models llama    # ~2 minutes on 2 CPU cores
    python benchmarks/model_budget.py --issue    # adds the GPT of issue 16 (width 128, 8 blocks)
    python benchmarks/model_budget.py --costs static   # the blocks planned by the roofline
    python benchmarks/model_budget.py --large           # GPU sizes: ViT-S/16 at 224x224, ...
    python benchmarks/model_budget.py --policies default,ranked   # the fitted rows per menu

On a GPU (or with ``--device-columns on``) each row also gets the jitted gradient's compiled
temp memory (``memory_analysis``), its median step time and that time over the uniform
policy's it is compared with (on CPU XLA undoes remat, so those columns say nothing there).

``--policies`` names the policy menus the blocks are planned with (comma-separated; the
fitted rows are repeated per menu, labelled with it): ``default``, ``none`` (the whole tape
only), ``ranked`` (the default and ``"dots_ranked"``, issue 17.6), ``plus`` (the default and
``"dots_plus"``). ``--uniform`` restricts the uniform rows (and so the fitted ones) to some
labels, e.g. ``--uniform "every block,save_qkv_proj"``.

The blocks are planned with ``--costs`` (default ``flops``, what the table compares; the
examples' default is ``static``, the roofline, which may trade flops for memory traffic).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jaxremat.flax  # noqa: E402
from jaxremat.flax import remat_blocks  # noqa: E402
from jaxremat.measure.costs import lowered_costs  # noqa: E402
from jaxremat.flax.meter import pure_step  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from jax_memory import compiled_columns  # noqa: E402
from policies import MENUS  # noqa: E402  (the menus by --policies name)

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpt = _example("gpt_nnx")
resnet = _example("resnet_nnx")
vit = _example("vit_nnx")
llama = _example("llama_nnx")


UNIFORM = {"every block": "nothing_saveable", "dots_no_batch": "dots_with_no_batch_dims_saveable",
           "dots": "dots_saveable"}
"""The uniform ``jax.checkpoint_policies`` policies every model is compared with, by label."""

_QKV = ("query_proj", "value_proj", "key_proj", "qkv_proj")
_MINIMAL = _QKV + ("out_proj", "mlpwi_0", "mlpwi_1", "mlpwi", "mlpwo")
MAXTEXT = {
    "save_out_proj": ("out_proj",),
    "save_qkv_proj": _QKV,
    "save_dot_except_mlp": _QKV + ("out_proj",),
    "save_dot_except_mlpwi": _QKV + ("out_proj", "mlpwo"),
    "save_dot_with_context_except_mlp": _QKV + ("context", "out_proj"),
    "minimal": _MINIMAL,
    "minimal_with_context": _MINIMAL + ("context",),
}
"""MaxText's ``remat_policy`` presets built on ``save_only_these_names``, with the names each
keeps (MaxText's ``Decoder.get_remat_policy`` and ``minimal_policy``, 2025-26; its
``minimal`` was ``dots_with_no_batch_dims_saveable`` before). Its blocks mark
``query_proj``/``key_proj``/``value_proj`` (or a fused ``qkv_proj``), ``context`` (the
attention's output), ``out_proj``, ``mlpwi`` (or ``mlpwi_0``/``mlpwi_1`` when gated) and
``mlpwo``, as the GPT and ViT examples do."""


_WIDTH = 41  # the label column: "fitted @ save_dot_with_context_except_mlp"


def _policy(uniform: str | tuple[str, ...]):
    """The ``jax.checkpoint`` policy of a :data:`UNIFORM` or :data:`MAXTEXT` entry."""
    if isinstance(uniform, tuple):
        return jax.checkpoint_policies.save_only_these_names(*uniform)
    return getattr(jax.checkpoint_policies, uniform)


def _looped(cls, before, after, policy: str | tuple[str, ...] | None):
    """``cls`` with its blocks looped plainly (``policy`` None), or each block under its own
    ``nnx.remat`` with the policy of a :data:`UNIFORM` value or :data:`MAXTEXT` names."""

    def __call__(self, *args):
        h = before(self, *args)
        for block in self.blocks:
            if policy is None:
                h = block(h)
            else:
                h = nnx.remat(lambda b, h: b(h), policy=_policy(policy))(block, h)
        return after(self, h)

    return type(f"{cls.__name__}_{policy and 'remat' or 'plain'}", (cls,), {"__call__": __call__})


def _described(policy: str | tuple[str, ...]) -> str:
    if isinstance(policy, tuple):
        return f"save_only_these_names({', '.join(policy)}) on each block"
    return f"nnx.remat({policy}) on each block"


ResNet = resnet.ResNet  # its residual blocks under remat_blocks (scope="model")


def _flops(model, loss_fn, *batch) -> float:
    step, params, rest = pure_step(model, loss_fn)
    return lowered_costs(jax.grad(step), params, rest, *batch)["flops"]


def _device(model, loss_fn, batch) -> tuple[int, float]:
    """``(compiled temp bytes, median step seconds)`` of the jitted gradient of the whole
    step (:func:`jax_memory.compiled_columns`)."""
    step, params, rest = pure_step(model, loss_fn)
    _, temp, seconds = compiled_columns(lambda p, a: step(p, a[0], *a[1]), params, (rest, batch))
    return temp, seconds


def _device_cells(cols, reference) -> str:
    if cols is None:
        return ""
    ratio = f"{cols[1] / reference[1]:>8.3f}" if reference else f"{'-':>8}"
    return f" {cols[0] / 2**20:>9.1f} {cols[1] * 1e3:>8.2f} {ratio}"


def compare(name: str, make, cls, before, after, loss_fn, batch, shares, costs: str,
            device: bool = False, menus: tuple[str, ...] = ("default",),
            policies: dict[str, str | tuple[str, ...]] = UNIFORM) -> None:
    looped = functools.partial(_looped, cls, before, after)  # plain or uniform: the user's loop
    # the example's class, its blocks planned with ``costs`` and each menu (a subclass each)
    fitted = {menu: remat_blocks("blocks", costs=costs, policies=MENUS[menu])(
        type(cls.__name__, (cls,), {})) for menu in menus}
    measure = lambda model: jaxremat.flax.activation_memory(model, loss_fn, *batch)  # noqa: E731
    plain_model = make(looped(None))
    plain, plain_flops = measure(plain_model), _flops(plain_model, loss_fn, *batch)
    print(f"\n== {name}: whole step without remat {jaxremat.format_bytes(plain)} ==")
    print(f"{'':>{_WIDTH}} {'memory':>11} {'of plain':>9} {'flops/plain':>12} {'flops/policy':>13}"
          + (f" {'temp MiB':>9} {'step ms':>8} {'step/pol':>8}" if device else "") + "  plan")
    uniform, steps = {}, {}
    for label, policy in policies.items():
        model = make(looped(policy))
        uniform[label] = measure(model), _flops(model, loss_fn, *batch)
        steps[label] = _device(model, loss_fn, batch) if device else None
        memory, flops = uniform[label]
        print(f"{label:>{_WIDTH}} {jaxremat.format_bytes(memory):>11} {memory / plain:>9.3f} "
              f"{flops / plain_flops:>12.3f} {1:>13.3f}{_device_cells(steps[label], steps[label])}"
              f"  {_described(policy)}")
    tag = lambda menu: "" if menus == ("default",) else f"{menu}: "  # noqa: E731
    budgets = [(menu, f"{tag(menu)}fitted @ {label}", memory, label)
               for menu in menus for label, (memory, _) in uniform.items()]
    budgets += [(menu, f"{tag(menu)}fitted @ {s}", s, None) for menu in menus for s in shares]
    budgets += [(menu, f"{tag(menu)}fitted @ {mid / plain:.3f}", mid, None)
                for menu in menus for mid in _between(m for m, _ in uniform.values())]
    fits = {}  # (menu, budget): the fitted model, its plan, memory and flops
    for menu, label, budget, policy in budgets:
        between = policy is None  # a share or a midpoint: the half-overhead target
        if between:  # the cheapest uniform policy that fits it
            share = float(budget.rstrip("%")) / 100 * plain if isinstance(budget, str) else budget
            fitting = [k for k, (m, _) in uniform.items() if m <= share]
            policy = min(fitting, key=lambda k: uniform[k][1]) if fitting else None
        if (menu, budget) not in fits:  # presets of the same memory: one fit
            model = make(fitted[menu])
            model.remat_budget = budget
            start = time.process_time()
            plan = model.fit_blocks(loss_fn, *batch)
            seconds = time.process_time() - start
            fits[menu, budget] = (model, plan, measure(model), _flops(model, loss_fn, *batch),
                                  seconds)
        model, plan, memory, flops, seconds = fits[menu, budget]
        assert memory <= plan.scope.budget
        ratio = f"{flops / uniform[policy][1]:>13.3f}" if policy else f"{'-':>13}"
        options = sorted({o for o in plan.options if o != "everything"})
        cells = _device_cells(_device(model, loss_fn, batch) if device else None,
                              steps[policy] if policy else None)
        print(f"{label:>{_WIDTH}} {jaxremat.format_bytes(memory):>11} {memory / plain:>9.3f} "
              f"{flops / plain_flops:>12.3f} {ratio}{cells}  {plan.method}: "
              f"{sum(d.startswith('store tape') for d in plan.decisions())} of {len(plan.decisions())} tapes stored"
              + (f" (policies {', '.join(options)})" if options else "")
              + (f"; vs {policy}" if between and policy else "")
              + (f"; half its overhead: {_half(flops, uniform[policy][1], plain_flops)}"
                 if between and policy else "") + f"; fit {seconds:.1f} CPU s")


def _between(memories) -> list[int]:
    """The midpoints between consecutive distinct memories of the uniform rows."""
    ordered = sorted(set(memories))
    return [(lo + hi) // 2 for lo, hi in zip(ordered, ordered[1:])]


def _half(flops: float, policy_flops: float, plain_flops: float) -> str:
    """Whether the overhead over the plain step (flops) is at most half the uniform
    policy's (issue 17.6's target between the uniform policies' memories)."""
    return "yes" if flops / plain_flops - 1 <= (policy_flops / plain_flops - 1) / 2 + 1e-9 else "NO"


def gpt_rows(issue: bool, costs: str, device: bool, large: bool, menus: tuple,
             policies: dict) -> None:
    before = lambda self, t: self.tokens(t) + self.positions(jnp.arange(t.shape[-1]))  # noqa: E731
    after = lambda self, h: self.out(self.norm(h))  # noqa: E731
    configs = [(32, 32, 4, 6, 32, 16)] + ([(256, 128, 4, 8, 128, 8)] if issue else [])
    if large:
        configs = [(512, 512, 8, 8, 256, 16)]
    for vocab, dim, heads, depth, context, batch in configs:
        data = gpt.synthetic_sequences(jax.random.key(0), batch, context, vocab)

        def make(cls, vocab=vocab, dim=dim, heads=heads, depth=depth, context=context):
            with jax.threefry_partitionable(False):
                return cls(vocab, dim, heads, depth, context, rngs=nnx.Rngs(0, dropout=1))

        compare(f"GPT (examples/gpt_nnx.py): width {dim}, {depth} blocks, context {context}, "
                f"batch {batch}", make, gpt.GPT, before, after, gpt.loss_fn, (data,),
                ["50%", "30%"], costs, device, menus, policies)


def resnet_rows(costs: str, device: bool, large: bool, menus: tuple, policies: dict) -> None:
    widths, n = ((32, 64, 128), 64) if large else ((8, 16, 32), 16)
    images, labels = resnet.synthetic_cifar(0, n)

    def make(cls):
        with jax.threefry_partitionable(False):
            return cls(widths, 2, 10, rngs=nnx.Rngs(0))

    compare(f"ResNet (examples/resnet_nnx.py blocks): widths {widths}, 6 residual blocks, "
            f"batch {n} of 32x32x3", make, ResNet, lambda self, x: self.stem(x),
            lambda self, h: self.head(h), resnet.loss_fn, (images, labels), ["80%", "60%"], costs, device, menus,
            {k: v for k, v in policies.items() if k in UNIFORM})  # its blocks mark no names


def vit_rows(costs: str, device: bool, large: bool, menus: tuple, policies: dict) -> None:
    # image, patch, width, heads, depth, batch: ViT-S/16 at --large
    size, patch, dim, heads, depth, n = (224, 16, 384, 6, 12, 32) if large else (32, 4, 32, 4, 6, 16)
    images, labels = vit.synthetic_images(0, n, size)

    def make(cls):
        with jax.threefry_partitionable(False):
            return cls(size, patch, dim, heads, depth, 10, rngs=nnx.Rngs(0, dropout=1))

    compare(f"ViT (examples/vit_nnx.py): {size}x{size} images in {patch}x{patch} patches "
            f"({(size // patch) ** 2 + 1} tokens), width {dim}, {heads} heads, {depth} blocks, "
            f"batch {n}", make, vit.ViT, lambda self, x: self.embed(x),
            lambda self, h: self.classify(h), vit.loss_fn, (images, labels), ["50%", "30%"], costs, device,
            menus, policies)


def llama_rows(costs: str, device: bool, large: bool, menus: tuple, policies: dict) -> None:
    # vocab, width, heads, kv heads, blocks, MLP width, length, batch
    sizes = (4096, 512, 8, 2, 8, 1408, 256, 16) if large else (256, 64, 4, 2, 6, 176, 32, 4)
    vocab, dim, heads, kv_heads, depth, hidden, length, n = sizes
    tokens, labels = llama.progressions(0, n, length, vocab)

    def make(cls):
        with jax.threefry_partitionable(False):
            return cls(vocab, dim, heads, kv_heads, depth, hidden, rngs=nnx.Rngs(0))

    compare(f"Llama (examples/llama_nnx.py): width {dim}, {heads} heads, {kv_heads} kv heads, "
            f"{depth} blocks, MLP {hidden}, length {length}, batch {n}, vocab {vocab}", make,
            llama.Llama, lambda self, t: self.embed(t), lambda self, h: self.head(self.norm(h)),
            llama.loss_fn, (tokens, labels), ["50%", "30%"], costs, device, menus,
            {k: v for k, v in policies.items() if k in UNIFORM})  # written without names


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt,resnet,vit")
    parser.add_argument("--issue", action="store_true", help="add the width-128, 8-block GPT")
    parser.add_argument("--costs", default="flops", choices=("flops", "static", "measured"),
                        help="the blocks' cost model (remat_blocks' costs=); the table "
                        "compares flops, which 'flops' minimises")
    parser.add_argument("--policies", default=["default"],
                        type=lambda s: [v for v in s.split(",") if v],
                        help=f"the blocks' policy menus, comma-separated: {sorted(MENUS)}")
    parser.add_argument("--uniform", default=None, type=lambda s: [v for v in s.split(",") if v],
                        help="the uniform rows to measure and fit at, comma-separated labels "
                        f"(default all): {list(UNIFORM) + list(MAXTEXT)}")
    parser.add_argument("--large", action="store_true", help="GPU sizes (ViT-S/16 and the like)")
    parser.add_argument("--device-columns", choices=("auto", "on", "off"), default="auto",
                        help="compiled temp memory and step time: auto = on a GPU/TPU only")
    args = parser.parse_args(argv)
    device = {"auto": jax.devices()[0].platform != "cpu", "on": True,
              "off": False}[args.device_columns]
    menus = tuple(args.policies)
    policies = {**UNIFORM, **MAXTEXT}
    if args.uniform is not None:
        if set(args.uniform) - set(policies):
            parser.error(f"unknown uniform rows {sorted(set(args.uniform) - set(policies))}; "
                         f"choose from {list(policies)}")
        policies = {k: v for k, v in policies.items() if k in args.uniform}
    rows = {"gpt": lambda: gpt_rows(args.issue, args.costs, device, args.large, menus, policies),
            "resnet": lambda: resnet_rows(args.costs, device, args.large, menus, policies),
            "vit": lambda: vit_rows(args.costs, device, args.large, menus, policies),
            "llama": lambda: llama_rows(args.costs, device, args.large, menus, policies)}
    unknown = set(args.models.split(",")) - set(rows)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {sorted(rows)}")
    if set(menus) - set(MENUS):
        parser.error(f"unknown menus {sorted(set(menus) - set(MENUS))}; choose from {sorted(MENUS)}")
    print(f"JAX {jax.__version__}, backend {jax.default_backend()}; costs={args.costs!r}; memory: "
          "jaxremat.flax.activation_memory (program order), flops: lowered cost_analysis")
    for name in args.models.split(","):
        rows[name]()


if __name__ == "__main__":
    main()
