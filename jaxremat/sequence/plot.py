"""Pictures of a rematerialization plan: memory over the schedule, and time versus budget.

:func:`plot_plan` draws, for a :class:`jaxremat.Plan` (``Plan.plot(path)`` delegates here),
a PNG with two panels:

1. *Memory over the schedule*: the memory in use while each op of Rotor's op sequence runs
   (the simulator's peak candidate, :func:`solver.memory_trace`), x-axis the op index, for
   the chosen schedule and, as thinner lines, the "none" (store everything) and
   "every_layer" baselines, with the budget as a horizontal line. The chosen schedule's
   forward and backward phases are shaded and its recomputed forwards (forward ops after the
   loss) are marked.
2. *Time versus budget*: the optimal time (Rotor's DP, :func:`solver.solve`) over a sweep of
   budgets from the smallest feasible one to the no-remat peak, with the baselines as points
   and the chosen plan highlighted.

:meth:`jaxremat.Plan.compare` prints the same comparison as a table (every method's time
overhead per budget, :mod:`solver.compare`).

The numbers behind both panels come from :func:`memory_curves` and :func:`tradeoff_curve`,
which need only numpy, so they are usable (and tested) without matplotlib. matplotlib is an
optional extra: ``pip install jaxremat[plot]``.

Reference for the model: Beaumont et al., Rotor (arXiv:1911.13214), section 3; ALGORITHMS.md
section 1 for the ops and their peak candidates.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

import numpy as np

import solver
from solver import Chain, InfeasibleBudget, OpKind, Schedule
from solver.chain.baselines import BASELINE_METHODS, baseline_schedule
from solver.compare import budget_range, compare_methods

__all__ = [
    "MemoryCurve",
    "TradeoffCurve",
    "memory_curves",
    "tradeoff_curve",
    "plot_schedule",
    "plot_plan",
]

_FORWARD_KINDS = (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE)


@dataclasses.dataclass(frozen=True)
class MemoryCurve:
    """Memory over one schedule's op sequence.

    Attributes:
      method: the schedule's method.
      during: memory in use while op ``k`` runs (its peak candidate: temporaries included).
      after: memory held once op ``k`` is done.
      loss_index: position of the ``loss`` op: ops before it are the forward phase.
      recomputed: positions of forward ops that run after the loss (recomputations).
      peak: the schedule's peak (max of ``during`` and the starting memory ``x[0]``).
    """

    method: str
    during: np.ndarray
    after: np.ndarray
    loss_index: int
    recomputed: np.ndarray
    peak: float


@dataclasses.dataclass(frozen=True)
class TradeoffCurve:
    """Least time per budget for one method, plus single-schedule baselines.

    Attributes:
      budgets: the budgets swept, increasing.
      times: the method's schedule time at each budget (``nan`` where none fits).
      baselines: ``{method: (peak, time)}`` for each baseline schedule.
      min_budget: the smallest budget for which the method finds a schedule.
      no_remat_time: time of the "none" schedule (every tape stored).
    """

    budgets: np.ndarray
    times: np.ndarray
    baselines: dict[str, tuple[float, float]]
    min_budget: float
    no_remat_time: float


def memory_curves(chain: Chain, schedule: Schedule) -> MemoryCurve:
    """The memory in use over ``schedule``'s ops on ``chain`` (via :func:`solver.memory_trace`)."""
    trace = solver.memory_trace(chain, schedule.ops)
    kinds = [OpKind(op[0]) for op, _, _ in trace]
    loss_index = kinds.index(OpKind.LOSS)
    recomputed = np.array(
        [k for k, kind in enumerate(kinds) if kind in _FORWARD_KINDS and k > loss_index], dtype=int
    )
    during = np.array([candidate for _, _, candidate in trace], dtype=np.float64)
    after = np.array([memory for _, memory, _ in trace], dtype=np.float64)
    peak = float(max(during.max(initial=0.0), chain.x_size[0]))
    return MemoryCurve(schedule.method, during, after, loss_index, recomputed, peak)


def _baseline(chain: Chain, method: str) -> Schedule | None:
    """A baseline's schedule whatever the budget (the budget only decides if it fits)."""
    try:
        return baseline_schedule(chain, method, math.inf)
    except InfeasibleBudget:
        return None


