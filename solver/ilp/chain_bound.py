"""A lower bound on the least time of ANY op sequence of a chain with options and tapes.

Checkmate's ILP (:mod:`solver.ilp.chain_adapter`) is exact only on tapeless chains without
per-layer options; profiled JAX stacks have both (and temporaries, tape-only forwards,
inputs read in part). This module bounds the optimum of the full chain model instead: a
small mixed-integer program (``scipy.optimize.milp``, HiGHS) whose optimum is at most the
time of every sequence of simulator ops and drops within the budget
(:mod:`solver.chain.simulator`, :func:`solver.chain.exhaustive.replay`), persistent or not,
hence at most Rotor's optimum (:func:`solver.solve`) at any discretisation. Where the
bound equals the time of the DP's schedule, that schedule is optimal over all sequences;
where it exceeds a target, no schedule over the chain's menu of options reaches it.

**The lineage.** Take any valid complete sequence. The ``g[0]`` it ends with was stored by
some ``B(0)``, which read ``g[1]``, stored by the latest ``B(1)`` before it, and so on:
``B*(L-1) < ... < B*(0)``, preceded by ``loss*``, the latest loss before ``B*(L-1)``.
``x[L]`` is available at ``loss*``, so there are forwards ``phi(0) < ... < phi(L-1) <
loss*``, ``phi(i)`` of layer ``i`` producing the ``x[i+1]`` that ``phi(i+1)`` reads.
``B*(i)`` consumes a tape built by one ``F_all(i)`` with some option ``k_i``, ``F*(i)``,
stored from ``F*(i)`` to ``B*(i)``; for ``i + 1 < L`` it reads a copy ``X*(i+1)`` of
``x[i+1]`` (on its own or inside a tape of layer ``i``), stored from the forward of layer
``i`` that produced it to ``B*(i+1)`` (for ``i = L - 1``, ``X*(L)`` is the copy ``loss*``
reads). Each layer is in one of five cases (:data:`CASES`):

* ``simple``: ``phi(i)`` is the layer's only forward, so ``F*(i) = phi(i)`` and it
  produced ``X*(i+1)``;
* ``held``: ``F*(i)`` and the production of ``X*(i+1)`` run before ``loss*``, and the
  layer has another forward;
* ``output_again``: ``F*(i)`` runs before ``loss*``, ``X*(i+1)`` is produced after it;
* ``tape_again``: ``F*(i)`` runs after ``loss*``, ``X*(i+1)`` is produced before it;
* ``both_again``: both after ``loss*`` (the last two never for ``i = L - 1``).

**Time.** ``phi(i)`` costs at least ``f_i``: the least of the layer's ``fwd_time``, its
options' ``fwd_time`` and, for options that keep the output in the tape, their
``fwd_tape_time``: the least a forward that stores ``x[i+1]`` costs (``F_all`` while
``g[i+1]`` is stored costs ``fwd_tape_time`` but keeps ``x[i+1]`` only inside the tape). A
simple layer's ``phi(i)`` is ``F_all`` with ``k_i``: at least its ``fwd_time`` (the smaller
of it and its ``fwd_tape_time`` if ``k_i`` keeps the output in the tape). Beyond ``phi(i)``:
``held`` runs another forward ``w``: at least ``f_i``, or a tape-only ``F_all`` (at least
``m_i``, the least any forward of the layer costs) while ``g[i+1]`` is stored. Not between
``B*(i+1)`` and ``B*(i)``: ``F*(i)``'s tape is stored then and a tape is never stored
twice. So ``g[i+1]`` was stored by a ``B(i+1)`` other than ``B*(i+1)``, one more op, at
least the least ``bwd_time`` of layer ``i+1`` (a loss, free, for ``i = L - 1``);
``output_again`` a forward storing ``x[i+1]`` (``f_i``); ``tape_again`` ``F*(i)`` (at least
``t(k_i) = min(fwd_tape_time, fwd_time)`` of ``k_i``); ``both_again`` ``F*(i)``, which may
also produce ``X*(i+1)`` only if ``k_i`` keeps its output in the tape (``t(k_i)``) or runs
before ``g[i+1]`` exists (its ``fwd_time``), else ``F*(i)`` and another forward
(``t(k_i) + f_i``). Every ``B*(i)`` costs ``bwd_time`` of ``k_i``.

**Memory.** Peak candidates of the simulator at ``L + 1`` moments:

* ``loss*`` (after storing ``g[L]``): ``g[L]``; ``x[0]`` (never recomputed: stored until
  ``B(0)``); ``x[L]`` (on its own, or inside ``F*(L-1)``'s tape if it runs before and keeps
  its output there); ``H_i`` of every layer;
* ``B*(j)`` (after storing ``g[j]``, plus ``bwd_tmp`` of ``k_j``): ``g[j+1]``, ``g[j]``,
  ``x[0]``, the tape of layer ``j``, ``H_i`` of the layers ``i < j`` and, unless counted in
  ``H_{j-1}``, ``X*(j)``, which ``B*(j)`` reads.

``H_i`` is what layer ``i`` stores from ``loss*`` to ``B*(i)`` (its tape, if ``F*(i)`` ran
before) and to ``B*(i+1)`` (``X*(i+1)``, if produced before; inside that tape if the option
keeps its output there). A copy of ``x[m]`` counts ``x_size[m]`` less its largest possible
cut (``Chain.x_read_size``, ``x_rec_size``; ``x_own_read_size``, the larger cut of a copy
on its own, so that the bound never counts more): what ``F_all(m)`` with ``k_m`` frees if layer
``m`` is simple (its only forward), else the most any forward of layer ``m`` frees. A tape
that does not hold its output is never cut (the simulator cuts the copy on its own then).
The dependence of ``H_i`` on layer ``i+1``'s case is linearised with continuous variables
(``H_i`` is at least each of two linear expressions, both valid, one exact in each case).
Forward temporaries and every other stored value are left out: a bound only needs moments
every sequence has.

**Rebuilt inputs.** A rebuilt layer's ``F*(i)`` (after ``loss*``) reads a copy of ``x[i]``
not cut by any ``F_all(i)`` (the simulator refuses that), at most by ``x_rec_size``. Either
that copy was produced before ``loss*`` (``Y_i = 0``; always for ``i = 0``, and when layer
``i-1`` is simple, its only output): then at ``loss*`` it holds ``max_cut - x_rec_free``
more than the copy the ``H_{i-1}`` term may count (``F_i``), and at each ``B*(j)``, ``j > i``,
either it is still stored or ``F*(i)`` has run and its tape is (``E_i``, the smaller; at
``B*(i+1)`` the tape beyond its output, ``N_i``: an option that keeps its output in the tape
may hold the very ``X*(i+1)`` that row counts on its own); or a
forward of layer ``i-1`` produced it after ``loss*`` (``Y_i = 1``): free in the bound when
that layer's case already runs such a forward, and when it is ``tape_again`` with an option
that keeps its output outside the tape, at least ``min(f_{i-1}, fwd_time - t(k))`` more
(``P_i``): ``F*(i-1)`` stores ``x[i]`` only while ``g[i]`` is not stored, at its
``fwd_time``, else another forward runs.

**Program.** One binary per layer, option and case (exactly one per layer), continuous
``H_i``, the tape term of each ``B*(j)`` row and ``x[0]``'s size, and the rebuilt inputs'
``Y_i``, ``F_i``, ``E_i``, ``N_i``, ``P_i``; minimise the time above (with ``P``) under the ``L + 1``
memory rows. Each sequence maps to a feasible point of no larger
objective, so the optimum bounds every sequence (the bound returned is HiGHS's proven
dual bound). When the best sequence is a persistent plan that keeps every layer's tape
(every layer simple: the usual optimum between the uniform policies' memories) and no
option that keeps its output in the tape has a cheaper tape-only forward, its point has
the plan's time and the rows are the simulator's peaks at those moments exactly, so the
bound is the optimum. Rotor's DP is Beaumont et al., arXiv:1911.13214, options as in
Rockmate (Zhao et al., ICML 2023); the program is a multiple-choice knapsack (Sinha and
Zoltners, Operations Research 27(3), 1979) with one capacity row per moment.
"""

