"""The chain simulator: time and peak memory of an op sequence (ALGORITHMS.md section 1).

Memory starts holding ``x[0]``. The values that can be stored are ``x[k]`` on its own,
the tape ``tape[i]`` of layer ``i`` (which contains ``x[i+1]``), and gradients ``g[k]``.
"``x[k]`` available" means ``x[k]`` is stored on its own or ``tape[k-1]`` is stored.

=========  ==========================  ==============================================  =====================
op         needs                       effect                                          peak candidate
=========  ==========================  ==============================================  =====================
F_all(i)   x[i] available              stores tape[i]                                  after + fwd_tmp[i]
F_ck(i)    x[i] available              stores x[i+1], keeps x[i]                       after + fwd_tmp[i]
F_none(i)  x[i] available              stores x[i+1], then frees x[i] (or tape[i-1]    after storing
                                       if x[i] came from it)                           + fwd_tmp[i]
loss       x[L] available              stores g[L]; frees x[L] if stored on its own    after storing
B(i)       g[i+1], tape[i], x[i]       stores g[i]; frees x[i] if stored on its own,   after storing
           available                   g[i+1] and tape[i]                              + bwd_tmp[i]
=========  ==========================  ==============================================  =====================

The loss freeing ``x[L]`` (when held on its own) is the one rule the table in
ALGORITHMS.md leaves implicit: nothing reads ``x[L]`` after the loss except ``B(L-1)``,
which reads it from ``tape[L-1]``. Rotor's dynamic program assumes exactly this.

Outputs outside the tape (``Chain.output_in_tape[i]`` false: layer ``i``'s backward does not
read ``x[i+1]``): ``tape[i]`` then holds ``tape_size[i] = xbar_size[i] - x_size[i+1]`` bytes
and does not make ``x[i+1]`` available; ``F_all(i)`` also stores ``x[i+1]`` on its own,
unless ``g[i+1]`` is stored (the backward has passed layer ``i+1``, so nothing ahead reads
``x[i+1]``: the last layer of a recomputed segment); then the output still counts in the
op's peak candidate (a backend may compute it and drop it at once, as the ``custom_vjp``
backend's ``jax.vjp`` does) but is not stored. That own ``x[i+1]`` is then freed by
the rules above (``F_none(i+1)``, the loss, ``B(i+1)``). In a plan's op sequence this never
holds more than the all-true model at any moment (``F_none(i+1)`` never follows
``F_all(i)`` in a plan; tests/test_simulate.py checks every plan of small chains). Rotor's
dynamic program models the flags exactly (:mod:`solver.chain.rotor`).

Times: every op costs its layer's ``fwd_time`` / ``bwd_time`` (the loss 0), except
``F_all(i)`` while ``g[i+1]`` is stored, which costs ``fwd_tape_time[i]``: the backward has
passed layer ``i+1``, so only ``B(i)`` will read what it computes (``Chain.fwd_tape_time``).

Storing a value that is already stored is an invalid sequence, like a missing input.
The state is a small immutable record of bitmasks so that exhaustive searches can hash it.

:func:`make_schedule` costs a plan (:mod:`solver.chain.schedule`) with the simulator.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from .chain import Chain
from .schedule import Op, OpKind, Plan, Schedule, plan_to_ops

__all__ = [
    "MemoryState",
    "initial_state",
    "apply_op",
    "drop",
    "simulate",
    "memory_trace",
    "make_schedule",
]


@dataclasses.dataclass(frozen=True)
class MemoryState:
    """What is stored: bit ``k`` of ``x`` (own activations), ``tape``, ``g`` (gradients)."""

    x: int
    tape: int
    g: int
    memory: float

    def has_x(self, k: int, output_in_tape: np.ndarray | None = None) -> bool:
        """``x[k]`` available: stored on its own, or inside ``tape[k-1]`` when that tape
        holds its output (``output_in_tape[k-1]``; pass the chain's flags, default all
        true)."""
        if self.x >> k & 1:
            return True
        inside = output_in_tape is None or bool(output_in_tape[k - 1])
        return k > 0 and inside and bool(self.tape >> (k - 1) & 1)


def initial_state(chain: Chain) -> MemoryState:
    """Memory holding only the chain's input ``x[0]``."""
    return MemoryState(x=1, tape=0, g=0, memory=float(chain.x_size[0]))


def _kind(op: Op) -> OpKind:
    try:
        return OpKind(op[0])
    except (ValueError, TypeError, IndexError):
        raise ValueError(f"Unknown op {op!r}: kinds are {[k.value for k in OpKind]}.") from None


