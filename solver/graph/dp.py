"""The division-tree dynamic program behind :func:`solver.graph.search.checkpoint_search`.

For a fixed bound ``m`` on the largest segment (Feng & Huang's "max term", arXiv:1808.00079
sec. 4) it finds the checkpoint sets of least checkpoint bytes (memory mode) or the
(checkpoint bytes, recompute) Pareto front (budget mode) whose segments all fit in ``m``,
under the memory model of :mod:`solver.graph.model`.

Each independent segment ``(u, w)`` of the division tree (:mod:`solver.graph.division`) reports,
for every way its endpoints can end up, a :class:`~solver.graph.fronts.Front`:

======  ===================================================================================
state   endpoints, and what the open weights mean
======  ===================================================================================
``cc``  both kept (or source/target): every inner segment is closed and must fit in ``m``
``oc``  ``u`` recomputed, ``w`` kept: ``a`` = inner bytes in ``u``'s segment
``co``  ``u`` kept, ``w`` recomputed: ``b`` = inner bytes in ``w``'s segment
``sp``  both recomputed, in different segments: ``a``, ``b`` as above
``jn``  both recomputed and joined through this segment into one segment: ``a`` = inner
        bytes in it. Every inner vertex lies on a ``u -> w`` path, so every inner segment
        is then on a cycle with the joined one and merges into it (graph_model docstring)
``fr``  both recomputed and already joined elsewhere: any inner checkpoints, everything
        recomputed merges; ``a`` = inner recomputed bytes
======  ===================================================================================

The endpoints' own bytes are added by the parent, which decides whether they are kept.
Compositions (``v`` the shared vertex of a linear division; "kept v" adds its size, a
recomputed ``v`` adds its cost and joins the segments on both sides):

* series ``cc`` = kept v: ``cc1 cc2``; recomputed v: ``co1(b1) oc2(a2)`` with
  ``b1 + size[v] + a2 <= m``. The other states follow the same pattern; a ``jn`` side
  carries its bytes across ``v`` (e.g. ``oc`` gets ``jn1(W1) oc2(a2) -> a = W1 + size[v] + a2``).
* branch: states multiply across branches (``a``, ``b`` and costs add); ``sp`` needs every
  branch split (a direct edge never is); ``jn`` needs one branch joined, the others ``fr``.
* complex: all ``2^k`` subsets of the ``k`` inner vertices are enumerated once (exact up to
  ``COMPLEX_LIMIT`` inner vertices; beyond, only the ``COMPLEX_LIMIT`` smallest inner
  vertices are candidates, plus "keep them all": a documented heuristic).

In memory mode a segment that is joined (``jn``/``fr``) never holds inner checkpoints: moving
a checkpoint out of a merged segment never raises ``size + max segment`` (graph_model), so the
optimum over all ``m`` is unchanged while the fronts stay small. Budget mode keeps them (they
save recompute at no memory cost when the merged segment is the largest). It also drops
candidates whose bytes plus open weight exceed ``Context.memory_limit`` (the open weights
end up in segments at least that large), and on ``Context.bounded``, the top-level linear
division, those that the Lagrangian bound of :mod:`solver.graph.bounds` shows cannot beat
``Context.cap``.
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import numba
import numpy as np

from .bounds import Lagrangian, SeriesBounds
from .division import Complex, Leaf, Node, Parallel, Series
from .fronts import EMPTY, Candidates, Front, pairs, prune, single
from .model import segment_masks

__all__ = ["Context", "TimeLimit", "FrontLimit", "evaluate", "COMPLEX_LIMIT"]

COMPLEX_LIMIT = 12
_MASK_BITS = 63  # local vertex masks of a complex division are int64
CACHE_DEPTH = 16  # cached results per node and set of states

STATES = ("cc", "oc", "co", "sp", "jn", "fr")
_COLUMNS = {"cc": "", "oc": "a", "co": "b", "sp": "ab", "jn": "a", "fr": "a"}
# What a series composition needs from its left part (P) and right part (Q) per state.
_P_NEEDS = {"cc": {"cc", "co"}, "co": {"cc", "co"}, "oc": {"oc", "sp", "jn"},
            "sp": {"oc", "sp", "jn"}, "jn": {"jn"}, "fr": set()}
_Q_NEEDS = {"cc": {"cc", "oc"}, "oc": {"cc", "oc"}, "co": {"co", "sp", "jn"},
            "sp": {"co", "sp", "jn"}, "jn": {"jn"}, "fr": set()}


class TimeLimit(Exception):
    """Raised inside an evaluation when :attr:`Context.deadline` has passed or the
    evaluations of one budgeted search have examined more than :attr:`Context.work_limit`
    candidates (a deterministic limit: the same graph and limits stop at the same point on
    any machine, under any load)."""


class FrontLimit(Exception):
    """Raised inside an evaluation when a front of :attr:`Context.bounded` holds more than
    :attr:`Context.front_limit` candidates."""


@dataclasses.dataclass
class Context:
    """Sizes, costs and limits of one evaluation, plus caches shared across evaluations."""

    sizes: np.ndarray
    costs: np.ndarray
    budget_mode: bool
    seg_limit: float = np.inf
    size_limit: float = np.inf
    rc_limit: float = np.inf
    knapsack_limit: float = np.inf
    tables: dict = dataclasses.field(default_factory=dict)
    knapsacks: dict = dataclasses.field(default_factory=dict)
    totals: dict = dataclasses.field(default_factory=dict)
    cache: dict = dataclasses.field(default_factory=dict)
    ranges: list = dataclasses.field(default_factory=list)
    deadline: float = np.inf
    # Budget mode: the memory limit (fixed for the whole search); the Lagrangian bounds
    # applied on ``bounded`` (the root of the evaluation) against ``cap`` (<= rc_limit), and
    # the lower bound they give on the whole evaluation (``prebound``).
    memory_limit: float = np.inf
    lagrangian: Lagrangian | None = None
    bounded: Node | None = None
    cap: float = np.inf
    prebound: float = -np.inf
    # Budget mode: the most candidates a front of ``bounded`` may hold (FrontLimit beyond).
    front_limit: float = np.inf
    # Candidates examined so far (rows of the fronts before pruning, plus one per front
    # pruned), across evaluations; TimeLimit once more than ``work_limit``.
    work: int = 0
    work_limit: float = np.inf

    def prune(self, groups, state: str, bound=None) -> Front:
        if time.monotonic() > self.deadline:
            raise TimeLimit
        front = prune(groups, _COLUMNS[state], seg_limit=self.seg_limit,
                      size_limit=self.size_limit, with_rc=self.budget_mode, record=self.record_range,
                      rc_limit=self.rc_limit, tick=self.tick, memory_limit=self.memory_limit,
                      bound=bound)
        if bound is not None and len(front) > self.front_limit:
            raise FrontLimit
        return front

    def tick(self, rows: int = 0) -> None:
        """Count ``rows`` candidates examined (and one front pruned); raise
        :class:`TimeLimit` past the work limit or the deadline."""
        self.work += rows + 1
        if self.work > self.work_limit or time.monotonic() > self.deadline:
            raise TimeLimit

    def record(self, kind: str, values: np.ndarray, accepted: np.ndarray) -> None:
        """Note a comparison against a limit: the result holds for limits in
        ``[max accepted value, min rejected value)`` (per kind; the recompute limit is a
        strict ``<``, so its range is ``(max accepted, min rejected]``)."""
        if not self.ranges or len(values) == 0:
            return
        if accepted.all():
            self.record_range(kind, float(values.max()), np.inf)
        elif not accepted.any():
            self.record_range(kind, -np.inf, float(values.min()))
        else:
            self.record_range(kind, float(values[accepted].max()), float(values[~accepted].min()))

    def record_range(self, kind: str, largest_accepted: float, least_rejected: float) -> None:
        """:meth:`record` from the extremes of the values (``-inf`` / ``inf``: none)."""
        if self.ranges:
            r = self.ranges[-1]
            i = {"seg": 0, "size": 2, "rc": 4}[kind]
            r[i] = max(r[i], largest_accepted)
            r[i + 1] = min(r[i + 1], least_rejected)

    def total(self, node: Node) -> tuple[float, float]:
        """(bytes, cost) of the node's inner vertices."""
        key = id(node)
        if key not in self.totals:
            inner = list(node.inner)
            self.totals[key] = (float(self.sizes[inner].sum()), float(self.costs[inner].sum()))
        return self.totals[key]


