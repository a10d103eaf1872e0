"""The feasibility part of Rotor's dynamic program: the first feasible memory of every
subproblem (ALGORITHMS.md section 2), an integer DP run before the time table.

It shares the padded integer arrays and contexts of :mod:`solver.chain.kernels` (see its
docstring: "Monotonicity", "Saturation", "Checkpoints held in part") and its thresholds
(:func:`~solver.chain.kernels.base_threshold`, :func:`~solver.chain.kernels.chain_start`,
:func:`~solver.chain.kernels.leaf_start`), so that the time table sweeps each option exactly
from the memory at which the simulator's peak of that option fits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kernels import base_threshold, chain_start, leaf_start

__all__ = ["fill_bounds"]


@njit(cache=True)
def fill_bounds(cw, cbw, cout, cgone, cfree, crf, route, sub, ftmp, fck, gbt, tft, lean_chain,
                lean_base, M, off, mnull, mmin, sat, fneed):
    """Integer part of the DP, for every pair ``(i, l)`` (row ``off[i] + l - i``) and context.

    ``mnull[row]``: Rotor's lower bound ``m∅ = cw[l+1] + max(cw[i+1] + ftmp[i],
    max_{i<k<l} (cw[k] + cw[k+1] + ftmp[k]))`` (0 on the diagonal), with each layer's least
    transient over its forwards (``ftmp`` of its options, ``fck`` of its forward without
    tape): some forward of each layer ``k < l`` computes ``x[k+1]``.
    ``mmin[c, row]``: the first ``m`` at which ``Opt_c[m][i][l] < inf`` (``M + 1`` if none),
    i.e. the least over the options of their first feasible ``m``. ``sat[c, row]``: the
    first ``m`` from which the chain option stores every tape with lean options (``M + 1``
    if none). ``fneed[i, j]`` (``i < j <= L``): see the module docstring. O(L^3 + L^2 K)
    integer operations per context.
    """
    L = cw.shape[0] - 2
    K = cbw.shape[1]
    C = cfree.shape[0]
    lower = not (cfree[0] > 0).any()  # m∅ bounds nothing once F_all cuts inputs (kernels)
    ftmin = np.empty(L + 1, dtype=np.int64)
    for p in range(L + 1):
        ftmin[p] = fck[p]
        for k in range(K):
            ftmin[p] = min(ftmin[p], ftmp[p, k])
    for i in range(L, -1, -1):
        row = off[i]
        for c in range(C):
            first, saturated = M + 1, M + 1
            for k in range(K):
                t = base_threshold(cw, cbw, cout, cfree[c], tft, gbt, i, k)
                first = min(first, t)
                if lean_base[i, k]:
                    saturated = min(saturated, t)
            mmin[c, row] = first
            sat[c, row] = saturated
        mnull[row] = 0
        mx = cw[i + 1] + ftmin[i]  # max_{i<k<l} maintained as l grows
        fx = 0  # the F_none part of fneed
        for l in range(i + 1, L + 1):
            fneed[i, l] = fx
            row = off[i] + (l - i)
            mn = cw[l + 1] + mx if lower else 0
            mnull[row] = mn
            rest = off[i + 1] + (l - i - 1)
            for c in range(C):
                b = crf[i] if route[c, 1] == 0 else 0
                first, saturated = M + 1, M + 1
                for k in range(K):
                    q = sub[i, k]
                    start = chain_start(cw, cbw, cgone, cfree[c], ftmp, gbt, mmin[q, rest], i, l,
                                        mn, k)
                    first = min(first, start)
                    if lean_chain[i, k]:
                        saturated = min(saturated,
                                        max(start, cbw[i + 1, k] - cfree[c, i, k] + sat[q, rest]))
                for j in range(i + 1, l + 1):
                    s = leaf_start(cw, fck, off, mnull, mmin, fneed, b, i, l, j, route[c, 0])
                    if s < first and s <= M - b:
                        first = s
                mmin[c, row] = min(first, M + 1)
                sat[c, row] = min(saturated, M + 1)
            if l < L:
                mx = max(mx, cw[l] + cw[l + 1] + ftmin[l])
                fx = max(fx, cw[l] + cw[l + 1] + fck[l])
