"""The chain simulator: time and peak memory of an op sequence (ALGORITHMS.md section 1).

Memory starts holding ``x[0]``. The values that can be stored are ``x[k]`` on its own,
the tape ``tape[i]`` of layer ``i`` (which contains ``x[i+1]``), and gradients ``g[k]``.
"``x[k]`` available" means ``x[k]`` is stored on its own or ``tape[k-1]`` is stored.

=========  ==========================  ==============================================  =====================
op         needs                       effect                                          peak candidate
=========  ==========================  ==============================================  =====================
F_all(i)   x[i] available              stores tape[i]                                  after + fwd_tmp[i]
F_ck(i)    x[i] available              stores x[i+1], keeps x[i]                       after + ck_tmp[i]
F_none(i)  x[i] available              stores x[i+1], then frees x[i] (or tape[i-1]    after storing
                                       if x[i] came from it)                           + ck_tmp[i]
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
Its peak candidate is then the state after it plus ``Chain.fwd_tape_tmp[i]`` (by default
``fwd_tmp[i]`` and the dropped output, as above:
:func:`solver.chain.options.base_forward_tmp`).

Options (:mod:`solver.chain.options`): ``(F_all, i, k)`` runs ``F_all(i)`` with option ``k``
and charges that option's ``xbar_size``, ``output_in_tape``, ``fwd_time`` /
``fwd_tape_time`` and ``fwd_tmp``; the state remembers the option of every stored tape, so
``B(i)`` charges its ``bwd_time`` and ``bwd_tmp`` and frees its tape size (as do
``F_none(i+1)`` and early drops). ``F_ck`` and ``F_none`` cost the chain's own fields.

Forwards without tape (``F_ck``, ``F_none``) peak at the state after storing ``x[i+1]`` plus
``ck_tmp[i]``: ``Chain.fwd_ck_tmp``, the plain forward's transient, where given, else
``fwd_tmp`` (``Chain.ck_tmp``).

Unread input leaves (``Chain.x_read_size``): once ``F_all(i)`` has run (its forward read all
of ``x[i]``), ``x[i]`` is cut to the part ``B(i)`` reads, freeing ``option_x_free[i, k]``
bytes (``k`` the option of that ``F_all``): the
copy stored on its own if there is one, else the one inside ``tape[i-1]``. A cut ``x[i]``
serves ``B(i)`` but no forward, and is freed as ``x_size[i]`` less those bytes (its tape
as ``tape_size[i-1]`` less them). In a plan nothing but ``B(i)`` reads ``x[i]`` after
``F_all(i)``, so every plan stays valid. A copy stored on its own is cut further, to what
``B(i)`` alone reads (``Chain.option_x_own_free``): ``B(i-1)`` reads ``x[i]`` only from
``tape[i-1]`` (after ``F_ck(i-1)`` from its recomputation's), never that copy.

Checkpoints held in part (``Chain.x_rec_size``): once ``F_ck(i)`` has run, ``x[i]`` is cut
to the part a recomputation reads, freeing ``x_rec_free[i]`` bytes (the same copy as
above). Forwards may still read that ``x[i]`` (the recomputation's ``F_ck(i)`` or
``F_all(i)``; a later ``F_all(i)`` cuts it on to what ``B(i)`` reads, freeing the rest of
``option_x_free``), and it is freed as ``x_size[i]`` less the bytes cut. In a plan the
only forward on ``x[i]`` after ``F_ck(i)`` is the recomputation's.

Storing a value that is already stored is an invalid sequence, like a missing input, and so
is a forward of layer ``i`` once the backward has passed it (``g[k]`` stored for some
``k <= i``): nothing reads what it computes, and its only effect would be the cuts above
(found by the unpruned search of tests/test_exhaustive.py on a chain of zero forward times,
where a recomputation after ``B(2)`` cut ``x[2]`` out of ``tape[1]`` for free).
The state is a small immutable record of bitmasks so that exhaustive searches can hash it.

:func:`make_schedule` costs a plan (:mod:`solver.chain.schedule`) with the simulator.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from .chain import Chain
from .options import LayerCosts, layer_costs, option_index
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
    """What is stored: bit ``k`` of ``x`` (own activations), ``tape``, ``g`` (gradients).

    ``tape_options`` holds, in bits ``8 i .. 8 i + 7``, the option ``tape[i]`` was built with
    (0, the whole tape, when the chain has no options), so equal states compare equal.
    Bit ``k`` of ``cut`` says ``x[k]`` was cut to its read part by ``F_all(k)`` (the copy
    on its own if stored, else the one in ``tape[k-1]``); ``cut_options`` packs the option
    of that ``F_all`` like ``tape_options`` (what it freed: ``Chain.option_x_free``). Bit
    ``k`` of ``rec`` says ``F_ck(k)`` cut ``x[k]`` to what a recomputation reads
    (``Chain.x_rec_free``); bit ``k`` of ``own`` that the copy ``F_all(k)`` cut was stored on
    its own, so cut to what ``B(k)`` alone reads (``Chain.option_x_own_free``).
    """

    x: int
    tape: int
    g: int
    memory: float
    tape_options: int = 0
    cut: int = 0
    cut_options: int = 0
    rec: int = 0
    own: int = 0

    def cut_size(self, chain: Chain, k: int) -> float:
        """Bytes freed of ``x[k]``: by ``F_all(k)`` if it cut it, else by ``F_ck(k)``, else 0."""
        if self.cut >> k & 1:
            freed = chain.option_x_own_free if self.own >> k & 1 else chain.option_x_free
            return float(freed[k, self.cut_options >> (8 * k) & 0xFF])
        if self.rec >> k & 1:
            return float(chain.x_rec_free[k])
        return 0.0

    def option(self, i: int) -> int:
        """The option of ``tape[i]`` (meaningful while it is stored)."""
        return self.tape_options >> (8 * i) & 0xFF

    def has_x(self, k: int, output_in_tape: np.ndarray | None = None) -> bool:
        """``x[k]`` available: stored on its own, or inside ``tape[k-1]`` when that tape
        holds its output. Pass the chain's flags: ``Chain.output_in_tape`` (one per layer) or
        ``Chain.options.output_in_tape`` (per layer and option, read at the tape's option);
        default all true."""
        if self.x >> k & 1:
            return True
        if k == 0 or not self.tape >> (k - 1) & 1:
            return False
        if output_in_tape is None:
            return True
        if getattr(output_in_tape, "ndim", 1) == 2:
            return bool(output_in_tape[k - 1, self.option(k - 1)])
        return bool(output_in_tape[k - 1])


def initial_state(chain: Chain) -> MemoryState:
    """Memory holding only the chain's input ``x[0]``."""
    return MemoryState(x=1, tape=0, g=0, memory=float(chain.x_size[0]))


def _kind(op: Op) -> OpKind:
    try:
        return OpKind(op[0])
    except (ValueError, TypeError, IndexError):
        raise ValueError(f"Unknown op {op!r}: kinds are {[k.value for k in OpKind]}.") from None


def _flags(chain: Chain) -> np.ndarray:
    """The output-in-tape flags :meth:`MemoryState.has_x` reads for ``chain``."""
    return chain.output_in_tape if chain.options is None else chain.options.output_in_tape


def _stored_tape(chain: Chain, state: MemoryState, i: int) -> LayerCosts:
    return layer_costs(chain, i, state.option(i))


def apply_op(chain: Chain, state: MemoryState, op: Op) -> tuple[MemoryState, float, float]:
    """Apply one op; return ``(new_state, peak_candidate, time)`` or raise ``ValueError``.

    ``(OpKind.F_ALL, i, k)`` runs ``F_all(i)`` with option ``k`` (:mod:`solver.chain.options`):
    it stores, costs and later frees that option's tape, and ``B(i)`` then costs the
    option's backward.
    """
    kind = _kind(op)
    if len(op) != 2 and not (len(op) == 3 and kind is OpKind.F_ALL):
        raise ValueError(
            f"Op {op!r}: an op is a pair (kind, layer index), or (F_all, layer, option)."
        )
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
    x, tape, g, mem, options = state.x, state.tape, state.g, state.memory, state.tape_options
    cut, cuts, rec, own = state.cut, state.cut_options, state.rec, state.own
    xs, flags = chain.x_size, _flags(chain)

    if kind in (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE):
        if not state.has_x(i, flags):
            raise ValueError(f"Op {op!r}: x[{i}] is not available.")
        if cut >> i & 1:
            raise ValueError(f"Op {op!r}: x[{i}] was cut to the part B({i}) reads.")
        if g & ((2 << i) - 1):  # g[k], k <= i: the backward has passed layer i
            raise ValueError(f"Op {op!r}: the backward has passed layer {i}; nothing reads "
                             "what its forward computes.")
        if kind is OpKind.F_ALL:
            try:
                k = option_index(chain, i, op[2]) if len(op) == 3 else 0
            except ValueError as error:
                raise ValueError(f"Op {op!r}: {error}") from None
            if tape >> i & 1:
                raise ValueError(f"Op {op!r}: tape[{i}] is already stored.")
            cost = layer_costs(chain, i, k)
            mem += cost.tape_size
            last_use = bool(g >> (i + 1) & 1)  # B(i) is next: only the tape is needed
            if not cost.output_in_tape and not last_use:  # the output, on its own
                if x >> (i + 1) & 1:
                    raise ValueError(f"Op {op!r}: x[{i + 1}] is already stored.")
                x |= 1 << (i + 1)
                mem += xs[i + 1]
            time = cost.fwd_tape_time if last_use else cost.fwd_time
            options = options & ~(0xFF << 8 * i) | k << 8 * i
            # with B(i) next: the tape-only forward's peak (by default the output, computed
            # and dropped, and fwd_tmp: solver.chain.options.base_forward_tmp)
            peak = mem + (cost.fwd_tape_tmp if last_use else cost.fwd_tmp)
            alone = bool(x >> i & 1)  # a copy on its own: B(i-1) never reads it
            freed = (chain.option_x_own_free if alone else chain.option_x_free)[i, k]
            if freed > 0:  # only B(i) (and B(i-1), from tape[i-1]) reads x[i] from here on
                mem -= freed - state.cut_size(chain, i)
                cut |= 1 << i
                cuts = cuts & ~(0xFF << 8 * i) | k << 8 * i
                own = own | 1 << i if alone else own & ~(1 << i)
                rec &= ~(1 << i)
            return (MemoryState(x, tape | 1 << i, g, mem, options, cut, cuts, rec, own & cut),
                    peak, time)
        if x >> (i + 1) & 1 or cut >> (i + 1) & 1 or rec >> (i + 1) & 1:
            raise ValueError(f"Op {op!r}: x[{i + 1}] is already stored.")
        mem += xs[i + 1]
        peak = mem + chain.ck_tmp[i]  # the plain forward (Chain.fwd_ck_tmp)
        x |= 1 << (i + 1)
        if kind is OpKind.F_NONE:
            if x >> i & 1:
                x &= ~(1 << i)
                mem -= xs[i] - state.cut_size(chain, i)
            else:  # x[i] came from tape[i-1]
                tape &= ~(1 << (i - 1))
                mem -= _stored_tape(chain, state, i - 1).tape_size - _cut_in_tape(chain, state, i)
                options &= ~(0xFF << 8 * (i - 1))
            rec &= ~(1 << i)
        elif chain.x_rec_free[i] > 0 and not rec >> i & 1:  # only a recomputation reads x[i]
            rec |= 1 << i
            mem -= chain.x_rec_free[i]
        return (MemoryState(x, tape, g, mem, options, cut, cuts, rec, own & cut), peak,
                chain.fwd_time[i])

    if kind is OpKind.LOSS:
        if not state.has_x(L, flags):
            raise ValueError(f"Op {op!r}: x[{L}] is not available.")
        if g >> L & 1:
            raise ValueError(f"Op {op!r}: g[{L}] is already stored.")
        mem += xs[L]
        peak = mem
        g |= 1 << L
        if x >> L & 1:
            x &= ~(1 << L)
            mem -= xs[L]
        return MemoryState(x, tape, g, mem, options, cut, cuts, rec, own & cut), peak, 0.0

    # Backward B(i).
    missing = [
        name
        for name, ok in ((f"g[{i + 1}]", g >> (i + 1) & 1), (f"tape[{i}]", tape >> i & 1),
                         (f"x[{i}]", state.has_x(i, flags)))
        if not ok
    ]
    if missing:
        raise ValueError(f"Op {op!r}: {', '.join(missing)} not available.")
    if g >> i & 1:
        raise ValueError(f"Op {op!r}: g[{i}] is already stored.")
    cost = _stored_tape(chain, state, i)
    mem += xs[i]
    peak = mem + cost.bwd_tmp
    g = (g | 1 << i) & ~(1 << (i + 1))
    mem -= xs[i + 1]
    tape &= ~(1 << i)
    mem -= cost.tape_size - _cut_in_tape(chain, state, i + 1)
    options &= ~(0xFF << 8 * i)
    if i + 1 < L and not x >> (i + 1) & 1:
        cut &= ~(1 << (i + 1))
        rec &= ~(1 << (i + 1))
    if x >> i & 1:
        x &= ~(1 << i)
        mem -= xs[i] - state.cut_size(chain, i)
        cut &= ~(1 << i)
        rec &= ~(1 << i)
    return (MemoryState(x, tape, g, mem, options, cut, _kept(cuts, cut), rec, own & cut), peak,
            cost.bwd_time)


def _kept(cuts: int, cut: int) -> int:
    """``cut_options`` with the bytes of the values no longer cut cleared."""
    kept, k = 0, 0
    while cut >> k:
        if cut >> k & 1:
            kept |= cuts & 0xFF << 8 * k
        k += 1
    return kept


def _cut_in_tape(chain: Chain, state: MemoryState, k: int) -> float:
    """Bytes already freed from ``tape[k-1]``: what ``F_all(k)`` freed if it cut the copy of
    ``x[k]`` that tape holds (none stored on its own)."""
    if k >= chain.length or state.x >> k & 1:
        return 0.0
    return state.cut_size(chain, k)


def drop(chain: Chain, state: MemoryState, value: tuple[str, int]) -> MemoryState:
    """Free one stored value, ``("x", k)``, ``("tape", i)`` or ``("g", k)``, early.

    Not one of Rotor's ops: exhaustive searches use it to explore non-persistent schedules.
    """
    name, k = value
    mask = getattr(state, name)
    if not mask >> k & 1:
        raise ValueError(f"Cannot drop {name}[{k}]: it is not stored.")
    cut, rec = state.cut, state.rec
    if name == "tape":
        size = _stored_tape(chain, state, k).tape_size - _cut_in_tape(chain, state, k + 1)
        if k + 1 < chain.length and not state.x >> (k + 1) & 1:
            cut &= ~(1 << (k + 1))
            rec &= ~(1 << (k + 1))
    elif name == "x":
        size = chain.x_size[k] - state.cut_size(chain, k)
        cut &= ~(1 << k)
        rec &= ~(1 << k)
    else:
        size = chain.x_size[k]
    fields = {"x": state.x, "tape": state.tape, "g": state.g}
    fields[name] = mask & ~(1 << k)
    options = state.tape_options & ~(0xFF << 8 * k) if name == "tape" else state.tape_options
    return MemoryState(memory=state.memory - size, tape_options=options, cut=cut,
                       cut_options=_kept(state.cut_options, cut), rec=rec,
                       own=state.own & cut, **fields)


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
      ops: ``(kind, layer)`` pairs, or ``(OpKind.F_ALL, layer, option)``; ``kind`` an
        :class:`OpKind` or its string value.
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
    """Build a :class:`Schedule` from a plan, costing it with the simulator.

    Raises ``ValueError`` for a plan that does not cover the chain or names an option a
    layer does not offer (:func:`~solver.chain.schedule.validate_plan`).
    """
    ops = plan_to_ops(plan, chain.length, chain=chain)
    time, peak = simulate(chain, ops)
    return Schedule(ops=ops, time=time, peak=peak, plan=tuple(plan), method=method)
