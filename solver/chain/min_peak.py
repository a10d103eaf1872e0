"""Minimum-peak checkpoint selection on a linear chain (ALGORITHMS.md section 3).

Problem (Hong, Tsai, Wang, Liu, Wu, arXiv:2502.12499, the "checkpoint selection" problem):
``sizes[0..n-1]`` are the intermediate tensors of a chain (its input and output are not
counted). Keep any subset ``C``; the *segments* are the maximal runs of consecutive indices
not in ``C``. The peak of ``C`` is

    peak(C) = sum_{i in C} sizes[i] + max_segment sum_{j in segment} sizes[j]   (0 if none),

the memory of the kept tensors plus the largest segment rebuilt during the backward pass.
:func:`min_peak_chain` returns a ``C`` of least peak. Hong et al. give an O(n^3) dynamic
program whose recurrences we could not read; both methods here are our own exact
algorithms, built on one reformulation.

Notation. ``P[k] = sizes[0] + ... + sizes[k-1]`` (``P[0] = 0``); the segment of indices
``s .. e-1`` has sum ``P[e] - P[s]``. The *candidate bounds* are
``Sigma = {P[e] - P[s] : 0 <= s <= e <= n}``, ``N = |Sigma| <= (n+1)(n+2)/2``. For a bound
``S`` let ``cost(S)`` be the least kept sum among subsets whose segments all have sum
``<= S``.

Lemma 1 (reformulation). ``min_C peak(C) = min_{S in Sigma} S + cost(S)``.
  Proof. (<=) the subset attaining ``cost(S)`` has peak ``<= cost(S) + S``. (>=) for an
  optimal ``C*`` let ``S*`` be its largest segment sum (``0 = P[0] - P[0]`` if no segment):
  ``S* in Sigma`` and ``C*`` is feasible for ``S*``, so ``cost(S*) <= peak(C*) - S*``. []

Lemma 2 (``cost(S)`` in O(n)). Number the nodes ``0 .. n+1``: node 0 is a virtual kept
start, node ``k`` (1..n) is tensor ``k-1`` with weight ``w_k = sizes[k-1]``, node ``n+1`` a
virtual kept end of weight 0. Two consecutive kept nodes ``j < k`` enclose the segment
``j .. k-2`` of sum ``P[k-1] - P[j]``. Hence ``cost(S) = h[n+1]`` with

    h[0] = 0,   h[k] = w_k + min { h[j] : 0 <= j < k,  P[k-1] - P[j] <= S }.

Sizes are non-negative, so ``P`` is non-decreasing: the admissible ``j`` form a contiguous
range ``[lo_k, k-1]`` (never empty, ``j = k-1`` gives an empty segment) whose left end
``lo_k`` is non-decreasing in ``k``. A sliding-window minimum with a monotone deque
therefore computes every ``h[k]`` in amortised O(1): O(n) time and memory per bound. []

All comparisons use differences of the same prefix sums, so the segment that defines a
candidate ``S = P[e] - P[s]`` is admitted at bound ``S`` exactly (no rounding mismatch).
With floating-point sizes the sums themselves carry the usual rounding (exact for integer
sizes below 2**53, e.g. byte counts).

``method="cubic"``: evaluate ``cost`` at every candidate (Lemma 1 + Lemma 2):
O(N n) = O(n^3) time, O(n^2) memory for the candidate list.

``method="fast"``: best-first branch and bound over the candidates; see
:func:`_branch_and_bound` for the algorithm, its proof and its complexity.
"""

from __future__ import annotations

import heapq
import math
from typing import Literal, Sequence

import numpy as np
from numba import njit

from ..checkpoint_set import CheckpointSet
from ..errors import float_array

__all__ = ["min_peak_chain"]

Method = Literal["cubic", "fast"]


@njit(cache=True)
def _bounded_cost(sizes: np.ndarray, prefix: np.ndarray, bound: float, parent: np.ndarray) -> float:
    """``cost(bound)`` by Lemma 2's sliding-window DP; fills ``parent[k]`` (chosen ``j``)."""
    n = sizes.shape[0]
    h = np.empty(n + 2)
    deque = np.empty(n + 2, np.int64)
    head = 0
    tail = 1
    h[0] = 0.0
    deque[0] = 0
    for k in range(1, n + 2):
        if k >= 2:  # node k-1 becomes admissible (empty segment); ties keep the older node,
            # so that among equal costs the set with longer segments (fewer checkpoints) wins
            value = h[k - 1]
            while tail > head and h[deque[tail - 1]] > value:
                tail -= 1
            deque[tail] = k - 1
            tail += 1
        while prefix[k - 1] - prefix[deque[head]] > bound:
            head += 1
        best = deque[head]
        parent[k] = best
        h[k] = (sizes[k - 1] if k <= n else 0.0) + h[best]
    return h[n + 1]


