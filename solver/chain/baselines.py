"""Baseline schedules every comparison should carry (ALGORITHMS.md section 2, last paragraph).

- ``"none"``: no rematerialization, every layer keeps its tape (``Layer(i)`` for each ``i``).
- ``"every_layer"``: keep each layer's input only and recompute the layer in the backward
  pass (``Checkpoint(i, i + 1, (Layer(i),))`` for each ``i``).
- ``"sqrt"``: Chen, Xu, Zhang, Guestrin, "Training deep nets with sublinear memory cost"
  (arXiv:1604.06174), section 4.1: cut the chain into about ``sqrt(L)`` segments of about
  ``sqrt(L)`` consecutive layers; the forward pass keeps only each segment's input and the
  backward pass recomputes one segment at a time, keeping all of its tapes. We cut by layer
  count (``round(sqrt(L))`` segments of near-equal length), not by Chen's memory-greedy rule.
- ``"revolve"``: Griewank & Walther, "Algorithm 799: revolve" (ACM TOMS 26(1), 2000):
  binomial checkpointing with ``s`` snapshots, optimal for a homogeneous chain. On a
  heterogeneous chain we use the plan that is optimal when every forward step costs the
  mean forward time, i.e. the homogeneous plan, which depends only on ``L`` and ``s``
  (the count of forward steps is what revolve minimises). The snapshot count is then chosen
  on the real chain: the fastest plan (real times) whose real peak fits the budget.

Every baseline's :class:`~solver.chain.schedule.Schedule` is built by
:func:`~solver.chain.simulator.make_schedule`, so its time and peak are the simulator's on the real
sizes, and a baseline that does not fit raises :class:`~solver.errors.InfeasibleBudget`
carrying the smallest budget at which the method gives a schedule.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
from numba import njit

from ..errors import InfeasibleBudget
from .chain import Chain
from .options import base_forward_tmp
from .schedule import Checkpoint, Layer, Plan, Schedule
from .simulator import make_schedule

__all__ = [
    "BASELINE_METHODS",
    "baseline_schedule",
    "none_plan",
    "every_layer_plan",
    "sqrt_plan",
    "revolve_plan",
    "revolve_extra_forwards",
    "revolve_snapshot_counts",
    "revolve_costs",
]

BASELINE_METHODS = ("none", "every_layer", "sqrt", "revolve")

# Plans nested deeper than this are not offered by revolve: plan_to_ops walks a plan with
# nested generators, whose cost per op grows with the depth and which Python's recursion
# limit stops near 1000. Only one snapshot on chains longer than this needs such depth.
MAX_NESTING = 200


# ----------------------------------------------------------------------------- simple plans


def none_plan(length: int) -> Plan:
    """No rematerialization: every layer stores its tape."""
    return tuple(Layer(i) for i in range(length))


def every_layer_plan(length: int) -> Plan:
    """Checkpoint every layer: store each layer's input, recompute the layer in the backward."""
    return tuple(Checkpoint(i, i + 1, (Layer(i),)) for i in range(length))


def sqrt_plan(length: int) -> Plan:
    """Chen et al.'s sqrt(L) segments (arXiv:1604.06174, section 4.1).

    ``round(sqrt(L))`` segments of near-equal length; each is a ``Checkpoint`` whose body
    stores all its tapes, so the backward pass recomputes one segment at a time.
    """
    count = max(1, round(math.sqrt(length)))
    bounds = np.linspace(0, length, count + 1).round().astype(int)
    return tuple(
        Checkpoint(int(a), int(b), tuple(Layer(i) for i in range(a, b)))
        for a, b in zip(bounds[:-1], bounds[1:])
    )


# ------------------------------------------------------------------ revolve (binomial tables)


