"""Numba kernels of Rotor's dynamic program (ALGORITHMS.md section 2).

Everything here works on Rotor's padded integer arrays for a chain of ``L`` layers, with
positions ``0..L`` (position ``L`` is the loss):

- ``cw[k]`` (``k = 0..L+1``): size of ``x[k]`` (``cw[L+1] = 0``),
- ``cbw[k]`` (``k = 0..L+1``): ``cbw[i+1]`` is the tape size of layer ``i`` (``cbw[0]`` unused,
  ``cbw[L+1] = 0``),
- ``cout[k]`` (``k = 0..L+1``): ``cout[i+1]`` is the part of ``cbw[i+1]`` that ``B(i)`` does not
  hold: the size of ``x[i+1]`` when layer ``i``'s output is outside its tape
  (``Chain.output_in_tape[i]`` false), else 0 (see :mod:`solver.chain.rotor`),
- ``ftmp``, ``btmp``, ``fw``, ``bw`` (``L+1`` entries, the loss's entry 0),
- ``ft`` (``L+1`` entries, the loss's 0): ``Chain.fwd_tape_time``, the cost of ``F_all(i)`` in
  the base case ``(i, i)``, where ``g[i+1]`` is held and ``B(i)`` follows at once (only the
  tape is computed); everywhere else a forward costs ``fw``,
- ``cum``: float64 prefix sums of ``fw`` (``cum[k] = Σ_{t<k} fw[t]``); the recomputation
  cost of the leaf option ``j`` is ``float32(cum[j] - cum[i])``, the same bits everywhere.

The table of the time DP is triangular: the pair ``(i, l)`` with ``i <= l`` owns row
``off[i] + l - i`` of a ``(pairs, M + 1)`` float32 array whose last, contiguous axis is the
memory ``m``. So the inner loop of the leaf option is a contiguous, vectorisable sweep over
``m``, and the table needs ``4 (L+1)(L+2)/2 (M+1)`` bytes.

Three facts keep it fast.

- Monotonicity: ``Opt[m][i][l]`` is nonincreasing in ``m``, so every option is feasible
  exactly on an interval ``[start, M]``. Feasibility is a separate, cheap integer DP
  (:func:`fill_bounds`: ``mmin[row]``, the first feasible ``m``, is the discretised minimum
  peak), and no infinity ever enters the arithmetic of the time DP.
- Saturation: from the first ``m`` (``sat[row]``) at which the chain option stores every
  tape of ``i..l``, its time ``Σ_{k<l} fw[k] + ft[l] + Σ bw`` is a lower bound of every
  option (each layer runs backward once; each layer ``k < l`` runs at least one forward
  that computes ``x[k+1]``, which layer ``k+1`` reads, costing ``fw[k]``; layer ``l`` runs
  forward only while ``g[l+1]`` is held, costing ``ft[l] <= fw[l]``), and ties favour
  storing, so the leaf options are only swept below ``sat``.
- Blocking: cells are computed in square tiles of ``block x block`` pairs. For a tile off the
  diagonal, the leaf options whose split ``j`` lies between the tile's ``i`` range and its
  ``l`` range only read finished rows, so they run ``j``-outermost: each operand row is read
  once per tile and reused ``block`` times from cache, instead of streaming the whole table
  from memory for every cell (the DP is memory-bound otherwise).

There is no decision table: the row of best times is enough to recover a decision, by
recomputing the options at the one ``(i, l, m)`` asked (:func:`decide`) in the same
float32 arithmetic, chain option first (ties favour storing), then the leaf options in
increasing ``j``. A cell's value is the minimum over the options it computed, whatever the
order, and each option's value is recomputed bit for bit, so the recovered decision attains
the stored optimum.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = [
    "row_offsets",
    "block_size",
    "fill_bounds",
    "fill_time_table",
    "decide",
    "trace_time_plan",
    "fill_min_peak",
]


@intrinsic
def _fmin32(typingctx, a, b):
    """``min(a, b)`` for float32 without NaNs, as ``llvm.minnum`` (one ``vminps``).

    Written as ``v if v < o else o`` the update loop compiles to a masked store, which is
    microcoded and about 7x slower on AMD Zen; ``minnum`` keeps it a plain vector min.
    """
    sig = types.float32(types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
        fn = builder.module.declare_intrinsic("llvm.minnum", [ir.FloatType()], fnty)
        return builder.call(fn, args, fastmath=("nnan",))

    return sig, codegen


def row_offsets(num_positions: int) -> np.ndarray:
    """``off[i]``: first row of the pairs ``(i, i..L)`` in the triangular table."""
    n = num_positions
    i = np.arange(n + 1, dtype=np.int64)
    return i * n - i * (i - 1) // 2


def block_size(capacity: int) -> int:
    """Tile side for :func:`fill_time_table`: ``block^2`` rows of ``M + 1`` floats ~ 256 KiB."""
    return int(min(64, max(1, np.sqrt(65536 / (capacity + 1)))))


@njit(cache=True)
def _chain_bounds(cw, cbw, cout, ftmp, btmp, mmin, sat, off, i, l, mnull):
    """First feasible ``m`` of the chain option of ``(i, l)``, ``i < l``, and its saturation.

    The chain option runs ``F_all(i)`` while the incoming gradient ``g[l+1]`` is held,
    which needs ``cw[l+1] + cbw[i+1] + ftmp[i]``, then solves ``(i+1, l)`` beside
    ``tape[i]`` (and ``x[i+1]``), then ``B(i)``, which needs ``cw[i] + cw[i+1] + cbw[i+1] +
    btmp[i] - cout[i+1]`` (``x[i+1]``, if outside the tape, was freed by the sub-solve).
    This is the correction to the published recurrence, which charges ``F_all(i)`` through
    ``Opt[m][i][i]``, i.e. as if ``g[i+1]`` were held: ``cw[i+1] + cbw[i+1] + ftmp[i]``.
    That undercounts when ``cw[l+1] > cw[i+1]`` (the schedule can overflow under the
    simulator) and overcounts when ``cw[l+1] < cw[i+1]`` (valid schedules, even "store
    everything", are missed).
    """
    rest = off[i + 1] + (l - i - 1)
    start = max(
        max(mnull, cw[l + 1] + cbw[i + 1] + ftmp[i]),
        max(cw[i] + cw[i + 1] + cbw[i + 1] + btmp[i] - cout[i + 1], cbw[i + 1] + mmin[rest]),
    )
    saturated = max(start, cbw[i + 1] + sat[rest])
    return start, saturated


@njit(cache=True)
def fill_bounds(cw, cbw, cout, ftmp, btmp, M, off, mnull, mmin, sat):
    """Integer part of the DP, for every pair ``(i, l)`` (row ``off[i] + l - i``).

    ``mnull[row]``: Rotor's lower bound ``m∅ = cw[l+1] + max(cw[i+1] + ftmp[i],
    max_{i<k<l} (cw[k] + cw[k+1] + ftmp[k]))`` (0 on the diagonal). ``mmin[row]``: the
    first ``m`` at which ``Opt[m][i][l] < inf`` (``M + 1`` if none), i.e. the least over the
    options of their first feasible ``m``. ``sat[row]``: the first ``m`` from which the chain
    option stores every tape (``M + 1`` if none). O(L^3) integer operations.
    """
    L = cw.shape[0] - 2
    for i in range(L, -1, -1):
        row = off[i]
        t = max(cw[i + 1] + cbw[i + 1] + ftmp[i],
                cw[i] + cw[i + 1] + cbw[i + 1] + btmp[i] - cout[i + 1])
        mnull[row] = 0
        mmin[row] = min(t, M + 1)
        sat[row] = min(t, M + 1)
        mx = cw[i + 1] + ftmp[i]  # max_{i<k<l} maintained as l grows
        for l in range(i + 1, L + 1):
            row = off[i] + (l - i)
            mn = cw[l + 1] + mx
            mnull[row] = mn
            first, saturated = _chain_bounds(cw, cbw, cout, ftmp, btmp, mmin, sat, off, i, l,
                                             mn)
            for j in range(i + 1, l + 1):
                s = max(mn, max(cw[j] + mmin[off[j] + (l - j)], mmin[off[i] + (j - 1 - i)]))
                if s < first:
                    first = s
            mmin[row] = min(first, M + 1)
            sat[row] = min(saturated, M + 1)
            if l < L:
                v = cw[l] + cw[l + 1] + ftmp[l]
                if v > mx:
                    mx = v


@njit(cache=True, inline="always")
def _update(opt, row, ra, rb, shift, s, e, prefix):
    """``opt[row, m] = min(opt[row, m], prefix + opt[ra, m - shift] + opt[rb, m])``, s<=m<=e."""
    a = opt[ra, s - shift:e + 1 - shift]
    b = opt[rb, s:e + 1]
    out = opt[row, s:e + 1]
    for k in range(e + 1 - s):
        out[k] = _fmin32(prefix + a[k] + b[k], out[k])


@njit(cache=True, inline="always")
def _leaves(opt, cw, cum, off, mnull, mmin, sat, M, i, l, j0, j1):
    """Leaf options ``j0 <= j <= j1`` of the pair ``(i, l)``, ``i < l``.

    Leaf ``j``: ``F_ck(i), F_none(i+1..j-1)``, solve ``(j, l)`` holding ``x[j]``, then solve
    ``(i, j-1)``: ``Σ_{k=i}^{j-1} fw[k] + Opt[m - cw[j]][j][l] + Opt[m][i][j-1]``.
    """
    row = off[i] + (l - i)
    hi = min(M, sat[row] - 1)
    mn = mnull[row]
    for j in range(j0, j1 + 1):
        ra = off[j] + (l - j)
        rb = off[i] + (j - 1 - i)
        shift = cw[j]
        s = max(mn, max(shift + mmin[ra], mmin[rb]))
        if s <= hi:
            _update(opt, row, ra, rb, shift, s, hi, np.float32(cum[j] - cum[i]))


@njit(cache=True, inline="always")
def _start_cell(opt, ft, bw, off, mmin, M, i, l):
    """Initialise a row: the base case ``F_all(i), B(i)`` if ``i == l``, else ``inf``.

    The base case's forward only builds the tape (``g[i+1]`` is held, nothing else reads
    ``x[i+1]``): it costs ``ft[i]``, not ``fw[i]``.
    """
    row = off[i] + (l - i)
    inf = np.float32(np.inf)
    if i == l:
        t = mmin[row]  # the base case's threshold, from fill_bounds
        value = np.float32(ft[i] + bw[i])
        for m in range(M + 1):
            opt[row, m] = value if m >= t else inf
    else:
        for m in range(M + 1):
            opt[row, m] = inf


@njit(cache=True, inline="always")
def _chain(opt, cw, cbw, cout, ftmp, btmp, fw, bw, off, mnull, mmin, sat, M, i, l):
    """Chain option of ``(i, l)``, ``i < l``: ``F_all(i)``, solve ``(i+1, l)``, ``B(i)``."""
    row = off[i] + (l - i)
    start, _ = _chain_bounds(cw, cbw, cout, ftmp, btmp, mmin, sat, off, i, l, mnull[row])
    if start <= M:
        shift = cbw[i + 1]
        value = np.float32(fw[i] + bw[i])
        b = opt[off[i + 1] + (l - i - 1), start - shift:M + 1 - shift]
        out = opt[row, start:M + 1]
        for k in range(M + 1 - start):
            out[k] = _fmin32(value + b[k], out[k])


@njit(cache=True)
def fill_time_table(cw, cbw, cout, ftmp, btmp, fw, bw, ft, cum, M, off, mnull, mmin, sat, block,
                    opt):
    """Fill Rotor's table ``opt[row(i, l), m]`` for every ``0 <= i <= l <= L``, ``m <= M``.

    ``opt`` is float32 ``(pairs, M + 1)``; infeasible cells hold ``inf``. Needs the bounds of
    :func:`fill_bounds`. Recurrence: ALGORITHMS.md section 2 (Rotor, arXiv:1911.13214,
    section 4) with the chain-option correction of :func:`_chain_bounds`; tiles of
    ``block x block`` pairs, see the module docstring.
    """
    n = fw.shape[0]
    nb = (n + block - 1) // block
    for ib in range(nb - 1, -1, -1):
        i_lo = ib * block
        i_hi = min(n, i_lo + block) - 1
        # Diagonal tile: every split j lies inside the tile; plain dependency order.
        for i in range(i_hi, i_lo - 1, -1):
            for l in range(i, i_hi + 1):
                _start_cell(opt, ft, bw, off, mmin, M, i, l)
                if i < l:
                    _leaves(opt, cw, cum, off, mnull, mmin, sat, M, i, l, i + 1, l)
                    _chain(opt, cw, cbw, cout, ftmp, btmp, fw, bw, off, mnull, mmin, sat, M, i, l)
        for lb in range(ib + 1, nb):
            l_lo = lb * block
            l_hi = min(n, l_lo + block) - 1
            for i in range(i_lo, i_hi + 1):
                for l in range(l_lo, l_hi + 1):
                    _start_cell(opt, ft, bw, off, mmin, M, i, l)
            # Splits i_hi < j <= l_lo only read rows of earlier tiles: j outermost, so the
            # operand rows (j, l_lo..l_hi) and (i_lo..i_hi, j-1) are reused from cache.
            for j in range(i_hi + 1, l_lo + 1):
                shift = cw[j]
                for i in range(i_lo, i_hi + 1):
                    rb = off[i] + (j - 1 - i)
                    mb = mmin[rb]
                    if mb > M:
                        continue
                    prefix = np.float32(cum[j] - cum[i])
                    for l in range(l_lo, l_hi + 1):
                        row = off[i] + (l - i)
                        ra = off[j] + (l - j)
                        s = max(mnull[row], max(shift + mmin[ra], mb))
                        e = min(M, sat[row] - 1)
                        if s <= e:
                            _update(opt, row, ra, rb, shift, s, e, prefix)
            # Splits inside the tile, in dependency order.
            for i in range(i_hi, i_lo - 1, -1):
                for l in range(l_lo, l_hi + 1):
                    _leaves(opt, cw, cum, off, mnull, mmin, sat, M, i, l, i + 1, i_hi)
                    _leaves(opt, cw, cum, off, mnull, mmin, sat, M, i, l, l_lo + 1, l)
                    _chain(opt, cw, cbw, cout, ftmp, btmp, fw, bw, off, mnull, mmin, sat, M, i, l)


@njit(cache=True)
def decide(opt, cw, cbw, cout, ftmp, btmp, fw, bw, cum, off, mnull, mmin, sat, M, i, l, m):
    """The decision :func:`fill_time_table` took at ``(i, l, m)``, ``i < l``.

    Returns 0 for the chain option, ``j > i`` for the leaf option ``j``, -1 if ``m`` is
    infeasible. Recomputes each option's value exactly as the fill did and returns the
    first that equals the stored best: chain first (ties favour storing), then ``j``
    increasing.
    """
    row = off[i] + (l - i)
    if m < mmin[row] or m > M:
        return -1
    best = opt[row, m]
    mn = mnull[row]
    start, _ = _chain_bounds(cw, cbw, cout, ftmp, btmp, mmin, sat, off, i, l, mn)
    if m >= start:
        v = np.float32(fw[i] + bw[i]) + opt[off[i + 1] + (l - i - 1), m - cbw[i + 1]]
        if v == best:
            return 0
    for j in range(i + 1, l + 1):
        ra = off[j] + (l - j)
        rb = off[i] + (j - 1 - i)
        if m >= max(mn, max(cw[j] + mmin[ra], mmin[rb])):
            v = np.float32(cum[j] - cum[i]) + opt[ra, m - cw[j]] + opt[rb, m]
            if v == best:
                return j
    return -1


@njit(cache=True)
def trace_time_plan(opt, cw, cbw, cout, ftmp, btmp, fw, bw, cum, off, mnull, mmin, sat, M,
                    m0):
    """Decisions of the optimal plan for ``(0, L)`` at memory ``m0``, in replay order.

    Walks the plan depth first without recursion: along a spine ``(i, l, m)`` a chain
    decision moves to ``(i+1, l, m - cbw[i+1])``; a leaf decision ``j`` first solves the
    body ``(i, j-1, m)`` and then resumes at ``(j, l, m - cw[j])`` (kept on a stack).
    Returns the decisions (0 = chain, ``j`` = leaf) in the order they are met; a -1 entry
    (last) means the table is inconsistent (a bug).
    """
    L = cw.shape[0] - 2
    out = np.empty(max(16, 4 * L), dtype=np.int64)
    n_out = 0
    stack = np.empty((L + 2, 3), dtype=np.int64)
    stack[0, 0] = 0
    stack[0, 1] = L
    stack[0, 2] = m0
    top = 1
    while top > 0:
        top -= 1
        i = stack[top, 0]
        l = stack[top, 1]
        m = stack[top, 2]
        while i < l:
            d = decide(opt, cw, cbw, cout, ftmp, btmp, fw, bw, cum, off, mnull, mmin, sat, M,
                       i, l, m)
            if n_out == out.shape[0]:
                grown = np.empty(2 * out.shape[0], dtype=np.int64)
                grown[:n_out] = out[:n_out]
                out = grown
            out[n_out] = d
            n_out += 1
            if d < 0:
                return out[:n_out]
            if d == 0:
                m -= cbw[i + 1]
                i += 1
            else:
                stack[top, 0] = d
                stack[top, 1] = l
                stack[top, 2] = m - cw[d]
                top += 1
                l = d - 1
    return out[:n_out]


@njit(cache=True)
def fill_min_peak(cw, cbw, cout, ftmp, btmp, fw, bw, ft, peak, time, choice):
    """Exact minimum peak ``P[i][l]`` over persistent schedules of ``(i, l)`` (float64).

    The same recurrence as the time DP read as a min-max (ALGORITHMS.md section 2): base
    ``max(cw[i+1] + cbw[i+1] + ftmp[i], cw[i] + cw[i+1] + cbw[i+1] + btmp[i] - cout[i+1])``;
    leaf ``j``:
    ``max(m∅, cw[j] + P[j][l], P[i][j-1])``; chain (corrected, see :func:`_chain_bounds`):
    ``max(m∅, cw[l+1] + cbw[i+1] + ftmp[i], cw[i] + cw[i+1] + cbw[i+1] + btmp[i] -
    cout[i+1], cbw[i+1] + P[i+1][l])``; the least over options. Equal peaks are broken by the
    time of the options' plans (``time[i, l]``, a heuristic: it is not the least time among
    all minimum-peak schedules), then in favour of the chain option, then the smallest ``j``.
    ``peak``, ``time`` and ``choice`` are ``(L+1, L+1)``; ``choice`` gets 0 (chain) or ``j``
    (leaf). O(L^3) time.
    """
    L = peak.shape[0] - 1
    for i in range(L, -1, -1):
        peak[i, i] = max(cw[i + 1] + cbw[i + 1] + ftmp[i],
                         cw[i] + cw[i + 1] + cbw[i + 1] + btmp[i] - cout[i + 1])
        time[i, i] = ft[i] + bw[i]
        choice[i, i] = 0
        mx = cw[i + 1] + ftmp[i]
        for l in range(i + 1, L + 1):
            mnull = cw[l + 1] + mx
            best = max(max(mnull, cw[l + 1] + cbw[i + 1] + ftmp[i]),
                       max(cw[i] + cw[i + 1] + cbw[i + 1] + btmp[i] - cout[i + 1],
                           cbw[i + 1] + peak[i + 1, l]))
            best_time = fw[i] + bw[i] + time[i + 1, l]
            arg = 0
            prefix = 0.0
            for j in range(i + 1, l + 1):
                prefix += fw[j - 1]
                v = max(mnull, max(cw[j] + peak[j, l], peak[i, j - 1]))
                if v <= best:
                    t = prefix + time[j, l] + time[i, j - 1]
                    if v < best or t < best_time:
                        best = v
                        best_time = t
                        arg = j
            peak[i, l] = best
            time[i, l] = best_time
            choice[i, l] = arg
            if l < L:
                v = cw[l] + cw[l + 1] + ftmp[l]
                if v > mx:
                    mx = v
