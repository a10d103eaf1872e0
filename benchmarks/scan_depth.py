"""Scanned stacks: compile time, program size, memory and flops against depth (issue 18).

For a residual MLP block scanned over stacked parameters, L in {8, 16, 32, 64, 128}
(``--quick``: {8, 16, 32}):

1. trace + compile CPU time of the gradient (the least of ``REPEATS`` runs, all threads)
   and its program size (jaxpr equations, scan and checkpoint bodies included) for a plain
   ``lax.scan``, a scan with ``jax.checkpoint`` per layer (``nothing_saveable``, what
   ``nnx.remat`` does by default), the layer under ``dots_saveable`` in the scan,
   ``remat_scan`` at 50% and at its least budget (planning included: with the layer's
   profile as on a first call, with the profile cached, and with the plan cached) and the unrolled ``remat_sequence`` at 50%; the ratio to the scan with
   ``nothing_saveable``;
2. memory (``jaxremat.activation_memory``: program order on the jaxpr) and flops of
   ``remat_scan`` (``costs="flops"``: the targets are in flops) at its least budget, at
   25/50/75% budgets and at the measured memory of each uniform policy
   (``nothing_saveable``, ``dots_saveable``, ``dots_with_no_batch_dims_saveable`` in the
   scan); memory over that of ``nothing_saveable``.

Flops are counted on the gradient's jaxpr (``jaxremat.measure.dataflow.equation_flops`` per equation,
a scan body times its length): ``Lowered.cost_analysis()`` counts a loop body once, whatever
its trip count (a plain scan of 8 or 32 layers reports the same flops). CPU figures: XLA's
CPU compiler undoes remat, so memory is the meter's, never XLA's.
    python benchmarks/scan_depth.py [--quick] [--first]
    python benchmarks/scan_depth.py --least [--unroll 0|2|auto] [--block mlp3|lnmlp|lnmlp2|gpt]
        [--at least|25%] [--depths 32,64,128]
    python benchmarks/scan_compile.py [--block mlp,gpt] [--depths 8,16,32,64,128]
    python benchmarks/scan_depth.py --crossover [--block all|mlp,lnmlp,...] [--depths 32]
    python benchmarks/scan_depth.py --gpt [--gpt-shape 24,512,8,8,256] [--device-columns on]
        [--policies default|plus]

``--gpt`` measures instead a GPT-2-style decoder of 24 blocks (``policies.py``'s
``gpt2_block``: pre-LayerNorm causal attention and a 4x GELU MLP) scanned over stacked
parameters: the plain scan, the scan with each uniform policy, ``remat_scan`` at each
policy's memory and at 25/50/75%, and the unrolled ``remat_sequence`` at 50%. Columns: memory
(meter, % of the plain scan), flops (counted on the jaxpr, x plain scan), trace + compile wall
seconds of the jitted ``value_and_grad`` (planning excluded), and on a GPU (``--device-columns auto``) the compiled temp memory
(``memory_analysis().temp_size_in_bytes``) and the median step time of the jitted gradient.
``--gpt-shape`` is depth, width, heads, batch, sequence length.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jaxremat  # noqa: E402
import solver  # noqa: E402
from jax.extend.core import ClosedJaxpr, Jaxpr  # noqa: E402

from jaxremat.measure.dataflow import equation_flops  # noqa: E402
from jaxremat.measure.timing import median_time  # noqa: E402
from jaxremat.scan.checks import program_size  # noqa: E402
from jaxremat.sequence.profile import profile_cache  # noqa: E402

WIDTH, BATCH = 64, 256
REPEATS = 3  # compile timings: the least of this many
COSTS = "flops"  # the budget table's cost model: its targets are in flops
POLICIES = ("nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable")


def block(p, h):
    return h + jnp.tanh(h @ p["w1"] + p["b"]) @ p["w2"]


def mlp3_block(p, h):
    """A residual MLP with three hidden tanh layers (14 jaxpr equations)."""
    z = jnp.tanh(h @ p["w1"] + p["b1"])
    z = jnp.tanh(z @ p["w2"] + p["b2"])
    z = jnp.tanh(z @ p["w3"] + p["b3"])
    return h + z @ p["w4"]


def layer_norm(h, scale, bias, eps=1e-5):
    mean = h.mean(-1, keepdims=True)
    var = ((h - mean) ** 2).mean(-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + eps) * scale + bias


def ln_mlp_block(p, h):
    """A transformer's MLP sub-block: pre-LayerNorm, a 4x GELU MLP, the residual (31 jaxpr
    equations)."""
    z = jax.nn.gelu(layer_norm(h, p["g"], p["beta"]) @ p["w1"] + p["b1"])
    return h + z @ p["w2"] + p["b2"]


def ln_mlp2_block(p, h):
    """Two pre-LayerNorm MLP sub-blocks (:func:`ln_mlp_block`) as one layer (62 equations)."""
    return ln_mlp_block(p["b"], ln_mlp_block(p["a"], h))


def _normal(key, shape):
    return jax.random.normal(key, shape) / np.sqrt(shape[-2])


def mlp3_stack(L):
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    params = {f"w{i + 1}": _normal(keys[i], (L, WIDTH, WIDTH)) for i in range(4)}
    params.update({f"b{i + 1}": jnp.zeros((L, WIDTH)) for i in range(3)})
    return params


def ln_mlp_stack(L, seed=2):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"g": jnp.ones((L, WIDTH)), "beta": jnp.zeros((L, WIDTH)),
            "w1": _normal(k1, (L, WIDTH, 4 * WIDTH)), "b1": jnp.zeros((L, 4 * WIDTH)),
            "w2": _normal(k2, (L, 4 * WIDTH, WIDTH)), "b2": jnp.zeros((L, WIDTH))}


BLOCKS = {  # --block: the layer and its stacked parameters for L layers, at width WIDTH
    "mlp": (block, lambda L: stack(L)),
    "mlp3": (mlp3_block, mlp3_stack),
    "lnmlp": (ln_mlp_block, ln_mlp_stack),
    "lnmlp2": (ln_mlp2_block, lambda L: {"a": ln_mlp_stack(L, 2), "b": ln_mlp_stack(L, 3)}),
}


def stack(L):
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    scale = 1 / np.sqrt(WIDTH)
    return {"w1": scale * jax.random.normal(k1, (L, WIDTH, WIDTH)),
            "w2": scale * jax.random.normal(k2, (L, WIDTH, WIDTH)),
            "b": jnp.zeros((L, WIDTH))}


def scanned(policy=None, layer=block):
    """``layer`` scanned over stacked parameters, under ``jax.checkpoint`` with the named
    ``jax.checkpoint_policies`` policy or a policy function (``None``: plain)."""
    if isinstance(policy, str):
        policy = getattr(jax.checkpoint_policies, policy)
    body = layer if policy is None else jax.checkpoint(layer, policy=policy, prevent_cse=False)
    return lambda p, x: jax.lax.scan(lambda h, q: (body(q, h), None), x, p)[0]


def unrolled(L):
    seq = jaxremat.remat_sequence([block] * L, "50%")
    return lambda p, x: seq([jax.tree.map(lambda a: a[i], p) for i in range(L)], x)


def loss_of(fn):
    return lambda p, x: jnp.sum(fn(p, x) ** 2)


def compile_seconds(fn, params, x, fresh=None, first=False):
    """CPU seconds (all threads: less sensitive to other jobs than wall time) to trace and
    compile the gradient, the least of ``REPEATS`` runs; ``fresh()`` (if given) makes ``fn``
    anew for each run: planning included, and with ``first`` the layer's profiling too (the
    module-wide profile cache cleared, as on a first call in a process)."""
    best = float("inf")
    for _ in range(REPEATS):
        if fresh is not None:
            if first:
                profile_cache().clear()
            fn = fresh()
        start = time.process_time()
        jax.jit(jax.grad(loss_of(fn))).lower(params, x).compile()
        best = min(best, time.process_time() - start)
    return best


def size(fn, params, x):
    return program_size(jax.make_jaxpr(jax.grad(loss_of(fn)))(params, x))


def _flops(jaxpr):
    total = 0.0
    for eqn in jaxpr.eqns:
        subs = [sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
                for param in eqn.params.values()
                for sub in (param if isinstance(param, (tuple, list)) else (param,))
                if isinstance(sub, (ClosedJaxpr, Jaxpr))]
        if not subs:
            total += equation_flops(eqn)
        elif eqn.primitive.name == "cond":
            total += max(_flops(sub) for sub in subs)
        else:
            total += eqn.params.get("length", 1) * sum(_flops(sub) for sub in subs)
    return total


def flops(fn, params, x):
    return _flops(jax.make_jaxpr(jax.grad(loss_of(fn)))(params, x).jaxpr)


def memory(fn, params, x):
    return jaxremat.activation_memory(loss_of(fn), params, x)


def least_budget(params, x, costs="static", unroll="auto", layer=block):
    """The smallest budget remat_scan names (its InfeasibleBudget at one byte)."""
    try:
        jaxremat.remat_scan(layer, 1, costs=costs, unroll=unroll).plan(params, x)
    except solver.InfeasibleBudget as error:
        return int(error.min_budget)
    raise AssertionError("one byte fits")


def at_least(budget, params, x):
    """A function making remat_scan at ``budget`` anew, or at the smallest budget that works
    when that is less, and the budget's label."""
    try:
        jaxremat.remat_scan(block, budget).plan(params, x)
        return (lambda: jaxremat.remat_scan(block, budget)), budget
    except solver.InfeasibleBudget:
        least = least_budget(params, x)
        return (lambda: jaxremat.remat_scan(block, least)), "min"