def evaluate(node: Node, ctx: Context, needs: set[str] = frozenset(STATES)) -> dict[str, Front]:
    """Fronts of ``node`` for the requested states (others may be missing).

    Results are cached per node together with the range of limits for which every
    comparison made while computing them comes out the same; within that range the cached
    fronts are returned unchanged (the branch and bound re-evaluates with nearby limits).
    The last ``CACHE_DEPTH`` results are kept per node (the budgeted search goes back and
    forth between max-term intervals).
    """
    if node is ctx.bounded:  # depends on the interval and the bounds too: never cached
        return _evaluate(node, ctx, set(needs))
    key = (id(node), frozenset(needs))
    entries = ctx.cache.setdefault(key, [])
    for fronts, r in entries:
        if (r[0] <= ctx.seg_limit < r[1] and r[2] <= ctx.size_limit < r[3]
                and r[4] < ctx.rc_limit <= r[5]):
            _merge_range(ctx, r)
            return fronts
    ctx.ranges.append([-np.inf, np.inf, -np.inf, np.inf, -np.inf, np.inf])
    try:
        fronts = _evaluate(node, ctx, set(needs))
    finally:
        r = ctx.ranges.pop()
    entries.insert(0, (fronts, r))
    del entries[CACHE_DEPTH:]
    _merge_range(ctx, r)
    return fronts


