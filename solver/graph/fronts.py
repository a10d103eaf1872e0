"""Pareto fronts of partial checkpoint sets, the currency of the division-tree DP (solver.graph.search).

A :class:`Front` holds candidate checkpoint sets of one independent segment as parallel
numpy columns:

* ``a``, ``b``: bytes of the segment's recomputed vertices that end up in the segment of
  its first / last endpoint (the "open" weights, still growing outside the segment);
* ``size``: bytes of its checkpoints; ``rc``: compute cost of its recomputed vertices;
* ``top``: bytes of its largest closed segment (one that no longer grows). It takes no part
  in dominance (ties aside): it is carried along so that a complete set's memory
  ``size + top`` is known without rebuilding its segments (the budgeted search checks whole
  fronts at once);
* ``mask``: the checkpoint set itself, a Python ``int`` bitmask over vertex ids (object
  column), so that no back-pointers are needed to rebuild the answer.

:func:`prune` keeps the candidates that fit the limits and that no other candidate beats on
every column that matters (see there). Candidate groups (:class:`Candidates`) are built by
pairing two fronts and carry a lazy mask builder, so masks are only OR-ed for survivors.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numba
import numpy as np

__all__ = ["Front", "Candidates", "Pairs", "EMPTY", "single", "pairs", "prune", "nondominated"]


@dataclasses.dataclass(frozen=True, eq=False)
class Front:
    """Candidate checkpoint sets of one segment (columns described in the module docstring)."""

    a: np.ndarray
    b: np.ndarray
    size: np.ndarray
    rc: np.ndarray
    top: np.ndarray
    mask: np.ndarray

    def __len__(self) -> int:
        return len(self.size)

    def take(self, idx: np.ndarray) -> "Front":
        """The candidates at ``idx``."""
        if len(idx) == len(self.size):
            return self
        return Front(self.a[idx], self.b[idx], self.size[idx], self.rc[idx], self.top[idx], self.mask[idx])


def _object_array(values: Sequence[int]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


EMPTY = Front(*(np.zeros(0) for _ in range(5)), _object_array([]))


def single(a: float = 0.0, b: float = 0.0, size: float = 0.0, rc: float = 0.0, top: float = 0.0,
           mask: int = 0) -> Front:
    """A front with one candidate."""
    return Front(np.array([a]), np.array([b]), np.array([size]), np.array([rc]), np.array([top]),
                 _object_array([mask]))


@dataclasses.dataclass(frozen=True, eq=False)
class Candidates:
    """Unpruned candidates; ``masks(indices)`` builds the bitmasks of the chosen ones."""

    a: np.ndarray
    b: np.ndarray
    size: np.ndarray
    rc: np.ndarray
    top: np.ndarray
    masks: Callable[[np.ndarray], np.ndarray]

    @classmethod
    def of(cls, front: Front, *, a=None, b=None, size_add: float = 0.0, rc_add: float = 0.0,
           bit: int = 0) -> "Candidates":
        """The candidates of ``front`` with shifted columns (``a``/``b`` replace if given)."""
        mask = front.mask
        return cls(
            front.a if a is None else a,
            front.b if b is None else b,
            front.size + size_add,
            front.rc + rc_add,
            front.top,
            (lambda k: mask[k] | bit) if bit else (lambda k: mask[k]),
        )


CHUNK = 1_000_000  # candidates materialised at once when pairing two fronts


@dataclasses.dataclass(frozen=True, eq=False)
class Pairs:
    """Every pair of candidates of two fronts, built lazily in chunks (see :func:`pairs`)."""

    f: Front
    g: Front
    combine: Callable
    size_add: float
    rc_add: float
    bit: int

    def chunks(self, rows: int = CHUNK):
        """Yield :class:`Candidates` for blocks of ``f``'s rows paired with all of ``g``."""
        f, g = self.f, self.g
        step = max(1, rows // max(len(g), 1))
        for start in range(0, len(f), step):
            stop = min(len(f), start + step)
            i = np.repeat(np.arange(start, stop), len(g))
            j = np.tile(np.arange(len(g)), stop - start)
            a, b, ok, formed = self.combine(i, j)
            top = np.maximum(f.top[i], g.top[j])
            if formed is not None:
                top = np.maximum(top, formed)
            if ok is not None:
                i, j, a, b, top = i[ok], j[ok], a[ok], b[ok], top[ok]
                if len(i) == 0:
                    continue
            yield Candidates(a, b, f.size[i] + g.size[j] + self.size_add,
                             f.rc[i] + g.rc[j] + self.rc_add, top, _mask_builder(f, g, i, j, self.bit))


def _mask_builder(f: Front, g: Front, i: np.ndarray, j: np.ndarray, bit: int):
    fm, gm = f.mask, g.mask

    def masks(k: np.ndarray) -> np.ndarray:
        out = fm[i[k]] | gm[j[k]]
        return out | bit if bit else out

    return masks


def pairs(
    f: Front,
    g: Front,
    combine: Callable[[np.ndarray, np.ndarray], tuple],
    *,
    size_add: float = 0.0,
    rc_add: float = 0.0,
    bit: int = 0,
) -> Pairs | None:
    """Every pair ``(i, j)`` of candidates of ``f`` and ``g``, joined (lazily).

    ``combine(i, j)`` returns the new ``a`` and ``b`` columns, an optional boolean filter
    (e.g. "the segment formed in the middle fits the limit") and the optional weights of a
    segment closed by the pairing (it updates ``top``). Sizes and recompute add up,
    plus ``size_add`` / ``rc_add``; masks are OR-ed, plus ``bit``. :func:`prune` builds the
    pairs in chunks of about ``CHUNK`` and prunes as it goes, so memory stays bounded.
    """
    if len(f) == 0 or len(g) == 0:
        return None
    return Pairs(f, g, combine, size_add, rc_add, bit)


def nondominated(columns: Sequence[np.ndarray], tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Indices of the rows no other row beats or equals on every column.

    Among rows equal on every column, the one with the least ``tiebreak`` is kept.
    """
    k = len(columns[0])
    if k <= 1:
        return np.arange(k)
    keys = list(columns) + ([tiebreak] if tiebreak is not None else [])
    order = np.lexsort(keys[::-1])
    d = len(columns)
    if d == 1:
        return order[:1]
    if d == 2:
        second = columns[1][order]
        running = np.minimum.accumulate(second)
        previous = np.concatenate(([np.inf], running[:-1]))
        return order[second < previous]
    if d == 3:
        ranks = np.unique(columns[1][order], return_inverse=True)[1].astype(np.int64)
        return order[_sweep3(ranks.reshape(-1), columns[2][order])]
    return order[_sweep(np.stack([c[order] for c in columns], axis=1))]


@numba.njit(cache=True)
def _sweep3(rank1: np.ndarray, x2: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Three columns, rows sorted lexicographically: row ``r`` is dominated iff an earlier
    kept row has column 1 ``<=`` and column 2 ``<=`` (column 0 is ``<=`` by the order).
    A Fenwick tree over the ranks of column 1 keeps prefix minima of column 2: O(k log k)."""
    k = rank1.shape[0]
    size = int(rank1.max()) + 1 if k else 0
    tree = np.full(size + 1, np.inf)
    keep = np.zeros(k, dtype=np.bool_)
    for r in range(k):
        i = rank1[r] + 1
        best = np.inf
        while i > 0:
            if tree[i] < best:
                best = tree[i]
            i -= i & (-i)
        if best <= x2[r]:
            continue
        keep[r] = True
        i = rank1[r] + 1
        while i <= size:
            if x2[r] < tree[i]:
                tree[i] = x2[r]
            i += i & (-i)
    return keep


@numba.njit(cache=True)
def _sweep(x: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Rows sorted lexicographically: a dominating row always comes first, so row ``r`` is
    dropped when some earlier *kept* row is ``<=`` on every column (dominance is
    transitive). ``O(rows * front)``."""
    k, d = x.shape
    keep = np.zeros(k, dtype=np.bool_)
    front = np.empty(k, dtype=np.int64)
    n = 0
    for r in range(k):
        dominated = False
        for t in range(n):
            j = front[t]
            le = True
            for c in range(d):
                if x[j, c] > x[r, c]:
                    le = False
                    break
            if le:
                dominated = True
                break
        if not dominated:
            keep[r] = True
            front[n] = r
            n += 1
    return keep


def prune(
    groups: Sequence[Candidates | Front | Pairs | None],
    columns: str,
    *,
    seg_limit: float,
    size_limit: float,
    with_rc: bool,
    record: Callable[[str, np.ndarray, np.ndarray], None] | None = None,
    rc_limit: float = np.inf,
    tick: Callable[[int], None] | None = None,
    memory_limit: float = np.inf,
    bound: Callable[..., np.ndarray] | None = None,
) -> Front:
    """Merge candidate groups, drop those over the limits, keep the Pareto-optimal ones.

    Args:
      groups: candidate groups (``None`` entries are skipped).
      columns: which open weights matter: ``""``, ``"a"``, ``"b"`` or ``"ab"``.
      seg_limit: every open weight must be ``<= seg_limit`` (it only grows later).
      size_limit: checkpoint bytes must be ``<= size_limit``.
      with_rc: compare on recompute too (budget mode: the fronts are (weights, size, rc)
        Pareto fronts, ties broken by the least ``top``); otherwise recompute only breaks
        ties.
      record: called as ``record(kind, largest_accepted, least_rejected)`` for the
        comparisons against the limits (``kind`` is ``"seg"``, ``"size"`` or ``"rc"``;
        ``-inf`` / ``inf`` when no value was accepted / rejected), so that callers can tell
        for which limits the result stays the same.
      rc_limit: recompute must be ``< rc_limit`` (an incumbent's; recompute only grows).
      tick: called as ``tick(rows)`` after each batch of ``rows`` candidates is pruned
        (at least once per call, so that callers can count the work done and enforce a
        limit by raising).
      memory_limit: ``size + max(a, b) <= memory_limit`` is required (the open weights end
        up in segments at least that large). The caller keeps it fixed between calls that
        share a cache: it is not passed to ``record``.
      bound: ``bound(a, b, size, rc)`` says which candidates may still be completed into a
        set under some limit (:mod:`solver.graph.bounds`); it must be monotone (it never keeps
        a candidate that another one it drops dominates). Applied last.
    """
    kwargs = dict(columns=columns, seg_limit=seg_limit, size_limit=size_limit, with_rc=with_rc,
                  record=record, rc_limit=rc_limit, memory_limit=memory_limit, bound=bound)
    pending: list = []
    rows = 0
    for group in groups:
        if group is None:
            continue
        parts = group.chunks() if isinstance(group, Pairs) else (group,)
        for part in parts:
            pending.append(part)
            rows += len(part.size)
            if rows > CHUNK:
                pending = [_prune_once(pending, **kwargs)]
                if tick is not None:
                    tick(rows)
                rows = len(pending[0])
    if tick is not None:
        tick(rows)
    return _prune_once(pending, **kwargs)


@numba.njit(cache=True)
def _within(a: np.ndarray, b: np.ndarray, size: np.ndarray, rc: np.ndarray, seg_limit: float,
            size_limit: float, rc_limit: float, memory_limit: float,
            extremes: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Indices of the rows within the limits of :func:`prune` (one pass). Writes into
    ``extremes`` the largest accepted and least rejected value of each comparison (bytes
    against ``size_limit``; ``a`` and ``b`` against ``seg_limit``; ``rc`` against
    ``rc_limit``), where ``-inf`` / ``inf`` mean none."""
    out = np.empty(len(size), dtype=np.int64)
    count = 0
    for k in range(len(size)):
        good = True
        for slot, value, fits in ((0, size[k], size[k] <= size_limit), (2, a[k], a[k] <= seg_limit),
                                  (2, b[k], b[k] <= seg_limit), (4, rc[k], rc[k] < rc_limit)):
            if fits:
                if value > extremes[slot]:
                    extremes[slot] = value
            else:
                good = False
                if value < extremes[slot + 1]:
                    extremes[slot + 1] = value
        if good and memory_limit < np.inf and size[k] + max(a[k], b[k]) > memory_limit:
            good = False
        if good:
            out[count] = k
            count += 1
    return out[:count]


def _prune_once(groups, *, columns, seg_limit, size_limit, with_rc, record, rc_limit, memory_limit,
                bound) -> Front:
    parts = [g for g in groups if g is not None and len(g.size)]
    if not parts:
        return EMPTY
    if len(parts) == 1:
        a, b, size, rc, top = parts[0].a, parts[0].b, parts[0].size, parts[0].rc, parts[0].top
    else:
        a = np.concatenate([p.a for p in parts])
        b = np.concatenate([p.b for p in parts])
        size = np.concatenate([p.size for p in parts])
        rc = np.concatenate([p.rc for p in parts])
        top = np.concatenate([p.top for p in parts])
    extremes = np.array([-np.inf, np.inf] * 3)
    idx = _within(a, b, size, rc, float(seg_limit), float(size_limit), float(rc_limit),
                  float(memory_limit), extremes)
    if record is not None:
        record("size", extremes[0], extremes[1])
        record("seg", extremes[2], extremes[3])
        if rc_limit < np.inf:
            record("rc", extremes[4], extremes[5])
    if bound is not None and len(idx):
        idx = idx[bound(a[idx], b[idx], size[idx], rc[idx])]
    if len(idx) == 0:
        return EMPTY
    cols = [x[idx] for name, x in (("a", a), ("b", b)) if name in columns]
    cols.append(size[idx])
    if with_rc:
        cols.append(rc[idx])
    idx = idx[nondominated(cols, top[idx] if with_rc else rc[idx])]
    if len(parts) == 1:
        p = parts[0]
        mask = p.mask[idx] if isinstance(p, Front) else p.masks(idx)
    else:
        mask = np.empty(len(idx), dtype=object)
        starts = np.cumsum([0] + [len(p.size) for p in parts])  # part n: rows starts[n]:starts[n+1]
        group = np.searchsorted(starts, idx, side="right") - 1
        local = idx - starts[group]
        for n, p in enumerate(parts):
            sel = np.flatnonzero(group == n)
            if len(sel):
                mask[sel] = p.mask[local[sel]] if isinstance(p, Front) else p.masks(local[sel])
    return Front(a[idx], b[idx], size[idx], rc[idx], top[idx], mask)
