"""Predicted versus measured memory of ``remat_sequence`` schedules, per method and budget.

    python benchmarks/jax_memory.py --model mlp|conv|gpt [--budgets 0.2,0.35,0.5,0.75,1]
        [--methods rotor,sqrt,every_layer,revolve,none] [--backend checkpoint|custom_vjp]
        [--costs static|flops]

For one model (an MLP stack with residual blocks, a small ResNet-like conv stack, or a
GPT-like stack of attention and MLP sublayers) it builds ``remat_sequence`` for each method
and each budget (a fraction of the measured no-remat activation memory) and prints:

* predicted: the plan's predicted peak (the chain simulator's);
* measured: :func:`jaxremat.activation_memory` of the loss (program-order peak of the
  ``jax.grad`` program, parameters and their gradients excluded), and measured/predicted;
* flops: ``Lowered.cost_analysis()`` flops of the jitted ``jax.value_and_grad`` (a training
  step reports its loss) relative to no remat (taken before XLA optimises, so recomputation
  is included); with ``jax.grad`` alone the last layers' primal outputs would be dead code,
  which flatters plans that end with a long recomputed segment;
* on a GPU only: compiled memory of the jitted gradient (``memory_analysis``: argument +
  output + temp - alias), ``memory_stats()["peak_bytes_in_use"]`` of a fresh process running
  the step, and the median step time. On CPU those columns are skipped: XLA's CPU compiler
  removes remat (ALGORITHMS.md section 7) and CPU devices report no memory statistics.

A budget below the method's least need prints "infeasible" with that need.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import solver  # noqa: E402
from jaxremat import activation_memory, format_bytes, remat_sequence  # noqa: E402
from jaxremat.measure import costs  # noqa: E402
from jaxremat.measure.costs import lowered_costs  # noqa: E402
from jaxremat.measure.timing import median_time  # noqa: E402

# ------------------------------------------------------------------------------- models


def _normal(rng, shape, scale):
    return jnp.asarray(scale * rng.standard_normal(shape), dtype=jnp.float32)


def _layer_norm(x, scale, bias):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale + bias


def mlp_block(p, x):
    """Pre-norm residual MLP block with a 4x hidden layer."""
    h = _layer_norm(x, p["ln_s"], p["ln_b"])
    return x + jax.nn.gelu(h @ p["w1"] + p["b1"]) @ p["w2"]


def mlp_model(scale: int = 1):
    rng = np.random.default_rng(0)
    d, depth, batch = 256, 16, 64 * scale
    params = [{"ln_s": jnp.ones(d), "ln_b": jnp.zeros(d), "w1": _normal(rng, (d, 4 * d), d**-0.5),
               "b1": jnp.zeros(4 * d), "w2": _normal(rng, (4 * d, d), (4 * d) ** -0.5)}
              for _ in range(depth)]
    return [mlp_block] * depth, params, _normal(rng, (batch, d), 1.0)


def _conv(x, k, stride=1):
    return jax.lax.conv_general_dilated(x, k, (stride, stride), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def stem(p, x):
    return jax.nn.relu(_conv(x, p["k"]) + p["b"])


def res_block(p, x):
    """Basic ResNet block: conv-relu-conv plus the (projected when strided) shortcut."""
    stride = 2 if "proj" in p else 1
    h = jax.nn.relu(_conv(x, p["k1"], stride) + p["b1"])
    h = _conv(h, p["k2"]) + p["b2"]
    shortcut = _conv(x, p["proj"], stride) if "proj" in p else x
    return jax.nn.relu(h + shortcut)


def head(p, x):
    return jnp.mean(x, axis=(1, 2)) @ p["w"]


def conv_model(scale: int = 1):
    rng = np.random.default_rng(1)
    widths, blocks, batch, res = [16, 32, 64], 3, 8 * scale, 32
    layers = [stem]
    params = [{"k": _normal(rng, (3, 3, 3, widths[0]), 0.3), "b": jnp.zeros(widths[0])}]
    c_in = widths[0]
    for stage, c in enumerate(widths):
        for b in range(blocks):
            p = {"k1": _normal(rng, (3, 3, c_in, c), (9 * c_in) ** -0.5), "b1": jnp.zeros(c),
                 "k2": _normal(rng, (3, 3, c, c), (9 * c) ** -0.5), "b2": jnp.zeros(c)}
            if stage > 0 and b == 0:
                p["proj"] = _normal(rng, (1, 1, c_in, c), c_in**-0.5)
            layers.append(res_block)
            params.append(p)
            c_in = c
    layers.append(head)
    params.append({"w": _normal(rng, (c_in, 10), c_in**-0.5)})
    return layers, params, _normal(rng, (batch, res, res, 3), 1.0)


def attention(p, x, heads):
    """Pre-norm causal multi-head self-attention sublayer with a residual."""
    b, t, d = x.shape
    h = _layer_norm(x, p["ln_s"], p["ln_b"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    split = lambda a: a.reshape(b, t, heads, d // heads)  # noqa: E731
    scores = jnp.einsum("bthd,bshd->bhts", split(q), split(k)) / math.sqrt(d // heads)
    mask = jnp.tril(jnp.ones((t, t), bool))
    att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", att, split(v)).reshape(b, t, d)
    return x + out @ p["o"]


def gpt_model(scale: int = 1):
    rng = np.random.default_rng(2)
    d, blocks, heads, batch, t = 128, 6, 4, 4 * scale, 128
    layers, params = [], []
    attention_layer = functools.partial(attention, heads=heads)  # one object: profiled once
    for _ in range(blocks):
        layers.append(attention_layer)
        params.append({"ln_s": jnp.ones(d), "ln_b": jnp.zeros(d),
                       "qkv": _normal(rng, (d, 3 * d), d**-0.5), "o": _normal(rng, (d, d), d**-0.5)})
        layers.append(mlp_block)
        params.append({"ln_s": jnp.ones(d), "ln_b": jnp.zeros(d), "w1": _normal(rng, (d, 4 * d), d**-0.5),
                       "b1": jnp.zeros(4 * d), "w2": _normal(rng, (4 * d, d), (4 * d) ** -0.5)})
    return layers, params, _normal(rng, (batch, t, d), 1.0)


MODELS = {"mlp": mlp_model, "conv": conv_model, "gpt": gpt_model}


# ------------------------------------------------------------------------------ measuring


def _plain(layers, params, x):
    for layer, p in zip(layers, params):
        x = layer(p, x)
    return x


def _loss(run):
    return lambda params, x: jnp.sum(run(params, x))


def _flops(loss, params, x) -> float:
    return lowered_costs(jax.value_and_grad(loss), params, x)["flops"]


def compiled_columns(loss, params, x, *, repeats: int = 10) -> tuple[int, int, float]:
    """Of the jitted gradient: compiled memory (``memory_analysis``: argument + output + temp
    - alias), its temp part alone (activations and XLA's workspace) and the median step time
    (seconds, ``repeats`` runs after warm-up)."""
    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, x).compile()
    stats = compiled.memory_analysis()
    total = (stats.argument_size_in_bytes + stats.output_size_in_bytes
             + stats.temp_size_in_bytes - stats.alias_size_in_bytes)
    return int(total), int(stats.temp_size_in_bytes), median_time(compiled, (params, x), repeats=repeats)


def _gpu_columns(loss, params, x, model, scale, method, budget, backend, peak=True,
                 cost_model="static"):
    """``compiled_columns`` plus ``peak_bytes_in_use`` of a fresh process running the step
    (``None`` without ``peak``: the fresh process costs a JAX start and a compilation)."""
    compiled_bytes, temp_bytes, step = compiled_columns(loss, params, x)
    if not peak:
        return compiled_bytes, temp_bytes, None, step
    worker = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(
        {"model": model, "scale": scale, "method": method, "budget": budget, "backend": backend,
         "costs": cost_model})]
    # The parent holds its own allocations: the worker must not try to preallocate the
    # device's memory too, and it grows its pool as it goes (the peak is still counted).
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    out = subprocess.run(worker, capture_output=True, text=True, check=True, env=env).stdout
    peak_in_use = json.loads(out.strip().splitlines()[-1])["peak_bytes_in_use"]
    return compiled_bytes, temp_bytes, peak_in_use, step


def _maybe_bytes(n) -> str:
    return "n/a" if n is None else format_bytes(n)


def _worker(spec: dict) -> None:
    """Run one training step in this (fresh) process; print the device's peak bytes."""
    layers, params, x = MODELS[spec["model"]](spec["scale"])
    if spec["method"] == "plain":
        run = lambda p, x: _plain(layers, p, x)  # noqa: E731
    else:
        run = remat_sequence(layers, spec["budget"], method=spec["method"], backend=spec["backend"],
                             costs=spec.get("costs", "static"))
    step = jax.jit(jax.value_and_grad(_loss(run)))
    jax.block_until_ready(step(params, x))
    stats = jax.devices()[0].memory_stats() or {}
    print(json.dumps({"peak_bytes_in_use": stats.get("peak_bytes_in_use")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--scale", type=int, default=1, help="multiplies the batch size")
    parser.add_argument("--budgets", default="0.2,0.35,0.5,0.75,1.0",
                        help="fractions of the no-remat activation memory")
    parser.add_argument("--methods", default="rotor,sqrt,every_layer,revolve,none")
    parser.add_argument("--backend", default="checkpoint", choices=("checkpoint", "custom_vjp"))
    parser.add_argument("--costs", default="static", choices=("static", "flops"),
                        help="remat_sequence's cost model (jaxremat.sequence.profile)")
    parser.add_argument("--device-columns", choices=("auto", "on", "off"), default="auto",
                        help="compiled memory, peak bytes in use, step time: auto = on a GPU/TPU "
                             "only ('on' also on CPU, to exercise the code; the numbers mean "
                             "little there)")
    parser.add_argument("--no-peak", action="store_true",
                        help="skip the fresh-process peak_bytes_in_use column (faster). Note: "
                             "a convolution's autotuning during compilation can set that peak")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(json.loads(args.worker))
        return

    gpu = {"auto": jax.devices()[0].platform != "cpu", "on": True, "off": False}[args.device_columns]
    layers, params, x = MODELS[args.model](args.scale)
    plain_loss = _loss(lambda p, x: _plain(layers, p, x))
    full = activation_memory(plain_loss, params, x)
    base_flops = _flops(plain_loss, params, x)
    param_bytes = sum(a.nbytes for a in jax.tree.leaves(params))
    print(f"model={args.model} layers={len(layers)} x={x.shape} params={format_bytes(param_bytes)} "
          f"backend={args.backend} costs={args.costs} device={jax.devices()[0].device_kind}")
    print(f"no-remat activation memory (measured, program order): {format_bytes(full)}; "
          f"no-remat grad flops: {base_flops:.4g} (cost analysis: {costs.LAST_SOURCE})")
    header = (f"{'method':<12} {'budget':>6} {'budget B':>11} {'predicted':>11} {'measured':>11} "
              f"{'meas/pred':>9} {'meas/bud':>8} {'flops x':>7}")
    if gpu:
        header += f" {'compiled':>11} {'temp':>11} {'peak in use':>11} {'step ms':>8}"
        plain_cols = _gpu_columns(plain_loss, params, x, args.model, args.scale, "plain", 0,
                                  args.backend, not args.no_peak)
        print(f"plain step: compiled {format_bytes(plain_cols[0])}, temp "
              f"{format_bytes(plain_cols[1])}, peak in use {_maybe_bytes(plain_cols[2])}, "
              f"step {plain_cols[3] * 1e3:.2f} ms")
    else:
        print("(CPU: compiled memory, peak bytes in use and step time are skipped: XLA's CPU "
              "compiler undoes remat and CPU devices report no memory statistics)")
    print(header)
    print("-" * len(header))
    rows = {}
    for method in args.methods.split(","):
        for fraction in (float(f) for f in args.budgets.split(",")):
            rows[method, fraction] = _row(args, method, int(fraction * full), fraction, layers,
                                          params, x, base_flops, gpu)
    if "every_layer" in args.methods.split(","):
        _equal_memory(args, rows, layers, params, x, base_flops, full,
                      plain_cols[3] if gpu else None)


def _row(args, method, budget, fraction, layers, params, x, base_flops, gpu) -> dict | None:
    """Print one table row; return its numbers (None when the budget is infeasible)."""
    seq = remat_sequence(layers, budget, method=method, backend=args.backend, costs=args.costs)
    try:
        plan = seq.plan(params, x)
    except solver.InfeasibleBudget as error:
        print(f"{method:<12} {fraction:>6.2f} {format_bytes(budget):>11} infeasible "
              f"(needs {format_bytes(error.min_budget)})")
        return None
    loss = _loss(seq)
    measured = activation_memory(loss, params, x)
    flops = _flops(loss, params, x)
    row = (f"{method:<12} {fraction:>6.2f} {format_bytes(budget):>11} "
           f"{format_bytes(plan.predicted_peak):>11} {format_bytes(measured):>11} "
           f"{measured / plan.predicted_peak:>9.3f} {measured / budget:>8.3f} "
           f"{flops / base_flops:>7.3f}")
    result = {"predicted": plan.predicted_peak, "measured": measured, "flops": flops / base_flops}
    if gpu:
        compiled, temp, in_use, step = _gpu_columns(loss, params, x, args.model, args.scale,
                                                    method, budget, args.backend, not args.no_peak,
                                                    args.costs)
        row += (f" {format_bytes(compiled):>11} {format_bytes(temp):>11} "
                f"{_maybe_bytes(in_use):>11} {step * 1e3:>8.2f}")
        result.update(compiled=compiled, temp=temp, in_use=in_use, step=step)
    print(row)
    return result


def _equal_memory(args, rows, layers, params, x, base_flops, full, plain_step) -> None:
    """Rotor with every-layer checkpointing's predicted peak as its budget: flops and, on a
    GPU (``plain_step`` given), step time of each relative to the plain step (the
    comparison the project's issue asks for)."""
    every = next((r for (m, _), r in rows.items() if m == "every_layer" and r), None)
    if every is None:
        return
    budget = every["predicted"]
    print(f"\nat every_layer's predicted peak ({format_bytes(budget)}):")
    rotor = _row(args, "rotor", budget, budget / full, layers, params, x, base_flops,
                 plain_step is not None)
    if rotor is not None:
        print(f"flops vs plain: every_layer {every['flops']:.3f}x, rotor {rotor['flops']:.3f}x")
    if rotor is not None and plain_step is not None:
        print(f"step time vs plain: every_layer {every['step'] / plain_step:.3f}x, "
              f"rotor {rotor['step'] / plain_step:.3f}x; temp: every_layer "
              f"{format_bytes(every['temp'])}, rotor {format_bytes(rotor['temp'])}")


if __name__ == "__main__":
    main()