def depth_table(depths, first_only=False):
    """The compile table (module docstring, 1.); ``first_only``: only the scan with
    ``nothing_saveable`` and remat_scan at 50% (first call, new plan, cached plan)."""
    print("L    method                 compile s   equations   / scan+nothing_saveable   "
          "(CPU s, least of %d; remat_scan at 50%%, or at its smallest budget where 50%% "
          "does not fit: 'min'; and at its smallest budget; 'first': layer profiled and plan "
          "made, 'new plan': profile cached, 'cached': plan cached)" % REPEATS)
    for L in depths:
        params, x = stack(L), jnp.ones((BATCH, WIDTH))
        rows = [("scan", scanned(), None, False),
                ("scan+nothing_saveable", scanned("nothing_saveable"), None, False),
                ("scan+dots_saveable", scanned("dots_saveable"), None, False)]
        makes = [at_least("50%", params, x)]
        if not first_only:
            makes.append((lambda least=least_budget(params, x): jaxremat.remat_scan(block, least),
                          "min"))
        for make, used in makes:
            cached = make()
            cached.plan(params, x)
            rows += [(f"remat_scan {used} first", cached, make, True),
                     (f"remat_scan {used} new plan", cached, make, False),
                     (f"remat_scan {used} cached", cached, None, False)]
        if first_only:
            rows = [row for row in rows if row[0] == "scan+nothing_saveable"
                    or row[0].startswith("remat_scan")]
        else:
            rows.append(("remat_sequence 50%", unrolled(L), None, False))
        base = None
        for name, fn, fresh, first in rows:
            if name.startswith("remat_sequence") and L > 64:
                print(f"{L:<4} {name:<22} {'skipped (unrolled, > 64 layers)':>21}")
                continue
            seconds = compile_seconds(fn, params, x, fresh, first)
            base = seconds if name == "scan+nothing_saveable" else base
            ratio = f"{seconds / base:>6.2f}" if base else ""
            member = ""
            if name.startswith("remat_scan"):
                plan = fn.plan(params, x)
                member = f"  [{plan.member}; {plan.option_name}]"
            print(f"{L:<4} {name:<22} {seconds:>9.3f}   {size(fn, params, x):>9}   "
                  f"{ratio:>22}{member}")


