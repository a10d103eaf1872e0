"""jaxremat: optimal rematerialization (activation checkpointing) for JAX and Flax.

Plan which activations to keep and which to recompute under a memory budget, then run the
plan with nested ``jax.checkpoint`` (or ``jax.custom_vjp``) segments:

* :func:`remat_sequence` -- a sequence of pure layers ``layer(params, x) -> y``;
* :func:`remat_scan` -- one layer scanned over stacked parameters (``lax.scan``), as
  nested scans of checkpointed segments, a program whose size does not grow with depth;
* :func:`remat_graph` -- any function ``fn(params, x)``: Feng & Huang's checkpoints on its
  dataflow graph (branches, residuals, concatenations);
* :mod:`jaxremat.flax` -- Flax NNX and Linen wrappers (imported on demand);
* :func:`profile_layers` -- the cost model of a sequence (sizes, times, transients);
* :func:`activation_memory` / :func:`program_memory` -- program-order memory on the jaxpr,
  the meter that shows rematerialization on CPU;
* budgets: :func:`parse_budget`, :func:`resolve_budget`, :func:`budget_from_device`.

The algorithms live in the framework-agnostic :mod:`solver` package.
"""

from .measure.device import budget_from_device
from .budget import format_bytes, parse_budget, resolve_budget
from .measure.meter import activation_memory, program_memory
from .sequence.plan import Plan
from .sequence.profile import profile_layers
from .graph.remat import GraphPlan, RematGraph, remat_graph
from .scan.remat import RematScan, ScanPlan, remat_scan
from .sequence.remat import RematSequence, remat_sequence

__all__ = [
    "GraphPlan",
    "Plan",
    "ScanPlan",
    "RematGraph",
    "RematScan",
    "RematSequence",
    "activation_memory",
    "budget_from_device",
    "format_bytes",
    "parse_budget",
    "profile_layers",
    "program_memory",
    "remat_graph",
    "remat_scan",
    "remat_sequence",
    "resolve_budget",
]
