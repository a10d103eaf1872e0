"""Lagrangian lower bounds on the recompute the rest of a graph must add (budgeted search).

The budgeted search of :mod:`solver.graph.search` asks, per max-term interval, for the least
recompute of a checkpoint set whose segments fit ``seg_limit`` and whose checkpoint bytes fit
``L = size_limit``, and only cares about sets under ``rc_limit`` (the best set found so far).
Along the top-level linear division (:func:`solver.graph.dp.evaluate`) a partial set ``X``
covers a prefix of the graph; every completion ``Y`` covers the rest ``R`` and has
``size(Y) <= L - size(X)``. For every multiplier ``lam >= 0``:

    rc(Y) >= h_R(lam) - lam * size(Y) >= h_R(lam) - lam * (L - size(X)),
    h_R(lam) = min over admissible Y of rc(Y) + lam * size(Y)

(Lagrangian relaxation of the size limit). ``h_R`` is bounded below by a sum over the pieces
of ``R`` (the sub-segments and the vertices between them): the least of
``rc + lam * size`` over each piece's front, and ``min(cost, lam * size)`` for a vertex. The
coupling between pieces (segments across a shared vertex, the common size limit) only
raises the true minimum, so the sum stays a lower bound. Hence ``X`` can be dropped when

    rc(X) + max over lam of [h_R(lam) - lam * (L - size(X))] >= rc_limit:

no completion of ``X`` beats the best set. The test is monotone (more bytes or more
recompute never make it pass), so dropping ``X`` never drops a candidate that would dominate
a kept one. Every piece's front contains, or dominates, the restriction of any admissible
set to that piece, so the bound holds for every admissible completion, not only for those
the DP builds: the search stays exact.

The multipliers are a fixed grid spanning the graph's recompute-per-byte ratios (a maximum
over any set of multipliers is a valid bound). A slack of ``1e-9`` of each multiplier's
scale absorbs floating-point rounding, so rounding never drops a candidate.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np

from .fronts import Front

__all__ = ["Lagrangian"]


@dataclasses.dataclass(frozen=True)
class Lagrangian:
    """A grid of multipliers (recompute per byte) and the bounds computed with them."""

    lambdas: np.ndarray
    slack: np.ndarray

    @classmethod
    def for_graph(cls, sizes: np.ndarray, costs: np.ndarray, count: int = 40) -> "Lagrangian":
        """Multipliers ``0``, ``count - 1`` log-spaced ones from half the least to eight
        times the largest cost-per-byte ratio of an inner vertex, and the distinct such
        ratios (``count`` of them at most, evenly picked). For single vertices the bound
        ``sum(min(cost, lam * size)) - lam * L`` is concave and piecewise linear in ``lam``
        with its kinks at their ratios, so it peaks at one of them; on Inception-v3 at a
        50 % budget the log grid alone left the bound about 10 % below the optimum."""
        inner = slice(1, len(sizes) - 1)
        s, c = np.asarray(sizes[inner], dtype=float), np.asarray(costs[inner], dtype=float)
        useful = (s > 0) & (c > 0)
        lambdas = np.zeros(1)
        if useful.any():
            ratio = c[useful] / s[useful]
            grid = np.geomspace(ratio.min() / 2, ratio.max() * 8, count - 1)
            kinks = np.unique(ratio)
            if len(kinks) > count:  # keep the cost of the bounds in check: every k-th one
                kinks = kinks[np.linspace(0, len(kinks) - 1, count).round().astype(int)]
            lambdas = np.unique(np.concatenate(([0.0], grid, kinks)))
        scale = float(c.sum()) + lambdas * float(s.sum())
        return cls(lambdas, 1e-9 * np.maximum(scale, 1.0))

    def zero(self) -> np.ndarray:
        return np.zeros(len(self.lambdas))

    def of_front(self, front: Front, size_add: float = 0.0, rc_add: float = 0.0) -> np.ndarray:
        """``min(rc + rc_add + lam * (size + size_add))`` over the front, per multiplier
        (``inf`` for an empty front)."""
        if len(front) == 0:
            return np.full(len(self.lambdas), np.inf)
        return _least(front.size + size_add, front.rc + rc_add, self.lambdas)

    def of_fronts(self, fronts: dict[str, Front]) -> np.ndarray:
        """The least over several states' fronts of one piece."""
        return np.min([self.of_front(f) for f in fronts.values()], axis=0)

    def of_vertex(self, size: float, cost: float) -> np.ndarray:
        """A single vertex: kept (``lam * size``) or recomputed (``cost``)."""
        return np.minimum(cost, self.lambdas * size)

    def keep(self, size: np.ndarray, rc: np.ndarray, rest: np.ndarray, room: float,
             rc_limit: float) -> np.ndarray:
        """Which candidates ``(size, rc)`` may still lead to a set under ``rc_limit`` when
        the rest has the lower-bound function ``rest`` and the size limit is ``room``."""
        if not np.isfinite(rc_limit) or not np.isfinite(room):
            return np.ones(len(size), dtype=bool)
        order = np.argsort(-(rest - self.lambdas * room), kind="stable")
        return _keep(np.ascontiguousarray(size, dtype=float), np.ascontiguousarray(rc, dtype=float),
                     rest[order], self.lambdas[order], room, rc_limit + self.slack[order])