def budget_table(depths):
    print("\nL    method                            memory (meter)   pred/budget      flops  "
          "flops / policy's   mem / nothing_saveable")
    for L in depths:
        params, x = stack(L), jnp.ones((BATCH, WIDTH))
        policy_rows = [(p, memory(scanned(p), params, x), flops(scanned(p), params, x))
                       for p in POLICIES]
        nothing = policy_rows[0][1]
        budgets = [("least", least_budget(params, x, COSTS))] + [(share, share) for share in ("25%", "50%", "75%")]
        budgets += [(f"= {name}", mem) for name, mem, _ in policy_rows]
        base = dict((name, fl) for name, _, fl in policy_rows)
        for name, mem, fl in policy_rows:
            print(f"{L:<4} scan+{name:<29} {mem:>14}   {'':>11} {fl:>10.3g}  {'':>6}  "
                  f"{mem / nothing:>6.3f}")
        for label, budget in budgets:
            f = jaxremat.remat_scan(block, budget, costs=COSTS)
            try:
                plan = f.plan(params, x)
            except solver.InfeasibleBudget as error:
                print(f"{L:<4} remat_scan {label:<23} infeasible (needs {error.min_budget:.0f})")
                continue
            fl, mem = flops(f, params, x), memory(f, params, x)
            ratio = fl / base[label[2:]] if label.startswith("=") else float("nan")
            print(f"{L:<4} remat_scan {label:<23} {mem:>14}   "
                  f"{plan.predicted_peak:>7.0f}/{plan.budget:<7} {fl:>10.3g}  {ratio:>6.3f}  "
                  f"{mem / nothing:>6.3f}  [{plan.member}; {plan.option_name}; gap to Rotor "
                  f"{plan.gap_to_rotor:+.1%}]")


