"""Speed and memory of Rotor's dynamic program (solver/chain/rotor.py) on one CPU core.

For each chain length L, a random heterogeneous chain (``solver.chain.generators.random_chain``) is
solved with M = 500 memory slots at budgets a fraction ``f`` of the way from the exact
minimum budget to the no-rematerialisation peak. Each (L, f) runs in its own subprocess so
that the peak RSS is per measurement; the JIT is warmed there first (numba's on-disk cache
is loaded), so the times exclude compilation, which is measured once separately with an
empty cache.

Per-layer options (Rockmate's multi-option layers, ``solver.chain.options``): each (L, f)
runs once per ``--options`` count ``K`` (default 1 and 4), the chain being the same random
chain with ``K - 1`` random extra options per layer
(``solver.chain.generators.with_random_options``); ``K = 1`` is the chain without options,
so the two rows compare the same machine in the same run.

Columns: ``K`` options per layer; ``minpeak s`` exact minimum-budget DP (O(L^3)); ``table s`` the time DP
(O(L^3 M)), wall clock, and ``cpu s`` its CPU time (the two differ when other processes
share the core); ``rebuild s`` reconstruction of the plan plus the simulator's costing of it;
``total s`` the sum; ``table MiB`` the DP's arrays; ``RSS MiB`` the subprocess's peak
resident memory (Python, numpy and numba included, about 150 MiB on their own);
``overhead`` the schedule's time over the no-rematerialisation time (of option 0, the
whole tapes), minus one; ``F_all k>0`` how many of the plan's ``F_all`` ops use an option
other than the whole tape.

Targets: L = 200 within 0.5 s (one option) and 2 s (4 options); L = 1000 within 60 s and
4 GiB.

    python benchmarks/solver_speed.py               # L = 25 .. 1000, K = 1 and 4
    python benchmarks/solver_speed.py --max-layers 200 --options 1 4
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

LENGTHS = (25, 50, 100, 200, 400, 1000)


def _child(length: int, fraction: float, slots: int, seed: int, options: int) -> dict:
    import resource

    from solver import Layer, make_schedule
    from solver.chain.generators import random_chain, with_random_options
    from solver.chain.rotor import RotorTable, rotor_min_budget

    warm = random_chain(3, seed)
    for table in (warm, with_random_options(warm, seed)):  # load the JIT cache
        RotorTable(table, 400.0, slots).schedule(400.0)

    chain = random_chain(length, seed)
    if options > 1:
        chain = with_random_options(chain, seed, options=options)
    t0 = time.perf_counter()
    low = rotor_min_budget(chain)
    t1 = time.perf_counter()
    high = make_schedule(chain, tuple(Layer(i) for i in range(length))).peak
    budget = low + fraction * (high - low)
    t2 = time.perf_counter()
    c2 = time.process_time()
    table = RotorTable(chain, budget, slots)
    c3 = time.process_time()
    t3 = time.perf_counter()
    schedule = table.schedule(budget)
    t4 = time.perf_counter()
    assert schedule.peak <= budget
    return dict(
        L=length,
        K=options,
        f=fraction,
        M=table.capacity,
        minpeak=t1 - t0,
        table=t3 - t2,
        table_cpu=c3 - c2,
        rebuild=t4 - t3,
        total=(t1 - t0) + (t4 - t2),
        table_mib=table.nbytes / 2**20,
        rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        overhead=schedule.time / (chain.fwd_time.sum() + chain.bwd_time.sum()) - 1,
        fallback=table.predicted_time(budget) == float("inf"),
        optioned=sum(1 for op in schedule.ops if len(op) == 3),
    )


def _compile_child(slots: int) -> dict:
    t0 = time.perf_counter()
    from solver.chain.generators import random_chain
    from solver.chain.rotor import RotorTable

    t1 = time.perf_counter()
    RotorTable(random_chain(3, 0), 400.0, slots).schedule(400.0)
    return dict(import_s=t1 - t0, first_call_s=time.perf_counter() - t1)


def _run(args: list[str], env: dict | None = None) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *args],
        check=True, capture_output=True, text=True, cwd=root,
        env={**os.environ, "PYTHONPATH": root, **(env or {})},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-layers", type=int, default=1000)
    parser.add_argument("--slots", type=int, default=500)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.5])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--options", type=int, nargs="+", default=[1, 4],
                        help="options per layer (K); 1 = the chain without options")
    parser.add_argument("--child", nargs=3, type=float, help=argparse.SUPPRESS)
    parser.add_argument("--compile-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(_child(int(args.child[0]), args.child[1], args.slots, args.seed,
                                int(args.child[2]))))
        return
    if args.compile_child:
        print(json.dumps(_compile_child(args.slots)))
        return

    with tempfile.TemporaryDirectory() as cache:
        cold = _run(["--compile-child", "--slots", str(args.slots)], {"NUMBA_CACHE_DIR": cache})
        warm = _run(["--compile-child", "--slots", str(args.slots)], {"NUMBA_CACHE_DIR": cache})
    print(f"numba compile, empty cache: {cold['first_call_s']:.2f} s; "
          f"first call with the cache on disk: {warm['first_call_s']:.2f} s")
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print()
    header = (f"{'L':>5} {'K':>2} {'f':>4} {'M':>4} {'minpeak s':>9} {'table s':>8} {'cpu s':>7} "
              f"{'rebuild s':>9} "
              f"{'total s':>8} {'table MiB':>9} {'RSS MiB':>8} {'overhead':>8} {'F_all k>0':>9}")
    print(header)
    print("-" * len(header))
    for length in (n for n in LENGTHS if n <= args.max_layers):
        for fraction in args.fractions:
            for options in args.options:
                r = _run(["--child", str(length), str(fraction), str(options), "--slots",
                          str(args.slots), "--seed", str(args.seed)])
                note = " (min-peak fallback)" if r["fallback"] else ""
                print(f"{r['L']:>5} {r['K']:>2} {r['f']:>4.2f} {r['M']:>4} {r['minpeak']:>9.3f} "
                      f"{r['table']:>8.3f} {r['table_cpu']:>7.3f} {r['rebuild']:>9.3f} "
                      f"{r['total']:>8.3f} {r['table_mib']:>9.1f} {r['rss_mib']:>8.0f} "
                      f"{r['overhead']:>7.1%} {r['optioned']:>9}{note}", flush=True)


if __name__ == "__main__":
    main()