def tradeoff_curve(
    chain: Chain,
    *,
    points: int = 16,
    method: str = "rotor",
    baselines: Sequence[str] = BASELINE_METHODS,
    slots: int = 500,
) -> TradeoffCurve:
    """Solve ``method`` over ``points`` budgets from Rotor's minimum to the no-remat peak.

    Budgets come from :func:`solver.compare.budget_range` (evenly spaced between the
    smallest feasible budget and the peak of storing every tape, above which storing
    everything is optimal) and times from :func:`solver.compare.compare_methods`. Baselines
    are returned as ``(peak, time)`` points.
    """
    if points < 2:
        raise ValueError(f"points must be at least 2, got {points}.")
    budgets = budget_range(chain, points)
    rows = compare_methods(chain, budgets, methods=(method,), slots=slots)
    times = np.array([np.nan if row.times[0] is None else row.times[0] for row in rows])
    points_by_method = {}
    for name in baselines:
        schedule = _baseline(chain, name)
        if schedule is not None:
            points_by_method[name] = (float(schedule.peak), float(schedule.time))
    return TradeoffCurve(budgets, times, points_by_method, float(budgets[0]),
                         float(rows[0].reference_time))


def _require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "Plotting needs matplotlib, an optional extra of jaxremat. Install it with "
            "`pip install jaxremat[plot]` (or `pip install matplotlib`)."
        ) from None
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _byte_scale(largest: float) -> tuple[float, str]:
    for power, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB")):
        if largest >= 1024**power:
            return float(1024**power), unit
    return 1.0, "bytes"


_COLORS = {"none": "tab:gray", "every_layer": "tab:green", "sqrt": "tab:purple",
           "revolve": "tab:brown"}
_MARKERS = {"none": "s", "every_layer": "D", "sqrt": "^", "revolve": "v"}