from __future__ import annotations

import dataclasses
import math
import time as timer

import numpy as np
from scipy import optimize

from ..chain.chain import Chain
from ..chain.options import layer_costs
from ..errors import check_real

__all__ = ["ChainBound", "chain_time_bound", "CASES"]

CASES = ("simple", "held", "output_again", "tape_again", "both_again")
"""A layer's cases in the program (module docstring)."""


@dataclasses.dataclass(frozen=True)
class ChainBound:
    """The bound of :func:`chain_time_bound`.

    Attributes:
      time: a lower bound on the time of every sequence within the budget (``inf``: no
        sequence fits); HiGHS's dual bound if the time limit stopped it first.
      optimal: whether HiGHS proved ``time`` the program's optimum.
      options: per layer, the option of the program's best point (empty if none).
      cases: per layer, its case there (:data:`CASES`).
      seconds: wall time spent.
    """

    time: float
    optimal: bool
    options: tuple[int, ...]
    cases: tuple[str, ...]
    seconds: float


def _max_cut(chain: Chain) -> np.ndarray:
    """``(L + 1,)``: the most bytes any forward may cut from a copy of ``x[m]`` (0 for ``x[L]``)."""
    cut = np.zeros(chain.length + 1)
    cut[:-1] = np.maximum(chain.option_x_own_free.max(axis=1), chain.x_rec_free)
    return np.minimum(cut, chain.x_size)


