"""The chain model: a sequence of layers, each run forward once and backward once.

Rotor's cost model (Beaumont et al., arXiv:1911.13214): per layer the sizes of its output,
tape and temporaries and the times of its forward and backward. Here are the chain itself,
schedules (op sequences and nested plans), per-layer options (Rockmate's multi-option
layers) and the simulator that costs them, Rotor's dynamic
program and its numba kernels, the baselines (sqrt, revolve, ...), the exhaustive oracle for
tiny chains, min-peak checkpoint selection (Hong et al.), chain generators, the uniform
plans (every layer saved alike) and slot refinement.
"""

from .baselines import BASELINE_METHODS, baseline_schedule
from .chain import Chain
from .exhaustive import ExhaustiveResult, exhaustive_optimum, exhaustive_search
from .generators import random_chain, resnet_like, transformer_like, with_random_options
from .min_peak import min_peak_chain
from .options import LayerOptions
from .refine import refined_schedule
from .rotor import RotorTable, min_peak_schedule, rotor_min_budget
from .schedule import (
    Checkpoint,
    Layer,
    Op,
    OpKind,
    Plan,
    Schedule,
    format_plan,
    plan_to_ops,
    validate_plan,
)
from .simulator import (
    MemoryState,
    apply_op,
    drop,
    initial_state,
    make_schedule,
    memory_trace,
    simulate,
)
from .uniform import UNIFORM_PREFIX, uniform_plans

__all__ = [
    "apply_op",
    "BASELINE_METHODS",
    "baseline_schedule",
    "Chain",
    "Checkpoint",
    "drop",
    "exhaustive_optimum",
    "exhaustive_search",
    "ExhaustiveResult",
    "format_plan",
    "initial_state",
    "Layer",
    "LayerOptions",
    "make_schedule",
    "memory_trace",
    "MemoryState",
    "min_peak_chain",
    "min_peak_schedule",
    "Op",
    "OpKind",
    "Plan",
    "plan_to_ops",
    "random_chain",
    "refined_schedule",
    "resnet_like",
    "rotor_min_budget",
    "RotorTable",
    "Schedule",
    "simulate",
    "transformer_like",
    "uniform_plans",
    "UNIFORM_PREFIX",
    "validate_plan",
    "with_random_options",
]