def _merge_range(ctx: Context, r: list[float]) -> None:
    if ctx.ranges:
        parent = ctx.ranges[-1]
        parent[0] = max(parent[0], r[0])
        parent[1] = min(parent[1], r[1])
        parent[2] = max(parent[2], r[2])
        parent[3] = min(parent[3], r[3])
        parent[4] = max(parent[4], r[4])
        parent[5] = min(parent[5], r[5])


def _evaluate(node: Node, ctx: Context, needs: set[str]) -> dict[str, Front]:
    out: dict[str, Front] = {}
    if "fr" in needs:
        out["fr"] = _free(node, ctx)
        needs.discard("fr")
    if not needs:
        return out
    if isinstance(node, Leaf):
        out.update(cc=single(), oc=single(), co=single(), sp=EMPTY, jn=single())
    elif isinstance(node, Series):
        out.update(_series(node, ctx, needs))
    elif isinstance(node, Parallel):
        out.update(_parallel(node, ctx, needs))
    else:
        out.update(_complex(node, ctx, needs))
    return out


# --------------------------------------------------------------------------- series
def _series(node: Series, ctx: Context, needs: set[str]) -> dict[str, Front]:
    """Compose the parts left to right. On ``ctx.bounded`` (the top-level division in budget
    mode) partial sets that cannot beat ``ctx.rc_limit`` are dropped (solver.graph.bounds)."""
    # The prefix needs are closed under _P_NEEDS after one step.
    prefix_needs = set().union(*(_P_NEEDS[s] for s in needs))
    prefix_needs |= set().union(*(_P_NEEDS[s] for s in prefix_needs))
    steps = len(node.mids)
    wants = [needs if k == steps - 1 else prefix_needs for k in range(steps)]
    parts = [evaluate(node.parts[0], ctx, prefix_needs if steps else needs)]
    parts += [evaluate(node.parts[k + 1], ctx, set().union(*(_Q_NEEDS[s] for s in want)))
              for k, want in enumerate(wants)]
    bounds = None
    if node is ctx.bounded and ctx.lagrangian is not None:
        bounds = SeriesBounds(ctx.lagrangian, parts, ctx.sizes[list(node.mids)],
                              ctx.costs[list(node.mids)], ctx.memory_limit, ctx.size_limit,
                              min(ctx.cap, ctx.rc_limit))
        ctx.prebound = bounds.prebound
    prefix = parts[0] if bounds is None else bounds.prefix(parts[0])
    for k, v in enumerate(node.mids):
        right = parts[k + 1] if bounds is None else bounds.part(k + 1, prefix, parts[k + 1])
        prefix = _compose(prefix, v, right, ctx, wants[k], None if bounds is None else bounds.after(k + 1))
    return prefix