def apply_op(chain: Chain, state: MemoryState, op: Op) -> tuple[MemoryState, float, float]:
    """Apply one op; return ``(new_state, peak_candidate, time)`` or raise ``ValueError``."""
    kind = _kind(op)
    if len(op) != 2:
        raise ValueError(f"Op {op!r}: an op is a pair (kind, layer index).")
    i = op[1]
    L = chain.length
    if isinstance(i, bool) or not hasattr(i, "__index__"):
        raise ValueError(f"Op {op!r}: the layer index must be an integer.")
    i = int(i)
    if kind is OpKind.LOSS:
        if i != L:
            raise ValueError(f"Op {op!r}: the loss op's index must be L = {L}.")
    elif not 0 <= i < L:
        raise ValueError(f"Op {op!r}: layer index out of range 0..{L - 1}.")
    x, tape, g, mem = state.x, state.tape, state.g, state.memory
    xs, xbar, inside = chain.x_size, chain.tape_size, chain.output_in_tape

    if kind in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE):
        if not state.has_x(i, inside):
            raise ValueError(f"Op {op!r}: x[{i}] is not available.")
        tmp = chain.fwd_tmp[i]
        if kind is OpKind.F_ALL:
            if tape >> i & 1:
                raise ValueError(f"Op {op!r}: tape[{i}] is already stored.")
            mem += xbar[i]
            dropped = 0.0
            last_use = bool(g >> (i + 1) & 1)  # B(i) is next: only the tape is needed
            if not inside[i]:  # the output, on its own while something ahead reads it
                if last_use:
                    dropped = xs[i + 1]
                elif x >> (i + 1) & 1:
                    raise ValueError(f"Op {op!r}: x[{i + 1}] is already stored.")
                else:
                    x |= 1 << (i + 1)
                    mem += xs[i + 1]
            time = chain.fwd_tape_time[i] if last_use else chain.fwd_time[i]
            return MemoryState(x, tape | 1 << i, g, mem), mem + dropped + tmp, time
        if x >> (i + 1) & 1:
            raise ValueError(f"Op {op!r}: x[{i + 1}] is already stored.")
        mem += xs[i + 1]
        peak = mem + tmp
        x |= 1 << (i + 1)
        if kind is OpKind.F_NONE:
            if x >> i & 1:
                x &= ~(1 << i)
                mem -= xs[i]
            else:  # x[i] came from tape[i-1]
                tape &= ~(1 << (i - 1))
                mem -= xbar[i - 1]
        return MemoryState(x, tape, g, mem), peak, chain.fwd_time[i]

    if kind is OpKind.LOSS:
        if not state.has_x(L, inside):
            raise ValueError(f"Op {op!r}: x[{L}] is not available.")
        if g >> L & 1:
            raise ValueError(f"Op {op!r}: g[{L}] is already stored.")
        mem += xs[L]
        peak = mem
        g |= 1 << L
        if x >> L & 1:
            x &= ~(1 << L)
            mem -= xs[L]
        return MemoryState(x, tape, g, mem), peak, 0.0

    # Backward B(i).
    missing = [
        name
        for name, ok in ((f"g[{i + 1}]", g >> (i + 1) & 1), (f"tape[{i}]", tape >> i & 1),
                         (f"x[{i}]", state.has_x(i, inside)))
        if not ok
    ]
    if missing:
        raise ValueError(f"Op {op!r}: {', '.join(missing)} not available.")
    if g >> i & 1:
        raise ValueError(f"Op {op!r}: g[{i}] is already stored.")
    mem += xs[i]
    peak = mem + chain.bwd_tmp[i]
    g = (g | 1 << i) & ~(1 << (i + 1))
    mem -= xs[i + 1]
    tape &= ~(1 << i)
    mem -= xbar[i]
    if x >> i & 1:
        x &= ~(1 << i)
        mem -= xs[i]
    return MemoryState(x, tape, g, mem), peak, chain.bwd_time[i]


def drop(chain: Chain, state: MemoryState, value: tuple[str, int]) -> MemoryState:
    """Free one stored value, ``("x", k)``, ``("tape", i)`` or ``("g", k)``, early.

    Not one of Rotor's ops: exhaustive searches use it to explore non-persistent schedules.
    """
    name, k = value
    sizes = {"x": chain.x_size, "tape": chain.tape_size, "g": chain.x_size}[name]
    mask = getattr(state, name)
    if not mask >> k & 1:
        raise ValueError(f"Cannot drop {name}[{k}]: it is not stored.")
    fields = {"x": state.x, "tape": state.tape, "g": state.g}
    fields[name] = mask & ~(1 << k)
    return MemoryState(memory=state.memory - sizes[k], **fields)


def memory_trace(chain: Chain, ops: Iterable[Op]) -> list[tuple[Op, float, float]]:
    """Per op: ``(op, memory after it, its peak candidate)``, for plots and reports.

    Raises ``ValueError`` like :func:`simulate` on an invalid sequence.
    """
    state = initial_state(chain)
    trace = []
    for position, op in enumerate(ops):
        try:
            state, candidate, _ = apply_op(chain, state, op)
        except ValueError as error:
            raise ValueError(f"Invalid op at position {position}: {error}") from None
        trace.append((op, state.memory, candidate))
    return trace


def simulate(chain: Chain, ops: Iterable[Op], *, complete: bool = True) -> tuple[float, float]:
    """Time and peak memory of ``ops`` on ``chain`` (the table above, applied exactly).

    Args:
      chain: the costs.
      ops: ``(kind, layer)`` pairs; ``kind`` an :class:`OpKind` or its string value.
      complete: also require that the sequence ends having produced ``g[0]``, the gradient of
        the chain's input (a full training step).

    Returns:
      ``(time, peak)``: the summed op times, and the peak memory including ``x[0]``.

    Raises:
      TypeError: ``chain`` is not a :class:`Chain`.
      ValueError: an unknown or malformed op, an index out of range, a needed value that is not
        available, a value stored twice, or (with ``complete``) a sequence that never
        produces ``g[0]``.
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"simulate expects a solver.Chain, got {type(chain).__name__}.")
    state = initial_state(chain)
    peak = state.memory
    time = 0.0
    for position, op in enumerate(ops):
        try:
            state, candidate, op_time = apply_op(chain, state, op)
        except ValueError as error:
            raise ValueError(f"Invalid op at position {position}: {error}") from None
        peak = max(peak, candidate)
        time += op_time
    if complete and not state.g & 1:
        raise ValueError("The sequence never computes g[0]: it does not finish the backward pass.")
    return float(time), float(peak)


def make_schedule(chain: Chain, plan: Plan, method: str = "") -> Schedule:
    """Build a :class:`Schedule` from a plan, costing it with the simulator."""
    ops = plan_to_ops(plan, chain.length)
    time, peak = simulate(chain, ops)
    return Schedule(ops=ops, time=time, peak=peak, plan=tuple(plan), method=method)