@numba.njit(cache=True)
def _least(size: np.ndarray, rc: np.ndarray, lambdas: np.ndarray) -> np.ndarray:  # pragma: no cover
    out = np.full(len(lambdas), np.inf)
    for i in range(len(size)):
        for k in range(len(lambdas)):
            value = rc[i] + lambdas[k] * size[i]
            if value < out[k]:
                out[k] = value
    return out


@numba.njit(cache=True)
def _keep(size: np.ndarray, rc: np.ndarray, rest: np.ndarray, lambdas: np.ndarray, room: float,
          limit: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    out = np.ones(len(size), dtype=np.bool_)
    for i in range(len(size)):
        for k in range(len(lambdas)):
            if rc[i] + rest[k] - lambdas[k] * (room - size[i]) >= limit[k]:
                out[i] = False
                break
    return out


_RIGHT_KEPT = frozenset({"cc", "oc"})  # end states (solver.graph.dp) whose last endpoint is kept


class SeriesBounds:
    """The bound above along a linear division ``P_0, m_0, P_1, ..., m_{S-1}, P_S`` that is
    the whole graph (its endpoints, the source and the target, are left out of every sum).

    After the prefix ``P_0 .. P_j`` is composed, the rest is ``m_j`` (whose fate the prefix's
    end state fixes: kept adds its bytes, recomputed its cost), then ``P_{j+1}, m_{j+1}, ...,
    P_S``. Before pairing the prefix with ``P_{j+1}``, the part's candidates are filtered the
    same way, with the prefix bounded by the least ``rc + lam * size`` over its own front.

    The room left to the rest is ``size_limit - size``, and also
    ``memory_limit - size - max(a, b)``: the open weights end up in segments at least that
    large, and a set's memory is its bytes plus its largest segment.
    """

    def __init__(self, lag: Lagrangian, parts: list[dict[str, Front]], mid_sizes, mid_costs,
                 memory_limit: float, size_limit: float, rc_limit: float) -> None:
        self.lag, self.room, self.rc_limit = lag, memory_limit, rc_limit
        self.floor = memory_limit - size_limit
        self.mids = list(zip(map(float, mid_sizes), map(float, mid_costs)))
        steps = len(self.mids)
        rest = [lag.zero()] * (steps + 1)
        for j in range(steps - 1, -1, -1):
            rest[j] = rest[j + 1] + lag.of_fronts(parts[j + 1])
            if j + 1 < steps:
                rest[j] = rest[j] + lag.of_vertex(*self.mids[j + 1])
        self.rest = rest
        whole = rest[0] + lag.of_fronts(parts[0]) + (lag.of_vertex(*self.mids[0]) if steps else 0.0)
        #: lower bound on the recompute of every set the division admits
        self.prebound = float(np.max(whole - lag.lambdas * max(size_limit, 0.0)))

    def _end(self, j: int, state: str) -> tuple[float, float]:
        """(bytes, cost) that ``m_j``, the vertex after ``P_j``, adds in ``state``."""
        if j >= len(self.mids):
            return 0.0, 0.0
        size, cost = self.mids[j]
        return (size, 0.0) if state in _RIGHT_KEPT else (0.0, cost)

    def _filter(self, j: int, state: str, rest: np.ndarray):
        size_add, rc_add = self._end(j, state)

        def keep(a, b, size, rc):
            used = size + size_add + np.maximum(np.maximum(a, b), self.floor)
            ok = used <= self.room
            ok[ok] = self.lag.keep(used[ok], rc[ok] + rc_add, rest, self.room, self.rc_limit)
            return ok

        return keep

    def after(self, j: int):
        """``state -> filter(a, b, size, rc)`` for the prefix ending with ``P_j``."""
        return lambda state: self._filter(j, state, self.rest[j])

    @staticmethod
    def _select(fronts: dict[str, Front], filters) -> dict[str, Front]:
        return {state: f.take(np.flatnonzero(filters(state)(f.a, f.b, f.size, f.rc)))
                for state, f in fronts.items()}

    def prefix(self, fronts: dict[str, Front]) -> dict[str, Front]:
        """Filter the first part's fronts (the prefix ``P_0``)."""
        return self._select(fronts, self.after(0))

    def part(self, j: int, prefix: dict[str, Front], fronts: dict[str, Front]) -> dict[str, Front]:
        """Filter the fronts of ``P_j`` before they are paired with the prefix ``P_0..P_{j-1}``."""
        known = [self.lag.of_front(f, *self._end(j - 1, s)) for s, f in prefix.items()]
        head = np.min(known, axis=0) if known else np.full(len(self.lag.lambdas), np.inf)
        rest = head + self.rest[j]
        return self._select(fronts, lambda state: self._filter(j, state, rest))
