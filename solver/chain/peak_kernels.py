"""Numba kernel of the exact minimum peak of Rotor's recurrence (ALGORITHMS.md section 2).

The same recurrence as the time DP (:mod:`solver.chain.kernels`, whose array conventions
it shares, options included) read as a min-max on the real sizes (float64, no rounding):
the least peak ``P[i][l]`` over persistent schedules of ``(i, l)``. Absent options carry
infinite sizes here, so they are never chosen.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import base_threshold, chain_start

__all__ = ["fill_min_peak"]


@njit(cache=True)
def fill_min_peak(cw, cbw, cout, cgone, cfree, crf, route, sub, ftmp, fck, gbt, tft, fw, bw, ft,
                  peak, time, choice):
    """Exact minimum peak ``P_c[i][l]`` over persistent schedules of ``(i, l)`` (float64), in
    each context ``c`` (0: ``x[i]`` whole; ``rc``, the last: ``x[i]`` cut by ``F_ck(i)``,
    :mod:`solver.chain.kernels`).

    Base ``(i, i)``: the least over options ``k`` of :func:`~solver.chain.kernels.base_threshold`.
    Leaf ``j``: ``max(m∅, cw[l+1] + max(cw[i+1] + fck[i], fneed(i, j) - b), cw[j] - b +
    P_0[j][l], P_rc[i][j-1] - b)``
    (``b = crf[i]`` in context 0, else 0). Chain with option ``k``:
    :func:`~solver.chain.kernels.chain_start` with ``P_0[i+1][l]`` (the corrected
    recurrence). The least over options. Equal peaks are broken by the time of the options'
    plans (``time[c, i, l]``, a heuristic: it is not the least time among all minimum-peak
    schedules), then in favour of chain options (lower ``k`` first), then the smallest
    ``j``. ``peak``, ``time`` and ``choice`` are ``(C, L+1, L+1)``; ``choice`` gets ``-k``
    (chain, or the base case's option) or ``j`` (leaf). O(L^3 + L^2 K) time per context.
    """
    C = peak.shape[0]
    L = peak.shape[1] - 1
    K = cbw.shape[1]
    lower = not (cfree[0] > 0).any()  # m∅ only without cut inputs (solver.chain.kernels)
    ftmin = np.empty(L + 1)
    for p in range(L + 1):
        ftmin[p] = fck[p]  # the least transient of a forward of layer p (solver.chain.bounds)
        for k in range(K):
            ftmin[p] = min(ftmin[p], ftmp[p, k])
    for i in range(L, -1, -1):
        for c in range(C):
            best, best_time, arg = np.inf, np.inf, 0
            for k in range(K):
                v = base_threshold(cw, cbw, cout, cfree[c], tft, gbt, i, k)
                t = ft[i, k] + bw[i, k]
                if v < best or (v == best and t < best_time):
                    best, best_time, arg = v, t, -k
            peak[c, i, i], time[c, i, i], choice[c, i, i] = best, best_time, arg
        mx = cw[i + 1] + ftmin[i]
        for l in range(i + 1, L + 1):
            mnull = cw[l + 1] + mx if lower else 0.0
            for c in range(C):
                rc = route[c, 0]
                b = crf[i] if route[c, 1] == 0 else 0.0
                best, best_time, arg = np.inf, np.inf, 0
                for k in range(K):
                    q = sub[i, k]
                    v = chain_start(cw, cbw, cgone, cfree[c], ftmp, gbt, peak[q, i + 1, l], i, l,
                                    mnull, k)
                    t = fw[i, k] + bw[i, k] + time[q, i + 1, l]
                    if v < best or (v == best and t < best_time):
                        best, best_time, arg = v, t, -k
                prefix = 0.0
                fx = 0.0  # F_none(i+1..j-1), after F_ck(i) freed b of x[i]
                for j in range(i + 1, l + 1):
                    prefix += fw[j - 1, 0]
                    if j > i + 1:
                        fx = max(fx, cw[j - 1] + cw[j] + fck[j - 1])
                    v = max(max(mnull, cw[l + 1] + max(cw[i + 1] + fck[i], fx - b)),
                            max(cw[j] - b + peak[0, j, l], peak[rc, i, j - 1] - b))
                    if v <= best:
                        t = prefix + time[0, j, l] + time[rc, i, j - 1]
                        if v < best or t < best_time:
                            best = v
                            best_time = t
                            arg = j
                peak[c, i, l] = best
                time[c, i, l] = best_time
                choice[c, i, l] = arg
            if l < L:
                mx = max(mx, cw[l] + cw[l + 1] + ftmin[l])