@njit(cache=True)
def _all_costs(sizes: np.ndarray, prefix: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``cost(S)`` for every ``S`` in ``bounds`` (the cubic method's inner loop)."""
    parent = np.empty(sizes.shape[0] + 2, np.int64)
    out = np.empty(bounds.shape[0])
    for t in range(bounds.shape[0]):
        out[t] = _bounded_cost(sizes, prefix, bounds[t], parent)
    return out


@njit(cache=True)
def _candidates_between(prefix: np.ndarray, low: float, high: float, rank: int) -> tuple[int, float, float]:
    """Candidates ``S = P[e] - P[s]`` (``s <= e``) with ``low < S <= high``, in one O(n) pass.

    Returns ``(count, smallest, chosen)``: how many pairs ``(s, e)`` lie in the range, the
    smallest such value, and the value of the ``rank``-th pair in row-major order (``rank``
    in ``[0, count)``; ignored when negative). For each ``s`` the admissible ``e`` form a
    contiguous range whose ends only move right as ``s`` grows (two pointers).
    """
    size = prefix.shape[0]
    first = 0
    last = 0
    count = 0
    smallest = np.inf
    chosen = np.nan
    for s in range(size):
        if first < s:
            first = s
        while first < size and prefix[first] - prefix[s] <= low:
            first += 1
        if last < first:
            last = first
        while last < size and prefix[last] - prefix[s] <= high:
            last += 1
        here = last - first
        if here > 0:
            value = prefix[first] - prefix[s]
            if value < smallest:
                smallest = value
            if count <= rank < count + here:
                chosen = prefix[first + rank - count] - prefix[s]
        count += here
    return count, smallest, chosen


def _branch_and_bound(sizes: np.ndarray, prefix: np.ndarray, seed: int = 0) -> tuple[float, int]:
    """The bound ``S`` minimising ``S + cost(S)`` (Lemma 1), by best-first branch and bound.

    Returns ``(S, E)``: the bound and the number of evaluations of ``cost`` it took.

    Algorithm. Evaluate ``cost`` at ``S = 0`` and ``S = P[n]`` (keep nothing, cost 0); keep
    ``best = min S + cost(S)`` over evaluated bounds. A node is a half-open range
    ``(a, b]`` of candidate bounds whose ends are evaluated, keyed by a lower bound on
    ``lb(a, b) = a+ + cost(b)``, where ``a+`` is the smallest candidate in ``(a, b)``. Pop
    the node of least key; stop when it is ``>= best``. Drop the node if
    ``cost(a) == cost(b)``, if ``(a, b)`` holds no candidate, or if ``lb >= best``
    (computed exactly now); push it back keyed by ``lb`` if its key was smaller (a right
    child ``(m, b]`` is pushed with the key ``m + cost(b)``). Otherwise pick a pivot ``m``, a candidate of ``(a, b)`` drawn
    uniformly among the pairs ``(s, e)`` that produce one (seeded, so deterministic),
    evaluate ``cost(m)``, update ``best`` and push ``(a, m]`` and ``(m, b]``.

    Lemma 3 (pruning is exact). For a candidate ``S`` in ``(a, b]``: ``cost`` is
    non-increasing, so ``S + cost(S) >= a+ + cost(b) = lb``. If ``cost(a) == cost(b)`` then
    ``cost(S) = cost(a)`` and ``S + cost(S) > a + cost(a)``, already counted in ``best``.
    Every candidate is thus evaluated or lies in a dropped node whose bound was ``>= best``
    at the time (and ``best`` only decreases), so the returned bound attains the minimum
    of Lemma 1. The node ``(a, b]`` with no candidate in ``(a, b)`` has only ``b`` left,
    which is evaluated: it is dropped too. []

    Complexity. A node costs O(n): two or three passes of :func:`_candidates_between` and
    one DP (Lemma 2). Every pivot is a distinct candidate value (the open ranges of the
    nodes are disjoint and each pivot lies strictly inside its node's), so the number ``E``
    of evaluations satisfies ``E <= N``: worst case O(n N) = O(n^3) time, the same order as
    ``cubic``; memory O(n + E), against ``cubic``'s O(n^2).

    Instance bound (Theorem 4). Let ``v*`` be the optimum. Call a set ``Z`` of candidates a
    *certificate* if for every two consecutive members ``z < z'`` of ``Z + {0, P[n]}``
    either ``cost(z) == cost(z')``, or no candidate lies strictly between them, or
    ``z+ + cost(z') > v*`` (``z+`` the least candidate above ``z``); let ``k`` be the size
    of the smallest certificate. Then ``E[E] <= 2 + k O(log n)``, and the expected time is
    O(n k log n).
      Proof. (i) A node is keyed by a lower bound of its ``lb`` (the exact one for a left
      child, ``m + cost(b)`` for a right child ``(m, b]``); a node popped with a weaker key
      is pushed back with its exact ``lb``, so a node is split only when popped with key
      ``lb``. A node ``(a, b]`` that contains the optimal candidate ``S*`` has ``lb <= S* +
      cost(S*) = v*``; such a node is in the heap until ``S*`` is evaluated, so every node
      split before that has ``lb <= v*``, and every node split after it has ``lb < best =
      v*``. (ii) A split node ``(a, b]`` has ``cost(a) > cost(b)``, a candidate inside
      and ``lb <= v*``; if no member of ``Z`` lay strictly inside it, it would lie between
      two consecutive members ``z <= a < b <= z'`` and by monotonicity ``cost(a) ==
      cost(b)`` where ``cost(z) == cost(z')``, or ``lb >= z+ + cost(z') > v*``: so it holds
      a member of ``Z``. (iii) The nodes containing a fixed candidate form one root-to-leaf
      path of the recursion, of expected length O(log N) with uniform random pivots (the
      randomised-quickselect argument: each split leaves the candidate in a part with at
      most 3/4 of the node's pairs with probability >= 1/2, and there are at most
      ``(n+1)(n+2)/2`` pairs). Summing (ii) over ``Z`` bounds the split nodes. []
    Conversely, an algorithm that learns ``cost`` only by evaluating it and uses only its
    monotonicity cannot stop before its evaluations form a certificate up to ties (a gap
    ``z+ + cost(z') < v*`` leaves a non-increasing ``cost``, equal to ``cost(z')`` on
    ``(z, z']`` and consistent with every evaluation, under which ``z+`` beats ``v*``), so
    it needs about ``k`` evaluations: the search is within O(log n) evaluations of every
    such algorithm on every input. (Theorem 4 and this lower bound are from a helper's
    analysis in session 6; the weak-key re-push was added to make (i) hold.)

    Lower bound (Lemma 5). On :func:`tied_blocks` ``(m)`` (``n = 4m - 1`` sizes: blocks
    ``[T0, d, (j-1) d]`` for ``j = 1..m`` separated by zeros, ``T0 = 10 m d``, ``m >= 2``)
    every certificate has at least ``m = (n+1)/4`` members. So every algorithm that learns
    ``cost`` only by evaluating it (one O(n) DP each) needs ``Omega(n)`` evaluations,
    ``Omega(n^2)`` time, on these inputs: no method of that kind has a worst case below
    ``n^2``, and ours is within an ``O(log n)`` factor of the best one on every input.
      Proof. For ``S < T0`` every ``T0`` is kept: ``S + cost(S) >= m T0 > T0 + m d``. For
      ``S >= T0`` keep the zeros (free), so the blocks are independent. Block ``j`` can stay
      whole iff ``T0 + j d <= S``. Otherwise it keeps a value. Keeping its ``d`` is
      cheapest: ``T0`` costs more, ``(j-1) d >= d`` for ``j >= 2``, and for ``j = 1``
      keeping the ``0`` leaves the run ``T0 + d > S``. Keeping ``d`` leaves runs
      ``T0, (j-1) d <= S``. So ``cost(S) = d #{j : T0 + j d > S}`` and ``S + cost(S) >= v* =
      T0 + m d``, with equality exactly at the candidates ``x_i = T0 + i d``, ``i = 0..m``
      (the run ``T0``, and the run ``T0, d, (i-1) d`` of block ``i``). Now suppose
      consecutive members ``z < z'`` of a certificate (with ``0`` and ``P[n]``) had ``z <
      x_i`` and ``z' >= x_{i+1}``. Then ``cost(z) >= cost(x_i) > cost(x_{i+1}) >=
      cost(z')``, and ``x_i`` lies strictly between them. Also ``z+ + cost(z') <= x_i +
      cost(x_{i+1}) = v* - d < v*``. So the pair passes none of the three tests, and each
      of the ``m`` ranges ``[x_i, x_{i+1})`` holds a member. [] (A helper found the family
      in session 8 by looking for tied optima; the certificate argument is ours.) Measured
      with ``d = 1`` (``benchmarks/linear_speed.py``, n padded with one zero): the search
      makes 265 and 2520 evaluations at ``n = 1000`` and ``10 000``, about ``m``, taking
      0.31 s at ``n = 10 000``. With ties broken by ``1e-9`` noise it makes 3749
      evaluations (0.44 s). This is the most evaluations of any family we know.

    What this does *not* prove: a worst case below O(n^3). The gap between ``Omega(n^2)``
    (Lemma 5, for evaluation-based methods) and ``O(n^3)`` is open. ``k`` is at most the
    number ``K`` of breakpoints of ``cost``, which can be of order ``n^2`` (a hill-climbed
    instance of 16 sizes has 120 breakpoints), and we know no bound on ``k`` below ``N``:
    hill-climbing that maximises ``k`` reached 16, 20, 30, 29 and 29 at n = 10, 20, 30, 40
    and 50 on real sizes, and 17, 22, 29, 50 at n = 10, 20, 40, 80 on integers 0..1000
    (session 8), against ``m = (n+1)/4`` on Lemma 5's family. Routes to a sub-cubic worst case that we checked and that fail: (i) sweeping
    the breakpoints of ``cost`` (one DP each) is O(n K), cubic for such inputs, and
    maintaining the DP under the O(n^2) window expansions changes ``h[k]`` once per
    breakpoint of each prefix, about ``n^2.5`` times on mirrored geometric sizes; (ii) a
    DP over nodes keeping the Pareto front of (largest segment, kept sum) has fronts of 36
    points at n = 12 on hill-climbed inputs; (iii) fixing the largest segment ``(a, b)``,
    ``best(a, b) = prefix cost + S + suffix cost`` has a row minimum that is not monotone
    in ``a`` (29 of 300 random small inputs), so SMAWK does not apply; (iv) the
    relaxation ``min_T T + min_C [sum_C s + sum_segments (sigma - T)^+]`` (exact, and the
    strongest relaxation that is separable over segments) is not unimodal in ``T`` and
    its optimal sets change about ``0.2 n^2`` times on mirrored geometric sizes; (v) at a
    fixed bound, the least kept weight ``d(j, k)`` between kept nodes ``j < k`` is not a
    Monge matrix (unit sizes, runs of one: ``d(0,7) + d(1,8) = 8 > 7 = d(0,8) + d(1,7)``),
    so a divide and conquer over ``S`` that contracts the edges present throughout a range
    cannot apply SMAWK to it as it stands; (vi) the optimal sets along the greedy
    certificate chain need not be nested, so "each step drops a kept tensor" does not bound
    ``k`` by ``n``: on a hill-climbed instance of 10 sizes, 8 of the 9 consecutive pairs of
    (unique) optimal sets are not nested. What
    pruning gives in practice is measured by ``benchmarks/linear_speed.py``: at ``n = 10
    000`` the search evaluates 10 to 200 bounds (each an O(n) pass) for random, equal,
    near-equal, increasing, decreasing, sawtooth, heavy-tailed and 0/1 sizes, in under 0.1
    s; random hill-climbing over inputs of 50 and 200 sizes, maximising ``E``, found no
    input with ``E`` above 1.7 n.
    """
    rng = np.random.default_rng(seed)
    parent = np.empty(sizes.shape[0] + 2, np.int64)
    low, high = 0.0, float(prefix[-1])
    cost_low = _bounded_cost(sizes, prefix, low, parent)
    best_bound, best = (low, low + cost_low) if low + cost_low <= high else (high, high)
    heap = [(low, low, cost_low, high, 0.0)]
    evaluations = 1  # cost(0); cost(P[n]) = 0 needs no DP
    while heap:
        key, a, cost_a, b, cost_b = heapq.heappop(heap)
        if key >= best:
            break
        if cost_a == cost_b:
            continue
        below_b = float(np.nextafter(b, -np.inf))  # candidates strictly inside (a, b)
        count, smallest, _ = _candidates_between(prefix, a, below_b, -1)
        if count == 0 or smallest + cost_b >= best:
            continue
        if smallest + cost_b > key:  # a right child's weak key: wait for the exact one
            heapq.heappush(heap, (smallest + cost_b, a, cost_a, b, cost_b))
            continue
        _, _, pivot = _candidates_between(prefix, a, below_b, int(rng.integers(count)))
        cost_pivot = _bounded_cost(sizes, prefix, pivot, parent)
        evaluations += 1
        if pivot + cost_pivot < best:
            best_bound, best = pivot, pivot + cost_pivot
        heapq.heappush(heap, (smallest + cost_pivot, a, cost_a, pivot, cost_pivot))
        heapq.heappush(heap, (pivot + cost_b, pivot, cost_pivot, b, cost_b))
    return best_bound, evaluations


def tied_blocks(m: int, d: float = 1.0) -> np.ndarray:
    """Lemma 5's sizes: blocks ``[T0, d, (j-1) d]``, ``j = 1..m``, between zeros, ``T0 = 10 m d``.

    ``4m - 1`` sizes whose least peak ``T0 + m d`` is attained at ``m + 1`` largest-segment
    bounds, each needing its own evaluation: the hardest input we know for ``"fast"``
    (see :func:`_branch_and_bound`). Used by the tests and ``benchmarks/linear_speed.py``.
    """
    if m < 2:
        raise ValueError(f"tied_blocks: m must be at least 2, got {m}.")
    top = 10.0 * m * d
    blocks = np.array([[top, d, (j - 1) * d, 0.0] for j in range(1, m + 1)])
    return blocks.ravel()[:-1]


def _cubic_bound(sizes: np.ndarray, prefix: np.ndarray) -> float:
    """The bound minimising ``S + cost(S)`` over every candidate (Lemma 1): O(n^3)."""
    rows, cols = np.triu_indices(prefix.shape[0])
    bounds = np.unique(prefix[cols] - prefix[rows])
    totals = bounds + _all_costs(sizes, prefix, bounds)
    return float(bounds[int(np.argmin(totals))])


def _validate(sizes: Sequence[float] | np.ndarray) -> np.ndarray:
    array = float_array(sizes, "min_peak_chain: sizes")
    if array.ndim != 1:
        raise ValueError(
            f"min_peak_chain: sizes must be a one-dimensional sequence (one size per "
            f"intermediate tensor), got shape {array.shape}."
        )
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"min_peak_chain: sizes[{i}] = {float(array[i])!r}; sizes must be finite and non-negative."
        )
    with np.errstate(over="ignore"):
        total = array.sum()
    if not np.isfinite(total):
        raise ValueError(
            "min_peak_chain: the sizes sum to infinity in float64; express them in larger "
            "units (e.g. MiB instead of bytes)."
        )
    return np.ascontiguousarray(array)


def _checkpoint_set(sizes: np.ndarray, kept: np.ndarray) -> CheckpointSet:
    """Segments and peak of a kept set, summed directly (not from prefix differences)."""
    n = sizes.shape[0]
    mask = np.zeros(n, dtype=bool)
    mask[kept] = True
    free = np.flatnonzero(~mask)
    breaks = np.flatnonzero(np.diff(free) != 1) + 1
    runs = np.split(free, breaks) if free.size else []
    segments = tuple(tuple(int(i) for i in run) for run in runs)
    largest = max((math.fsum(sizes[run]) for run in runs), default=0.0)
    peak = math.fsum(sizes[kept]) + largest
    return CheckpointSet(
        checkpoints=tuple(int(i) for i in kept), segments=segments, peak=float(peak)
    )


def min_peak_chain(sizes: Sequence[float] | np.ndarray, *, method: Method = "fast") -> CheckpointSet:
    """The subset of tensors to keep that minimises the peak (Hong et al.'s problem).

    Args:
      sizes: the ``n`` intermediate tensor sizes of a chain, neither its input nor its
        output. Any non-negative finite numbers (bytes in practice).
      method: ``"fast"`` (branch and bound over the largest-segment bound, exact; see
        :func:`_branch_and_bound`) or ``"cubic"`` (exhaustive over the O(n^2) bounds, O(n^3)).
        Both return a set of least peak; they may differ in which one when there are ties.

    Returns:
      A :class:`CheckpointSet`: ``checkpoints`` the kept indices (sorted), ``segments`` the
      maximal runs of consecutive non-kept indices, ``peak`` = sum of kept sizes + the
      largest segment sum (0 for ``n = 0``).

    Raises:
      ValueError: ``sizes`` is not 1-d, has a negative or non-finite entry (named by
        index), or ``method`` is unknown.
    """
    array = _validate(sizes)
    if method not in ("cubic", "fast"):
        raise ValueError(f"min_peak_chain: method must be 'cubic' or 'fast', got {method!r}.")
    n = array.shape[0]
    if n == 0:
        return CheckpointSet(checkpoints=(), segments=(), peak=0.0)
    prefix = np.concatenate(([0.0], np.cumsum(array)))
    bound = _cubic_bound(array, prefix) if method == "cubic" else _branch_and_bound(array, prefix)[0]
    parent = np.empty(n + 2, np.int64)
    _bounded_cost(array, prefix, bound, parent)
    kept = []
    node = int(parent[n + 1])
    while node > 0:
        kept.append(node - 1)
        node = int(parent[node])
    return _checkpoint_set(array, np.array(kept[::-1], dtype=np.int64))