def _compose(p: dict, v: int, q: dict, ctx: Context, want: set[str], bound=None) -> dict[str, Front]:
    """Join segment fronts ``p`` over ``(u, v)`` and ``q`` over ``(v, w)`` at vertex ``v``;
    ``bound(state)``, if given, filters each state's candidates (Context.prune)."""
    wv, cv, bit = float(ctx.sizes[v]), float(ctx.costs[v]), 1 << v
    m = ctx.seg_limit
    zero = lambda n: np.zeros(n)  # noqa: E731
    out: dict[str, Front] = {}

    def kept(f, g, a_of, b_of):  # v kept: no segment crosses v
        return pairs(f, g, lambda i, j: (a_of(f, g, i, j), b_of(f, g, i, j), None, None),
                     size_add=wv, bit=bit)

    def through(f, g, a_of, b_of):  # v recomputed: f's b-side + v + g's a-side form a segment
        def combine(i, j):
            segment = f.b[i] + wv + g.a[j]
            ok = segment <= m
            ctx.record("seg", segment, ok)
            return a_of(f, g, i, j), b_of(f, g, i, j), ok, segment
        return pairs(f, g, combine, rc_add=cv)

    A1 = lambda f, g, i, j: f.a[i]  # noqa: E731
    B2 = lambda f, g, i, j: g.b[j]  # noqa: E731
    Z = lambda f, g, i, j: zero(len(i))  # noqa: E731
    filters = bound or (lambda state: None)

    def close(groups, state):
        return ctx.prune(groups, state, filters(state))

    if "cc" in want:
        out["cc"] = close([kept(p["cc"], q["cc"], Z, Z), through(p["co"], q["oc"], Z, Z)], "cc")
    if "oc" in want:
        out["oc"] = close([
            kept(p["oc"], q["cc"], A1, Z),
            through(p["sp"], q["oc"], A1, Z),
            _joined_left(p["jn"], q["oc"], wv, cv, Z),
        ], "oc")
    if "co" in want:
        out["co"] = close([
            kept(p["cc"], q["co"], Z, B2),
            through(p["co"], q["sp"], Z, B2),
            _joined_right(p["co"], q["jn"], wv, cv, Z),
        ], "co")
    if "sp" in want:
        out["sp"] = close([
            kept(p["oc"], q["co"], A1, B2),
            through(p["sp"], q["sp"], A1, B2),
            _joined_left(p["jn"], q["sp"], wv, cv, B2),
            _joined_right(p["sp"], q["jn"], wv, cv, A1),
        ], "sp")
    if "jn" in want:
        out["jn"] = close([
            pairs(p["jn"], q["jn"], lambda i, j: (p["jn"].a[i] + wv + q["jn"].a[j], zero(len(i)), None, None),
                  rc_add=cv)
        ], "jn")
    return out


def _joined_left(f: Front, g: Front, wv: float, cv: float, b_of) -> Candidates | None:
    """``f`` joined ``u`` to ``v``; ``v`` recomputed; ``g``'s a-side joins: a = W1 + v + a2."""
    return pairs(f, g, lambda i, j: (f.a[i] + wv + g.a[j], b_of(f, g, i, j), None, None), rc_add=cv)


def _joined_right(f: Front, g: Front, wv: float, cv: float, a_of) -> Candidates | None:
    """``g`` joins ``v`` to ``w``; ``v`` recomputed; ``f``'s b-side joins: b = b1 + v + W2."""
    return pairs(f, g, lambda i, j: (a_of(f, g, i, j), f.b[i] + wv + g.a[j], None, None), rc_add=cv)