def block_stack(kind, L):
    """``(layer, stacked params, x)`` of ``L`` layers of block ``kind``: a key of
    :data:`BLOCKS` (width ``WIDTH``, batch ``BATCH``) or ``"gpt"`` (:func:`gpt_stack`: width
    128, 4 heads, batch 4 of 64 tokens)."""
    if kind == "gpt":
        return gpt_stack(L, 128, 4, 4, 64)
    layer, make = BLOCKS[kind]
    return layer, make(L), jnp.ones((BATCH, WIDTH))


def least_table(depths, unroll, kind="mlp", at="least"):
    """remat_scan (inner runs of at most ``unroll`` layers unrolled) at its least budget
    (``at="least"``) or at the share ``at`` of the plain scan's memory: the member, the
    budget, measured memory and compile CPU seconds (plan cached) over the scan with
    ``nothing_saveable``; ``kind`` a key of :data:`BLOCKS` (the residual MLP block of 6
    jaxpr equations, one of 3 hidden layers (14), a pre-LayerNorm GELU MLP sub-block (31),
    two of them (62)) or "gpt" (a GPT-2 block of width 128, 4 heads, batch 4 of 64 tokens:
    89 equations)."""
    print(f"block {kind} at {at}: L    member                                     "
          "budget B   measured B  mem / nothing  compile x")
    for L in depths:
        layer, params, x = block_stack(kind, L)
        base = compile_seconds(scanned("nothing_saveable", layer), params, x)
        if at == "least":
            budget = least_budget(params, x, unroll=unroll, layer=layer)
        else:
            budget = at
        f = jaxremat.remat_scan(layer, budget, unroll=unroll)
        try:
            plan = f.plan(params, x)
        except solver.InfeasibleBudget as error:
            print(f"{L:<4} infeasible at {at} (needs {error.min_budget:.0f})", flush=True)
            continue
        member = f"{plan.member} ({plan.option_name}), unroll {plan.unroll}"
        mem = memory(f, params, x)
        print(f"{L:<4} {member:<48} {plan.budget:>9} {mem:>12} "
              f"{mem / memory(scanned('nothing_saveable', layer), params, x):>14.3f} "
              f"{compile_seconds(f, params, x) / base:>9.2f}", flush=True)


