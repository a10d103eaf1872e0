"""Host offload options (issue 17.4) on the GPT stack: device memory and flops with and without.

    python benchmarks/offload.py [--model gpt] [--fractions 0.25,0.4,0.6] [--costs flops]
        [--scale N] [--device-columns auto|on|off]

On the stack of ``benchmarks/jax_memory.py`` (its builders are reused), at each budget (a
fraction of the plain stack's activation memory) ``remat_sequence`` is planned and measured
with three menus:

* ``default``: the default policy menu (no offload);
* ``+ offload``: the default menu and ``offload_dots_no_batch``, ``offload_names``, with the
  transfer time of the nominal bandwidth (:data:`jaxremat.measure.offload.NOMINAL_HOST_BANDWIDTH`,
  25 GB/s against the 50 Tflop/s of the flops cost model);
* ``+ offload, 450 GB/s``: the same at a bandwidth of the order of NVLink-C2C's one way;
* ``+ offload, free transfers``: the same with an unbounded bandwidth, the most offload can
  buy (a bound, not a device).

Device memory is :func:`jaxremat.activation_memory` (program order; residuals in host memory
are not on the device), flops are the lowered ``cost_analysis`` of ``value_and_grad``, both
relative to the plain stack; "host" is what the plan keeps in host memory, "predicted time"
the chain's time over no remat (transfers included, overlapped as modelled). On CPU the
transfer time is modelled, never measured: host and device are the same memory there.
On a GPU (``--device-columns auto``) the menu ``+ offload, measured`` uses the bandwidth
measured on the device (:func:`jaxremat.measure.offload.host_bandwidth` under
``costs="measured"``: a timed ``device_put`` to ``pinned_host``), and every row adds the
compiled device temp memory of the jitted ``value_and_grad``
(``memory_analysis().temp_size_in_bytes``), its host temp memory
(``host_temp_size_in_bytes``, where this JAX reports it) and the median step time: what
offload really costs in time, and whether the residuals really left the device.
Also printed: the profiling time (CPU seconds, after a warm-up profile, cache cleared) of
each menu, which is what putting the offload options on the default menu would cost.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import solver  # noqa: E402
from jax_memory import MODELS, _flops, _loss, _plain  # noqa: E402
from jaxremat import activation_memory, remat_sequence  # noqa: E402
from jaxremat.measure import offload  # noqa: E402
from jaxremat.measure.timing import median_time  # noqa: E402
from jaxremat.sequence.policies import DEFAULT_POLICIES, OFFLOAD_POLICIES  # noqa: E402
from jaxremat.sequence.profile import profile_cache, profile_sequence  # noqa: E402

MENUS = {
    "default": (DEFAULT_POLICIES, None),
    "+ offload": (DEFAULT_POLICIES + OFFLOAD_POLICIES, None),
    "+ offload, 450 GB/s": (DEFAULT_POLICIES + OFFLOAD_POLICIES, 450e9),
    "+ offload, free transfers": (DEFAULT_POLICIES + OFFLOAD_POLICIES, 1e30),
}


def _measure(loss, params, x):
    return activation_memory(loss, params, x), _flops(loss, params, x)


def _device_cells(loss, params, x) -> str:
    """Compiled device temp MiB, host temp MiB and median step ms of the jitted
    ``value_and_grad`` of ``loss``."""
    compiled = jax.jit(jax.value_and_grad(loss)).lower(params, x).compile()
    stats = compiled.memory_analysis()
    host = getattr(stats, "host_temp_size_in_bytes", None)
    host_cell = "n/a" if host is None else f"{host / 2**20:.1f}"
    step = median_time(compiled, (params, x), repeats=10)
    return f" {stats.temp_size_in_bytes / 2**20:.1f} | {host_cell} | {step * 1e3:.2f} |"


def _profile_seconds(layers, params, x, menu, costs) -> float:
    profile_cache().clear()
    start = time.process_time()
    profile_sequence(layers, params, x, costs=costs, policies=menu)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt", choices=sorted(MODELS))
    parser.add_argument("--costs", default="flops", choices=("flops", "static"))
    parser.add_argument("--fractions", default="0.25,0.4,0.6",
                        type=lambda s: [float(v) for v in s.split(",") if v])
    parser.add_argument("--scale", type=int, default=1, help="multiplies the batch size")
    parser.add_argument("--device-columns", choices=("auto", "on", "off"), default="auto",
                        help="compiled device and host temp memory, step time: auto = on a "
                             "GPU/TPU only")
    args = parser.parse_args()
    gpu = {"auto": jax.devices()[0].platform != "cpu", "on": True,
           "off": False}[args.device_columns]
    reason = offload.offload_unavailable()
    if reason:
        raise SystemExit(f"offload options are not available here: {reason}")
    menus = dict(MENUS)
    if gpu:
        measured = offload.host_bandwidth("measured")
        menus["+ offload, measured"] = (DEFAULT_POLICIES + OFFLOAD_POLICIES, measured)
        print(f"measured device-to-host bandwidth: {measured / 1e9:.1f} GB/s "
              f"({offload.PROBE_BYTES >> 20} MiB device_put to pinned_host, best of 3)")
    layers, params, x = MODELS[args.model](args.scale)
    plain_loss = _loss(lambda p, v: _plain(layers, p, v))
    plain_mem, plain_flops = _measure(plain_loss, params, x)
    print(f"JAX {jax.__version__}, backend {jax.default_backend()}, model {args.model} "
          f"({len(layers)} layers, input {tuple(x.shape)}), costs={args.costs!r}; plain: "
          f"activation memory {plain_mem / 2**20:.2f} MiB")
    if gpu:
        print("plain step: device temp MiB | host temp MiB | step ms:"
              + _device_cells(plain_loss, params, x))
    _profile_seconds(layers, params, x, MENUS["+ offload"][0], args.costs)  # warm-up
    for name, (menu, _) in list(MENUS.items())[:2]:
        print(f"profiling time, menu {name!r}: "
              f"{_profile_seconds(layers, params, x, menu, args.costs):.1f} s CPU")
    print("\n| budget (% plain) | menu | device memory (% plain) | flops x plain | host "
          "| predicted time x no remat | options used |"
          + (" device temp MiB | host temp MiB | step ms |" if gpu else ""))
    print("|---|---|---|---|---|---|---|" + ("---|---|---|" if gpu else ""))
    nominal = offload.NOMINAL_HOST_BANDWIDTH
    for fraction in args.fractions:
        budget = int(fraction * plain_mem)
        for name, (menu, bandwidth) in menus.items():
            offload.NOMINAL_HOST_BANDWIDTH = bandwidth or nominal
            seq = remat_sequence(layers, budget, costs=args.costs, policies=menu)
            try:
                plan = seq.plan(params, x)
            except solver.InfeasibleBudget as error:
                print(f"| {fraction:.0%} | {name} | infeasible (min "
                      f"{error.min_budget / plain_mem:.1%}) | - | - | - | - |"
                      + (" - | - | - |" if gpu else ""))
                continue
            mem, flops = _measure(_loss(seq), params, x)
            used = sorted({o for o in plan.options if o != "everything"}) or ["-"]
            print(f"| {fraction:.0%} | {name} | {mem / plain_mem:.1%} | "
                  f"{flops / plain_flops:.3f} | {sum(plan.host_bytes) / 2**20:.2f} MiB | "
                  f"{plan.predicted_time / plan.no_remat_time:.3f} | {', '.join(used)} |"
                  + (_device_cells(_loss(seq), params, x) if gpu and bandwidth != 1e30 else
                     (" - | - | - |" if gpu else "")))
    offload.NOMINAL_HOST_BANDWIDTH = nominal


if __name__ == "__main__":
    main()
