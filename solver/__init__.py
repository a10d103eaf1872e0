"""jaxremat's solver: cost models and rematerialization algorithms, framework-agnostic.

This package never imports JAX: it works on plain numbers (numpy, numba, scipy).
"""

from .chain import Chain
from .errors import InfeasibleBudget, format_bytes
from .schedule import (
    Checkpoint,
    Layer,
    Op,
    OpKind,
    Plan,
    Schedule,
    format_plan,
    make_schedule,
    plan_to_ops,
    validate_plan,
)
from .simulate import MemoryState, apply_op, drop, initial_state, memory_trace, simulate
from .checkpoint_set import CheckpointSet
from .graph import Graph
from .linear import min_peak_chain
from .baselines import BASELINE_METHODS, baseline_schedule
from .exhaustive import ExhaustiveResult, exhaustive_optimum, exhaustive_search
from .chains import random_chain, resnet_like, transformer_like
from .rotor import RotorTable, min_peak_schedule, rotor_min_budget
from .solve import METHODS, solve
from .acg import checkpoint_search
from .graph_model import graph_segments, training_memory
from .graph_simulate import schedule_graph, simulate_graph
from .ilp import IlpSolution, ilp_min_peak, solve_ilp
from .training_graph import TrainingGraph

__all__ = [
    "apply_op",
    "BASELINE_METHODS",
    "baseline_schedule",
    "Chain",
    "Checkpoint",
    "checkpoint_search",
    "CheckpointSet",
    "drop",
    "exhaustive_optimum",
    "exhaustive_search",
    "ExhaustiveResult",
    "format_bytes",
    "format_plan",
    "Graph",
    "graph_segments",
    "ilp_min_peak",
    "IlpSolution",
    "InfeasibleBudget",
    "initial_state",
    "Layer",
    "make_schedule",
    "memory_trace",
    "MemoryState",
    "METHODS",
    "min_peak_chain",
    "min_peak_schedule",
    "Op",
    "OpKind",
    "Plan",
    "plan_to_ops",
    "random_chain",
    "resnet_like",
    "rotor_min_budget",
    "RotorTable",
    "Schedule",
    "schedule_graph",
    "simulate",
    "simulate_graph",
    "solve",
    "solve_ilp",
    "training_memory",
    "TrainingGraph",
    "transformer_like",
    "validate_plan",
]
