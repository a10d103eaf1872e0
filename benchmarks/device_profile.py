"""Static versus measured layer costs on a device, and what each plan costs when run.

    python benchmarks/device_profile.py [--model gpt] [--scale 64] [--budget 0.35]

For one model of ``benchmarks/jax_memory.py`` it profiles the layers twice,
``costs="static"`` (roofline from ``cost_analysis``, program-order transients) and
``costs="measured"`` (each layer's jitted forward and backward timed on the device; on a GPU
the transients from ``memory_analysis``), and prints per distinct layer the two sets of
numbers. It then plans ``remat_sequence(..., method="rotor")`` at the budget (a share of the
no-remat activation memory) with each cost model and runs both: predicted time overhead,
measured step time (median of 10) and compiled temp bytes. Last it prints
``budget_from_device`` for the parameters and an Adam state (a GPU reports ``bytes_limit``;
on CPU it says why there is none).

On CPU it runs too (measured = CPU wall time), but the numbers say little there.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import optax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jax_memory import MODELS, _loss, _plain, compiled_columns  # noqa: E402
from jaxremat import activation_memory, budget_from_device, format_bytes, remat_sequence  # noqa: E402
from jaxremat.sequence.profile import profile_sequence  # noqa: E402


def _layer_table(static, measured) -> None:
    print(f"{'layer':>5} {'static fwd us':>13} {'meas fwd us':>11} {'static bwd us':>13} "
          f"{'meas bwd us':>11} {'static tmp f/b':>19} {'meas tmp f/b':>19}")
    seen = set()
    for s, m in zip(static.layers, measured.layers):
        key = (s.fwd_flops, s.bwd_flops, s.tape_bytes)
        if key in seen:
            continue
        seen.add(key)
        print(f"{s.index:>5} {s.fwd_time * 1e6:>13.1f} {m.fwd_time * 1e6:>11.1f} "
              f"{s.bwd_time * 1e6:>13.1f} {m.bwd_time * 1e6:>11.1f} "
              f"{format_bytes(s.fwd_tmp):>9}/{format_bytes(s.bwd_tmp):>9} "
              f"{format_bytes(m.fwd_tmp):>9}/{format_bytes(m.bwd_tmp):>9}")
    for name, prof in (("static", static), ("measured", measured)):
        chain = prof.chain
        print(f"{name:>8}: forward {sum(chain.fwd_time) * 1e3:.3f} ms, backward "
              f"{sum(chain.bwd_time) * 1e3:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt")
    parser.add_argument("--scale", type=int, default=64)
    parser.add_argument("--budget", type=float, default=0.35)
    args = parser.parse_args()
    layers, params, x = MODELS[args.model](args.scale)
    print(f"model={args.model} scale={args.scale} x={x.shape} device={jax.devices()[0].device_kind}")
    static = profile_sequence(layers, params, x, costs="static")
    measured = profile_sequence(layers, params, x, costs="measured", progress=False)
    _layer_table(static, measured)

    plain_loss = _loss(lambda p, x: _plain(layers, p, x))
    full = activation_memory(plain_loss, params, x)
    _, plain_temp, plain_step = compiled_columns(plain_loss, params, x)
    budget = int(args.budget * full)
    print(f"\nplain: activation memory {format_bytes(full)}, compiled temp "
          f"{format_bytes(plain_temp)}, step {plain_step * 1e3:.2f} ms; budget "
          f"{format_bytes(budget)} ({args.budget:.0%})")
    print(f"{'costs':<9} {'pred. overhead':>14} {'measured':>10} {'temp':>10} {'step ms':>8} "
          f"{'step x':>7}")
    for costs in ("static", "measured"):
        seq = remat_sequence(layers, budget, costs=costs)
        plan = seq.plan(params, x)
        loss = _loss(seq)
        _, temp, step = compiled_columns(loss, params, x)
        overhead = plan.predicted_time / plan.no_remat_time
        print(f"{costs:<9} {overhead:>14.3f} {format_bytes(activation_memory(loss, params, x)):>10} "
              f"{format_bytes(temp):>10} {step * 1e3:>8.2f} {step / plain_step:>7.3f}")

    opt_state = optax.adam(1e-3).init(params)
    try:
        found = budget_from_device(params, opt_state)
        stats = jax.devices()[0].memory_stats()
        print(f"\nbudget_from_device: {format_bytes(found)} of bytes_limit "
              f"{format_bytes(stats['bytes_limit'])} (params + grads + Adam state subtracted)")
    except ValueError as error:
        print(f"\nbudget_from_device: {error}")


if __name__ == "__main__":
    main()