# --------------------------------------------------------------------------- branches
def _parallel(node: Parallel, ctx: Context, needs: set[str]) -> dict[str, Front]:
    child_needs = set(needs)
    if "jn" in needs:
        child_needs |= {"jn", "fr"}
    fronts = [evaluate(b, ctx, child_needs) for b in node.branches]
    out: dict[str, Front] = {}
    for state in needs - {"jn"}:
        acc = fronts[0][state]
        for f in fronts[1:]:
            acc = _sum(acc, f[state], ctx, state)
        out[state] = acc
    if "jn" in needs:
        joined, free = fronts[0]["jn"], fronts[0]["fr"]
        for f in fronts[1:]:
            joined = ctx.prune([_sum_candidates(joined, f["fr"]), _sum_candidates(free, f["jn"])], "jn")
            free = _sum(free, f["fr"], ctx, "fr")
        out["jn"] = joined
    return out


def _sum_candidates(f: Front, g: Front) -> Candidates | None:
    return pairs(f, g, lambda i, j: (f.a[i] + g.a[j], f.b[i] + g.b[j], None, None))


def _sum(f: Front, g: Front, ctx: Context, state: str) -> Front:
    return ctx.prune([_sum_candidates(f, g)], state)


# --------------------------------------------------------------------------- free segments
def _free(node: Node, ctx: Context) -> Front:
    """``fr``: every inner vertex recomputed into one merged segment, or kept at will."""
    weight, cost = ctx.total(node)
    if not ctx.budget_mode or not node.inner:
        return ctx.prune([single(a=weight, rc=cost)], "fr")
    key = id(node)
    if key not in ctx.knapsacks:
        # Pareto knapsack over (kept bytes, recompute), built once per node.
        front = single(a=weight, rc=cost)
        for v in node.inner:
            s, c = float(ctx.sizes[v]), float(ctx.costs[v])
            moved = Candidates.of(front, a=front.a - s, size_add=s, rc_add=-c, bit=1 << v)
            front = prune([front, moved], "", seg_limit=np.inf, size_limit=ctx.knapsack_limit,
                          with_rc=True)
        ctx.knapsacks[key] = front
    return ctx.prune([ctx.knapsacks[key]], "fr")


# --------------------------------------------------------------------------- complex
def _complex(node: Complex, ctx: Context, needs: set[str]) -> dict[str, Front]:
    table = ctx.tables.get(id(node))
    if table is None:
        table = ctx.tables[id(node)] = _complex_table(node, ctx)
    out = {}
    for state in needs:
        rows = table[state]
        ok = rows["closed"] <= ctx.seg_limit
        ctx.record("seg", rows["closed"], ok)
        idx = np.flatnonzero(ok)
        f = Front(rows["a"][idx], rows["b"][idx], rows["size"][idx], rows["rc"][idx], rows["closed"][idx],
                  rows["mask"][idx])
        out[state] = ctx.prune([f], state)
    return out


