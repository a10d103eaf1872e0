"""``solve``: the one entry point from a chain and a memory budget to a schedule.

``METHODS`` lists the methods whose schedules carry a nested plan (what the JAX frontend
applies). ``"ilp"`` (Checkmate's ILP, :mod:`solver.ilp.chain_adapter`) is accepted by
:func:`solve` too, but is not in ``METHODS``: its schedules are not persistent
(``plan is None``), an optimality oracle rather than something to apply.
"""

from __future__ import annotations

import math
import numbers
from typing import Mapping, Sequence

import numpy as np

from .chain.baselines import BASELINE_METHODS, baseline_schedule
from .chain.chain import Chain
from .chain.refine import refined_schedule
from .chain.rotor import rotor_min_budget
from .chain.schedule import Schedule
from .chain.simulator import make_schedule
from .chain.uniform import UNIFORM_PREFIX, uniform_plans
from .errors import InfeasibleBudget
from .ilp.chain_adapter import ilp_chain_schedule

__all__ = ["solve", "METHODS", "is_uniform_method"]

METHODS = ("rotor",) + tuple(BASELINE_METHODS)
ORACLE_METHODS = ("ilp",)  # accepted by solve, but their schedules have no plan

# Relative slack when checking a schedule's simulated peak against the budget: sizes are
# summed in a different order by the DP and by the simulator.
_PEAK_TOLERANCE = 1e-9

MAX_SLOTS = 20000
"""The most slots :func:`scaled_slots` gives a short chain."""

_REFERENCE_LENGTH = 200  # scaled_slots keeps the table work of ``slots`` at this length


def _check_arguments(chain: Chain, budget: float, method: str, slots: int) -> float:
    if not isinstance(chain, Chain):
        raise TypeError(f"solve expects a solver.Chain, got {type(chain).__name__}.")
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise ValueError(f"budget must be a positive number, got {budget!r}.")
    budget = float(budget)
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(
            f"budget must be finite and > 0 (same units as the chain's sizes), got {budget!r}. "
            f"Pass the memory available for activations, e.g. in bytes."
        )
    if isinstance(slots, bool) or not isinstance(slots, numbers.Integral) or slots < 1:
        raise ValueError(
            f"slots must be an integer >= 1 (Rotor uses 500), got {slots!r}. More slots "
            f"round sizes more finely, at a cost linear in slots."
        )
    if method not in METHODS + ORACLE_METHODS and not is_uniform_method(method):
        raise ValueError(f"Unknown method {method!r}; choose one of {METHODS + ORACLE_METHODS}, "
                         f"or {UNIFORM_PREFIX!r} and an option's name.")
    return budget


def is_uniform_method(method: str) -> bool:
    """Whether ``method`` names a uniform option plan: ``"uniform:<option name>"``."""
    return isinstance(method, str) and method.startswith(UNIFORM_PREFIX) and (
        len(method) > len(UNIFORM_PREFIX))


