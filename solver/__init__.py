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
from .simulate import MemoryState, apply_op, drop, initial_state, simulate
