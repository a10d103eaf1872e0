"""Schedules: the op sequence and the equivalent nested plan.

A *persistent* schedule (Rotor's weak memory persistence) is a tree. We write it as a
*plan*: a tuple of items covering consecutive layers,

- ``Layer(i)``: run layer ``i`` in "save all" mode (``F_all``); its backward ``B(i)`` runs
  when the backward pass reaches it. In JAX: call the layer plainly, autodiff keeps its
  residuals (the tape). ``Layer(i, k)``: the same with the layer's option ``k``
  (:mod:`solver.chain.options`; in JAX the layer under ``jax.checkpoint`` with policy ``k``);
  ``Layer(i) == Layer(i, 0)``, the whole tape.
- ``Checkpoint(start, stop, body)``: run layers ``start .. stop-1`` keeping only the
  segment's input (``F_ck(start)``, ``F_none(start+1 .. stop-1)``). When the backward pass
  reaches the segment, ``body`` (a plan for the same layers) runs forward then backward. In
  JAX: ``jax.checkpoint`` of a function that applies ``body``.

``plan_to_ops`` turns a plan into Rotor's op sequence, which :func:`solver.simulate`
checks. Every solver in this package returns a plan, so the op sequence, the simulated cost
and the JAX application all come from one structure.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Sequence, Union

from .chain import Chain
from .options import option_index

__all__ = [
    "OpKind",
    "Op",
    "Layer",
    "Checkpoint",
    "Plan",
    "Schedule",
    "plan_to_ops",
    "validate_plan",
    "format_plan",
]


class OpKind(str, enum.Enum):
    """The five operations of Rotor's model (ALGORITHMS.md section 1)."""

    F_ALL = "F_all"
    F_CK = "F_ck"
    F_NONE = "F_none"
    LOSS = "loss"
    B = "B"

    def __str__(self) -> str:
        return self.value


Op = tuple
"""``(OpKind, i)``, or ``(OpKind.F_ALL, i, k)`` for ``F_all(i)`` with option ``k >= 1``.

A plain tuple so that ``("F_all", 0)`` compares equal; ``op[0]`` is the kind and ``op[1]``
the layer (``L`` for the loss)."""


