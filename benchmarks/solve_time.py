"""CPU time of ``solver.solve`` (planning without profiling), in this checkout and another.

    python benchmarks/solve_time.py [--other /path/to/other/checkout]

Profiles the models of ``benchmarks/policies.py`` once (``costs="flops"``, default menu),
then, in a fresh process per checkout (this one, and ``--other`` if given, e.g. the main
branch), times ``solver.solve`` on those chains (with the frontend's option aliases where
``solve`` takes them) at 25/30/40/60/80/100% of the chain's no-remat peak, and on random
chains with 4 options per layer (``with_random_options(random_chain(L, 0))``, L = 12, 50,
200) at 10/30/60% of the way from the least budget to the no-remat peak. Each figure is the
best of 5 runs of ``time.process_time`` (CPU seconds: the machine is shared), summed over the
budgets; the profile's CPU time is printed beside it for scale.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_TIMER = r'''
import inspect, pickle, sys, time
root, path = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import solver
assert solver.__file__.startswith(root), solver.__file__
takes_aliases = "aliases" in inspect.signature(solver.solve).parameters

def best(chain, budget, kw):
    try:
        solver.solve(chain, budget, **kw)
    except solver.InfeasibleBudget:
        return 0.0
    runs = []
    for _ in range(5):
        start = time.process_time()
        solver.solve(chain, budget, **kw)
        runs.append(time.process_time() - start)
    return min(runs)

for name, (chain, aliases, top, profile) in pickle.load(open(path, "rb")).items():
    kw = {"aliases": aliases} if takes_aliases else {}
    total = sum(best(chain, f * top, kw) for f in (0.25, 0.3, 0.4, 0.6, 0.8, 1.0))
    print(f"  {name:>10} (L={chain.length:3d}): solve {total * 1e3:7.1f} ms over 6 budgets; "
          f"profile {profile:.2f} s")
for L in (12, 50, 200):
    chain = solver.with_random_options(solver.random_chain(L, 0, max_size=10**6), 0, options=4)
    low = solver.rotor_min_budget(chain)
    top = solver.make_schedule(chain, tuple(solver.Layer(i) for i in range(L))).peak
    total = sum(best(chain, low + f * (top - low), {}) for f in (0.1, 0.3, 0.6))
    print(f"  random K=4 (L={L:3d}): solve {total * 1e3:7.1f} ms over 3 budgets")
'''


def profile_models(path: str) -> None:
    """Pickle ``{model: (chain, aliases, no-remat peak, profile CPU seconds)}`` to ``path``."""
    import time

    sys.path.insert(0, ROOT)
    sys.path.insert(0, HERE)
    import solver
    from jaxremat.sequence.options import option_aliases
    from jaxremat.sequence.profile import profile_sequence
    from policies import BUILDERS

    out = {}
    for name, build in BUILDERS.items():
        layers, params, x = build()
        start = time.process_time()
        profile = profile_sequence(layers, params, x, costs="flops")
        seconds = time.process_time() - start
        chain = profile.chain
        top = solver.make_schedule(chain, solver.uniform_plans(chain)["none"]).peak
        out[name] = (chain, [option_aliases(p.dropped) for p in profile.layers], top, seconds)
    with open(path, "wb") as f:
        pickle.dump(out, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", help="another checkout to time on the same chains")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "chains.pkl")
        profile_models(path)
        for root in [ROOT] + ([os.path.abspath(args.other)] if args.other else []):
            print(f"{root}:", flush=True)
            subprocess.run([sys.executable, "-c", _TIMER, root, path], check=True)


if __name__ == "__main__":
    main()
