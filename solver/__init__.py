"""jaxremat's solver: cost models and rematerialization algorithms, framework-agnostic.

This package never imports JAX: it works on plain numbers (numpy, numba, scipy).

One subpackage per model: :mod:`solver.chain` (Rotor's chains of layers), :mod:`solver.graph`
(Feng & Huang's computation graphs) and :mod:`solver.ilp` (Checkmate's integer program). The
pieces they share stand at the top: errors, :class:`CheckpointSet`, :func:`solve` (which picks
a chain method, the ILP included) and :mod:`solver.compare`. Every public name is here.
"""

from . import chain, graph, ilp
from .chain import (
    BASELINE_METHODS,
    Chain,
    Checkpoint,
    ExhaustiveResult,
    Layer,
    LayerOptions,
    MemoryState,
    Op,
    OpKind,
    Plan,
    RotorTable,
    Schedule,
    apply_op,
    baseline_schedule,
    drop,
    exhaustive_optimum,
    exhaustive_search,
    format_plan,
    initial_state,
    make_schedule,
    memory_trace,
    min_peak_chain,
    min_peak_schedule,
    plan_to_ops,
    random_chain,
    refined_schedule,
    resnet_like,
    rotor_min_budget,
    simulate,
    transformer_like,
    uniform_plans,
    UNIFORM_PREFIX,
    validate_plan,
    with_random_options,
)
from .checkpoint_set import CheckpointSet
from .errors import InfeasibleBudget, format_bytes
from .graph import (
    Graph,
    checkpoint_search,
    graph_segments,
    schedule_graph,
    simulate_graph,
    training_memory,
)
from .ilp import ChainBound, IlpSolution, TrainingGraph, chain_time_bound, ilp_min_peak, solve_ilp
from .solve import MAX_SLOTS, METHODS, is_uniform_method, scaled_slots, solve

__all__ = [
    *chain.__all__,
    *graph.__all__,
    *ilp.__all__,
    "CheckpointSet",
    "format_bytes",
    "InfeasibleBudget",
    "MAX_SLOTS",
    "METHODS",
    "is_uniform_method",
    "scaled_slots",
    "solve",
]