@functools.lru_cache(maxsize=16)
def _beta_table(length: int) -> np.ndarray:
    """``beta[s, r] = C(s + r, s)`` for ``s <= length + 1`` and the ``r`` that matter, capped.

    Griewank's beta(s, r) is the most steps that ``s`` snapshots reverse with ``r``
    repetitions. Row ``s`` is the running sum of row ``s - 1`` (Pascal's rule), so the table
    is built one vectorised row at a time. Columns stop at the least ``r`` with
    ``beta(2, r) >= length``: with two snapshots or more no count needs more repetitions
    (one snapshot is handled in closed form: ``r = n - 1``). Values above
    ``(length + 1) ** 2`` are capped to it; no count for ``length`` steps reads more.
    """
    columns = 1
    while (columns + 1) * (columns + 2) // 2 < length:  # beta(2, r) = C(r + 2, 2)
        columns += 1
    cap = (length + 1) ** 2
    table = np.empty((length + 2, columns + 2), dtype=np.int64)
    table[0] = 1
    for s in range(1, length + 2):
        table[s] = np.minimum(np.cumsum(table[s - 1]), cap)
    table.setflags(write=False)
    return table


def _beta(table: np.ndarray, s: int, r: int) -> int:
    return 0 if r < 0 else int(table[s, r])


def _repetitions(table: np.ndarray, steps: int, snapshots: int) -> int:
    """Griewank's repetition number: the least ``r`` with ``beta(s, r) >= steps``."""
    return int(np.searchsorted(table[snapshots], steps))