def plot_schedule(
    chain: Chain,
    schedule: Schedule,
    path: str | os.PathLike,
    *,
    budget: float | None = None,
    baselines: Sequence[str] = ("none", "every_layer"),
    points: int = 16,
    slots: int = 500,
    title: str | None = None,
    units: str = "bytes",
) -> str:
    """Write the two-panel PNG (see the module docstring) for ``schedule`` on ``chain``.

    Args:
      chain: the chain the schedule was solved for.
      schedule: the chosen schedule.
      path: the PNG file to write.
      budget: the budget line to draw (none if ``None``).
      baselines: methods drawn next to the schedule in the memory panel.
      points: number of budgets in the trade-off sweep.
      slots: the DP's memory discretisation for the sweep.
      title: the figure title; defaults to the method, peak and time.
      units: ``"bytes"`` scales the memory axes to KiB/MiB/GiB; anything else labels them
        with that string as is.

    Returns:
      ``str(path)``.
    """
    plt = _require_matplotlib()
    from matplotlib.ticker import MaxNLocator

    chosen = memory_curves(chain, schedule)
    others = []
    for name in baselines:
        if name == schedule.method:
            continue
        other = _baseline(chain, name)
        if other is not None:
            others.append(memory_curves(chain, other))
    curve = tradeoff_curve(chain, points=points, slots=slots)

    largest = max([chosen.peak] + [o.peak for o in others] + [budget or 0.0])
    scale, unit = _byte_scale(largest) if units == "bytes" else (1.0, units)

    fig, (ax_mem, ax_time) = plt.subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.6, 1.0]}
    )
    n_ops = len(chosen.during)
    ax_mem.axvspan(-0.5, chosen.loss_index + 0.5, color="tab:blue", alpha=0.07, lw=0)
    ax_mem.axvspan(chosen.loss_index + 0.5, n_ops - 0.5, color="tab:orange", alpha=0.07, lw=0)
    ymax = largest / scale * 1.4  # head room for the legend
    ax_mem.text(chosen.loss_index / 2, ymax * 0.015, "forward", ha="center", va="bottom",
                color="tab:blue", fontsize=9)
    ax_mem.text((chosen.loss_index + n_ops) / 2, ymax * 0.015, "backward", ha="center",
                va="bottom", color="tab:orange", fontsize=9)
    for other in others:
        ax_mem.step(np.arange(len(other.during)), other.during / scale, where="mid", lw=1.1,
                    ls="--", color=_COLORS.get(other.method, None),
                    label=f"{other.method} (peak {other.peak / scale:.3g} {unit})")
    ax_mem.step(np.arange(n_ops), chosen.during / scale, where="mid", lw=2.0, color="tab:red",
                label=f"{schedule.method or 'chosen'} (peak {chosen.peak / scale:.3g} {unit})")
    if chosen.recomputed.size:
        ax_mem.plot(chosen.recomputed, chosen.during[chosen.recomputed] / scale, "v",
                    color="black", ms=4, label=f"recomputed forward ({chosen.recomputed.size})")
    if budget is not None:
        ax_mem.axhline(budget / scale, color="black", lw=1.2, ls=":",
                       label=f"budget {budget / scale:.3g} {unit}")
    ax_mem.set_ylim(0, ymax)
    ax_mem.set_xlim(-0.5, max(n_ops, *(len(o.during) for o in others)) - 0.5 if others
                    else n_ops - 0.5)
    ax_mem.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_mem.set_xlabel("op index (Rotor's op sequence)")
    ax_mem.set_ylabel(f"memory in use ({unit})")
    ax_mem.set_title("Memory over the schedule")
    ax_mem.legend(loc="upper left", fontsize=8, framealpha=0.9, ncol=2)
    ax_mem.grid(alpha=0.3)

    base_time = curve.no_remat_time or 1.0
    ok = ~np.isnan(curve.times)
    ax_time.plot(curve.budgets[ok] / scale, curve.times[ok] / base_time, "-o", ms=3,
                 color="tab:red", label="rotor (optimal persistent)")
    for name, (peak, time) in curve.baselines.items():
        ax_time.plot(peak / scale, time / base_time, _MARKERS.get(name, "s"), ms=8,
                     color=_COLORS.get(name), alpha=0.8, label=name)
    ax_time.plot(chosen.peak / scale, schedule.time / base_time, "*", ms=14, color="gold",
                 markeredgecolor="black", label="this plan", zorder=5)
    if budget is not None:
        ax_time.axvline(budget / scale, color="black", lw=1.2, ls=":", label="budget")
    ax_time.set_xlabel(f"memory budget ({unit})")
    ax_time.set_ylabel("time / no-remat time")
    ax_time.set_title("Time vs budget")
    ax_time.legend(fontsize=8, framealpha=0.9)
    ax_time.grid(alpha=0.3)

    fig.suptitle(title or (
        f"{chain.length} layers, method {schedule.method!r}: peak {chosen.peak / scale:.3g} "
        f"{unit}, time {schedule.time / base_time:.3f}x no-remat"))
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=110)
    plt.close(fig)
    return os.fspath(path)


def _plan_parts(plan: Any) -> tuple[Chain, Schedule, float | None]:
    """``(chain, schedule, budget)`` of a :class:`jaxremat.Plan`-like object."""
    try:
        chain, schedule = plan.chain, plan.schedule
    except AttributeError:
        raise TypeError(
            f"plot_plan needs a jaxremat Plan (with .chain and .schedule), got "
            f"{type(plan).__name__}. For a bare solver schedule use plot_schedule(chain, "
            "schedule, path)."
        ) from None
    budget = getattr(plan, "budget", None)
    return chain, schedule, None if budget is None else float(budget)


def plot_plan(plan: Any, path: str | os.PathLike, **kwargs: Any) -> str:
    """Write the PNG of :func:`plot_schedule` for a :class:`jaxremat.Plan`.

    ``plan.chain``, ``plan.schedule`` and (if present) ``plan.budget`` are used; keyword
    arguments go to :func:`plot_schedule`. When the plan stores some tapes under a
    checkpoint policy (issue 17), the title lists them (``Plan.policy_summary``).
    Returns ``str(path)``.
    """
    chain, schedule, budget = _plan_parts(plan)
    kwargs.setdefault("budget", budget)
    summary = getattr(plan, "policy_summary", lambda: "")()
    if summary and "title" not in kwargs:  # the checkpoint policy of each stored tape
        base = chain.fwd_time.sum() + chain.bwd_time.sum() or 1.0
        kwargs["title"] = (f"{chain.length} layers, method {schedule.method!r}: time "
                           f"{schedule.time / base:.3f}x no-remat\npolicies: {summary}")
    return plot_schedule(chain, schedule, path, **kwargs)
