"""Numba kernels of Rotor's dynamic program (ALGORITHMS.md section 2), with options.

Everything here works on Rotor's padded integer arrays for a chain of ``L`` layers, with
positions ``0..L`` (position ``L`` is the loss). Per-layer "save" options (Rockmate's
multi-option layers, :mod:`solver.chain.options`) are a second axis ``k = 0..K-1`` of the
arrays that describe ``F_all`` and ``B``; a chain without options has ``K = 1``:

- ``cw[p]`` (``p = 0..L+1``): size of ``x[p]`` (``cw[L+1] = 0``),
- ``cbw[p, k]`` (``p = 0..L+1``): ``cbw[i+1, k]`` is the tape size of layer ``i`` with option
  ``k`` (``cbw[0]`` unused, ``cbw[L+1, 0] = 0``),
- ``cout[p, k]``: ``cout[i+1, k]`` is the part of ``cbw[i+1, k]`` that ``B(i)`` does not hold:
  the size of ``x[i+1]`` when layer ``i``'s output is outside that option's tape, else 0
  (see :mod:`solver.chain.rotor`),
- ``cfree[c, p, k]`` (``p = 0..L``): ``Chain.option_x_free[i, k]``, the part of ``x[i]``
  that ``F_all(i)`` with option ``k`` frees (0 for the loss) in context ``c`` (see
  "Checkpoints held in part"); the chain option's sub-solve gets ``m - cbw[i+1, k] +
  cfree[c, i, k]``; ``crf[p]``: what ``F_ck(i)`` frees of ``x[i]`` (``Chain.x_rec_free``),
- ``cgone[p, k]``: what the chain option's ``B(i)`` no longer holds of ``tape[i]``:
  ``cout[i+1, k]``, or ``cfree[i+1, 0]`` where the output is in the tape (the same for
  every option of layer ``i+1`` then; the sub-solve's ``F_all(i+1)`` cut that copy),
- ``ftmp``, ``fw``, ``bw`` (``(L+1, K)``, the loss's row 0): ``F_all(i)``'s transient, the
  times of ``F_all(i)`` / ``B(i)`` with option ``k``; ``gbt``: what ``B(i)`` adds, ``cw[i] +
  bwd_tmp[i, k]``, rounded as one size (``bwd_tmp`` may be negative, the sum is not); ``tft``:
  the base case's ``F_all(i)`` peak, stored tape + ``Chain.fwd_tape_tmp`` (by default ``cbw + ftmp``),
- ``ft`` (``(L+1, K)``): ``fwd_tape_time``, the cost of ``F_all(i)`` in the base case
  ``(i, i)``, where ``g[i+1]`` is held and ``B(i)`` follows at once (only the tape is
  computed); everywhere else ``F_all`` costs ``fw``,
- an option a layer lacks has ``cbw``, ``ftmp``, ``gbt``, ``tft`` equal to ``M + 1`` (never feasible),
- ``F_ck`` and ``F_none`` run the layer without a tape and cost column 0: ``cum``, float64
  prefix sums of ``fw[:, 0]`` (the recomputation cost of the leaf option ``j`` is
  ``float32(cum[j] - cum[i])``, the same bits everywhere); their transient is ``fck`` (``L+1``,
  the loss's 0: ``Chain.ck_tmp``, the plain forward's); ``fneed[i, j]``, the memory
  ``F_none(i+1..j-1)`` need above ``g[l+1]``: ``max_{i<k<j} cw[k] + cw[k+1] + fck[k]``
  (0 for ``j = i + 1``), less what ``F_ck(i)`` freed before them; ``F_ck(i)`` itself needs
  ``cw[i+1] + fck[i]``,
- ``lean_chain[i, k]`` / ``lean_base[i, k]``: option ``k`` of layer ``i`` reaches the
  least time the layer can cost in a chain option / in the base case (see Saturation).

The table of the time DP is triangular: the pair ``(i, l)`` with ``i <= l`` owns row
``off[i] + l - i`` of a ``(pairs, M + 1)`` float32 array per context (below), whose last,
contiguous axis is the memory ``m``. So the inner loop of the leaf option is a contiguous, vectorisable sweep over
``m``, and the table needs ``4 (L+1)(L+2)/2 (M+1)`` bytes. Options only multiply the chain
option and the base case, ``O(L^2 K M)``, by ``K``; the leaves, ``O(L^3 M)``, are as before.

Three facts keep it fast.

- Monotonicity: ``Opt[m][i][l]`` is nonincreasing in ``m``, so every option is feasible
  exactly on an interval ``[start, M]``. Feasibility is a separate, cheap integer DP
  (:func:`solver.chain.bounds.fill_bounds`: ``mmin[row]``, the first feasible ``m``, is the
  discretised minimum peak), and no infinity ever enters the arithmetic of the time DP.
- Saturation: each layer ``k < l`` of ``(i, l)`` runs backward once, with the option of its
  one ``F_all``, and that ``F_all`` costs ``fw`` unless it is a base case, which costs
  ``ft`` after an ``F_ck`` / ``F_none`` of the layer (``fw[k, 0]``) computed ``x[k+1]``: at
  least ``min_o bw[k, o] + min(fw[k, o], ft[k, o] + fw[k, 0])``; layer ``l`` runs only its
  base case, at least ``min_o ft[l, o] + bw[l, o]``. The options reaching these bounds are
  ``lean``. From the first ``m`` (``sat[row]``) at which the chain option stores every tape
  of ``i..l`` with lean options, its time is that lower bound of every option, and ties
  favour storing, so the leaf options are only swept below ``sat``. Without options every
  layer's one option is lean (``ft <= fw``).
- Blocking: cells are computed in square tiles of ``block x block`` pairs. For a tile off the
  diagonal, the leaf options whose split ``j`` lies between the tile's ``i`` range and its
  ``l`` range only read finished rows, so they run ``j``-outermost: each operand row is read
  once per tile and reused ``block`` times from cache, instead of streaming the whole table
  from memory for every cell (the DP is memory-bound otherwise).

Rotor's lower bound ``m∅`` (:func:`solver.chain.bounds.fill_bounds`) assumes ``x[i]`` is held
whole while the forwards of ``(i, l)`` run; once ``F_all(i)`` cuts it (``cfree > 0``) a later
forward may need less, so then ``m∅`` is 0: every option's start already checks each of its ops
(``F_all``, ``B``, the forwards of a leaf, the sub-solves), so the bound only prunes.

Checkpoints held in part (``Chain.x_rec_size``): ``F_ck(i)`` cuts ``x[i]`` to what a
recomputation reads, freeing ``crf[i]`` (units, rounded down). A subproblem's input is then
whole or already cut, so every pair has two contexts (the leading axis ``c`` of ``opt``,
``mmin``, ``sat`` and ``cfree``): ``c = 0``, ``x[i]`` whole (``m`` excludes ``cw[i]``), and
``c = 1``, ``x[i]`` cut by its ``F_ck`` (``m`` excludes the cut size; ``F_all(i)`` frees only
what is left, ``cfree[1] = cfree[0] - crf``, and ``F_ck(i)`` frees nothing). The leaf ``j``
of ``(i, l)`` in context ``c`` solves ``(j, l)`` in context 0 with ``m - cw[j] + b`` and its
body ``(i, j-1)`` in context 1 with ``m + b``, ``b = crf[i]`` in context 0 (else 0); the
chain option's ``(i+1, l)`` is in context 0 (``F_all(i)`` stored ``x[i+1]`` whole). Reads
above ``M`` belong to memories no plan reaches (a subproblem's ``m`` is at most ``M`` less
its input), so the leaf is swept only up to ``M - b``. Without cuts (``crf`` all zero) the
table has the one context 0 and ``rc = 0``: the kernels are those of Rotor's DP above.

Copies on their own (``Chain.x_own_read_size``) double the contexts where their cut differs
(:func:`solver.chain.rotor.dp_contexts`), so the kernels take routes: ``route[c] = (rc, cut)``
(a leaf's body's context; ``b = crf[i]`` only where ``x[i]`` is not cut) and ``sub[i, k]``, the
context of the chain option's sub-solve (0 above).

There is no decision table: the row of best times is enough to recover a decision, by
recomputing the options at the one ``(i, l, m)`` asked (:func:`decide`, :func:`decide_base`)
in the same float32 arithmetic, chain options first in increasing ``k`` (ties favour storing
and the lower option), then the leaf options in increasing ``j``. A cell's value is the
minimum over the options it computed, whatever the order, and each option's value is
recomputed bit for bit, so the recovered decision attains the stored optimum. Decisions are
``-k`` for the chain option (or base case) with option ``k`` (0 for option 0), ``j >= 1``
for the leaf option ``j`` and :data:`NO_DECISION` when none matches (a bug).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = [
    "NO_DECISION",
    "row_offsets",
    "block_size",
    "base_threshold",
    "chain_start",
    "leaf_start",
    "fill_time_table",
    "decide",
    "decide_base",
    "trace_time_plan",
]

NO_DECISION = -(1 << 40)


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


@njit(cache=True, inline="always")
def base_threshold(cw, cbw, cout, cfree, tft, gbt, i, k):
    """Memory the base case ``F_all(i)`` (option ``k``), ``B(i)`` needs, ``g[i+1]`` held.

    ``max(cw[i+1] + tft[i, k], cw[i+1] + cbw[i+1, k] + gbt[i, k] - cout[i+1, k] -
    cfree[i, k])``: the tape-only forward holds the tape and peaks ``tft`` (by default the
    whole tape, the output computed beside it and dropped, and ``ftmp``); the backward adds
    ``g[i]`` and its transient (``gbt``) beside ``g[i+1]``, the tape and the part of ``x[i]``
    it reads (``F_all(i)`` freed ``cfree[i, k]`` of it).
    """
    return max(cw[i + 1] + tft[i, k],
               cw[i + 1] + cbw[i + 1, k] + gbt[i, k] - cout[i + 1, k] - cfree[i, k])


@njit(cache=True, inline="always")
def chain_start(cw, cbw, cgone, cfree, ftmp, gbt, peak_rest, i, l, mnull, k):
    """First feasible ``m`` of the chain option of ``(i, l)``, ``i < l``, with option ``k``.

    The chain option runs ``F_all(i)`` while the incoming gradient ``g[l+1]`` is held,
    which needs ``cw[l+1] + cbw[i+1] + ftmp[i]``, then solves ``(i+1, l)`` beside
    ``tape[i]`` (and ``x[i+1]``), whose own least memory is ``peak_rest``, then ``B(i)``,
    which needs ``cw[i+1] + cbw[i+1] + gbt[i] - cout[i+1]`` (``x[i+1]``, if
    outside the tape, was freed by the sub-solve). This is the correction to the published
    recurrence, which charges ``F_all(i)`` through ``Opt[m][i][i]``, i.e. as if ``g[i+1]``
    were held: ``cw[i+1] + cbw[i+1] + ftmp[i]``. That undercounts when ``cw[l+1] >
    cw[i+1]`` (the schedule can overflow under the simulator) and overcounts when
    ``cw[l+1] < cw[i+1]`` (valid schedules, even "store everything", are missed).

    Unread input leaves: after ``F_all(i)`` only ``cw[i] - cfree[i, k]`` of ``x[i]`` is held, and
    by ``B(i)`` the sub-solve has cut ``tape[i]``'s copy of ``x[i+1]`` too (``cgone`` is
    ``cfree[i+1, 0]`` where the output is in the tape, ``cout`` elsewhere).
    """
    return max(
        max(mnull, cw[l + 1] + cbw[i + 1, k] + ftmp[i, k]),
        max(cw[i + 1] + cbw[i + 1, k] + gbt[i, k] - cgone[i + 1, k] - cfree[i, k],
            cbw[i + 1, k] - cfree[i, k] + peak_rest),
    )


@njit(cache=True, inline="always")
def _update(opt, c, row, ra, rc, rb, shift, b, s, e, prefix):
    """``opt[c, row, m] = min(opt[c, row, m], prefix + opt[0, ra, m - shift] +
    opt[rc, rb, m + b])`` for ``s <= m <= e``."""
    a = opt[0, ra, s - shift:e + 1 - shift]
    bb = opt[rc, rb, s + b:e + 1 + b]
    out = opt[c, row, s:e + 1]
    for k in range(e + 1 - s):
        out[k] = _fmin32(prefix + a[k] + bb[k], out[k])


@njit(cache=True, inline="always")
def leaf_start(cw, fck, off, mnull, mmin, fneed, b, i, l, j, rc):
    """First feasible ``m`` of the leaf option ``j`` of ``(i, l)``; ``b``: what its ``F_ck(i)``
    frees of ``x[i]`` (``crf[i]`` in context 0, else 0), from its ``F_none`` on. The leaf
    exists for ``m <= M - b``; ``rc``: the context of its body."""
    return max(max(mnull[off[i] + (l - i)],
                   cw[l + 1] + max(cw[i + 1] + fck[i], fneed[i, j] - b)),
               max(cw[j] - b + mmin[0, off[j] + (l - j)], mmin[rc, off[i] + (j - 1 - i)] - b))


@njit(cache=True, inline="always")
def _leaves(opt, cw, fck, crf, route, cum, off, mnull, mmin, sat, fneed, M, c, i, l, j0, j1):
    """Leaf options ``j0 <= j <= j1`` of the pair ``(i, l)``, ``i < l``, in context ``c``.

    Leaf ``j``: ``F_ck(i), F_none(i+1..j-1)``, solve ``(j, l)`` holding ``x[j]``, then solve
    ``(i, j-1)`` (context ``rc``: ``x[i]`` cut): ``Σ_{k=i}^{j-1} fw[k] + Opt_0[m - cw[j] +
    b][j][l] + Opt_rc[m + b][i][j-1]``, ``b = crf[i]`` in context 0 (else 0).
    """
    row = off[i] + (l - i)
    rc = route[c, 0]
    b = crf[i] if route[c, 1] == 0 else 0
    hi = min(M - b, sat[c, row] - 1)
    for j in range(j0, j1 + 1):
        s = leaf_start(cw, fck, off, mnull, mmin, fneed, b, i, l, j, rc)
        if s <= hi:
            _update(opt, c, row, off[j] + (l - j), rc, off[i] + (j - 1 - i), cw[j] - b, b, s, hi,
                    np.float32(cum[j] - cum[i]))


@njit(cache=True, inline="always")
def _start_cell(opt, c, cw, cbw, cout, cfree, tft, gbt, ft, bw, off, M, i, l):
    """Initialise a row: the base case ``F_all(i), B(i)`` if ``i == l``, else ``inf``.

    The base case's forward only builds the tape (``g[i+1]`` is held, nothing else reads
    ``x[i+1]``): option ``k`` costs ``ft[i, k] + bw[i, k]`` from its threshold on.
    """
    row = off[i] + (l - i)
    inf = np.float32(np.inf)
    for m in range(M + 1):
        opt[c, row, m] = inf
    if i == l:
        for k in range(cbw.shape[1]):
            t = base_threshold(cw, cbw, cout, cfree[c], tft, gbt, i, k)
            value = np.float32(ft[i, k] + bw[i, k])
            for m in range(t, M + 1):
                opt[c, row, m] = _fmin32(value, opt[c, row, m])


@njit(cache=True, inline="always")
def _chain(opt, c, cw, cbw, cgone, cfree, sub, ftmp, gbt, fw, bw, off, mnull, mmin, M, i, l):
    """Chain options of ``(i, l)``, ``i < l``, in context ``c``: ``F_all(i)`` (option ``k``),
    solve ``(i+1, l)`` (context ``sub[i, k]``), ``B(i)``."""
    row = off[i] + (l - i)
    rest = off[i + 1] + (l - i - 1)
    for k in range(cbw.shape[1]):
        start = chain_start(cw, cbw, cgone, cfree[c], ftmp, gbt, mmin[sub[i, k], rest], i, l,
                            mnull[row], k)
        if start <= M:
            shift = cbw[i + 1, k] - cfree[c, i, k]
            value = np.float32(fw[i, k] + bw[i, k])
            b = opt[sub[i, k], rest, start - shift:M + 1 - shift]
            out = opt[c, row, start:M + 1]
            for m in range(M + 1 - start):
                out[m] = _fmin32(value + b[m], out[m])


@njit(cache=True)
def fill_time_table(cw, cbw, cout, cgone, cfree, crf, route, sub, ftmp, fck, gbt, tft, fw, bw, ft,
                    cum, M, off, mnull, mmin, sat, fneed, block, opt):
    """Fill Rotor's table ``opt[c, row(i, l), m]`` for every ``0 <= i <= l <= L``, ``m <= M``
    and context ``c`` (module docstring, "Checkpoints held in part").

    ``opt`` is float32 ``(C, pairs, M + 1)``; infeasible cells hold ``inf``. Needs the bounds
    of :func:`solver.chain.bounds.fill_bounds`. Recurrence: ALGORITHMS.md section 2 (Rotor,
    arXiv:1911.13214, section 4) with the chain-option correction of :func:`chain_start` and
    one chain option per layer option; tiles of ``block x block`` pairs, see the module docstring.
    """
    n = fw.shape[0]
    C = opt.shape[0]
    nb = (n + block - 1) // block
    for ib in range(nb - 1, -1, -1):
        i_lo = ib * block
        i_hi = min(n, i_lo + block) - 1
        # Diagonal tile: every split j lies inside the tile; plain dependency order.
        for i in range(i_hi, i_lo - 1, -1):
            for l in range(i, i_hi + 1):
                for c in range(C):
                    _start_cell(opt, c, cw, cbw, cout, cfree, tft, gbt, ft, bw, off, M, i, l)
                    if i < l:
                        _leaves(opt, cw, fck, crf, route, cum, off, mnull, mmin, sat, fneed, M, c, i, l,
                                i + 1, l)
                        _chain(opt, c, cw, cbw, cgone, cfree, sub, ftmp, gbt, fw, bw, off, mnull, mmin,
                               M, i, l)
        for lb in range(ib + 1, nb):
            l_lo = lb * block
            l_hi = min(n, l_lo + block) - 1
            for i in range(i_lo, i_hi + 1):
                for l in range(l_lo, l_hi + 1):
                    for c in range(C):
                        _start_cell(opt, c, cw, cbw, cout, cfree, tft, gbt, ft, bw, off, M, i, l)
            # Splits i_hi < j <= l_lo only read rows of earlier tiles: j outermost, so the
            # operand rows (j, l_lo..l_hi) and (i_lo..i_hi, j-1) are reused from cache.
            for j in range(i_hi + 1, l_lo + 1):
                for c in range(C):
                    rc = route[c, 0]
                    for i in range(i_lo, i_hi + 1):
                        b = crf[i] if route[c, 1] == 0 else 0
                        shift = cw[j] - b
                        rb = off[i] + (j - 1 - i)
                        mb = mmin[rc, rb] - b
                        if mb > M - b:
                            continue
                        prefix = np.float32(cum[j] - cum[i])
                        fi = max(cw[i + 1] + fck[i], fneed[i, j] - b)
                        for l in range(l_lo, l_hi + 1):
                            row = off[i] + (l - i)
                            ra = off[j] + (l - j)
                            s = max(max(mnull[row], cw[l + 1] + fi), max(shift + mmin[0, ra], mb))
                            e = min(M - b, sat[c, row] - 1)
                            if s <= e:
                                _update(opt, c, row, ra, rc, rb, shift, b, s, e, prefix)
            # Splits inside the tile, in dependency order.
            for i in range(i_hi, i_lo - 1, -1):
                for l in range(l_lo, l_hi + 1):
                    for c in range(C):
                        _leaves(opt, cw, fck, crf, route, cum, off, mnull, mmin, sat, fneed, M, c, i, l,
                                i + 1, i_hi)
                        _leaves(opt, cw, fck, crf, route, cum, off, mnull, mmin, sat, fneed, M, c, i, l,
                                l_lo + 1, l)
                        _chain(opt, c, cw, cbw, cgone, cfree, sub, ftmp, gbt, fw, bw, off, mnull, mmin,
                               M, i, l)


@njit(cache=True)
def decide_base(opt, cw, cbw, cout, cfree, tft, gbt, ft, bw, off, M, c, i, m):
    """The option ``k`` of the base case ``(i, i)`` in context ``c`` at ``m``, as ``-k``."""
    row = off[i]
    if m < 0 or m > M:
        return NO_DECISION
    for k in range(cbw.shape[1]):
        if m >= base_threshold(cw, cbw, cout, cfree[c], tft, gbt, i, k):
            if np.float32(ft[i, k] + bw[i, k]) == opt[c, row, m]:
                return -k
    return NO_DECISION


@njit(cache=True)
def decide(opt, cw, cbw, cgone, cfree, crf, route, sub, ftmp, fck, gbt, fw, bw, cum, off, mnull,
           mmin, fneed, M, c, i, l, m):
    """The decision :func:`fill_time_table` took at ``(c, i, l, m)``, ``i < l``.

    Returns ``-k`` for the chain option with option ``k`` (0 for option 0), ``j > i`` for
    the leaf option ``j``, :data:`NO_DECISION` if ``m`` is infeasible. Recomputes each
    option's value exactly as the fill did and returns the first that equals the stored
    best: chain options first (ties favour storing), then ``j`` increasing.
    """
    row = off[i] + (l - i)
    if m < mmin[c, row] or m > M:
        return NO_DECISION
    rc = route[c, 0]
    best = opt[c, row, m]
    rest = off[i + 1] + (l - i - 1)
    for k in range(cbw.shape[1]):
        q = sub[i, k]
        if m >= chain_start(cw, cbw, cgone, cfree[c], ftmp, gbt, mmin[q, rest], i, l, mnull[row],
                            k):
            v = np.float32(fw[i, k] + bw[i, k]) + opt[q, rest, m - cbw[i + 1, k] + cfree[c, i, k]]
            if v == best:
                return -k
    b = crf[i] if route[c, 1] == 0 else 0
    for j in range(i + 1, l + 1):
        if m >= leaf_start(cw, fck, off, mnull, mmin, fneed, b, i, l, j, rc) and m <= M - b:
            v = (np.float32(cum[j] - cum[i]) + opt[0, off[j] + (l - j), m - cw[j] + b]
                 + opt[rc, off[i] + (j - 1 - i), m + b])
            if v == best:
                return j
    return NO_DECISION


@njit(cache=True)
def trace_time_plan(opt, cw, cbw, cout, cgone, cfree, crf, route, sub, ftmp, fck, gbt, tft, fw,
                    bw, ft, cum, off, mnull, mmin, fneed, M, m0):
    """Decisions of the optimal plan for ``(0, L)`` at memory ``m0``, in replay order.

    Walks the plan depth first without recursion: along a spine ``(c, i, l, m)`` a chain
    decision ``-k`` moves to ``(0, i+1, l, m - cbw[i+1, k] + cfree[c, i, k])``; a leaf
    decision ``j`` first solves the body ``(rc, i, j-1, m + b)`` and then resumes at ``(0,
    j, l, m - cw[j] + b)`` (kept on a stack; ``b = crf[i]`` in context 0). A spine ends at
    its base case ``(l, l)``, whose option is a decision too (none for the loss, ``l ==
    L``). Returns the decisions in the order they are met; a :data:`NO_DECISION` entry
    (last) means the table is inconsistent (a bug).
    """
    L = cw.shape[0] - 2
    out = np.empty(max(16, 4 * L), dtype=np.int64)
    n_out = 0
    stack = np.empty((L + 2, 4), dtype=np.int64)
    stack[0, 0] = 0
    stack[0, 1] = L
    stack[0, 2] = m0
    stack[0, 3] = 0
    top = 1
    while top > 0:
        top -= 1
        i = stack[top, 0]
        l = stack[top, 1]
        m = stack[top, 2]
        c = stack[top, 3]
        while i <= l:
            if i < l:
                d = decide(opt, cw, cbw, cgone, cfree, crf, route, sub, ftmp, fck, gbt, fw, bw, cum,
                           off, mnull, mmin, fneed, M, c, i, l, m)
            elif l < L:
                d = decide_base(opt, cw, cbw, cout, cfree, tft, gbt, ft, bw, off, M, c, i, m)
            else:
                break
            if n_out == out.shape[0]:
                grown = np.empty(2 * out.shape[0], dtype=np.int64)
                grown[:n_out] = out[:n_out]
                out = grown
            out[n_out] = d
            n_out += 1
            if d == NO_DECISION:
                return out[:n_out]
            if i == l:
                break
            if d <= 0:
                m -= cbw[i + 1, -d] - cfree[c, i, -d]
                c = sub[i, -d]
                i += 1
            else:
                b = crf[i] if route[c, 1] == 0 else 0
                stack[top, 0] = d
                stack[top, 1] = l
                stack[top, 2] = m - cw[d] + b
                stack[top, 3] = 0
                top += 1
                l = d - 1
                m += b
                c = route[c, 0]
    return out[:n_out]