def revolve_extra_forwards(steps: int, snapshots: int) -> int:
    """Least number of extra forward steps to reverse ``steps`` steps with ``snapshots`` snapshots.

    Griewank's binomial result ("Achieving logarithmic growth of temporal and spatial
    complexity in reverse automatic differentiation", Optimization Methods and Software 1992;
    restated by Griewank & Walther, ACM TOMS 2000): with ``r`` the repetition number,
    ``beta(s, r - 1) < n <= beta(s, r)``, the minimum is ``r * n - beta(s + 1, r - 1)``,
    ``beta(s, r) = C(s + r, s)``. In this package's model it is the number of forward ops a
    revolve schedule runs beyond the ``n`` of a schedule that stores every tape. The
    snapshots include the one holding the chain's input ``x[0]``.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}.")
    if steps == 1:
        return 0
    if snapshots < 1:
        raise ValueError(f"Reversing {steps} > 1 steps needs at least one snapshot.")
    snapshots = min(snapshots, steps - 1)  # more snapshots than steps - 1 are never used
    if snapshots == 1:  # r = n - 1: every step is recomputed from x[0]
        return steps * (steps - 1) // 2
    table = _beta_table(steps)
    r = _repetitions(table, steps, snapshots)
    return r * steps - _beta(table, snapshots + 1, r - 1)


def revolve_plan(length: int, snapshots: int) -> Plan:
    """Revolve's schedule for ``length`` identical layers and ``snapshots`` snapshots, as a plan.

    Revolve advances ``m`` steps from a snapshot, places a new snapshot, reverses the last
    ``n - m`` steps with one snapshot fewer, then the first ``m`` with all of them. In a plan
    that is ``Checkpoint(i, i + m, <revolve on the first m>)`` followed by the items of
    revolve on the rest; a single step is ``Layer(i)`` (tape it, then reverse it). The
    snapshot at ``x[i]`` is the checkpoint's saved input; ``x[0]`` counts as one snapshot.
    """
    if length < 1:
        raise ValueError(f"A chain needs at least one layer, got length={length}.")
    if length > 1 and snapshots < 1:
        raise ValueError(f"Reversing {length} > 1 layers needs at least one snapshot.")
    start, steps, _, item_lo, item_hi = _revolve_tree(length, snapshots, _beta_table(length))
    plans: list[Plan] = [()] * length
    for k in range(length - 1, -1, -1):  # children (higher indices) first
        body = tuple(
            Checkpoint(int(start[t + 1]), int(start[t + 1] + steps[t + 1]), plans[t + 1])
            for t in range(item_lo[k], item_hi[k])
        )
        plans[k] = body + (Layer(int(start[k] + steps[k] - 1)),)
    return plans[0]


def revolve_snapshot_counts(length: int) -> tuple[int, ...]:
    """The snapshot counts revolve offers for ``length`` layers.

    ``1 .. length - 1`` (more snapshots give the same plan as ``length - 1``), leaving out
    plans that nest checkpoints deeper than ``MAX_NESTING``: in practice only one snapshot
    on chains longer than that (its plan is a tower ``length - 1`` deep).
    """
    return revolve_costs(Chain.homogeneous(length))[0]


# ------------------------------------------------------------- revolve costs without ops


@njit(cache=True)
def _beta_at(table: np.ndarray, s: int, r: int) -> int:
    return 0 if r < 0 else table[s, r]


@njit(cache=True)
def _revolve_tree(length, snaps, table):
    """Revolve's plan tree for ``length`` layers and ``snaps`` snapshots, as arrays.

    The nodes are revolve calls ``(start, steps, snapshots)``, each a run of checkpoint items
    then one ``Layer``; there are exactly ``length`` nodes and ``length - 1`` checkpoints.
    Listed breadth first from the root (node 0): node ``k``'s items are ``item_lo[k] ..
    item_hi[k] - 1``, and item ``t``'s body is node ``t + 1``. ``alone[k]``: node ``k``'s
    input is stored on its own (not inside the previous layer's tape).

    Revolve's split (Griewank & Walther 2000): with ``r`` the repetition number of
    ``(n, s)`` (least ``r`` with ``beta(s, r) >= n``), advancing ``m`` steps is optimal when
    ``max(beta(s, r-2), n - beta(s-1, r)) <= m <= min(beta(s, r-1), n - beta(s-1, r-1))``:
    the first ``m`` steps then need ``r - 1`` repetitions with ``s`` snapshots, the other
    ``n - m`` need ``r`` with ``s - 1``, and the counts add up to the closed form of
    :func:`revolve_extra_forwards` by Pascal's rule. We take the largest such ``m``.
    """
    start = np.zeros(length, np.int64)
    steps = np.zeros(length, np.int64)
    snapshots = np.zeros(length, np.int64)
    alone = np.zeros(length, np.bool_)
    item_lo = np.zeros(length, np.int64)
    item_hi = np.zeros(length, np.int64)
    steps[0], snapshots[0], alone[0] = length, snaps, True
    nodes = 1
    for k in range(length):
        item_lo[k] = nodes - 1
        i, n, s = start[k], steps[k], snapshots[k]
        while n > 1:
            s = min(s, n - 1)  # more snapshots than n - 1 are never used
            if s == 1:  # r = n - 1, and the rule gives m = n - 1
                m = n - 1
            else:
                r = np.searchsorted(table[s], n)
                m = max(1, min(_beta_at(table, s, r - 1), n - _beta_at(table, s - 1, r - 1),
                               n - 1))
            start[nodes], steps[nodes], snapshots[nodes] = i, m, s
            alone[nodes] = nodes - 1 > item_lo[k] or alone[k]
            nodes += 1
            i, n, s = i + m, n - m, s - 1
        item_hi[k] = nodes - 1
    return start, steps, alone, item_lo, item_hi


@njit(cache=True)
def _walk(snaps, table, x, xbar, tape, inside, ftmp, btmp, fttmp, fwd, bwd, ftape, fprefix,
          first, sparse):
    """``(time, peak, nesting)`` of revolve with ``snaps`` snapshots, from its plan tree.

    Nodes are costed children first: a node's peak above the memory it starts from, and
    its time, do not depend on that memory. The simulator's rules (solver/chain/simulator.py)
    applied to a node: a checkpoint's forward ``F_ck(a), F_none(a+1..b-1)`` peaks at
    ``max(x[a+1] + ck[a], max_k x[k] + x[k+1] + ck[k])`` above its base (``ck``: the chain's
    ``ck_tmp``, the plain forward's transient, in ``first`` and a range maximum from the
    sparse table) and leaves ``x[b]``; ``F_all``, the loss and ``B`` as listed
    there; a body run swaps ``g[b]`` for ``g[a]`` and frees ``x[a]`` if stored on its own.
    A node's last layer runs ``F_all`` while ``g[last+1]`` is held (``ftape``, the chain's
    ``fwd_tape_time``), except the root's, which the loss follows (``fwd``). Outputs outside
    the tape (``inside`` false): that ``F_all`` stores ``tape`` (the chain's ``tape_size``)
    and peaks ``fttmp`` above it (:func:`solver.chain.options.base_forward_tmp`: by default the
    output it drops and ``ftmp``); the root's stores the output on its own as well, and the
    loss frees it.
    """
    L = fwd.shape[0]
    start, steps, alone, item_lo, item_hi = _revolve_tree(L, snaps, table)
    node_peak = np.zeros(L)
    node_time = np.zeros(L)
    nesting = np.zeros(L, np.int64)
    for k in range(L - 1, -1, -1):  # children first
        mem, peak, time = 0.0, -np.inf, 0.0
        for t in range(item_lo[k], item_hi[k]):  # forward of the checkpoints
            a, b = start[t + 1], start[t + 1] + steps[t + 1]
            high = first[a]
            if b - a > 1:
                level = 0
                while (2 << level) <= b - a - 1:
                    level += 1
                high = max(high, sparse[level, a + 1], sparse[level, b - (1 << level)])
            peak = max(peak, mem + high)
            mem += x[b]
            time += fprefix[b] - fprefix[a]
        last = start[k] + steps[k] - 1
        if k == 0:  # F_all(last), the loss next
            peak = max(peak, mem + xbar[last] + ftmp[last])
        else:  # F_all(last) with g[last+1] held: the tape-only forward
            peak = max(peak, mem + tape[last] + fttmp[last])
        mem += xbar[last] if k == 0 else tape[last]
        time += fwd[last] if k == 0 else ftape[last]
        if k == 0:  # the loss: x[L] sits in tape[L-1] or on its own; it adds g[L]
            mem += x[L]
            peak = max(peak, mem)
            if not inside[last]:
                mem -= x[L]
        peak = max(peak, mem + x[last] + btmp[last])  # B(last) stores g[last], then frees
        last_alone = item_hi[k] > item_lo[k] or alone[k]
        mem += x[last] - x[last + 1] - tape[last] - (x[last] if last_alone else 0.0)
        time += bwd[last]
        for t in range(item_hi[k] - 1, item_lo[k] - 1, -1):  # the bodies, last first
            child = t + 1
            a, b = start[child], start[child] + steps[child]
            peak = max(peak, mem + node_peak[child])
            mem += x[a] - x[b] - (x[a] if alone[child] else 0.0)
            time += node_time[child]
            nesting[k] = max(nesting[k], nesting[child] + 1)
        node_peak[k], node_time[k] = peak, time
    return node_time[0], max(x[0], x[0] + node_peak[0]), nesting[0]


@njit(cache=True)
def _walk_all(table, x, xbar, tape, inside, ftmp, btmp, fttmp, fwd, bwd, ftape, fprefix,
              first, sparse):
    """``(times, peaks, nestings)`` of revolve with ``1 .. L-1`` snapshots (index ``s - 1``)."""
    count = max(1, fwd.shape[0] - 1)
    times = np.empty(count)
    peaks = np.empty(count)
    nestings = np.empty(count, np.int64)
    for s in range(1, count + 1):
        times[s - 1], peaks[s - 1], nestings[s - 1] = _walk(
            s, table, x, xbar, tape, inside, ftmp, btmp, fttmp, fwd, bwd, ftape, fprefix,
            first, sparse)
    return times, peaks, nestings


def _sparse_max_table(values: np.ndarray) -> np.ndarray:
    """Row ``j``: maxima of ``values`` over windows of ``2**j`` (padded with ``-inf``)."""
    rows = [values]
    while (2 << (len(rows) - 1)) <= values.shape[0]:
        prev, half = rows[-1], 1 << (len(rows) - 1)
        rows.append(np.maximum(prev[:-half], prev[half:]))
    table = np.full((len(rows), values.shape[0]), -np.inf)
    for j, row in enumerate(rows):
        table[j, : row.shape[0]] = row
    return table


@functools.lru_cache(maxsize=32)
def revolve_costs(chain: Chain) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """``(snapshot counts, times, peaks)`` of revolve on ``chain`` for every offered count.

    Times and peaks are those :func:`~solver.chain.simulator.simulate` gives the plans' ops (up to
    floating-point rounding), computed from the plan tree in compiled code: choosing the
    snapshot count needs every candidate's cost, and plans with few snapshots run O(L^2)
    ops. Cached per chain.
    """
    x, ftmp, ck = chain.x_size, chain.fwd_tmp, chain.ck_tmp
    # F_none(k) peaks at x[k] + x[k+1] + ck[k] above its base (k >= 1; entry 0 unused).
    inner = np.concatenate([[-np.inf], x[1:-1] + x[2:] + ck[1:]])
    times, peaks, nestings = _walk_all(
        _beta_table(chain.length), x, chain.xbar_size, chain.tape_size, chain.output_in_tape,
        ftmp, chain.bwd_tmp, base_forward_tmp(chain)[:, 0],
        chain.fwd_time,
        chain.bwd_time, chain.fwd_tape_time, np.concatenate([[0.0], np.cumsum(chain.fwd_time)]),
        x[1:] + ck,
        _sparse_max_table(inner))
    keep = np.flatnonzero(nestings <= MAX_NESTING)
    return tuple(int(s) + 1 for s in keep), times[keep], peaks[keep]


def _revolve_schedule(chain: Chain, budget: float) -> Schedule:
    counts, times, peaks = revolve_costs(chain)
    slack = 1e-9 * max(abs(budget), 1.0)  # the tree walk and the simulator round differently
    for index in np.lexsort((peaks, times)):  # fastest first, then smallest peak
        if peaks[index] > budget + slack:
            continue
        schedule = make_schedule(chain, revolve_plan(chain.length, counts[index]), "revolve")
        if schedule.peak <= budget:
            return schedule
    best = int(np.argmin(peaks))
    least = make_schedule(chain, revolve_plan(chain.length, counts[best]), "revolve").peak
    raise InfeasibleBudget(budget, least, "revolve")


# --------------------------------------------------------------------------- entry point


_PLANS: dict[str, Callable[[int], Plan]] = {
    "none": none_plan,
    "every_layer": every_layer_plan,
    "sqrt": sqrt_plan,
}


def baseline_schedule(chain: Chain, method: str, budget: float) -> Schedule:
    """The schedule of a baseline ``method`` (one of ``BASELINE_METHODS``) on ``chain``.

    Time and peak come from the simulator on the chain's real sizes. For ``"revolve"`` the
    snapshot count is the one giving the fastest schedule whose peak fits ``budget``.

    Raises:
      InfeasibleBudget: the method's peak exceeds ``budget``; ``min_budget`` is the smallest
        budget at which the method gives a schedule (for revolve: the least peak over the
        offered snapshot counts).
      ValueError: an unknown method.
    """
    if method == "revolve":
        return _revolve_schedule(chain, budget)
    if method not in _PLANS:
        raise ValueError(
            f"Unknown baseline method {method!r}; choose one of {BASELINE_METHODS}."
        )
    schedule = make_schedule(chain, _PLANS[method](chain.length), method)
    if schedule.peak > budget:
        raise InfeasibleBudget(budget, schedule.peak, method)
    return schedule