def scaled_slots(length: int, slots: int = 500) -> int:
    """The slot count for Rotor's table on a chain of ``length`` layers: ``slots`` times the
    whole part of ``(200 / length) ** 2``, at least ``slots`` and at most :data:`MAX_SLOTS`
    (when ``slots`` is below it).

    The table has ``length ** 2`` subproblems per memory slot, so a short chain affords
    finer units for the work ``slots`` cost at 200 layers. The unit is then a whole fraction
    of ``budget / slots``, so no size is rounded up more than with ``slots``. That matters
    at tight budgets: a whole-model fit (:mod:`jaxremat.flax`) probes budgets equal to
    plans' peaks, and with 500 slots on 6 layers the rounded table missed the optimum there
    (a ResNet of 6 blocks, five options per block: 4% slower than the exhaustive optimum,
    which 10000 slots find; benchmarks/RESULTS.md, "session 15")."""
    if length < 1 or slots < 1:
        raise ValueError(f"length and slots must be positive, got {length!r} and {slots!r}.")
    factor = min(MAX_SLOTS // int(slots), int((_REFERENCE_LENGTH / length) ** 2))
    return int(slots) * max(1, factor)


def solve(
    chain: Chain,
    budget: float,
    *,
    method: str = "rotor",
    slots: int = 500,
    time_limit: float = 60.0,
    aliases: Sequence[Mapping[str, str]] | None = None,
) -> Schedule:
    """The fastest schedule of ``chain`` whose peak memory fits ``budget``.

    Args:
      chain: the costs of the layers.
      budget: the memory available, in the unit of the chain's sizes, ``x[0]`` included.
      method: ``"rotor"`` (Rotor's dynamic program, ALGORITHMS.md section 2), a baseline
        (``"none"``, ``"every_layer"``, ``"sqrt"``, ``"revolve"``; see
        :mod:`solver.chain.baselines`), ``"uniform:<option name>"`` (every layer under that
        option, the uniform policy a practitioner picks by hand,
        :func:`solver.chain.uniform.uniform_plans`; ``aliases`` as for ``"rotor"``),
        or ``"ilp"``: Checkmate's ILP (:mod:`solver.ilp.chain_adapter`), the least time over
        non-persistent schedules of its class, for tapeless chains only
        (``xbar_size == x_size[1:]``, no temporaries) and a few dozen layers. Its
        schedule has ``plan=None`` and drops in ``ops`` (cost it with
        :func:`solver.chain.exhaustive.replay`); its time is a lower bound on ``"rotor"``'s.
      slots: Rotor's memory discretisation: sizes are rounded up to units of
        ``budget / slots``. Integer sizes with ``slots >= budget`` are solved exactly.
      time_limit: seconds HiGHS may spend for ``"ilp"`` (ignored otherwise); past it the
        best schedule found is returned and its ``method`` says it is not proven optimal.
      aliases: for ``"rotor"`` on a chain with options, per layer, option names the layer
        lacks mapped to the name of the option standing in for each (merged or dominating;
        :func:`solver.chain.uniform.uniform_plans`); a name with no alias means the whole tape.

    With per-layer options (``Chain.options``), ``"rotor"`` picks the best option for every
    ``Layer`` of its plan; the baselines run option 0 (the whole tape).

    For ``"rotor"`` the DP's schedule (or, if rounding makes the DP infeasible although the
    budget suffices, the exact minimum-peak schedule), refined by the DP's plans for up to
    5% more rounded memory that still fit (:func:`solver.chain.refine.refined_schedule`),
    is compared with every baseline and every uniform option plan (every layer under the
    same option, :func:`solver.chain.uniform.uniform_plans`) that fits, and the fastest is
    returned (ties: lower peak, then Rotor), so Rotor never loses to a uniform choice it
    could have made. Its ``method`` names the solver whose schedule won (``"rotor"``, a
    baseline, or ``"uniform:<option name>"``).

    Returns:
      A :class:`Schedule` whose simulated peak is ``<= budget``.

    Raises:
      InfeasibleBudget: no schedule of ``method`` fits; ``.min_budget`` is the least budget
        that works.
      ValueError: invalid ``budget``, ``slots`` or ``method``, or ``"ilp"`` on a chain with
        tapes or temporaries.
      NotImplementedError: ``"ilp"`` on a chain whose layers offer several options
        (``Chain.options``); ``"rotor"`` chooses among them, the baselines use option 0.
      RuntimeError: ``"ilp"`` found no schedule within ``time_limit``.
    """
    budget = _check_arguments(chain, budget, method, slots)
    if method == "ilp":
        schedule = ilp_chain_schedule(chain, budget, time_limit=time_limit)
    elif is_uniform_method(method):
        schedule = _uniform_schedule(chain, method, budget, aliases)
    elif method != "rotor":
        schedule = baseline_schedule(chain, method, budget)
    else:
        candidates = []
        try:
            candidates.append(refined_schedule(chain, budget, int(slots)))
        except InfeasibleBudget:
            pass
        for name in BASELINE_METHODS:
            try:
                candidates.append(baseline_schedule(chain, name, budget))
            except InfeasibleBudget:
                pass
        fastest = min((s.time for s in candidates), default=math.inf)
        candidates += _uniform_options(chain, budget, aliases, fastest)
        if not candidates:
            raise InfeasibleBudget(budget, rotor_min_budget(chain), "rotor")
        schedule = min(candidates, key=lambda s: (s.time, s.peak))
    if schedule.peak > budget * (1 + _PEAK_TOLERANCE):
        raise AssertionError(
            f"Internal error: the {schedule.method!r} schedule peaks at {schedule.peak!r} "
            f"over the budget {budget!r}. Please report this chain."
        )
    return schedule


def _uniform_schedule(chain: Chain, method: str, budget: float,
                      aliases: Sequence[Mapping[str, str]] | None) -> Schedule:
    """The uniform option plan ``method`` names (every layer under that option,
    :func:`solver.chain.uniform.uniform_plans`), if it fits ``budget``."""
    plans = uniform_plans(chain, aliases)
    if method not in plans:
        known = sorted(name for name in plans if name.startswith(UNIFORM_PREFIX))
        raise ValueError(f"method {method!r}: no layer of the chain has that option; the "
                         f"uniform plans it offers are {known} (and 'none', 'every_layer').")
    schedule = make_schedule(chain, plans[method], method)
    if schedule.peak > budget * (1 + _PEAK_TOLERANCE):
        raise InfeasibleBudget(budget, schedule.peak, method)
    return schedule


def _uniform_options(chain: Chain, budget: float, aliases: Sequence[Mapping[str, str]] | None,
                     time: float) -> list[Schedule]:
    """The uniform option plans (every layer under one option) that fit ``budget`` and take
    at most ``time``. Such a plan recomputes nothing, so its time is the sum of its options'
    forward and backward times: only those no slower than ``time`` are simulated."""
    table = chain.options
    fitting, seen = [], set()
    for method, plan in uniform_plans(chain, aliases).items():
        if not method.startswith(UNIFORM_PREFIX) or plan in seen:
            continue
        seen.add(plan)
        rows, options = np.arange(chain.length), [item.option for item in plan]
        if np.sum(table.fwd_time[rows, options] + table.bwd_time[rows, options]) > time * (
                1 + _PEAK_TOLERANCE):
            continue
        schedule = make_schedule(chain, plan, method)
        if schedule.peak <= budget * (1 + _PEAK_TOLERANCE):
            fitting.append(schedule)
    return fitting
