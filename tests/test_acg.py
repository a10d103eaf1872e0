"""checkpoint_search (Feng & Huang) against brute force, and the graph simulator.

The brute force below is written independently of solver.graph.model: segments are found
with union-find and merged with a transitive closure (Floyd-Warshall) of the quotient
graph, then every subset of inner vertices is tried.
"""

import itertools

import pytest
from hypothesis import given, strategies as st

from solver import CheckpointSet, Graph, checkpoint_search
from solver.graph.division import Complex, Parallel, Series, division_tree

from tiers import sweep

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


@sweep(70, quick=15)
@given(family_graphs())
def test_least_memory_equals_brute_force(graph):
    result = checkpoint_search(graph)
    assert isinstance(result, CheckpointSet)
    _check_result(graph, result)
    best = min(mem for _, mem, _ in brute_all(graph))
    assert result.peak == pytest.approx(best)


@sweep(15, quick=4)
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


def _closure(n, edges):
    """reach[a, b]: a path of length >= 0 from a to b (transitive closure, Warshall)."""
    import numpy as np

    reach = np.eye(n, dtype=bool)
    for a, b in edges:
        reach[a, b] = True
    for k in range(n):
        reach |= reach[:, [k]] & reach[[k], :]
    return reach


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=20),
    st.sets(st.integers(0, n - 1)))))
def test_compiled_segments_and_sccs_against_reachability(case):
    # merged_segments and strongly_connected are compiled (numba); check them against their
    # definitions: mutual reachability, in a topological order of the quotient graph.
    from solver.graph.model import merged_segments, strongly_connected

    n, edges, recomputed = case
    edges = [(a, b) for a, b in edges if a != b]
    succ = [set() for _ in range(n)]
    for a, b in edges:
        succ[a].add(b)
    reach = _closure(n, edges)
    sccs = strongly_connected(n, succ)
    assert sorted(v for g in sccs for v in g) == list(range(n))
    for i, g in enumerate(sccs):
        assert all(reach[u, v] and reach[v, u] for u in g for v in g)
        for h in sccs[i + 1:]:  # reverse topological: nothing earlier reaches a later one
            assert not any(reach[u, v] for u in g for v in h)
    undirected = edges + [(b, a) for a, b in edges if a in recomputed and b in recomputed]
    inner = _closure(n, [(a, b) for a, b in undirected if a in recomputed and b in recomputed])
    comp = {v: min(u for u in recomputed if inner[u, v]) for v in recomputed}  # component ids
    node = {v: ("c", comp[v]) if v in recomputed else ("k", v) for v in range(n)}
    names = sorted(set(node.values()))
    q = _closure(len(names), [(names.index(node[a]), names.index(node[b])) for a, b in edges])
    segments = merged_segments(n, edges, recomputed)
    assert sorted(v for s in segments for v in s) == sorted(recomputed)
    where = {v: k for k, s in enumerate(segments) for v in s}
    for s in segments:
        assert s == sorted(s)
    for u in recomputed:
        for v in recomputed:
            qu, qv = names.index(node[u]), names.index(node[v])
            assert (where[u] == where[v]) == bool(q[qu, qv] and q[qv, qu])
            if where[u] < where[v]:
                assert not q[qv, qu]  # topological: a later segment never feeds an earlier one
