"""Rotor's dynamic program: the fastest persistent schedule under a memory budget.

Implements the recurrence of ALGORITHMS.md section 2 (Beaumont et al., "Optimal
checkpointing for heterogeneous chains", arXiv:1911.13214, section 4; weak memory
persistence from the ACM TOMS version) with one correction.

**Correction.** In the chain option ``F_all(i), solve (i+1, l), B(i)``, the forward
``F_all(i)`` runs while the incoming gradient ``g[l+1]`` is held, so it needs
``cw[l+1] + cbw[i+1] + ftmp[i]``; ``B(i)`` needs ``cw[i] + cw[i+1] + cbw[i+1] + btmp[i]``.
The published recurrence writes the chain option as ``Opt[m][i][i] + Opt[m - cbw[i+1]][i+1][l]``,
so it checks ``F_all(i)`` as if ``g[i+1]`` were held (``cw[i+1] + cbw[i+1] + ftmp[i]``):
with ``cw[l+1] > cw[i+1]`` and a nonzero ``fwd_tmp`` its schedule can exceed the budget
under :func:`solver.simulate`; with ``cw[l+1] < cw[i+1]`` it rejects valid schedules (even
"store everything" at its own peak). We check exactly the two terms above, plus the
sub-solve's feasibility, and cost the option ``fw[i] + bw[i] + Opt[m - cbw[i+1]][i+1][l]``.
With it, the DP's memory model agrees with the simulator: its schedules fit, and its
minimum budget is the simulated peak of its minimum-peak plan (tests/test_rotor.py checks
both, against a brute-force recursion, and that the DP never loses to a baseline plan).

Outputs outside the tape (``Chain.output_in_tape[i]`` false, :mod:`solver.chain.simulator`) change
one term, ``cout[i+1] = x_size[i+1]`` where the flag is false (0 elsewhere). ``F_all(i)`` then
stores ``tape[i]`` (``cbw[i+1] - cout[i+1]``) and ``x[i+1]`` on its own: the same
``cbw[i+1]`` as before, so both ``F_all(i)`` checks are unchanged (in the base case
``(i, i)``, where ``g[i+1]`` is held, the output is not stored but counts in the op's peak,
again ``cw[i+1] + cbw[i+1] + ftmp[i]``). The sub-solve ``(i+1, l)`` still gets
``m - cbw[i+1]``: it excludes its input ``x[i+1]``, which it frees in its last op
(``B(i+1)`` or the loss) whether stored on its own or in a tape, and nothing in a plan reads
the difference (``F_none(i+1)`` never follows ``F_all(i)``). Only ``B(i)``, after the
sub-solve, no longer holds ``x[i+1]``: it needs ``cw[i] + cw[i+1] + cbw[i+1] - cout[i+1] +
btmp[i]``, in the chain option and in the base case alike. Leaf options and ``m∅`` involve
no tape and are unchanged. With this term the DP is exact for the flagged simulator: its
time at each budget is the least simulated time of the persistent plans that fit, and
:func:`rotor_min_budget` the least simulated peak (tests/test_rotor.py checks every plan of
small chains). With every flag true ``cout`` is zero and nothing changes. In the rounded
table the tape ``B(i)`` holds is rounded up on its own, so it never under-counts.

Tape-only forwards (``Chain.fwd_tape_time``, :mod:`solver.chain.simulator`) change one term too:
the base case ``(i, i)``, ``i < L``, costs ``ft[i] + bw[i]`` instead of ``fw[i] + bw[i]``,
because its ``F_all(i)`` runs while ``g[i+1]`` is held, the one situation in which the
simulator charges ``fwd_tape_time``. The chain option's ``F_all(i)`` (``g[l+1]`` held, ``l >
i``) and the leaf options' forwards still cost ``fw``. The base case is the only place where
a plan runs ``F_all(i)`` with ``g[i+1]`` stored, so the DP stays exact for the simulator
(tests/test_rotor.py draws chains with ``fwd_tape_time < fwd_time``). This is what makes the
DP prefer plans whose recomputed segments end on layers with a cheap tape (a residual
block, whose last matmul JAX skips there) over plans that recompute such layers' outputs.

Options (Rockmate's multi-option layers, Zhao et al. ICML 2023; :mod:`solver.chain.options`):
layer ``i`` may run ``F_all(i)`` with any option ``k`` it offers, each with its own
``cbw[i+1, k]``, ``cout``, ``ftmp``, ``btmp``, ``fw``, ``bw`` and ``ft``. Both places where a
plan runs ``F_all(i)`` take the best option that fits: the chain option of ``(i, l)`` is the
least over ``k`` of ``fw[i, k] + bw[i, k] + Opt[m - cbw[i+1, k]][i+1][l]`` where option
``k``'s two checks above hold, and the base case ``(i, i)`` the least ``ft[i, k] + bw[i, k]``
over the options whose threshold ``m`` reaches. ``F_ck`` and ``F_none`` keep the chain's own
costs (column 0), so the leaf options are unchanged except for one term: ``m∅`` takes each
layer's least transient over its forwards (it must bound every one from below), and each
leaf ``j`` checks the memory of its own forwards ``F_ck(i), F_none(i+1..j-1)`` with their
own transient (``fck``, :mod:`solver.chain.kernels`; implied by ``m∅`` without options).
The DP remains exact among persistent plans, now with an option per ``Layer``
(tests/test_options.py checks it against every plan and option of small chains). Without
options ``K = 1`` and every number is as before.

Forwards without tape (``Chain.fwd_ck_tmp``): ``F_ck`` and ``F_none`` peak at the plain
forward's transient ``Chain.ck_tmp`` above ``x[i] + x[i+1]``, not ``fwd_tmp``; the leaf
options and ``m∅`` charge it in both DPs (``fck``), and nothing else runs those forwards, so
both stay exact for the simulator (tests/test_ck_tmp.py draws it, with and without options).

Checkpoints held in part (``Chain.x_rec_size``, :mod:`solver.chain.simulator`): once
``F_ck(i)`` has run, ``x[i]`` holds only what a recomputation reads. Each subproblem ``(i,
l)`` then has two contexts, its input whole (the spine after a leaf, the chain option's
sub-solve, the root) or already cut (a checkpoint's body until its first op): the leaf
option gives its sub-solves the bytes its ``F_ck(i)`` freed, and the body's ``F_all(i)``
frees only the rest (:mod:`solver.chain.kernels`, "Checkpoints held in part"; the min-peak
kernel likewise). Exact against every plan (tests/test_rotor.py, tests/test_options.py);
without cuts the table has one context and is the DP above. Copies on their own
(``Chain.x_own_read_size``) double the contexts where their cut differs from that of the copy
inside a tape (:func:`dp_contexts`); exact against every plan too (tests/test_own_reads.py).

Memory is discretised: a table built for ``max_budget`` with ``slots`` slots has unit
``max_budget / slots`` and sizes rounded **up** to units, so every schedule it returns fits
the real budget. When every size is an integer and ``slots >= max_budget`` the unit is 1 and
the table is exact. One table answers every budget up to ``max_budget``
(:meth:`RotorTable.schedule`).

The minimum budget of persistent schedules is computed exactly (real sizes, no rounding) by
the same recurrence read as a min-max (:func:`min_peak_schedule`, :func:`rotor_min_budget`);
its plan is the fallback when rounding makes the table infeasible at a budget that is
nevertheless large enough.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from ..errors import InfeasibleBudget
from . import kernels
from .bounds import fill_bounds
from .chain import Chain
from .options import LayerOptions, base_forward_tmp
from .peak_kernels import fill_min_peak
from .schedule import Checkpoint, Layer, Plan, Schedule
from .simulator import make_schedule

__all__ = [
    "RotorTable",
    "min_peak_schedule",
    "rotor_min_budget",
    "plan_from_decisions",
    "plan_depth",
]


@dataclasses.dataclass(frozen=True)
class _Padded:
    """Rotor's padded arrays (float64, real units); see :mod:`solver.chain.kernels`.

    The per-option arrays are ``(positions, K)``; an option a layer lacks has infinite
    ``cbw``, ``ftmp``, ``gbt`` and ``tft`` and zero times, so it is never feasible.
    """

    cw: np.ndarray  # L + 2
    cbw: np.ndarray  # (L + 2, K)
    cout: np.ndarray  # (L + 2, K): x_size[i+1] where option k's output is outside its tape
    cgone: np.ndarray  # (L + 2, K): cout, or cfree[i+1, 0] where the output is in the tape
    cfree: np.ndarray  # (L + 1, K): what F_all(i) with option k frees of x[i] (loss: 0)
    cown: np.ndarray  # (L + 1, K): the same of a copy of x[i] stored on its own
    inside: np.ndarray  # (L + 1, K) bool: option k of layer i reads its output (in its tape)
    crf: np.ndarray  # L + 2: what F_ck(i) frees of x[i] (Chain.x_rec_free; 0 past L - 1)
    ftmp: np.ndarray  # (L + 1, K)
    fck: np.ndarray  # L + 1: F_ck / F_none's transient (Chain.ck_tmp; the loss's 0)
    tft: np.ndarray  # (L + 1, K): the base case's forward: the stored tape and fwd_tape_tmp
    gbt: np.ndarray  # (L + 1, K): what B(i) adds, g[i] and bwd_tmp (a size, never negative)
    fw: np.ndarray  # (L + 1, K)
    bw: np.ndarray  # (L + 1, K)
    ft: np.ndarray  # (L + 1, K): the base case's forward, fwd_tape_time (the loss's 0)
    lean_chain: np.ndarray  # (L + 1, K) bool: see kernels' "Saturation"
    lean_base: np.ndarray  # (L + 1, K) bool


def _padded(chain: Chain) -> _Padded:
    table = chain.options if chain.options is not None else LayerOptions.of_chain(chain)
    valid = np.vstack([table.valid, np.eye(1, table.width, dtype=bool)])  # the loss: option 0

    def rows(values: np.ndarray, before: bool, absent: float) -> np.ndarray:
        padded = np.vstack([values, np.zeros((1, table.width))])
        padded = np.where(valid, padded, absent)
        return np.vstack([np.zeros((1, table.width)), padded]) if before else padded

    x_out = np.where(table.output_in_tape, 0.0, chain.x_size[1:, None])
    fw, bw, ft = (rows(getattr(table, f), False, 0.0)
                  for f in ("fwd_time", "bwd_time", "fwd_tape_time"))
    lowest = np.where(valid, bw + np.minimum(fw, ft + fw[:, :1]), np.inf).min(axis=1)
    base = np.where(valid, ft + bw, np.inf)
    cfree = rows(chain.option_x_free, False, 0.0)
    # Where layer i's output is in its tape, every option of layer i+1 frees the same part
    # of x[i+1] (Chain checks it): column 0 says how much.
    gone = np.where(table.output_in_tape, cfree[1:, :1], chain.x_size[1:, None])
    crf = np.concatenate([chain.x_rec_free, np.zeros(2)])
    return _Padded(
        cw=np.concatenate([chain.x_size, np.zeros(1)]),
        cbw=rows(table.xbar_size, True, np.inf),
        cout=rows(x_out, True, 0.0),
        cgone=rows(gone, True, 0.0),
        cfree=cfree,
        cown=rows(chain.option_x_own_free, False, 0.0),
        inside=np.vstack([table.output_in_tape & table.valid, np.zeros((1, table.width), bool)]),
        crf=crf,
        ftmp=rows(table.fwd_tmp, False, np.inf),
        fck=np.concatenate([chain.ck_tmp, np.zeros(1)]),
        tft=rows(table.xbar_size - x_out + base_forward_tmp(chain), False, np.inf),
        gbt=rows(table.bwd_tmp, False, np.inf) + np.asarray(chain.x_size, float)[:, None],
        fw=fw,
        bw=bw,
        ft=ft,
        lean_chain=valid & (fw + bw <= lowest[:, None]),
        lean_base=valid & (base <= base.min(axis=1)[:, None]),
    )


def dp_contexts(p: _Padded) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(frees, route, sub)``: the DP's contexts (:mod:`solver.chain.kernels`). ``frees[c, i,
    k]``: what ``F_all(i)`` with option ``k`` frees of ``x[i]`` in context ``c``. Context 0:
    ``x[i]`` whole, a copy on its own (``cown``: the root, a leaf's ``(j, l)``); where some
    ``F_ck`` cuts its input (``crf > 0``), a cut context (``x[i]`` cut to what a
    recomputation reads: what is left to free) after each whole one; where the cut of a copy
    on its own differs (``Chain.x_own_read_size``), the same again for ``x[i]`` inside
    ``tape[i-1]`` (``cfree``). ``route[c]``: ``(context of a leaf's body, whether c is
    cut)``; ``sub[i, k]``: the context of the chain option's ``(i+1, l)`` with option ``k``
    (inside the tape where that option reads its output)."""
    groups = [p.cown] + ([p.cfree] if (p.cown != p.cfree).any() else [])
    cuts = 2 if (p.crf > 0).any() else 1
    frees, route = [], []
    for g, free in enumerate(groups):
        frees.append(free)
        route.append((g * cuts + cuts - 1, 0))
        if cuts == 2:
            frees.append(np.maximum(free - p.crf[:free.shape[0], None], 0.0))
            route.append((g * cuts + 1, 1))
    sub = np.where(p.inside, cuts, 0) if len(groups) == 2 else np.zeros(p.inside.shape)
    return np.stack(frees), np.array(route, dtype=np.int64), sub.astype(np.int64)


