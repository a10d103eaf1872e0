"""Uniform ``jax.checkpoint`` policies against jaxremat's per-layer choice, at equal memory.

    python benchmarks/policies.py [--models gpt,mlp,conv,gpt_blocks] [--costs flops|static|measured]
        [--fractions 0.25,0.4,0.6,0.8] [--policies default,ranked,...] [--bare] [--scale N]
        [--device-columns auto|on|off] [--oracle [missed|all]] [--oracle-time-limit S]
        [--finer]

For each model (``gpt``, ``mlp``, ``conv``: the builders of ``benchmarks/jax_memory.py``;
``gpt_blocks``: a GPT-2-style decoder written here as a user would, each whole block one
layer) it measures

* every uniform policy: ``jax.checkpoint(layer, policy=P, prevent_cse=True)`` around every
  layer, for P in ``nothing_saveable``, ``dots_with_no_batch_dims_saveable``,
  ``dots_saveable`` and ``everything_saveable`` (no remat: the plain stack);
* then ``remat_sequence(layers, budget=M)`` with the default policy menu (issue 17) at the
  measured memory ``M`` of each uniform policy, and at ``--fractions`` of the plain stack's.

Memory is :func:`jaxremat.activation_memory` (program-order peak of the ``jax.grad``
program, parameters and their gradients excluded); flops are
:func:`jaxremat.measure.costs.lowered_costs` of the jitted ``jax.value_and_grad`` (before XLA's
optimisations, so recomputation counts), both relative to the plain stack. The targets
(issue 17.6): at every budget, jaxremat's flops are at most those of the cheapest uniform
policy whose measured memory fits the budget ("<= cheapest"), and between the uniform
policies' memories jaxremat's overhead (flops - 1) is at most half of that policy's ("<= half
its overhead"; in parentheses on the rows at a uniform policy's own memory, where it is not
a target). Rows "predicted P" use as budget the chain's predicted peak of the uniform plan P
(what the dynamic program believes P needs, :func:`solver.uniform_plans`): where the chain
overestimates a plan's memory, the DP cannot take that plan at P's measured memory, and
those rows show what it does once the budget covers it. "source" is the solver whose
schedule won (``Schedule.method``: ``rotor``, a baseline, or ``uniform:<option>``).
The last column is the chain's model (predicted times, overhead against no remat): the
plan's overhead, the dynamic program's optimum at the same budget with 5000 slots, and half
the cheapest fitting uniform policy's predicted overhead; where even the optimum is above
that half, no mix of the menu's options reaches the target in the model.
``--bare`` adds jaxremat's flops with ``policies=()`` (the whole tape only).
``--oracle`` adds, on the rows that miss the half-overhead target (``--oracle all``: on
every row), a lower bound on the chain model's optimum over every schedule of the same
chain, options included, at the same budget (:func:`solver.chain_time_bound`, an integer
program solved by HiGHS; Checkmate's ILP, ``solve(method="ilp")``, refuses chains with
options or tapes), as overheads: the bound, the DP's plan and the half target, then the
verdict: "DP optimal" when the bound meets the DP's plan (it is then the optimum over every
schedule), else "DP above the bound by X"; and "target below the model's optimum" when the
bound exceeds the half target (no plan over this menu reaches it); then the seconds the
bound took (``--oracle-time-limit``).
``--finer`` measures the first layer's options between ``dots_saveable`` and its whole tape
(:func:`finer_policies`: the ``dots_plus`` search's candidates, greedy unions with no limit
on the tape) and adds a table with menu ``finer``: the default menu and all of those
unions, applied to every layer (issue 17.6: would a finer option reach the target?).
``--policies`` names the menus jaxremat plans with (:data:`MENUS`; one table per menu, the
uniform policies measured once): ``default``, ``none`` (the whole tape only), ``basic``
(the default menu without ``"searched"``: the default before session 24), ``ranked`` (the
default and ``"dots_ranked"``, issue 17.6), ``plus`` (the default and ``"dots_plus"``),
``ranked_plus`` (both).

On a GPU (``--device-columns auto``; ``on`` also runs them on CPU, where they mean nothing:
XLA's CPU compiler undoes remat) each row adds, for the cheapest fitting uniform policy and
for jaxremat, the compiled temp memory of the jitted ``value_and_grad``
(``Compiled.memory_analysis().temp_size_in_bytes``: activations and XLA's workspace) and its
median step time, and jaxremat's step time over that policy's. ``--scale N`` multiplies every
model's batch size (GPU runs use 16-64: at scale 1 a step is a few microseconds of kernels).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import solver  # noqa: E402
from jax_memory import MODELS, _flops, _loss, _plain, compiled_columns  # noqa: E402
from jaxremat import activation_memory, remat_sequence  # noqa: E402
from jaxremat.measure.costs import count_jaxpr  # noqa: E402
from jaxremat.measure.trace import trace_layer  # noqa: E402
from jaxremat.sequence.options import option_aliases  # noqa: E402
from jaxremat.sequence.policies import DEFAULT_POLICIES  # noqa: E402
from jaxremat.sequence.searched import SearchedPolicy, candidates  # noqa: E402
from jaxremat.trees import tree_bytes  # noqa: E402

UNIFORM = {
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "everything": None,  # the plain stack
}
# the uniform policy's plan among solver.uniform_plans (by method name)
UNIFORM_METHOD = {"nothing": "every_layer", "dots_no_batch": "uniform:dots_no_batch",
                  "dots": "uniform:dots", "everything": "none"}
MENUS = {"default": None, "none": (), "basic": ("dots", "dots_no_batch", "names"),
         "ranked": DEFAULT_POLICIES + ("dots_ranked",),
         "plus": DEFAULT_POLICIES + ("dots_plus",),
         "ranked_plus": DEFAULT_POLICIES + ("dots_ranked", "dots_plus")}
"""jaxremat's policy menus by ``--policies`` name (``remat_sequence(policies=...)``)."""