def _complex_table(node: Complex, ctx: Context) -> dict[str, dict[str, np.ndarray]]:
    """Enumerate the kept subsets of a complex segment's inner vertices, for each end state."""
    inner = list(node.inner)
    k = len(inner)
    n = k + 2
    if n > _MASK_BITS:
        raise ValueError(
            f"checkpoint_search: a complex division (a part of the graph that is not series-"
            f"parallel) has {k} inner vertices; at most {_MASK_BITS - 2} are supported (its "
            f"subsets are 64-bit masks). Group operations into fewer vertices, or give the "
            f"graph more articulation points (vertices every path passes through).")
    local = {v: i for i, v in enumerate([node.u, *inner, node.w])}
    undirected = np.zeros(n, dtype=np.int64)
    successors = np.zeros(n, dtype=np.int64)
    for a, b in node.edges:
        la, lb = local[a], local[b]
        successors[la] |= np.int64(1) << lb
        undirected[la] |= np.int64(1) << lb
        undirected[lb] |= np.int64(1) << la
    sizes = np.array([0.0, *ctx.sizes[inner], 0.0])
    costs = np.asarray(ctx.costs[inner], dtype=float)
    if k <= COMPLEX_LIMIT:
        subsets = np.arange(1 << k, dtype=np.int64)
    else:  # heuristic: only the COMPLEX_LIMIT smallest inner vertices may be kept, or all
        warnings.warn(
            f"checkpoint_search: a complex division has {k} inner vertices, more than the "
            f"{COMPLEX_LIMIT} enumerated exactly; only its {COMPLEX_LIMIT} smallest vertices "
            "may be kept there, so the result may not be optimal.", RuntimeWarning, stacklevel=2)
        pick = sorted(range(k), key=lambda i: (sizes[i + 1], i))[:COMPLEX_LIMIT]
        combos = np.arange(1 << COMPLEX_LIMIT, dtype=np.int64)
        subsets = np.zeros(len(combos), dtype=np.int64)
        for bit, i in enumerate(pick):
            subsets |= ((combos >> bit) & 1) << i
        subsets = np.append(subsets, np.int64((1 << k) - 1))
    bits = ((subsets[:, None] >> np.arange(k)) & 1).astype(bool)  # kept inner vertices
    size = bits @ sizes[1:-1] if k else np.zeros(len(subsets))
    rc = (~bits) @ costs if k else np.zeros(len(subsets))
    masks = np.empty(len(subsets), dtype=object)
    ids = [1 << v for v in inner]
    masks[:] = [sum(ids[i] for i in range(k) if s >> i & 1) for s in subsets.tolist()]
    a, b, closed, joined = _classify(subsets << 1, undirected, successors, n, sizes)
    table = {}
    for status, state in enumerate(("cc", "oc", "co", None)):
        if state is None:
            continue
        table[state] = _rows(a[:, status], b[:, status], size, rc, closed[:, status], masks)
    both = 3
    sp = ~joined[:, both]
    table["sp"] = _rows(a[sp, both], b[sp, both], size[sp], rc[sp], closed[sp, both], masks[sp])
    jn = joined[:, both] & ((subsets == 0) | ctx.budget_mode)  # memory mode: no kept vertex
    table["jn"] = _rows(a[jn, both], b[jn, both] * 0, size[jn], rc[jn], closed[jn, both], masks[jn])
    return table


def _rows(a, b, size, rc, closed, mask) -> dict[str, np.ndarray]:
    return {"a": a, "b": b, "size": size, "rc": rc, "closed": closed, "mask": mask}


@numba.njit(cache=True)
def _classify(kept: np.ndarray, undirected: np.ndarray, successors: np.ndarray, n: int,
              sizes: np.ndarray):  # pragma: no cover - compiled
    """Per kept set (local bitmask, endpoints excluded) and end state (0: both kept,
    1: ``u`` recomputed, 2: ``w`` recomputed, 3: both): the inner bytes in ``u``'s and
    ``w``'s segments, the largest other segment, and whether ``u`` and ``w`` share one."""
    count = len(kept)
    a = np.zeros((count, 4))
    b = np.zeros((count, 4))
    closed = np.zeros((count, 4))
    joined = np.zeros((count, 4), dtype=np.bool_)
    inner = ((np.int64(1) << (n - 1)) - 1) & ~np.int64(1)
    w_bit = np.int64(1) << (n - 1)
    for t in range(count):
        inner_open = inner & ~kept[t]
        for status in range(4):
            recomputed = inner_open
            if status & 1:
                recomputed |= np.int64(1)
            if status & 2:
                recomputed |= w_bit
            for seg in segment_masks(recomputed, undirected, successors, n):
                weight = 0.0
                for v in range(1, n - 1):
                    if (seg >> v) & 1:
                        weight += sizes[v]
                has_u = (seg & 1) != 0
                has_w = (seg & w_bit) != 0
                if has_u and has_w:
                    joined[t, status] = True
                    a[t, status] = weight
                elif has_u:
                    a[t, status] = weight
                elif has_w:
                    b[t, status] = weight
                elif weight > closed[t, status]:
                    closed[t, status] = weight
    return a, b, closed, joined