def crossover_table(depths, kinds, rounds=2):
    """Where ``unroll="auto"``'s threshold lies: one member, segments of two layers (the
    layers under option 1, e.g. ``dots_saveable``, where the block has it), run with its
    two-layer runs unrolled (``unroll=2``) and as inner scans (``unroll=0``), per block:
    the block's jaxpr equations, compile CPU s over the scan with ``nothing_saveable`` (the
    least of ``rounds`` x ``REPEATS``, the two settings alternating) and measured memory."""
    from jaxremat.scan.plan import option_policies
    from jaxremat.scan.realize import run_member as _run

    print("block    eqns  L    option                 compile x: unroll 2  unroll 0   "
          "memory / nothing: unroll 2  unroll 0")
    for kind in kinds:
        for L in depths:
            layer, params, x = block_stack(kind, L)
            one = jax.tree.map(lambda a: a[0], params)
            equations = program_size(jax.make_jaxpr(layer)(one, x))
            plan = jaxremat.remat_scan(layer, "100%").plan(params, x)
            policies = option_policies(plan.layer)
            option = min(1, len(policies) - 1)
            fns = {u: (lambda p, h, u=u: _run(layer, (2,), p, h, L, policies[option], unroll=u))
                   for u in (2, 0)}
            nothing = scanned("nothing_saveable", layer)
            base, best = float("inf"), {2: float("inf"), 0: float("inf")}
            for _ in range(rounds):
                base = min(base, compile_seconds(nothing, params, x))
                for u, fn in fns.items():
                    best[u] = min(best[u], compile_seconds(fn, params, x))
            mem = {u: memory(fn, params, x) / memory(nothing, params, x) for u, fn in fns.items()}
            name = plan.layer.options[option - 1].name if option else "everything"
            print(f"{kind:<8} {equations:>4}  {L:<4} {name:<22} {best[2] / base:>17.2f} "
                  f"{best[0] / base:>9.2f}   {mem[2]:>24.3f} {mem[0]:>9.3f}", flush=True)


def gpt_stack(depth, width, heads, batch, seq):
    """The GPT-2 block (``policies.gpt2_block`` with ``heads`` heads), ``depth`` blocks'
    parameters stacked on axis 0, and a batch of embeddings."""
    from policies import gpt_blocks_model, gpt2_block

    _, params, x = gpt_blocks_model(n_layer=depth, n_embd=width, batch=batch, seq=seq)
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *params)
    return (lambda p, h: gpt2_block(p, h, n_head=heads)), stacked, x