@dataclasses.dataclass(frozen=True)
class _Columns:
    """The binaries ``(layer, option, case)`` and their coefficients (module docstring)."""

    layer: np.ndarray
    option: np.ndarray
    case: np.ndarray  # index into CASES
    time: np.ndarray  # the objective, f_i excluded
    tape: np.ndarray  # tape_size of the option
    in_tape: np.ndarray
    bwd_tmp: np.ndarray
    cut: np.ndarray  # the most this layer's forwards cut from a copy of x[layer]
    tape_before: np.ndarray  # F*(i) before loss*
    output_before: np.ndarray  # X*(i+1) produced before loss*
    fwd: np.ndarray  # the option's fwd_time
    tape_time: np.ndarray  # min(fwd_tape_time, fwd_time) of the option

    @classmethod
    def of(cls, chain: Chain, max_cut: np.ndarray) -> tuple["_Columns", np.ndarray]:
        """The columns, and ``f_i`` per layer."""
        L = chain.length
        first = np.array(chain.fwd_time, dtype=np.float64)
        least = np.array(chain.fwd_time, dtype=np.float64)
        layers = [[layer_costs(chain, i, k) for k in range(int(chain.num_options[i]))]
                  for i in range(L)]
        for i, costs in enumerate(layers):
            for c in costs:
                t = min(c.fwd_tape_time, c.fwd_time)
                first[i] = min(first[i], c.fwd_time, t if c.output_in_tape else np.inf)
                least[i] = min(least[i], t)
        # a tape-only forward needs g[i+1]; in the held case, one stored by a B(i+1) other
        # than B*(i+1) (or a loss other than loss*, free, for i = L-1)
        again = [min(c.bwd_time for c in layers[i + 1]) if i + 1 < L else 0.0 for i in range(L)]
        rows = []
        for i, costs in enumerate(layers):
            for k, c in enumerate(costs):
                t = min(c.fwd_tape_time, c.fwd_time)
                extra = {  # the forwards beyond phi(i), by case
                    0: (t if c.output_in_tape else c.fwd_time) - first[i],
                    1: min(first[i], least[i] + again[i]),
                    2: first[i],
                    3: t,
                    4: t if c.output_in_tape else min(c.fwd_time, t + first[i]),
                }
                for case, more in extra.items():
                    if case in (2, 4) and i == L - 1:
                        continue  # X*(L) is read by loss*: produced before it
                    cut = chain.option_x_own_free[i, k] if case == 0 else max_cut[i]
                    rows.append((i, k, case, c.bwd_time + more, c.tape_size, c.output_in_tape,
                                 c.bwd_tmp, cut, case <= 2, case in (0, 1, 3), c.fwd_time, t))
        fields = [np.array(column) for column in zip(*rows)]
        return cls(*fields), first


