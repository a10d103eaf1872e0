"""checkpoint_search (Feng & Huang) against brute force, and the graph simulator.

The brute force below is written independently of solver.graph_model: segments are found
with union-find and merged with a transitive closure (Floyd-Warshall) of the quotient
graph, then every subset of inner vertices is tried.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from solver import CheckpointSet, Graph, InfeasibleBudget, checkpoint_search, simulate_graph
from solver.acg_bounds import Lagrangian
from solver.acg_dp import COMPLEX_LIMIT
from solver.division import Complex, Parallel, Series, division_tree
from solver.graph_simulate import schedule_graph

MAX_VERTICES = 12


# --------------------------------------------------------------------------- brute force
def brute_segments(n, edges, kept):
    """Segments of the inner vertices not in ``kept`` (0 and n-1 are source and target)."""
    recomputed = [v for v in range(1, n - 1) if v not in kept]
    parent = {v: v for v in recomputed}

    def root(v):
        while parent[v] != v:
            v = parent[v]
        return v

    for a, b in edges:
        if a in parent and b in parent:
            parent[root(a)] = root(b)
    groups = {}
    for v in recomputed:
        groups.setdefault(root(v), set()).add(v)
    comps = list(groups.values())
    r = len(comps)
    if r <= 1:
        return [frozenset(c) for c in comps]
    # Quotient nodes: components 0..r-1, then every other vertex on its own.
    node = {v: c for c, comp in enumerate(comps) for v in comp}
    others = [v for v in range(n) if v not in node]
    for i, v in enumerate(others):
        node[v] = r + i
    q = r + len(others)
    reach = [{c} for c in range(q)]
    for a, b in edges:
        reach[node[a]].add(node[b])
    for k in range(q):  # Floyd-Warshall closure on sets
        for i in range(q):
            if k in reach[i]:
                reach[i] |= reach[k]
    merged, seen = [], set()
    for c in range(r):
        if c in seen:
            continue
        group = {d for d in range(r) if d in reach[c] and c in reach[d]}
        seen |= group
        merged.append(frozenset().union(*(comps[d] for d in group)))
    return merged


def brute_memory(n, edges, sizes, costs, kept):
    segs = brute_segments(n, edges, kept)
    mem = sum(sizes[v] for v in kept) + max((sum(sizes[v] for v in s) for s in segs), default=0)
    rc = sum(costs[v] for s in segs for v in s)
    return mem, rc, segs


def brute_all(graph):
    n = len(graph)
    edges = graph.edges.tolist()
    sizes, costs = graph.sizes.tolist(), graph.costs.tolist()
    inner = range(1, n - 1)
    return [
        (kept, *brute_memory(n, edges, sizes, costs, set(kept))[:2])
        for r in range(n - 1)
        for kept in itertools.combinations(inner, r)
    ]


# --------------------------------------------------------------------------- graph families
class _Builder:
    def __init__(self):
        self.n = 1  # vertex 0 is the source
        self.edges = []

    def new(self, *inputs):
        v = self.n
        self.n += 1
        self.edges += [(u, v) for u in inputs]
        return v

    def chain(self, x, length):
        for _ in range(length):
            x = self.new(x)
        return x


def _diamond(draw, b, x, room):
    paths = draw(st.lists(st.integers(0, 2), min_size=2, max_size=3))
    if paths.count(0) > 1:
        paths = [p for p in paths if p] + [0]
    if sum(paths) + 1 > room:
        return None
    ends = [b.chain(x, p) for p in paths]
    return b.new(*ends)


def _residual(draw, b, x, room):
    length = draw(st.integers(1, 3))
    projection = draw(st.booleans())
    if length + 1 + projection > room:
        return None
    y = b.chain(x, length)
    shortcut = b.new(x) if projection else x
    return b.new(y, shortcut)


def _dense(draw, b, x, room):
    layers = draw(st.integers(2, 4))
    if layers + 1 > room:
        return None
    feats = [x]
    for _ in range(layers):
        feats.append(b.new(*feats))
    return b.new(*feats)


def _inception(draw, b, x, room):
    kinds = draw(st.lists(st.sampled_from(["short", "long", "split"]), min_size=2, max_size=3))
    need = sum({"short": 1, "long": 2, "split": 4}[k] for k in kinds) + 1
    if need > room:
        return None
    ends = []
    for k in kinds:
        if k == "split":  # y -> (a, b) -> inner concat, as in Inception-v3's E modules
            y = b.new(x)
            ends.append(b.new(b.new(y), b.new(y)))
        else:
            ends.append(b.chain(x, 1 if k == "short" else 2))
    return b.new(*ends)


BLOCKS = {"diamond": _diamond, "residual": _residual, "dense": _dense, "inception": _inception}


@st.composite
def family_graphs(draw, family=None):
    """Series of blocks of one family (or mixed), <= MAX_VERTICES vertices, random sizes."""
    family = family or draw(st.sampled_from([*BLOCKS, "mixed"]))
    b = _Builder()
    x = 0
    if draw(st.booleans()):
        x = b.chain(x, 1)
    for _ in range(4):
        room = MAX_VERTICES - 1 - b.n
        kind = draw(st.sampled_from(sorted(BLOCKS))) if family == "mixed" else family
        y = BLOCKS[kind](draw, b, x, room)
        if y is None:
            break
        x = y
        if b.n < MAX_VERTICES - 1 and draw(st.booleans()):
            x = b.chain(x, 1)
    b.new(x)  # the target (the loss)
    n = b.n
    sizes = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    costs = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
    return Graph.from_edges(b.edges, sizes, costs)


# --------------------------------------------------------------------------- least memory
def _check_result(graph, result):
    n = len(graph)
    kept = {graph.index(c) for c in result.checkpoints}
    assert graph.source not in kept and graph.target not in kept
    mem, rc, segs = brute_memory(n, graph.edges.tolist(), graph.sizes.tolist(), graph.costs.tolist(), kept)
    assert result.peak == pytest.approx(mem)
    assert result.recompute == pytest.approx(rc)
    assert {frozenset(graph.index(v) for v in s) for s in result.segments} == set(segs)
    return mem, rc


@settings(max_examples=70, deadline=None)
@given(family_graphs())
def test_least_memory_equals_brute_force(graph):
    result = checkpoint_search(graph)
    assert isinstance(result, CheckpointSet)
    _check_result(graph, result)
    best = min(mem for _, mem, _ in brute_all(graph))
    assert result.peak == pytest.approx(best)


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_every_family_is_covered(data):
    # Each family on its own (the mixed strategy above may under-sample one).
    for family in BLOCKS:
        graph = data.draw(family_graphs(family))
        result = checkpoint_search(graph)
        _check_result(graph, result)
        assert result.peak == pytest.approx(min(mem for _, mem, _ in brute_all(graph)))


def _nodes(node):
    yield node
    for child in getattr(node, "parts", ()) + getattr(node, "branches", ()):
        yield from _nodes(child)


def test_division_tree_shapes():
    # inception-like module: a branch division; dense block: a complex division.
    b = _Builder()
    y = b.new(0)
    top = b.new(b.new(y), b.new(y))
    out = b.new(b.new(top), top)
    b.new(out)
    g = Graph.from_edges(b.edges, [1] * b.n)
    tree = division_tree(g)
    assert isinstance(tree, Series)
    assert any(isinstance(p, Parallel) for p in tree.parts)
    assert not any(isinstance(p, Complex) for p in _nodes(tree))
    dense = _Builder()
    x = dense.new(0)
    _dense(lambda s: 3, dense, x, 10)
    dense.new(dense.n - 1)
    g = Graph.from_edges(dense.edges, [1] * dense.n)
    assert any(isinstance(p, Complex) for p in _nodes(division_tree(g)))


def test_departure_from_feng_huang_example():
    # s -> u -> {p1 -> p2, q1} -> v -> t. Feng & Huang's search keeps u and v whenever it
    # cuts inside the branch (best 22); keeping p1 and q1 and recomputing {u} and {p2, v}
    # separately costs 13.
    g = Graph.from_edges(
        [("s", "u"), ("u", "p1"), ("p1", "p2"), ("p2", "v"), ("u", "q1"), ("q1", "v"), ("v", "t")],
        {"s": 1, "u": 10, "p1": 1, "p2": 1, "q1": 1, "v": 10, "t": 1},
    )
    result = checkpoint_search(g)
    assert result.peak == 13.0
    assert set(result.checkpoints) >= {"p1", "q1"}


def test_merged_segments_example():
    # a -> d directly and a -> c1 -> b -> c2 -> d: keeping c1 and c2 leaves {a, d} and {b},
    # which lie on a cycle through the checkpoints and must be rebuilt together.
    g = Graph.from_edges(
        [("s", "a"), ("a", "d"), ("a", "c1"), ("c1", "b"), ("b", "c2"), ("c2", "d"), ("d", "t")],
        {"s": 1, "a": 5, "c1": 1, "b": 5, "c2": 1, "d": 5, "t": 1},
    )
    from solver import graph_segments, training_memory

    assert graph_segments(g, ["c1", "c2"]) == [("a", "b", "d")]
    assert training_memory(g, ["c1", "c2"]) == 2 + 15


# --------------------------------------------------------------------------- budgets
def _check_budget(graph, where):
    table = brute_all(graph)
    least = min(mem for _, mem, _ in table)
    budget = least + where * (float(graph.sizes[1:-1].sum()) - least)
    result = checkpoint_search(graph, budget=budget)
    mem, rc = _check_result(graph, result)
    assert mem <= budget + 1e-9
    assert rc == pytest.approx(min(r for _, m, r in table if m <= budget + 1e-9))


@settings(max_examples=50, deadline=None)
@given(family_graphs(), st.floats(0.0, 1.0))
def test_budget_least_recompute_equals_brute_force(graph, where):
    _check_budget(graph, where)


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_budget_every_family_is_covered(data):
    # The Lagrangian bounds prune along the top-level division: each family on its own,
    # inception modules (branch divisions under it) and dense blocks (complex) included.
    for family in BLOCKS:
        _check_budget(data.draw(family_graphs(family)), data.draw(st.floats(0.0, 1.0)))


@settings(max_examples=15, deadline=None)
@given(family_graphs(), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_budget_fractional_sizes(graph, where, seed):
    sizes = np.random.default_rng(seed).uniform(0.1, 5.0, len(graph))
    names = graph.names
    g = Graph.from_edges([(names[a], names[b]) for a, b in graph.edges.tolist()],
                         dict(zip(names, sizes.tolist())), dict(zip(names, graph.costs.tolist())))
    _check_budget(g, where)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30)), min_size=1, max_size=8),
       st.integers(0, 60), st.integers(0, 200), st.integers(0, 150))
def test_lagrangian_bound_never_drops_a_completable_set(items, used, room, limit):
    # The rest is a set of free vertices (kept: its bytes, recomputed: its cost); a partial
    # set with `used` bytes and recompute 0 must be kept whenever some completion fits the
    # room with recompute under the limit.
    sizes = np.array([0.0] + [s for s, _ in items] + [0.0])
    costs = np.array([0.0] + [c for _, c in items] + [0.0])
    lag = Lagrangian.for_graph(sizes, costs)
    rest = sum(lag.of_vertex(s, c) for s, c in items)
    best = min(
        (sum(c for (s, c), k in zip(items, keep) if not k)
         for keep in itertools.product([0, 1], repeat=len(items))
         if used + sum(s for (s, _), k in zip(items, keep) if k) <= room),
        default=np.inf)
    kept = lag.keep(np.array([float(used)]), np.array([0.0]), rest, float(room), float(limit))
    if best < limit:
        assert kept[0]


@settings(max_examples=20, deadline=None)
@given(family_graphs())
def test_budget_below_optimum_is_infeasible(graph):
    least = checkpoint_search(graph).peak
    if least >= 1:  # integer sizes: the optimum is at least 1 unless nothing is inner
        with pytest.raises(InfeasibleBudget) as info:
            checkpoint_search(graph, budget=least - 0.5)
        assert info.value.min_budget == pytest.approx(least)
    # at the optimum itself the budgeted search succeeds
    assert checkpoint_search(graph, budget=least).peak <= least + 1e-9


def test_time_limit_returns_a_fitting_set():
    rng = np.random.default_rng(1)
    g = Graph.chain(rng.integers(1, 100, 30).tolist(), rng.integers(1, 10, 30).tolist())
    least = checkpoint_search(g).peak
    budget = least + 0.3 * (g.sizes[1:-1].sum() - least)
    with pytest.warns(RuntimeWarning, match=r"time limit ran out.*within [0-9.e+-]+% of the least"):
        quick = checkpoint_search(g, budget=budget, time_limit=0.0)
    assert quick.peak <= budget
    exact = checkpoint_search(g, budget=budget)
    assert exact.recompute <= quick.recompute


@settings(max_examples=30, deadline=None)
@given(family_graphs(), st.floats(0.0, 1.0), st.sampled_from([0.05, 0.2, 0.5]))
def test_budget_gap_bounds_the_recompute(graph, where, gap):
    table = brute_all(graph)
    least = min(mem for _, mem, _ in table)
    budget = least + where * (float(graph.sizes[1:-1].sum()) - least)
    result = checkpoint_search(graph, budget=budget, gap=gap)
    mem, rc = _check_result(graph, result)
    optimum = min(r for _, m, r in table if m <= budget + 1e-9)
    assert mem <= budget + 1e-9
    assert optimum - 1e-9 <= rc <= optimum / (1 - gap) + 1e-9


def test_large_budget_keeps_everything():
    g = Graph.chain([3, 4, 5, 6, 7], [0, 1, 1, 1, 1])
    result = checkpoint_search(g, budget=1e9)
    assert set(result.checkpoints) == {1, 2, 3} and result.recompute == 0.0


def test_invalid_arguments():
    with pytest.raises(TypeError, match="solver.Graph"):
        checkpoint_search([1, 2, 3])
    with pytest.raises(ValueError, match="budget"):
        checkpoint_search(Graph.chain([1, 2, 3]), budget=-1)
    with pytest.raises(ValueError, match="gap"):
        checkpoint_search(Graph.chain([1, 2, 3]), budget=10, gap=1.0)


# --------------------------------------------------------------------------- linear graphs
@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=3, max_size=40))
def test_linear_graph_matches_min_peak_chain(sizes):
    from solver.linear import min_peak_chain

    result = checkpoint_search(Graph.chain(sizes))
    assert result.peak == pytest.approx(min_peak_chain(sizes[1:-1]).peak)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=3, max_size=12))
def test_linear_graph_brute_force(sizes):
    g = Graph.chain(sizes)
    assert checkpoint_search(g).peak == pytest.approx(min(m for _, m, _ in brute_all(g)))


def test_fractional_sizes():
    sizes = [0.5, 1.25, 2.5, 0.75, 3.125, 1.5, 0.25]
    g = Graph.chain(sizes)
    assert checkpoint_search(g).peak == pytest.approx(min(m for _, m, _ in brute_all(g)))


def test_large_complex_block_is_consistent():
    # A dense block with more inner vertices than the exact enumeration handles: the
    # heuristic must still return a set whose predicted memory is the model's.
    b = _Builder()
    feats = [b.new(0)]
    for _ in range(COMPLEX_LIMIT + 2):
        feats.append(b.new(*feats))
    b.new(b.new(*feats))
    rng = np.random.default_rng(0)
    g = Graph.from_edges(b.edges, rng.integers(1, 50, b.n).tolist())
    with pytest.warns(RuntimeWarning, match="complex division"):
        result = checkpoint_search(g)
    _check_result(g, result)
    assert result.peak <= g.sizes[1:-1].sum()


def test_too_large_complex_block_is_refused():
    # 61 inner vertices do not fit the 64-bit subset masks: a clear error, not an overflow.
    b = _Builder()
    feats = [b.new(0)]
    for _ in range(61):
        feats.append(b.new(*feats[-3:]))
    b.new(b.new(*feats[-3:]), feats[1])
    g = Graph.from_edges(b.edges, [1.0] * b.n)
    with pytest.raises(ValueError, match="at most 61 are supported"):
        checkpoint_search(g)


# --------------------------------------------------------------------------- simulator
@settings(max_examples=60, deadline=None)
@given(family_graphs())
def test_simulator_agrees_with_the_model(graph):
    result = checkpoint_search(graph)
    forward = float(graph.costs[1:].sum())
    time, peak = simulate_graph(graph, result)
    # Every segment is rebuilt exactly once: time = forward + recompute + 2 x forward.
    assert time == pytest.approx(3 * forward + result.recompute)
    # Backward values: checkpoints + one rebuilt segment at a time + source + target.
    _, values = simulate_graph(graph, result, gradients=False, phase="backward")
    ends = float(graph.sizes[graph.source] + graph.sizes[graph.target])
    assert values <= result.peak + ends + 1e-9
    assert peak >= values
    # Joins reading their inputs (conservative): valid too, never cheaper, and then a
    # gradient is only stored while its vertex's value is: gradients at most double the peak.
    _, strict = simulate_graph(graph, result, gradients=False, phase="backward", joins_read_inputs=True)
    assert strict >= values - 1e-9
    _, strict_all = simulate_graph(graph, result, gradients=False, joins_read_inputs=True)
    _, strict_grads = simulate_graph(graph, result, joins_read_inputs=True)
    assert strict_all <= strict_grads <= 2 * strict_all + 1e-9


@settings(max_examples=30, deadline=None)
@given(family_graphs(), st.data())
def test_simulator_runs_any_checkpoint_set(graph, data):
    inner = list(graph.names[1:-1])
    kept = data.draw(st.lists(st.sampled_from(inner), unique=True)) if inner else []
    time, _ = simulate_graph(graph, kept)
    recompute = sum(graph.cost(v) for v in inner if v not in kept)
    assert time == pytest.approx(3 * float(graph.costs[1:].sum()) + recompute)


def test_simulator_hand_worked_chain():
    # s(1) -> a(2) -> b(4) -> t(1), keep a. Forward: s, a, b(7), t(8), free b (4).
    # loss: +g_t 1 (5). Rebuild b: 9. B(t): g_b +4 = 13, then g_t freed (12).
    g = Graph.chain([1, 2, 4, 1], [0, 1, 1, 1])
    ops = schedule_graph(g, [1])
    assert ops[:6] == (("F", 1), ("F", 2), ("F", 3), ("free", 2), ("loss", 3), ("F", 2))
    time, peak = simulate_graph(g, ops=ops)
    assert time == 3 + 1 + 2 * 3
    assert peak == 13.0
    assert simulate_graph(g, [1], gradients=False) == (10.0, 8.0)


@pytest.mark.parametrize(
    "ops, message",
    [
        ([("F", 2)], "inputs \\[1\\] of 2 are not stored"),
        ([("F", 1), ("F", 1)], "already stored"),
        ([("F", 0)], "source is given"),
        ([("free", 1)], "not stored"),
        ([("F", 1), ("F", 2), ("F", 3), ("B", 3)], "gradient of 3 is missing"),
        ([("F", 1), ("F", 2), ("F", 3), ("loss", 3), ("B", 2)], "readers \\[3\\]"),
        ([("F", 1), ("F", 2), ("F", 3), ("free", 2), ("loss", 3), ("B", 3)], "values \\[3, 2\\]|values \\[2\\]"),
        ([("loss", 3)], "target's value"),
        ([("F", 1), ("loss", 1)], "seeds the target"),
        ([("jump", 1)], "unknown kind"),
        ([("F", 9)], "no vertex 9"),
        ([("F", 1), ("F", 2), ("F", 3), ("loss", 3), ("B", 3)], "never runs the backward"),
    ],
)
def test_simulator_rejects_invalid_sequences(ops, message):
    g = Graph.chain([1, 2, 4, 1])
    with pytest.raises(ValueError, match=message):
        simulate_graph(g, ops=ops)


def test_simulator_argument_errors():
    g = Graph.chain([1, 2, 1])
    with pytest.raises(ValueError, match="exactly one"):
        simulate_graph(g)
    with pytest.raises(ValueError, match="phase"):
        simulate_graph(g, [], phase="middle")