def gpt_table(shape, gpu, menu="default"):
    """Memory, flops, compile time and (``gpu``) compiled temp memory and step time of the
    scanned GPT's gradient under each method (module docstring); ``remat_scan`` plans with
    the policy menu ``policies.MENUS[menu]``."""
    from policies import MENUS

    depth, width, heads, batch, seq = shape
    layer, params, x = gpt_stack(depth, width, heads, batch, seq)

    plain = scanned(layer=layer)
    plain_mem, plain_flops = memory(plain, params, x), flops(plain, params, x)
    print(f"\nGPT-2 blocks scanned: depth {depth}, width {width}, heads {heads}, batch {batch}, "
          f"sequence {seq}; plain scan: memory {plain_mem / 2**20:.1f} MiB (meter), flops "
          f"{plain_flops:.4g}")
    rows = [("scan", plain, None)] + [(f"scan+{p}", scanned(p, layer), None) for p in POLICIES]
    policy_mem = {name: memory(fn, params, x) for name, fn, _ in rows[1:]}
    budgets = [(f"= {name[5:]}", mem) for name, mem in policy_mem.items()]
    budgets += [(share, share) for share in ("25%", "50%", "75%")]
    for label, budget in budgets:
        fn = jaxremat.remat_scan(layer, budget, costs=COSTS, policies=MENUS[menu])
        try:
            plan = fn.plan(params, x)
        except solver.InfeasibleBudget as error:
            print(f"remat_scan {label}: infeasible (needs {error.min_budget / 2**20:.1f} MiB)")
            continue
        rows.append((f"remat_scan {label}", fn, f"{plan.member}; {plan.option_name}"))
    unrolled_seq = jaxremat.remat_sequence([layer] * depth, int(0.5 * plain_mem), costs=COSTS)
    rows.append(("remat_sequence 50% (unrolled)",
                 lambda p, h: unrolled_seq([jax.tree.map(lambda a, i=i: a[i], p)
                                            for i in range(depth)], h), None))
    header = (f"{'method':<44} {'memory %':>9} {'flops x':>8} {'compile s':>9}"
              + (f" {'temp MiB':>9} {'step ms':>8} {'step x scan':>11}" if gpu else ""))
    print(header + "   plan")
    print("-" * (len(header) + 7))
    plain_step = None
    for name, fn, note in rows:
        loss = loss_of(fn)
        start = time.perf_counter()
        compiled = jax.jit(jax.value_and_grad(loss)).lower(params, x).compile()
        seconds = time.perf_counter() - start
        line = (f"{name:<44} {memory(fn, params, x) / plain_mem:>9.1%} "
                f"{flops(fn, params, x) / plain_flops:>8.3f} {seconds:>9.2f}")
        if gpu:
            temp = compiled.memory_analysis().temp_size_in_bytes
            step = median_time(compiled, (params, x), repeats=10)
            plain_step = plain_step or step
            line += f" {temp / 2**20:>9.1f} {step * 1e3:>8.2f} {step / plain_step:>11.3f}"
        print(line + (f"   [{note}]" if note else ""), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="L in {8, 16, 32} only")
    parser.add_argument("--first", action="store_true",
                        help="only the compile rows of remat_scan at 50%% (first call, new "
                             "plan, cached) and of the scan with nothing_saveable")
    parser.add_argument("--gpt", action="store_true", help="the scanned 24-block GPT table only")
    parser.add_argument("--crossover", action="store_true",
                        help="segments of two layers with unroll 2 and 0 on each --block "
                             "(comma-separated; default all): compile and memory")
    parser.add_argument("--least", action="store_true",
                        help="only remat_scan at its least budget: member, memory, compile")
    parser.add_argument("--unroll", type=lambda s: s if s == "auto" else int(s), default="auto",
                        help="with --least: remat_scan's unroll ('auto', the default: chosen "
                             "from the block's size; 0: every run scanned; 2: runs of <= 2 "
                             "layers unrolled)")
    parser.add_argument("--block", default=None,
                        help="with --least: the residual MLP block (6 jaxpr equations), one "
                             "of 3 hidden layers (mlp3: 14), a pre-LayerNorm GELU MLP (lnmlp: "
                             "31), two of them (lnmlp2: 62), or a GPT-2 block (gpt: 89)")
    parser.add_argument("--at", default="least",
                        help="with --least: the budget, 'least' (the default: the least "
                             "budget remat_scan names) or a share such as 25%%")
    parser.add_argument("--depths", default=None,
                        type=lambda s: tuple(int(v) for v in s.split(",")),
                        help="the depths L (default 8,16,32,64,128; with --least 8,16,32,64)")
    parser.add_argument("--gpt-shape", default="24,512,8,8,256",
                        type=lambda s: tuple(int(v) for v in s.split(",")),
                        help="depth,width,heads,batch,sequence of --gpt")
    parser.add_argument("--device-columns", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--policies", default="default",
                        help="with --gpt: remat_scan's policy menu, a name of "
                             "benchmarks/policies.py's MENUS (default, none, ranked, plus)")
    args = parser.parse_args()
    if args.gpt:
        gpu = {"auto": jax.devices()[0].platform != "cpu", "on": True,
               "off": False}[args.device_columns]
        print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), JAX "
              f"{jax.__version__}; costs={COSTS!r}")
        gpt_table(args.gpt_shape, gpu, args.policies)
        return
    depths = args.depths or ((8, 16, 32) if args.quick else (8, 16, 32, 64, 128))
    if args.block is None:
        args.block = "mlp"
    kinds = args.block.split(",")
    if any(k not in (*BLOCKS, "gpt", "all") for k in kinds) or (len(kinds) > 1
                                                              and not args.crossover):
        parser.error(f"--block: one of {', '.join((*BLOCKS, 'gpt'))} (a comma-separated list "
                     f"or 'all' with --crossover), got {args.block!r}")
    if args.crossover:
        kinds = (*BLOCKS, "gpt") if args.block == "all" else args.block.split(",")
        crossover_table(args.depths or (32,), kinds)
        return
    if args.least:
        least_table(args.depths or depths[:4], args.unroll, args.block, args.at)
        return
    print(f"backend {jax.default_backend()} (memory from the meter, flops counted on the "
          f"jaxpr), JAX {jax.__version__}, width {WIDTH}, batch {BATCH}; budget table with "
          f"costs={COSTS!r}")
    depth_table(depths, args.first)
    if not args.first:
        budget_table(depths)


if __name__ == "__main__":
    main()
