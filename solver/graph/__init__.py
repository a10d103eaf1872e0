"""The graph model: a DAG of tensors, each with its size and the cost of producing it.

Feng & Huang's model (CVPR 2021, arXiv:1808.00079): keep a set of tensors; the training
memory is what they hold plus the largest segment rebuilt in the backward pass. Here are the
graph itself, that memory model, the optimal checkpoint search over division trees (its
dynamic program, Pareto fronts and Lagrangian bounds) and the graph simulator that runs a
checkpoint set as explicit ops.
"""

from .graph import Graph
from .model import graph_segments, training_memory
from .search import checkpoint_search
from .simulator import schedule_graph, simulate_graph

__all__ = [
    "checkpoint_search",
    "Graph",
    "graph_segments",
    "schedule_graph",
    "simulate_graph",
    "training_memory",
]
