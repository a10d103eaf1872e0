"""solver.Graph: construction, topological ids, queries and every validation error."""

import math

import numpy as np
import pytest

from solver import Graph

DIAMOND = [("x", "a"), ("x", "b"), ("a", "y"), ("b", "y")]


def test_from_edges_orders_topologically_with_given_tie_break():
    # sizes' order is the tie-break: b before a.
    g = Graph.from_edges(DIAMOND, {"y": 1, "b": 2, "a": 3, "x": 4}, {"x": 0, "a": 5, "b": 6, "y": 7})
    assert g.names == ("x", "b", "a", "y")
    assert g.topological_order == g.names
    assert len(g) == 4
    assert g.source == 0 and g.target == 3
    np.testing.assert_array_equal(g.sizes, [4, 2, 3, 1])
    np.testing.assert_array_equal(g.costs, [0, 6, 5, 7])
    assert g.edges.tolist() == [[0, 1], [0, 2], [1, 3], [2, 3]]
    assert g.preds == ((), (0,), (0,), (1, 2))
    assert g.succs == ((1, 2), (3,), (3,), ())
    assert g.predecessors("y") == ("b", "a")
    assert g.successors("x") == ("b", "a")
    assert g.size("a") == 3.0 and g.cost("b") == 6.0
    assert g.index("y") == 3
    assert not g.is_linear
    # every edge goes forward in id order
    assert np.all(g.edges[:, 0] < g.edges[:, 1])
    assert g.adjacency()[0, 1] and not g.adjacency()[1, 0]
    assert "4 vertices" in repr(g) and "4 edges" in repr(g) and "'x'" in repr(g)


def test_arrays_are_read_only_and_duplicates_merge():
    g = Graph.from_edges([(0, 1), (0, 1), (1, 2)], [1, 2, 3])
    assert len(g.edges) == 2
    for array in (g.sizes, g.costs, g.edges):
        with pytest.raises(ValueError):
            array[0] = 0


def test_default_costs_and_chain():
    g = Graph.chain([5, 6, 7])
    assert g.is_linear and g.names == (0, 1, 2)
    np.testing.assert_array_equal(g.costs, [0, 1, 1])  # the source is given, not computed
    h = Graph.chain([5, 6, 7], [1, 2, 3])
    np.testing.assert_array_equal(h.costs, [1, 2, 3])


def test_topological_order_respects_late_listed_vertices():
    # 'a' is listed last but must come right after the source.
    g = Graph.from_edges([("s", "a"), ("a", "b"), ("b", "t")], {"t": 1, "b": 1, "s": 1, "a": 1})
    assert g.names == ("s", "a", "b", "t") and g.is_linear


def test_unknown_vertex_queries():
    g = Graph.chain([1, 1])
    with pytest.raises(KeyError, match="no vertex 'z'"):
        g.index("z")


@pytest.mark.parametrize(
    "edges, sizes, costs, message",
    [
        ([("a", "b"), ("b", "c")], {"a": 1, "b": 1}, None, "names vertex 'c'.*no size"),
        ([("a", "a"), ("a", "b")], {"a": 1, "b": 1}, None, "self-loop"),
        ([("a", "b"), ("b", "c"), ("c", "b"), ("c", "d")], {"a": 1, "b": 1, "c": 1, "d": 1}, None, "cycle"),
        ([("a", "b"), ("b", "a")], {"a": 1, "b": 1}, None, "no source"),
        ([("a", "c"), ("b", "c")], {"a": 1, "b": 1, "c": 1}, None, "exactly one source.*'a', 'b'"),
        ([("a", "b"), ("a", "c")], {"a": 1, "b": 1, "c": 1}, None, "exactly one target.*'b', 'c'"),
        ([("a", "b")], {"a": 1, "b": 1, "z": 1}, None, "exactly one source"),
        ([], {"a": 1}, None, "at least two vertices"),
        ([("a", "b")], {"a": 1, "b": -1}, None, "vertex 'b'.*non-negative"),
        ([("a", "b")], {"a": math.inf, "b": 1}, None, "vertex 'a'.*finite"),
        ([("a", "b")], {"a": float("nan"), "b": 1}, None, "vertex 'a'"),
        ([("a", "b")], {"a": "big", "b": 1}, None, "vertex 'a'.*not a number"),
        ([("a", "b")], {"a": 1, "b": 1}, {"a": 1}, "vertex 'b' has no cost"),
        ([("a", "b")], {"a": 1, "b": 1}, {"a": 1, "b": 1, "q": 1}, "unknown vertex 'q'"),
        ([("a", "b")], {"a": 1, "b": 1}, {"a": 1, "b": -2}, "vertex 'b'.*cost"),
        ([(0, 1)], [1, 1], [1], "costs: expected 2 values"),
        ([("a",)], {"a": 1, "b": 1}, None, "not a \\(u, v\\) pair"),
    ],
)
def test_validation_errors(edges, sizes, costs, message):
    with pytest.raises(ValueError, match=message):
        Graph.from_edges(edges, sizes, costs)
