"""``python -m jaxremat demo``: what jaxremat does, in one command.

1. Solves synthetic chains (sizes and flops from formulas for a ResNet-like and a
   transformer-like network, and a random chain; no JAX model is run) with every method at
   budgets from the smallest feasible to the no-remat peak, and prints the time overhead of
   each.
2. Profiles a small GPT-like JAX model (attention and MLP sublayers), solves it under a budget
   of 35% of its no-remat activation memory, prints the plan and the method comparison,
   measures the rematerialized training step with the program-order memory meter
   (:func:`jaxremat.activation_memory`) and its flops with ``cost_analysis``, checks the
   gradients against the plain model, and writes a plot of memory over the schedule
   (``--plot``, needs matplotlib: ``pip install -e ".[plot]"``).
"""

from __future__ import annotations

import argparse
import sys


def _solver_tables(num_budgets: int) -> None:
    from solver.chain.generators import random_chain, resnet_like, transformer_like
    from solver.compare import budget_range, compare_methods, format_table

    chains = {
        "Synthetic ResNet-like chain": resnet_like(),
        "Synthetic transformer-like chain": transformer_like(),
        "Synthetic random chain": random_chain(24, seed=0, max_size=1000),
    }
    print("Part 1: synthetic chains. Layer sizes and flop counts are computed from formulas "
          "(solver.chains), no JAX model is run; time is counted in flops.")
    for name, chain in chains.items():
        print(f"\n== {name}: {chain.length} layers; time overhead vs no remat, per budget ==")
        print(format_table(compare_methods(chain, budget_range(chain, num_budgets))))


def _gpt_like(depth: int, batch: int, seq: int, dim: int, heads: int):
    """``2 * depth`` pure sublayers (attention, MLP; pre-norm, residual) and their params."""
    import jax
    import jax.numpy as jnp

    def norm(h):
        mean = h.mean(-1, keepdims=True)
        return (h - mean) * jax.lax.rsqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def attention(p, h):
        b, t, d = h.shape
        q, k, v = jnp.split(norm(h) @ p["qkv"], 3, axis=-1)
        split = lambda a: a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)
        scores = split(q) @ split(k).transpose(0, 1, 3, 2) / (d // heads) ** 0.5
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)
        out = (jax.nn.softmax(scores, -1) @ split(v)).transpose(0, 2, 1, 3).reshape(b, t, d)
        return h + out @ p["out"]

    def mlp(p, h):
        return h + jax.nn.gelu(norm(h) @ p["up"]) @ p["down"]

    keys = iter(jax.random.split(jax.random.key(0), 4 * depth + 1))
    init = lambda shape: jax.random.normal(next(keys), shape) / shape[0] ** 0.5
    layers, params = [], []
    for _ in range(depth):
        layers += [attention, mlp]
        params += [{"qkv": init((dim, 3 * dim)), "out": init((dim, dim))},
                   {"up": init((dim, 4 * dim)), "down": init((4 * dim, dim))}]
    x = jax.random.normal(next(keys), (batch, seq, dim))
    return layers, params, x


def _model_demo(plot: str | None) -> None:
    import jax
    import jax.numpy as jnp

    import jaxremat
    from jaxremat.measure.costs import lowered_costs
    from solver import format_bytes

    layers, params, x = _gpt_like(depth=6, batch=4, seq=128, dim=128, heads=4)

    def plain_loss(params, x):
        for layer, p in zip(layers, params):
            x = layer(p, x)
        return jnp.mean(x**2)

    seq = jaxremat.remat_sequence(layers, "35%")
    remat_loss = lambda params, x: jnp.mean(seq(params, x) ** 2)
    plan = seq.plan(params, x)
    print(f"\n\nPart 2: a real JAX model, profiled from its jaxpr.\n"
          f"== A GPT-like JAX model: {len(layers)} sublayers, x {tuple(x.shape)}, "
          "budget 35% of its no-remat activation memory ==")
    print(plan.report())
    print("\nEvery method on this model's chain, per budget (time overhead vs no remat):")
    print(plan.compare())

    # grad w.r.t. params and x, as the budget assumes the input's gradient flows back.
    measured = jaxremat.activation_memory(remat_loss, params, x)
    baseline = jaxremat.activation_memory(plain_loss, params, x)
    flops = lambda f: lowered_costs(jax.grad(f), params, x)["flops"]
    grads = jax.jit(jax.grad(remat_loss))(params, x)
    expected = jax.jit(jax.grad(plain_loss))(params, x)
    error = max(float(jnp.max(jnp.abs(g - e))) for g, e in
                zip(jax.tree.leaves(grads), jax.tree.leaves(expected)))
    print("\nMeasured in program order (jaxremat.activation_memory; CPU compiled memory "
          "is meaningless because XLA undoes remat there):")
    print(f"  no remat       {format_bytes(baseline):>11}")
    print(f"  rematerialized {format_bytes(measured):>11}  (predicted "
          f"{format_bytes(plan.predicted_peak)}, budget {format_bytes(plan.budget)}; "
          f"measured/predicted {measured / plan.predicted_peak:.3f})")
    print(f"  flops          {flops(remat_loss) / flops(plain_loss):.3f}x the plain step "
          f"(counted by XLA's cost_analysis on the whole gradient)")
    print(f"  predicted time {plan.predicted_time / plan.no_remat_time:.3f}x the plain step "
          "(the plan's cost model, above: per layer max(flops / peak flops,\n"
          "                 bytes / bandwidth), bytes counted before XLA fuses element-wise "
          "ops; these layers are\n"
          "                 bandwidth-bound there, so recomputing them weighs more than in "
          "flops)")
    print(f"  gradients      max |remat - plain| = {error:.2e}")
    if plot:
        try:
            print(f"\nWrote {plan.plot(plot)}: memory over the schedule and time vs budget.")
        except ImportError as missing:
            print(f"\nNo plot: {missing}")


def demo(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxremat demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budgets", type=int, default=6, help="budgets per chain table")
    parser.add_argument("--plot", default="jaxremat_demo.png",
                        help="where to write the plot (default: %(default)s; '' for none)")
    args = parser.parse_args(argv)
    _solver_tables(args.budgets)
    _model_demo(args.plot or None)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "demo":
        print("usage: python -m jaxremat demo [--help]", file=sys.stderr)
        return 2
    return demo(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
