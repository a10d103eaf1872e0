"""Speed of min_peak_chain (solver/chain/min_peak.py): n, input family, method, seconds.

Run: ``python benchmarks/linear_speed.py``. Each time is the best of a few runs after a
warm-up call (numba compiles once, then its cache is reused). ``evals`` is how many bounds
the fast method's branch and bound evaluated (each an O(n) DP). "tied blocks" is the
family of ``solver.chain.min_peak``'s Lemma 5, on which every exact method that only evaluates
``cost`` needs at least n/4 evaluations; "+1e-9u" breaks its ties with noise. ``cubic``
evaluates every distinct segment sum and only runs while that takes a few seconds. Where
both run, the script checks that their peaks agree.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from solver import min_peak_chain  # noqa: E402
from solver.chain.min_peak import _branch_and_bound, tied_blocks  # noqa: E402

def _padded(sizes: np.ndarray, n: int) -> np.ndarray:
    """``sizes`` followed by zeros up to length ``n``."""
    return np.concatenate([sizes, np.zeros(n - sizes.size)])


FAMILIES = {
    "uniform[0,1)": lambda rng, n: rng.random(n),
    "int bytes 1..1e6": lambda rng, n: rng.integers(1, 1_000_000, n).astype(float),
    "all equal": lambda rng, n: np.ones(n),
    "near equal 1+1e-6u": lambda rng, n: 1.0 + 1e-6 * rng.random(n),
    "increasing 1..n": lambda rng, n: np.arange(1, n + 1, dtype=float),
    "decreasing n..1": lambda rng, n: np.arange(n, 0, -1, dtype=float),
    "sawtooth i%17+1": lambda rng, n: (np.arange(n) % 17) + 1.0,
    "heavy tail exp^3": lambda rng, n: rng.exponential(size=n) ** 3,
    "lognormal s=2": lambda rng, n: rng.lognormal(0.0, 2.0, n),
    "zeros and ones": lambda rng, n: rng.integers(0, 2, n).astype(float),
    "tied blocks": lambda rng, n: _padded(tied_blocks((n + 1) // 4), n),
    "tied blocks+1e-9u": lambda rng, n: _padded(tied_blocks((n + 1) // 4), n) + 1e-9 * rng.random(n),
}
SIZES = (100, 1000, 10_000)
CUBIC_MAX_N = 1000


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    min_peak_chain(np.ones(5), method="fast")  # compile / load the numba cache
    min_peak_chain(np.ones(5), method="cubic")
    print(f"{'n':>6}  {'family':<20} {'method':<6} {'seconds':>9} {'evals':>6} {'peak':>14}")
    worst_fast = 0.0
    for n in SIZES:
        for name, family in FAMILIES.items():
            sizes = family(np.random.default_rng(n), n)
            prefix = np.concatenate(([0.0], np.cumsum(sizes)))
            evals = _branch_and_bound(sizes, prefix)[1]
            fast = min_peak_chain(sizes, method="fast")
            seconds = best_time(lambda: min_peak_chain(sizes, method="fast"), 3)
            worst_fast = max(worst_fast, seconds) if n == 10_000 else worst_fast
            print(f"{n:>6}  {name:<20} {'fast':<6} {seconds:>9.4f} {evals:>6} {fast.peak:>14.6g}")
            if n <= CUBIC_MAX_N:
                cubic = min_peak_chain(sizes, method="cubic")
                seconds = best_time(lambda: min_peak_chain(sizes, method="cubic"), 1)
                agree = "" if np.isclose(cubic.peak, fast.peak, rtol=1e-12) else "  MISMATCH"
                print(f"{n:>6}  {name:<20} {'cubic':<6} {seconds:>9.4f} {'all':>6} {cubic.peak:>14.6g}{agree}")
    print(f"\nslowest fast run at n = 10 000: {worst_fast:.4f} s (target: <= 1 s)")


if __name__ == "__main__":
    main()