def plan_from_decisions(length: int, decide: Callable[..., int],
                        base: Callable[..., int] | None = None, *,
                        contexts: tuple[np.ndarray, np.ndarray] | None = None) -> Plan:
    """Build the nested plan of ``(0, L)`` from DP decisions, without recursion.

    ``decide(i, l)`` gives the decision for the subproblem ``(i, l)``, ``i < l``: ``-k``
    for the chain option with the layer's option ``k`` (0 for option 0: ``Layer(i, k)``,
    continue with ``(i+1, l)``) or ``j > i`` for the leaf option (``Checkpoint(i, j, plan
    of (i, j-1))``, continue with ``(j, l)``). Subproblems are visited depth first, a
    checkpoint's body before the rest of its spine: the order in which
    :func:`solver.chain.kernels.trace_time_plan` emits decisions. The subproblem ``(l, l)``
    that ends a spine is ``Layer(l, k)`` with ``-k = base(l)`` (option 0 without ``base``),
    asked when it is met, or nothing for the loss (``l == L``).

    With ``contexts=(route, sub)`` (:func:`dp_contexts`) the callbacks also get the
    subproblem's context (:mod:`solver.chain.kernels`): ``decide(i, l, c)`` and ``base(l, c)``.
    """
    # Each frame: [i, l, items, checkpoint_start, checkpoint_stop, context] of one spine.
    root: list = [0, length, [], -1, -1, 0]
    ask = (lambda f, *a: f(*a)) if contexts is not None else (lambda f, *a: f(*a[:-1]))
    route, sub = contexts if contexts is not None else (np.zeros((1, 2), np.int64), None)
    stack = [root]
    result: Plan | None = None
    while stack:
        frame = stack[-1]
        descended = False
        while frame[0] < frame[1]:
            i, l = frame[0], frame[1]
            d = int(ask(decide, i, l, frame[5]))
            if d <= 0:
                frame[2].append(Layer(i, -d))
                frame[0] = i + 1
                frame[5] = 0 if sub is None else int(sub[i, -d])
            elif i < d <= l:
                frame[3], frame[4] = i, d
                frame[0] = d
                stack.append([i, d - 1, [], -1, -1, int(route[frame[5], 0])])
                frame[5] = 0
                descended = True
                break
            else:
                raise RuntimeError(f"Invalid DP decision {d} for subproblem ({i}, {l}).")
        if descended:
            continue
        if frame[0] < length:
            option = 0 if base is None else -int(ask(base, frame[0], frame[5]))
            if option < 0:
                raise RuntimeError(f"Invalid DP decision {-option} for layer {frame[0]}.")
            frame[2].append(Layer(frame[0], option))
        stack.pop()
        plan = tuple(frame[2])
        if stack:
            parent = stack[-1]
            parent[2].append(Checkpoint(parent[3], parent[4], plan))
        else:
            result = plan
    assert result is not None
    return result