@dataclasses.dataclass(frozen=True)
class Layer:
    """Run layer ``index`` keeping its tape: the whole tape, or that of ``option`` (>= 1)."""

    index: int
    option: int = 0

    @property
    def start(self) -> int:
        return self.index

    @property
    def stop(self) -> int:
        return self.index + 1


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Run layers ``start .. stop-1`` keeping only their input; recompute with ``body``."""

    start: int
    stop: int
    body: "Plan"


Plan = tuple[Union[Layer, Checkpoint], ...]


def _check_option(item: Layer, chain: Chain | None) -> None:
    option = item.option
    if chain is not None:
        try:
            option_index(chain, item.index, option)
        except ValueError as error:
            raise ValueError(f"Plan item {item!r}: {error}") from None
    elif isinstance(option, bool) or not hasattr(option, "__index__") or option < 0:
        raise ValueError(f"{item!r}: a layer's option is an integer >= 0.")


def validate_plan(plan: Plan, start: int, stop: int, *, chain: Chain | None = None) -> None:
    """Raise ``ValueError`` unless ``plan`` covers layers ``start .. stop-1`` exactly once.

    Every ``Layer``'s option must be an integer ``>= 0``; given ``chain``, one its layer
    offers (option 0 only for a chain without options). A checkpoint's body must itself cover the checkpoint's layers and must end with a
    ``Layer``: a body ending in a checkpoint would store the segment's output on its own
    during the recomputation, where nothing frees it (Rotor's DP never builds one).
    Iterative, so plans nested thousands of levels deep are fine.
    """
    pending = [(plan, start, stop, False)]
    while pending:
        items, first, last, is_body = pending.pop()
        position = first
        for item in items:
            if isinstance(item, Checkpoint):
                if item.stop <= item.start:
                    raise ValueError(f"Checkpoint {item.start}..{item.stop} is empty.")
                pending.append((item.body, item.start, item.stop, True))
            elif not isinstance(item, Layer):
                raise TypeError(f"Plan items are Layer or Checkpoint, got {type(item).__name__}.")
            else:
                _check_option(item, chain)
            if item.start != position:
                raise ValueError(f"Plan item {item!r} does not start at layer {position}.")
            position = item.stop
        if position != last:
            raise ValueError(
                f"Plan covers layers {first}..{position - 1}, expected {first}..{last - 1}."
            )
        if is_body and not isinstance(items[-1], Layer):
            raise ValueError(
                f"The body of checkpoint {first}..{last - 1} ends with a checkpoint; end it with "
                f"Layer({last - 1}) (recompute the last layer with its tape)."
            )


def _forward_ops(plan: Plan) -> list[Op]:
    ops: list[Op] = []
    for item in plan:
        if isinstance(item, Layer):
            ops.append((OpKind.F_ALL, item.index, item.option) if item.option else
                       (OpKind.F_ALL, item.index))
        else:
            ops.append((OpKind.F_CK, item.start))
            ops.extend((OpKind.F_NONE, k) for k in range(item.start + 1, item.stop))
    return ops


def plan_to_ops(plan: Plan, length: int, *, chain: Chain | None = None) -> tuple[Op, ...]:
    """Rotor's op sequence for a plan over all ``length`` layers, the loss included.

    ``Layer(i, k)`` gives ``(OpKind.F_ALL, i, k)`` when ``k >= 1`` and ``(OpKind.F_ALL, i)``
    otherwise; ``chain`` (optional) checks the options (:func:`validate_plan`). Each plan runs
    forward, then (at the top level) the loss, then backward through its items
    in reverse: ``B(i)`` for a ``Layer``, the whole body plan for a ``Checkpoint``. Built with
    an explicit stack: linear in the number of ops whatever the nesting depth.
    """
    validate_plan(plan, 0, length, chain=chain)
    ops: list[Op] = []
    stack: list[tuple[Plan, bool] | int] = [(plan, True)]
    while stack:
        task = stack.pop()
        if isinstance(task, int):
            ops.append((OpKind.B, task))
            continue
        items, top = task
        ops.extend(_forward_ops(items))
        if top:
            ops.append((OpKind.LOSS, length))
        for item in items:  # pushed in order, popped in reverse: the backward order
            stack.append(item.index if isinstance(item, Layer) else (item.body, False))
    return tuple(ops)


def format_plan(plan: Plan, *, max_depth: int = 8,
                names: Sequence[Sequence[str]] | None = None) -> str:
    """A compact one-line rendering: ``0 1 [2-3: 2 3] 4`` (brackets = checkpoint + body).

    A layer run with option ``k >= 1`` prints as ``i:k``, or ``i:name`` given ``names``
    (per layer, the option names, e.g. ``chain.options.names``). Bodies nested deeper than
    ``max_depth`` print as ``...``.
    """

    def layer(item: Layer) -> str:
        if not item.option:
            return str(item.index)
        return f"{item.index}:{item.option if names is None else names[item.index][item.option]}"

    def render(items: Plan, depth: int) -> str:
        parts = []
        for item in items:
            if isinstance(item, Layer):
                parts.append(layer(item))
            elif depth >= max_depth:
                parts.append(f"[{item.start}-{item.stop - 1}: ...]")
            else:
                parts.append(f"[{item.start}-{item.stop - 1}: {render(item.body, depth + 1)}]")
        return " ".join(parts)

    return render(plan, 0)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule for a chain.

    Attributes:
      ops: Rotor's op sequence, ``(OpKind, layer)`` pairs (``layer == L`` for the loss) and
        ``(OpKind.F_ALL, layer, option)`` triples for options ``>= 1``.
        When ``plan`` is ``None`` it may also hold early frees ``("drop", (name, k))``:
        cost it with :func:`solver.chain.exhaustive.replay` rather than :func:`solver.simulate`.
      time: total time under :func:`solver.simulate` (or ``replay``) with the real sizes.
      peak: peak memory under :func:`solver.simulate` (or ``replay``), ``x[0]`` included.
      plan: the same schedule as a nested plan of ``Layer`` and ``Checkpoint`` items, which
        the JAX frontend applies. ``None`` for a schedule that is not persistent (e.g.
        ``solve(method="ilp")``): nested ``jax.checkpoint`` cannot express it, so it can
        only serve as an oracle (a bound on what the persistent solvers reach).
      method: the solver that produced it.
    """

    ops: tuple[Op, ...]
    time: float
    peak: float
    plan: Plan | None = None
    method: str = ""

    @property
    def num_forwards(self) -> int:
        """Number of forward ops (recomputations included)."""
        return sum(1 for op in self.ops if op[0] in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE))

    def forward_counts(self, length: int) -> list[int]:
        """How many times each layer's forward runs."""
        counts = [0] * length
        for op in self.ops:
            if op[0] in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE):
                counts[op[1]] += 1
        return counts

    def __str__(self) -> str:
        return (
            f"Schedule(method={self.method!r}, time={self.time:.6g}, peak={self.peak:.6g}, "
            f"plan={'None (not persistent)' if self.plan is None else format_plan(self.plan)})"
        )