def _cheapest_of_twins(matrix: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """The columns to keep: of binaries with identical columns in ``matrix`` (every row),
    the cheapest (the first among equals); the others never improve a point.

    HiGHS's MIP presolve (scipy 1.17-1.18) returns wrong optima, marked optimal, on this
    program's structure: on ``min 2a + c + d`` over binaries ``a + b + c + d = 1`` with
    ``H - 6b - 6c <= 4``, ``H >= 9b + 9c``, ``H >= 0`` it reports 1, not 0, where ``b`` and
    ``c`` are twins of different cost (the simple and held cases of a layer often are), and
    likewise where two such columns differ only in rows it reduces away first (two options of
    one layer). Removing twins did not suffice, so :func:`chain_time_bound` runs HiGHS
    without presolve (10-100x slower on random 200-layer chains; 0.01-0.5 s on profiled
    ones). The same class of presolve bug as HiGHS issues #3043, #3073 and #3094.
    """
    order = np.lexsort((np.arange(len(cost)), cost))  # by cost, then position
    _, first = np.unique(matrix[:, order].T, axis=0, return_index=True)
    return np.sort(order[first])


def _rebuilt_inputs(chain: Chain, col: _Columns, first: np.ndarray, max_cut: np.ndarray,
                    add_ge, variables: tuple[int, int, int, int, int]) -> None:
    """The rows of the input a rebuilt layer's ``F*(i)`` reads (module docstring, "Rebuilt
    inputs"): per layer the binary ``Y_i`` (that input produced after ``loss*``) and the
    continuous ``F_i`` (bytes at ``loss*``), ``E_i`` (at each ``B*(j)``, ``j > i + 1``),
    ``N_i`` (at ``B*(i+1)``) and ``P_i`` (time), through ``add_ge(coefficients, z, low)``.

    At ``B*(i+1)`` the tape of ``F*(i)`` may hold ``X*(i+1)`` itself (an option that keeps
    its output in the tape, run after ``loss*``), which that row counts on its own: there
    the tape counts only beyond its output (``N_i``). Counting it whole overcounted the
    row and called a budget infeasible that a sequence meets (a hypothesis draw of
    ``tests/test_ck_tmp.py``: ``tests/test_solver_bound.py::test_a_rebuilt_tape_that_holds_the_next_input_is_counted_once``)."""
    Y, F, E, N, P = variables
    rebuilt = ~col.tape_before
    for i in range(chain.length):
        mine = (col.layer == i) & rebuilt
        previous = col.layer == i - 1
        simple = np.where(previous & (col.case == 0), 1.0, 0.0)
        # Y_i <= rebuilt_i, and <= 1 - simple_{i-1} (Y_0 = 0: x[0] is never produced)
        add_ge({Y + i: -1.0}, np.where(mine, 1.0, 0.0), 0.0)
        add_ge({Y + i: -1.0}, -simple, -1.0 if i else 0.0)
        more = max_cut[i] - min(chain.x_rec_free[i], max_cut[i])
        tape = np.maximum(col.tape - np.where(col.in_tape, max_cut[i + 1], 0.0), 0.0)
        # F_i >= more (rebuilt_i - Y_i); E_i >= sum e z - max(e) Y_i
        add_ge({F + i: 1.0, Y + i: more}, np.where(mine, -more, 0.0), 0.0)
        e = np.where(mine, np.minimum(more, tape), 0.0)
        add_ge({E + i: 1.0, Y + i: float(e.max())}, -e, 0.0)
        beyond = np.maximum(col.tape - np.where(col.in_tape, chain.x_size[i + 1], 0.0), 0.0)
        e = np.where(mine, np.minimum(more, beyond), 0.0)
        add_ge({N + i: 1.0, Y + i: float(e.max())}, -e, 0.0)
        if i:  # P_i >= w of layer i-1's choice - max(w) (1 - Y_i)
            w = np.where(previous & (col.case == 3) & ~col.in_tape,
                         np.minimum(first[i - 1], col.fwd - col.tape_time), 0.0)
            add_ge({P + i: 1.0, Y + i: -float(w.max())}, -w, -float(w.max()))


def chain_time_bound(chain: Chain, budget: float, *, time_limit: float = 60.0) -> ChainBound:
    """A lower bound on the least time of any sequence of ``chain`` within ``budget``.

    See the module docstring for the program and the proof. The chain may use every field
    of :class:`~solver.chain.chain.Chain` (options, tapes, temporaries, tape-only forwards,
    inputs read in part). The program has about ``5 * sum(num_options) + 6 L`` variables:
    0.01-0.5 s on 6-16 profiled layers; on random chains of 200 layers with 4 options 3-60 s,
    often stopped at ``time_limit`` with the dual bound reached (HiGHS runs without its
    presolve, which returns wrong optima here: :func:`_cheapest_of_twins`; where the best
    schedules recompute much, the bound can be loose: 0.80-0.82 of the DP's time on those
    chains).

    Raises:
      TypeError: ``chain`` is not a :class:`~solver.chain.chain.Chain`.
      ValueError: ``budget`` or ``time_limit`` is not a non-negative (positive) number.
      RuntimeError: HiGHS stopped at ``time_limit`` with no bound; raise it.
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"chain_time_bound expects a solver.Chain, got {type(chain).__name__}.")
    budget = check_real(budget, "budget")
    time_limit = check_real(time_limit, "time_limit", strict=True)
    start = timer.perf_counter()
    L, xs = chain.length, chain.x_size
    max_cut = _max_cut(chain)
    col, first = _Columns.of(chain, max_cut)
    n = len(col.layer)
    # variables: [z (n binaries) | H | T | X0 | Y (L binaries) | F | E | P | N], per layer
    nv = n + 7 * L + 1
    H, T, X0 = n, n + L, n + 2 * L
    Y, F, E, P, N = (n + 2 * L + 1, n + 3 * L + 1, n + 4 * L + 1, n + 5 * L + 1,
                     n + 6 * L + 1)
    before = col.tape_before & col.in_tape  # x[i+1] possibly inside F*(i)'s tape
    copy = col.output_before & ~before  # X*(i+1) counted on its own
    next_cut = np.zeros((L, n))  # row i: what layer i+1's choice cuts from x[i+1]
    for i in range(L - 1):
        next_cut[i] = np.where(col.layer == i + 1, col.cut, 0.0)
    ge_rows, ge_low = [], []  # rows >= low

    def add_ge(coefficients: dict[int, float], z: np.ndarray, low: float) -> None:
        row = np.zeros(nv)
        row[:n] = z
        for v, a in coefficients.items():
            row[v] += a
        ge_rows.append(row)
        ge_low.append(low)

    for i in range(L):
        mine = col.layer == i
        out = xs[i + 1] if i + 1 < L else 0.0  # x[L]'s own copy is counted at loss* only
        # H_i >= what the layer holds, its output's copy cut by exactly layer i+1's choice
        a = np.where(mine & col.tape_before, col.tape, 0.0) + np.where(mine & copy, out, 0.0)
        add_ge({H + i: 1.0}, -(a - next_cut[i]), 0.0)
        # ... or cut by the most any forward of layer i+1 frees
        b = a - np.where(mine & (before | copy), max_cut[i + 1], 0.0)
        add_ge({H + i: 1.0}, -b, 0.0)
        # T_i >= the tape and temporaries of B*(i), likewise
        t = np.where(mine, col.tape + col.bwd_tmp, 0.0)
        add_ge({T + i: 1.0}, -(t - next_cut[i]), 0.0)
        add_ge({T + i: 1.0}, -(t - np.where(mine & col.in_tape, max_cut[i + 1], 0.0)), 0.0)
    # X0 >= x[0] less what layer 0's forwards cut
    add_ge({X0: 1.0}, np.where(col.layer == 0, col.cut, 0.0), xs[0])
    _rebuilt_inputs(chain, col, first, max_cut, add_ge, (Y, F, E, N, P))

    le_rows, le_high = [], []
    row = np.zeros(nv)  # loss*
    row[H:H + L] = 1.0
    row[X0] = 1.0
    row[F:F + L] = 1.0
    row[:n] -= np.where((col.layer == L - 1) & before, xs[L], 0.0)
    le_rows.append(row)
    le_high.append(budget - 2 * xs[L])
    for j in range(L):  # B*(j)
        row = np.zeros(nv)
        row[H:H + j] = 1.0
        row[T + j] = 1.0
        row[X0] = 1.0
        row[E:E + max(j - 1, 0)] = 1.0  # the rebuilt inputs of layers i < j - 1 ...
        if j >= 1:
            row[N + j - 1] = 1.0  # ... and of layer j - 1, whose tape may hold X*(j)
        high = budget - xs[j + 1] - xs[j]
        if j >= 1:  # X*(j), unless counted in H_{j-1}
            x_min = xs[j] - max_cut[j]
            row[:n] -= np.where((col.layer == j - 1) & col.output_before, x_min, 0.0)
            high -= x_min
        le_rows.append(row)
        le_high.append(high)
    one = np.zeros((L, nv))
    one[col.layer, np.arange(n)] = 1.0
    le, ge = np.array(le_rows), np.array(ge_rows)
    # in units of 1e-9 of the least time, so that HiGHS's absolute gap (1e-6) is negligible
    least = np.array([col.time[col.layer == i].min() for i in range(L)])
    total = float(first.sum() + least.sum())
    unit = total * 1e-9 if total > 1e-290 else 1.0
    objective = np.concatenate([(col.time - least[col.layer]) / unit, np.zeros(nv - n)])
    objective[P:P + L] = 1.0 / unit
    kept = np.concatenate([_cheapest_of_twins(np.vstack([le, ge, one])[:, :n], objective[:n]),
                           np.arange(n, nv)])
    constraints = [optimize.LinearConstraint(le[:, kept], -np.inf, np.array(le_high)),
                   optimize.LinearConstraint(ge[:, kept], np.array(ge_low), np.inf),
                   optimize.LinearConstraint(one[:, kept], 1.0, 1.0)]
    integrality = np.concatenate([np.ones(n), np.zeros(nv - n)])
    integrality[Y:Y + L] = 1
    upper = np.concatenate([np.ones(n), np.full(nv - n, np.inf)])
    upper[Y:Y + L] = 1.0
    lower = np.zeros(nv)
    lower[T:T + L] = -np.inf  # a backward that frees its input as it reads it: bwd_tmp < 0
    result = optimize.milp(objective[kept], constraints=constraints,
                           integrality=integrality[kept],
                           bounds=optimize.Bounds(lower[kept], upper[kept]),
                           options={"time_limit": time_limit, "mip_rel_gap": 0.0,
                                    "presolve": False})  # _cheapest_of_twins: HiGHS's is wrong
    seconds = timer.perf_counter() - start
    if result.status == 2:  # no point fits: no sequence does
        return ChainBound(math.inf, True, (), (), seconds)
    base = float(first.sum() + least.sum())
    optimal = result.status == 0
    bound = getattr(result, "mip_dual_bound", None)  # proven, unlike the incumbent's value
    if bound is None or not np.isfinite(bound):
        bound = result.fun if optimal else None
    if bound is None or not np.isfinite(bound):
        raise RuntimeError(
            f"chain_time_bound: HiGHS found no bound within time_limit={time_limit:g} s "
            f"(status {result.status}: {result.message}); raise time_limit.")
    if result.x is None:
        return ChainBound(base + float(bound) * unit, False, (), (), seconds)
    x = np.zeros(nv)
    x[kept] = result.x
    pick = sorted(np.flatnonzero(x[:n] > 0.5), key=lambda c: col.layer[c])
    return ChainBound(base + float(bound) * unit, optimal, tuple(int(col.option[c]) for c in pick),
                      tuple(CASES[col.case[c]] for c in pick), seconds)