def plan_depth(plan: Plan) -> int:
    """How deeply checkpoints nest in ``plan`` (0 for a plan of plain layers)."""
    deepest, stack = 0, [(plan, 0)]
    while stack:
        items, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((item.body, depth + 1) for item in items if isinstance(item, Checkpoint))
    return deepest


def _schedule(chain: Chain, plan: Plan) -> Schedule:
    return make_schedule(chain, plan, "rotor")


@functools.lru_cache(maxsize=8)
def _min_peak(chain: Chain) -> tuple[float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(min_budget, (choice, route, sub))``: exact least peak of persistent schedules, its
    decisions per context and the contexts' routes (:func:`dp_contexts`)."""
    p = _padded(chain)
    n = chain.length + 1
    frees, route, sub = dp_contexts(p)
    shape = (frees.shape[0], n, n)
    peak = np.empty(shape, dtype=np.float64)
    time = np.empty(shape, dtype=np.float64)
    choice = np.empty(shape, dtype=np.int64)
    fill_min_peak(p.cw, p.cbw, p.cout, p.cgone, frees, p.crf, route, sub, p.ftmp, p.fck, p.gbt,
                  p.tft, p.fw, p.bw, p.ft, peak, time, choice)
    return float(p.cw[0] + peak[0, 0, chain.length]), (choice, route, sub)


def rotor_min_budget(chain: Chain) -> float:
    """The smallest budget at which a persistent (Rotor) schedule exists, exactly.

    ``cw[0] + P[0][L]`` where ``P`` is the min-max form of Rotor's recurrence
    (ALGORITHMS.md section 2) on the real sizes. O(L^3) time, O(L^2) memory.
    """
    return _min_peak(chain)[0]


def min_peak_schedule(chain: Chain) -> Schedule:
    """A persistent schedule whose peak is :func:`rotor_min_budget` (method ``"rotor"``).

    Among equal peaks the DP prefers the option whose plan is faster (a heuristic: the
    result is not always the fastest minimum-peak schedule), so use it where nothing else
    fits.
    """
    _, (choice, route, sub) = _min_peak(chain)
    plan = plan_from_decisions(chain.length, lambda i, l, c: choice[c, i, l],
                               lambda l, c: choice[c, l, l], contexts=(route, sub))
    return _schedule(chain, plan)


def _to_units(values: np.ndarray, unit: float, cap: int) -> np.ndarray:
    """Sizes in whole units, rounded up, clipped at ``cap`` (anything above is infeasible)."""
    units = np.ceil(np.asarray(values, dtype=np.float64) / unit)
    return np.minimum(units, cap).astype(np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class RotorTable:
    """Rotor's DP table for ``chain``, built once for ``max_budget``, queried per budget.

    Attributes:
      chain: the chain.
      max_budget: the largest budget the table answers (same units as the chain's sizes).
      slots: number of memory units ``max_budget`` is divided into (Rotor: 500).
      unit: the size of one slot (1 when exact).
      capacity: ``M``, the number of units of ``max_budget``.
      exact: whether no rounding happens (integer sizes and ``slots >= max_budget``).
      min_budget: the exact smallest budget any persistent schedule fits in.

    Building costs O(L^3 M + L^2 K M) time (``K`` options per layer) and
    ``2 (L+1)(L+2) (M+1)`` bytes (float32, triangular).
    """

    chain: Chain
    max_budget: float
    slots: int = 500
    unit: float = dataclasses.field(init=False)
    capacity: int = dataclasses.field(init=False)
    exact: bool = dataclasses.field(init=False)
    min_budget: float = dataclasses.field(init=False)
    _arrays: dict = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        budget = float(self.max_budget)
        if not np.isfinite(budget) or budget <= 0:
            raise ValueError(f"max_budget must be finite and > 0, got {self.max_budget!r}.")
        if isinstance(self.slots, bool) or not isinstance(self.slots, (int, np.integer)):
            raise ValueError(f"slots must be an integer >= 1, got {self.slots!r}.")
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}.")
        chain = self.chain
        exact = chain.is_integral and self.slots >= budget
        unit = 1.0 if exact else budget / int(self.slots)
        capacity = int(np.floor(budget)) if exact else int(self.slots)
        p = _padded(chain)
        cap = capacity + 1
        cw, cbw, ftmp, fck, gbt, tft = (_to_units(a, unit, cap)
                                        for a in (p.cw, p.cbw, p.ftmp, p.fck, p.gbt, p.tft))
        # B(i) holds tape[i] without x[i+1] when the output is outside the tape: round that
        # tape up on its own (cbw - cout >= its real size), not the difference of roundings.
        cout = cbw - _to_units(p.cbw - p.cout, unit, cap)
        # What F_all(i) frees of x[i] is rounded down (never over-credited); so is what the
        # chain option's B(i) no longer holds of tape[i].
        frees, route, sub = dp_contexts(p)
        cfree = np.floor(frees / unit).astype(np.int64)
        crf = np.floor(p.crf / unit).astype(np.int64)  # what F_ck frees, rounded down too
        cgone = np.where(p.cout > 0, cout, np.floor(p.cgone / unit)).astype(np.int64)
        # Times in float32, scaled by a power of two (exact) so that the largest op time is
        # in [0.5, 1): no overflow, and integer times stay exact.
        largest = float(max(p.fw.max(), p.bw.max()))
        scale = float(2.0 ** np.frexp(largest)[1]) if largest > 0 else 1.0
        fw = (p.fw / scale).astype(np.float32)
        bw = (p.bw / scale).astype(np.float32)
        ft = (p.ft / scale).astype(np.float32)
        cum = np.concatenate([[0.0], np.cumsum(p.fw[:, 0] / scale)])
        n = chain.length + 1
        off = kernels.row_offsets(n)
        pairs = int(off[n])
        contexts = cfree.shape[0]
        mnull = np.empty(pairs, dtype=np.int64)
        mmin = np.empty((contexts, pairs), dtype=np.int64)
        sat = np.empty((contexts, pairs), dtype=np.int64)
        fneed = np.zeros((n, n + 1), dtype=np.int64)
        fill_bounds(cw, cbw, cout, cgone, cfree, crf, route, sub, ftmp, fck, gbt, tft,
                            p.lean_chain, p.lean_base, capacity, off, mnull, mmin, sat, fneed)
        opt = np.empty((contexts, pairs, capacity + 1), dtype=np.float32)
        kernels.fill_time_table(cw, cbw, cout, cgone, cfree, crf, route, sub, ftmp, fck, gbt,
                                tft, fw, bw, ft, cum, capacity, off, mnull, mmin, sat, fneed,
                                kernels.block_size(capacity), opt)
        arrays = dict(cw=cw, cbw=cbw, cout=cout, cgone=cgone, cfree=cfree, crf=crf, route=route,
                      sub=sub, ftmp=ftmp, fck=fck,
                      gbt=gbt, tft=tft,
                      fw=fw, bw=bw, ft=ft, cum=cum, off=off, mnull=mnull, mmin=mmin, fneed=fneed, opt=opt,
                      scale=scale)
        object.__setattr__(self, "max_budget", budget)
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "capacity", capacity)
        object.__setattr__(self, "exact", exact)
        object.__setattr__(self, "min_budget", rotor_min_budget(chain))
        object.__setattr__(self, "_arrays", arrays)

    @property
    def nbytes(self) -> int:
        """Bytes held by the table."""
        return int(sum(a.nbytes for a in self._arrays.values() if isinstance(a, np.ndarray)))

    def _memory(self, budget: float) -> int:
        """Units available to ``Opt[.][0][L]`` at ``budget`` (``M_b - cw[0]``), rounded down."""
        budget = float(budget)
        if not np.isfinite(budget) or budget <= 0:
            raise ValueError(f"budget must be finite and > 0, got {budget!r}.")
        if budget > self.max_budget * (1 + 1e-12):
            raise ValueError(
                f"budget {budget:.6g} exceeds the table's max_budget {self.max_budget:.6g}; "
                f"build RotorTable(chain, max_budget={budget:.6g}) to answer it."
            )
        units = self.capacity if budget >= self.max_budget else int(np.floor(budget / self.unit))
        return min(units, self.capacity) - int(self._arrays["cw"][0])

    def predicted_time(self, budget: float) -> float:
        """The DP's optimal time at ``budget`` (``inf`` if the rounded table is infeasible)."""
        a = self._arrays
        m = self._memory(budget)
        row = int(a["off"][0] + self.chain.length)
        if m < a["mmin"][0, row]:
            return float("inf")
        return float(a["opt"][0, row, m]) * a["scale"]

    def plan(self, budget: float) -> Plan | None:
        """The DP's optimal plan at ``budget``, or ``None`` if the rounded table is infeasible."""
        a = self._arrays
        m = self._memory(budget)
        row = int(a["off"][0] + self.chain.length)
        if m < a["mmin"][0, row]:
            return None
        decisions = kernels.trace_time_plan(a["opt"], a["cw"], a["cbw"], a["cout"], a["cgone"],
                                            a["cfree"], a["crf"], a["route"], a["sub"], a["ftmp"],
                                            a["fck"], a["gbt"], a["tft"], a["fw"], a["bw"],
                                            a["ft"], a["cum"],
                                            a["off"], a["mnull"], a["mmin"], a["fneed"],
                                            self.capacity, m)
        if decisions.size and decisions.min() == kernels.NO_DECISION:
            raise RuntimeError("Rotor's table is inconsistent (a decision could not be found).")
        sequence = iter(decisions.tolist())
        plan = plan_from_decisions(self.chain.length, lambda i, l: next(sequence),
                                   lambda l: next(sequence))
        if next(sequence, None) is not None:
            raise RuntimeError("Rotor's plan reconstruction left decisions unused.")
        return plan

    def schedule(self, budget: float) -> Schedule:
        """The fastest persistent schedule the table finds at ``budget`` (``<= max_budget``).

        If rounding makes the table infeasible although ``budget >= min_budget``, returns the
        exact minimum-peak schedule instead (:func:`min_peak_schedule`).

        Raises:
          InfeasibleBudget: ``budget < min_budget``; ``.min_budget`` says what suffices.
        """
        if budget < self.min_budget:
            raise InfeasibleBudget(float(budget), self.min_budget, "rotor")
        plan = self.plan(budget)
        if plan is None:
            return min_peak_schedule(self.chain)
        return _schedule(self.chain, plan)