# ------------------------------------------------- a GPT-2-style decoder, as a user writes it


def layer_norm(p, x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    sigma2 = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(sigma2 + eps) * p["g"] + p["b"]


def dense(p, x):
    return x @ p["w"] + p["b"]


def gpt2_block(p, x, n_head=4):
    """One pre-LayerNorm decoder block: ``x + attn(ln_1(x))``, then ``x + mlp(ln_2(x))``,
    with causal multi-head self-attention and a 4x GELU MLP (GPT-2's layout)."""
    B, T, C = x.shape
    q, k, v = jnp.split(dense(p["attn"]["c_attn"], layer_norm(p["ln_1"], x)), 3, axis=-1)
    heads = lambda t: t.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    att = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(C // n_head)
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    x = x + dense(p["attn"]["c_proj"], y)
    h = jax.nn.gelu(dense(p["mlp"]["c_fc"], layer_norm(p["ln_2"], x)), approximate=True)
    return x + dense(p["mlp"]["c_proj"], h)


def gpt_blocks_model(scale=1, n_layer=8, n_embd=128, batch=4, seq=128, seed=3):
    """``n_layer`` GPT-2 blocks (each a layer of the sequence) and a batch of
    ``batch * scale`` sequences of embeddings."""
    keys = iter(jax.random.split(jax.random.key(seed), 4 * n_layer + 1))

    def linear(n_in, n_out, scale=0.02):
        return {"w": scale * jax.random.normal(next(keys), (n_in, n_out)), "b": jnp.zeros(n_out)}

    def norm():
        return {"g": jnp.ones(n_embd), "b": jnp.zeros(n_embd)}

    params = [{"ln_1": norm(), "ln_2": norm(),
               "attn": {"c_attn": linear(n_embd, 3 * n_embd), "c_proj": linear(n_embd, n_embd)},
               "mlp": {"c_fc": linear(n_embd, 4 * n_embd), "c_proj": linear(4 * n_embd, n_embd)}}
              for _ in range(n_layer)]
    x = jax.random.normal(next(keys), (batch * scale, seq, n_embd))
    return [gpt2_block] * n_layer, params, x


BUILDERS = {**MODELS, "gpt_blocks": gpt_blocks_model}


# ---------------------------------------------------------------------------- measuring


def uniform(layers, policy):
    """The stack with every layer under ``jax.checkpoint(policy=policy)`` (plain: ``None``)."""
    if policy is None:
        return lambda params, x: _plain(layers, params, x)
    wrapped = [jax.checkpoint(layer, policy=policy, prevent_cse=True) for layer in layers]
    return lambda params, x: _plain(wrapped, params, x)


def uniform_predictions(plan) -> dict[str, solver.Schedule]:
    """The chain's schedule (predicted peak and time) of each uniform policy's plan, from a
    jaxremat plan's profile (:func:`solver.uniform_plans`, with the frontend's aliases for
    merged options)."""
    aliases = [option_aliases(layer.dropped) for layer in plan.layers]
    plans = solver.uniform_plans(plan.chain, aliases)
    # no layer offers the option: the whole tape everywhere
    return {name: solver.make_schedule(plan.chain, plans.get(method, plans["none"]))
            for name, method in UNIFORM_METHOD.items()}


def model_overheads(plan, best_schedule) -> str:
    """In the chain's model (predicted times, x no remat - 1): the plan's overhead, the
    DP's optimum with 5000 slots at the same budget, and half the cheapest fitting uniform
    policy's predicted overhead (what the half-overhead target asks of the model)."""
    chain, budget = plan.chain, plan.budget / plan.batch_size
    base = float(chain.fwd_time.sum() + chain.bwd_time.sum())
    aliases = [option_aliases(layer.dropped) for layer in plan.layers]
    fine = solver.solve(chain, budget, slots=5000, aliases=aliases).time
    half = "-" if best_schedule is None else f"{(best_schedule.time / base - 1) / 2:.4f}"
    return f"{plan.schedule.time / base - 1:.4f} / {fine / base - 1:.4f} / {half}"


def oracle_cell(plan, best_schedule, time_limit) -> str:
    """The model's overheads ``bound / DP's plan / half target`` at the plan's budget, the
    verdict and the bound's time (:func:`solver.chain_time_bound`: at most the time of
    every schedule of the chain, persistent or not, within the budget)."""
    chain, budget = plan.chain, plan.budget / plan.batch_size
    base = float(chain.fwd_time.sum() + chain.bwd_time.sum())
    bound = solver.chain_time_bound(chain, budget, time_limit=time_limit)
    low, dp = bound.time / base - 1, plan.schedule.time / base - 1
    half = None if best_schedule is None else (best_schedule.time / base - 1) / 2
    exact = plan.schedule.time <= bound.time * (1 + 1e-9)
    verdict = "DP optimal" if exact else f"DP above the bound by {dp - low:.4f}"
    if half is not None and low > half + 1e-12:
        verdict += "; target below the model's optimum: no plan over this menu reaches it"
    elif half is not None and dp <= half + 1e-12:
        verdict += "; its plan meets the target in the model"
    if not bound.optimal:
        verdict += " (time limit: HiGHS's dual bound)"
    return (f"{low:.4f} / {dp:.4f} / {'-' if half is None else f'{half:.4f}'}: {verdict} "
            f"({bound.seconds:.2f} s)")


def measure(run, params, x):
    """``(activation memory, flops)`` of the training step through ``run``."""
    loss = _loss(run)
    return activation_memory(loss, params, x), _flops(loss, params, x)


def device_columns(run, params, x) -> tuple[int, float]:
    """``(compiled temp bytes, median step seconds)`` of the jitted ``value_and_grad``
    through ``run`` (:func:`jax_memory.compiled_columns`)."""
    _, temp, step = compiled_columns(_loss(run), params, x)
    return temp, step


def _device_cells(uniform_cols, jaxremat_cols) -> list[str]:
    """The GPU cells: the cheapest fitting policy's temp MiB and step ms, jaxremat's, and
    jaxremat's step time over that policy's."""
    cells = ["-", "-"] if uniform_cols is None else [
        f"{uniform_cols[0] / 2**20:.1f}", f"{uniform_cols[1] * 1e3:.2f}"]
    cells += [f"{jaxremat_cols[0] / 2**20:.1f}", f"{jaxremat_cols[1] * 1e3:.2f}"]
    cells.append("-" if uniform_cols is None else f"{jaxremat_cols[1] / uniform_cols[1]:.3f}")
    return cells


def _without_options(layers, budget, args, params, x, plain_flops) -> str:
    """jaxremat's flops (x plain) at ``budget`` with the whole tape only (before issue 17)."""
    try:
        seq = remat_sequence(layers, int(budget), costs=args.costs, policies=())
        return f"{measure(seq, params, x)[1] / plain_flops:.3f}"
    except solver.InfeasibleBudget:
        return "infeasible"


def _targets(ratio, mem, budget, best, at_uniform) -> tuple[str, str]:
    """The two target cells: flops <= the cheapest fitting uniform policy's (and memory
    within the budget), and overhead <= half of its overhead (in parentheses where the row
    is a uniform policy's own memory, not a target there)."""
    if best is None:
        return "yes", "-"
    met = ratio <= best[0] + 1e-9 and mem <= budget
    half = ratio - 1 <= (best[0] - 1) / 2 + 1e-9
    half_cell = "yes" if half else "NO"
    return ("yes" if met else "NO"), (f"({half_cell})" if at_uniform else half_cell)


def model_table(name, args):
    layers, params, x = BUILDERS[name](args.scale)
    plain_mem, plain_flops = measure(uniform(layers, None), params, x)
    print(f"\n## {name}: {len(layers)} layers, input {tuple(x.shape)}; plain: activation "
          f"memory {plain_mem / 2**20:.2f} MiB, flops {plain_flops:.4g}")
    rows, device = {}, {}
    for policy_name, policy in UNIFORM.items():
        mem, flops = measure(uniform(layers, policy), params, x)
        rows[policy_name] = (mem, flops / plain_flops)
        if args.gpu:
            device[policy_name] = device_columns(uniform(layers, policy), params, x)
    menus = {menu: MENUS[menu] for menu in args.policies}
    if args.finer:
        menus["finer"] = DEFAULT_POLICIES + finer_policies(layers[0], params[0], x)
    for menu, policies in menus.items():
        menu_table(menu, policies, layers, params, x, plain_mem, plain_flops, rows, device, args)


def _tape_and_flops(layer, p, x, policy) -> tuple[int, float]:
    """``(tape bytes, flops of the vjp's forward and pullback)`` of ``layer`` under
    ``jax.checkpoint(policy=policy)`` (``None``: the plain layer, its whole tape)."""
    run = layer if policy is None else jax.checkpoint(layer, policy=policy, prevent_cse=True)
    traced = trace_layer(run, p, x, 0)
    return traced.tape_bytes, count_jaxpr(traced.forward)[0] + count_jaxpr(traced.backward)[0]


def _named(policy, name):
    """``policy`` as a menu entry named ``name`` (the menu names a callable by its
    ``__name__``)."""
    def entry(prim, *avals, **params):
        return policy(prim, *avals, **params)
    entry.__name__ = name
    return entry


def finer_policies(layer, p, x) -> tuple:
    """Options between ``dots_saveable`` and the whole tape (``--finer``): the candidates of
    ``layer``'s ``dots_plus`` search (:func:`jaxremat.sequence.searched.candidates`), each
    measured on its own beside ``dots_saveable``, then added greedily by flops saved per
    tape byte while the union lowers the flops, with no limit on the tape (the search stops
    at 1/4 above ``dots_saveable``'s, :data:`~jaxremat.sequence.searched.SLACKS`). Prints
    the table; returns every union (``finer:N``, ``N`` candidates) as a menu entry."""
    base = SearchedPolicy(frozenset(), "dots")
    whole, dots = _tape_and_flops(layer, p, x, None), _tape_and_flops(layer, p, x, base)
    keys = candidates(jax.make_jaxpr(layer)(p, x), tree_bytes(x), "dots")
    print(f"\nfirst layer's candidates over dots_saveable: whole tape {whole[0]} B, "
          f"{whole[1]:.0f} flops; dots_saveable {dots[0]} B, {dots[1]:.0f} flops\n"
          "\n| candidate (primitive, operand shapes) | tape bytes above dots | flops saved |\n"
          "|---|---|---|")
    gains = []
    for key in keys:
        tape, flops = _tape_and_flops(layer, p, x, SearchedPolicy(frozenset({key}), "dots"))
        print(f"| {key[0]} {[tuple(shape) for shape, _ in key[1]]} | {tape - dots[0]} "
              f"| {dots[1] - flops:.0f} |")
        if flops < dots[1]:
            gains.append((-(dots[1] - flops) / max(tape - dots[0], 1), len(gains), key))
    print("\n| union | tape bytes (x dots) | flops saved | recomputation left (flops, share "
          "of dots') |\n|---|---|---|---|")
    chosen, least, entries = [], dots[1], []
    for _, _, key in sorted(gains):
        tape, flops = _tape_and_flops(layer, p, x, SearchedPolicy(frozenset(chosen + [key]), "dots"))
        if flops < least:
            chosen.append(key)
            least = flops
            entries.append(_named(SearchedPolicy(frozenset(chosen), "dots"), f"finer:{len(chosen)}"))
            print(f"| finer:{len(chosen)} (+ {key[0]}) | {tape} ({tape / dots[0]:.2f}) "
                  f"| {dots[1] - flops:.0f} | {flops - whole[1]:.0f} "
                  f"({(flops - whole[1]) / (dots[1] - whole[1]):.0%}) |")
    return tuple(entries)


def menu_table(menu, policies, layers, params, x, plain_mem, plain_flops, rows, device, args):
    """The table of jaxremat with the policy menu ``policies`` (named ``menu``) against the
    uniform policies' ``rows`` (``device``: their GPU columns)."""
    budgets = [(f"= {n}", rows[n][0], True) for n in UNIFORM]
    names = policies if policies is None else tuple(getattr(e, "__name__", e) for e in policies)
    print(f"\n### menu {menu}: policies={names!r}")
    # the chain's own prediction of each uniform plan: at that budget the DP can take it
    profiled = remat_sequence(layers, int(plain_mem * 10), costs=args.costs, policies=policies)
    predictions = uniform_predictions(profiled.plan(params, x))
    budgets += [(f"predicted {n}", int(p.peak), True) for n, p in predictions.items()
                if n != "everything"]
    budgets += [(f"{f:.0%} of plain", int(f * plain_mem), False) for f in args.fractions]
    print("\n| budget | memory (% plain) | cheapest fitting uniform policy | its flops x plain "
          "| jaxremat memory (% plain) | jaxremat flops x plain | options used | source "
          "| <= cheapest | <= half its overhead | model overhead: plan / 5000 slots / half "
          "target |" + (" without options |" if args.bare else "")
          + (" its temp MiB | its step ms | jaxremat temp MiB | jaxremat step ms "
             "| step / its |" if args.gpu else "")
          + (" oracle: model bound / plan / half target |" if args.oracle else ""))
    print("|---" * (11 + args.bare + 5 * args.gpu + bool(args.oracle)) + "|")
    for label, budget, at_uniform in sorted(budgets, key=lambda b: b[1]):
        fitting = [(f, n) for n, (m, f) in rows.items() if m <= budget]
        best = min(fitting) if fitting else None
        start = time.perf_counter()
        seq = remat_sequence(layers, int(budget), costs=args.costs, policies=policies)
        cells = [label, f"{budget / plain_mem:.1%}", best[1] if best else "-",
                 f"{best[0]:.3f}" if best else "-"]
        try:
            mem, flops = measure(seq, params, x)
        except solver.InfeasibleBudget as error:
            cells += ([f"infeasible (min {error.min_budget / plain_mem:.1%})"]
                      + ["-"] * (6 + args.bare + 5 * args.gpu + bool(args.oracle)))
            print("| " + " | ".join(cells) + " |")
            continue
        ratio = flops / plain_flops
        plan = seq.cached_plans[-1]
        used = sorted({o for o in plan.options if o != "everything"}) or ["-"]
        targets = _targets(ratio, mem, budget, best, at_uniform)
        cells += [f"{mem / plain_mem:.1%}", f"{ratio:.3f}", ", ".join(used), plan.schedule.method,
                  *targets, model_overheads(plan, predictions[best[1]] if best else None)]
        if args.bare:
            cells.append(_without_options(layers, budget, args, params, x, plain_flops))
        if args.gpu:
            cells += _device_cells(device[best[1]] if best else None,
                                   device_columns(seq, params, x))
        if args.oracle:
            missed = targets[1] == "NO"
            cells.append(oracle_cell(plan, predictions[best[1]] if best else None,
                                     args.oracle_time_limit)
                         if missed or args.oracle == "all" else "-")
        print("| " + " | ".join(cells) + f" |   ({time.perf_counter() - start:.1f} s)")
    print("\nuniform policies: measured memory and flops, and the chain's predicted peak of "
          "the same plan (why jaxremat may not reach it at that budget):")
    for policy_name, (mem, flops) in rows.items():
        predicted = predictions[policy_name].peak
        text = f"{predicted / plain_mem:6.1%} ({predicted / mem:.3f}x measured)"
        gpu = ""
        if args.gpu:
            temp, step = device[policy_name]
            gpu = f"; compiled temp {temp / 2**20:.1f} MiB, step {step * 1e3:.2f} ms"
        print(f"  {policy_name:>14}: memory {mem / plain_mem:6.1%} of plain, flops {flops:.3f}x; "
              f"predicted {text}{gpu}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt,mlp,conv,gpt_blocks")
    parser.add_argument("--costs", default="flops", choices=("flops", "static", "measured"),
                        help="jaxremat's cost model: flops, the static roofline, or timed on "
                        "the device (remat_sequence's costs=)")
    parser.add_argument("--fractions", default="0.25,0.4,0.6,0.8",
                        type=lambda s: [float(v) for v in s.split(",") if v])
    parser.add_argument("--policies", default=["default"],
                        type=lambda s: [v for v in s.split(",") if v],
                        help=f"jaxremat's menus, comma-separated, one table each: {sorted(MENUS)}")
    parser.add_argument("--bare", action="store_true",
                        help="add jaxremat's flops with policies=() (the whole tape only)")
    parser.add_argument("--oracle", nargs="?", const="missed", choices=("missed", "all"),
                        help="a lower bound on the chain model's optimum (solver.chain_time_bound) "
                        "beside the DP's plan and the half target, on the rows that miss it "
                        "(or all rows)")
    parser.add_argument("--oracle-time-limit", type=float, default=60.0,
                        help="seconds HiGHS may spend on each row's bound")
    parser.add_argument("--finer", action="store_true",
                        help="measure the first layer's options between dots_saveable and the "
                        "whole tape and add a menu 'finer' with them all (finer_policies)")
    parser.add_argument("--scale", type=int, default=1, help="multiplies the batch size")
    parser.add_argument("--device-columns", choices=("auto", "on", "off"), default="auto",
                        help="compiled temp memory and step time: auto = on a GPU/TPU only")
    args = parser.parse_args()
    args.gpu = {"auto": jax.devices()[0].platform != "cpu", "on": True,
                "off": False}[args.device_columns]
    unknown = set(args.models.split(",")) - set(BUILDERS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {sorted(BUILDERS)}")
    if set(args.policies) - set(MENUS):
        parser.error(f"unknown menus {sorted(set(args.policies) - set(MENUS))}; choose from "
                     f"{sorted(MENUS)}")
    print(f"JAX {jax.__version__}, backend {jax.default_backend()}; costs={args.costs!r}, "
          f"menus={','.join(args.policies)}; memory: activation_memory (program order), flops: "
          "lowered cost_analysis of value_and_grad"
          + (f"; device {jax.devices()[0].device_kind}: compiled temp memory and median step "
             "time of the jitted value_and_grad" if args.gpu else ""))
    for name in args.models.split(","):
        model_table(name, args)


if __name__ == "__main__":
    main()
