"""``solver.simulate`` of a nested-scan plan, replaying repeated segments.

A nested-scan plan repeats the same segment (same length, same body) many times along a
homogeneous chain, and Rotor's simulator (:func:`solver.apply_op`) does the same thing to
each: the ops of a segment ``[a, b)`` read and write only the bits of ``x[a..b]``,
``tape[a-1..b-1]`` and ``g[a..b]`` of the simulator's state, and on a chain whose per-layer
costs are all equal they add the same time, change memory by the same amount and reach the
same height above the memory they start from, wherever ``a`` is, when those bits start
alike. :func:`simulate_member` runs the simulator op by op and records, for each segment's
forward (``F_ck``, ``F_none`` ...) and for each segment's recomputation and backward, the
bits it leaves, its time, its memory change and its peak above its start; a later segment
of the same shape starting from the same bits (shifted) is replayed from the record (runs of stored layers, and runs of equal segments, are cut into runs of powers of two for that, a run of ``2m`` segments recorded as two of ``m``). The
result is exactly ``solver.simulate(chain, solver.plan_to_ops(plan, L))`` (checked on every
member of the family of small chains in tests/test_scan.py), at a cost of about the
number of segments plus the stored layers' ops instead of every op.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

import solver
from solver import Chain, OpKind, apply_op, initial_state

from .loops import ScanBody, run_backward_excess, run_forward_excess
from .members import NestedScan, body_items, pieces, reshaped, runs, skeleton, solver_plan

__all__ = ["is_homogeneous", "simulate_member", "phase_peaks", "unrolled_peak",
           "scanned_runs_peak"]


def is_homogeneous(chain: Chain) -> bool:
    """Whether every per-layer cost and size of ``chain`` is the same (``x_size`` and the
    options too)."""
    vectors = [chain.fwd_time, chain.bwd_time, chain.x_size, chain.xbar_size, chain.fwd_tmp,
               chain.bwd_tmp, chain.fwd_tape_time, chain.output_in_tape, chain.ck_tmp]
    if chain.options is not None:  # (L, K) arrays: every row alike
        options = chain.options
        vectors += [options.xbar_size, options.fwd_time, options.fwd_tape_time,
                    options.bwd_time, options.fwd_tmp, options.bwd_tmp,
                    options.output_in_tape, options.valid]
    return all(bool(np.all(v == v[0])) for v in vectors)


def _chunks(start: int, stop: int) -> list[tuple[int, int]]:
    """``start .. stop-1`` cut into runs of powers of two, largest first, so that runs of
    stored layers of any length replay a few records."""
    chunks = []
    size = 1 << max(stop - start, 1).bit_length()
    while start < stop:
        while size > stop - start:
            size >>= 1
        chunks.append((start, start + size))
        start += size
    return chunks


def _groups(items: list[tuple]) -> list[list[tuple]]:
    """``items`` cut into runs: each ``("run", ...)`` item alone, consecutive checkpointed
    segments of the same length, body and option together."""
    groups: list[list[tuple]] = []
    for item in items:
        shape = (item[0], item[2] - item[1]) + tuple(item[3:])
        last = groups[-1][0] if groups else None
        if item[0] == "ck" and last is not None and last[0] == "ck" and \
                (last[0], last[2] - last[1]) + tuple(last[3:]) == shape:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def _window(state: solver.MemoryState, a: int, b: int) -> tuple[int, int, int, int]:
    """The state's bits that ops on layers ``a .. b-1`` read or write, shifted to 0: ``x``,
    ``tape``, ``g`` and the tapes' options (8 bits per tape)."""
    width = b - a + 1
    mask = (1 << width) - 1
    tape = (state.tape << 1 >> a) & mask  # tape[a-1 .. b-1]
    options = (state.tape_options << 8 >> 8 * a) & ((1 << 8 * width) - 1)
    return state.x >> a & mask, tape, state.g >> a & mask, options


def _replace(state: solver.MemoryState, a: int, b: int, bits: tuple[int, int, int, int],
             memory: float) -> solver.MemoryState:
    width = b - a + 1
    mask = (1 << width) - 1
    x, tape, g, options = bits
    new_x = state.x & ~(mask << a) | x << a
    new_g = state.g & ~(mask << a) | g << a
    tape_mask = (mask << a) >> 1  # bits a-1 .. b-1
    new_tape = state.tape & ~tape_mask | (tape << a) >> 1
    option_mask = (((1 << 8 * width) - 1) << 8 * a) >> 8  # tapes a-1 .. b-1
    new_options = state.tape_options & ~option_mask | (options << 8 * a) >> 8
    return solver.MemoryState(new_x, new_tape, new_g, memory, new_options)


class _Simulator:
    def __init__(self, chain: Chain, memo: dict) -> None:
        self.chain, self.memo = chain, memo
        self.state = initial_state(chain)
        self.peak, self.time = self.state.memory, 0.0

    def op(self, op: tuple) -> None:
        self.state, candidate, time = apply_op(self.chain, self.state, op)
        self.peak = max(self.peak, candidate)
        self.time += time

    def block(self, key: Any, a: int, b: int, run: Any) -> None:
        """Run ``run()`` (ops on layers ``a .. b-1``) or replay its record."""
        start = self.state
        found = self.memo.get((key, _window(start, a, b)))
        if found is None:
            peak, time = self.peak, self.time
            self.peak, self.time = start.memory, 0.0
            run()
            found = (_window(self.state, a, b), self.time, self.state.memory - start.memory,
                     self.peak - start.memory)
            self.memo[(key, _window(start, a, b))] = found
            self.peak, self.time = peak, time
        bits, time, delta, height = found
        self.state = _replace(start, a, b, bits, start.memory + delta)
        self.time += time
        self.peak = max(self.peak, start.memory + height)

    def _ops(self, kind: OpKind, indices: Any, option: int = 0) -> None:
        for i in indices:
            self.op((kind, i, option) if option else (kind, i))

    def forward(self, items: list[tuple]) -> None:
        for group in _groups(items):
            kind, a, b, *rest = group[0]
            if kind == "run":
                option = rest[0]
                for c, d in _chunks(a, b):
                    self.block(("store fwd", d - c, option), c, d,
                               lambda c=c, d=d: self._ops(OpKind.F_ALL, range(c, d), option))
            else:
                for c, d in _chunks(0, len(group)):
                    self._segments_forward(group[c:d])

    def _segments_forward(self, items: list[tuple]) -> None:
        """Equal checkpointed segments (a power of two of them), each or in two halves."""
        a, b = items[0][1], items[-1][2]
        if len(items) == 1:
            self.block(("fwd", b - a), a, b, lambda: self._segment_forward(a, b))
            return
        half = len(items) // 2
        self.block(("fwd*", b - a, len(items)), a, b,
                   lambda: (self._segments_forward(items[:half]),
                            self._segments_forward(items[half:])))

    def _segment_forward(self, a: int, b: int) -> None:
        self.op((OpKind.F_CK, a))
        for c, d in _chunks(a + 1, b):
            self.block(("none fwd", d - c), c, d,
                       lambda c=c, d=d: self._ops(OpKind.F_NONE, range(c, d)))

    def backward(self, items: list[tuple]) -> None:
        for group in reversed(_groups(items)):
            kind, a, b = group[0][:3]
            if kind == "run":
                for c, d in reversed(_chunks(a, b)):
                    self.block(("store bwd", d - c), c, d,
                               lambda c=c, d=d: self._ops(OpKind.B, range(d - 1, c - 1, -1)))
            else:
                for c, d in reversed(_chunks(0, len(group))):
                    self._segments_backward(group[c:d])

    def _segments_backward(self, items: list[tuple]) -> None:
        """The backward of equal checkpointed segments, last first, each or in two halves."""
        a, b = items[0][1], items[-1][2]
        if len(items) == 1:
            self.block(("bwd", b - a) + tuple(items[0][3:]), a, b,
                       lambda: self.run(body_items(items[0])))
            return
        half = len(items) // 2
        self.block(("bwd*", b - a, len(items)) + tuple(items[0][3:]), a, b,
                   lambda: (self._segments_backward(items[half:]),
                            self._segments_backward(items[:half])))

    def run(self, items: list[tuple]) -> None:
        self.forward(items)
        self.backward(items)


def simulate_member(chain: Chain, member: NestedScan, memo: dict | None = None
                    ) -> tuple[float, float]:
    """``(time, peak)`` of ``member``'s plan on ``chain``, equal to ``solver.simulate`` of
    the op sequence of :func:`jaxremat.scan.family.solver_plan` (module docstring).
    ``memo`` (a dict kept between calls on the same chain) shares the segments' records
    between members. ``chain`` must be homogeneous (:func:`is_homogeneous`)."""
    simulator = _Simulator(chain, {} if memo is None else memo)
    items = skeleton(0, chain.length, member.sizes, member.option)
    simulator.forward(items)
    simulator.op((OpKind.LOSS, chain.length))
    simulator.backward(items)
    if not simulator.state.g & 1:
        raise ValueError("The plan never computes g[0].")
    return float(simulator.time), float(simulator.peak)


def _candidates(chain: Chain, member: NestedScan) -> Iterator[tuple[tuple, float]]:
    """``(op, candidate)`` for each op of ``member``'s plan
    (:func:`jaxremat.scan.members.solver_plan`) on ``chain``, in order: the chain's memory
    peak candidate of the op (:func:`solver.apply_op`)."""
    state = initial_state(chain)
    for op in solver.plan_to_ops(solver_plan(member, chain.length), chain.length):
        state, candidate, _ = apply_op(chain, state, op)
        yield op, candidate


def phase_peaks(chain: Chain, member: NestedScan) -> tuple[float, float, float]:
    """``(forward, recompute, backward)``: the largest peak candidates of ``member``'s ops
    on ``chain`` (:func:`_candidates`), by phase: the forward (up to and including the loss
    op), the forwards after the loss (recomputations), and the ``B`` ops; 0 for a phase
    without ops. :func:`jaxremat.scan.family.loop_margin` adds to each phase the loop terms
    that belong to it."""
    peaks = [initial_state(chain).memory, 0.0, 0.0]
    after_loss = False
    for op, candidate in _candidates(chain, member):
        phase = 2 if op[0] is OpKind.B else int(after_loss)
        peaks[phase] = max(peaks[phase], candidate)
        after_loss = after_loss or op[0] is OpKind.LOSS
    return float(peaks[0]), float(peaks[1]), float(peaks[2])


def _runs_below(length: int, sizes: tuple[int, ...]) -> list[tuple[int, int, bool, int]]:
    """``(start, length, checkpointed, scanned)`` of the innermost runs of one level ``(k,)``
    or two ``(k, j)`` (each run of the second level cut into pieces of ``j``, all but the
    last checkpointed; :func:`jaxremat.scan.members.skeleton`); ``scanned``: the number of
    equal checkpointed pieces in the run's ``lax.scan`` (``jaxremat.scan.realize.run_member``: two
    or more in a row), 0 for a piece run inline."""
    if reshaped(length, sizes):
        top = [sizes[0]] * (length // sizes[0])
    else:
        top = pieces(length, sizes[0])
    runs, start = [], 0
    for n in top:
        parts = pieces(n, sizes[1]) if len(sizes) > 1 else [n]
        for index, part in enumerate(parts):
            checkpointed = index < len(parts) - 1
            scanned = sum(1 for p in parts[:-1] if p == part) if checkpointed else 0
            runs.append((start, part, checkpointed, scanned if scanned > 1 else 0))
            start += part
    return runs


def _chunk_gradients(length: int, sizes: tuple[int, ...]) -> list[int]:
    """Per layer, the layers whose parameter gradients a top level that splits the
    parameters (not :func:`jaxremat.scan.members.reshaped`) holds beside their parameter
    pieces at that layer's ``B`` op: in a ``lax.scan`` of equal segments, that scan's
    stacked gradients (allocated before its body, while its stacked parameter rows are
    read to its end), else none (a piece whose backward ran holds its gradient piece, to
    the concatenation at the end, and no longer its parameter piece: one or the other,
    which the split pieces once count). 0 for a reshaped top."""
    if reshaped(length, sizes):
        return [0] * length
    held, first = [0] * length, 0
    for part, count in runs(pieces(length, sizes[0])[:-1]):
        end = first + part * count
        for layer in range(first, end):
            held[layer] = part * count if count > 1 else 0
        first = end
    return held


def unrolled_peak(chain: Chain, member: NestedScan, param_bytes: float
                  ) -> tuple[float, float]:
    """``(peak, with_gradients)``: the chain's peak of ``member`` (one level ``(k,)`` or
    two ``(k, j)``, its innermost runs unrolled), and that peak with, at each op, what an
    unrolled run and its loops hold beside what the chain counts: at each ``B`` op the
    gradients of the run's layers already through their ``B`` (each padded into the run's
    ``[n, ...]`` rows: ``n`` layers' parameters), and, in a checkpointed piece of the
    second level, those of the segment's last piece (run inline before it, ``j`` layers;
    concatenated at the segment's end). Where a segment's ``m >= 2`` equal checkpointed
    pieces run as a ``lax.scan`` (:func:`_runs_below`), the ops of those pieces also count
    that loop's terms, by phase: in their recomputation and backward (inside the backward
    loop) its carry in and out (``2 x``), its stacked parameter gradients (``m`` pieces of
    ``j`` layers, allocated before the body) and the segment's input stored again as the
    first row of the forward loop's stacked inputs (``x``); in their forwards (the forward
    loop over the pieces) the stacked inputs not yet written, the copy of the segment's
    input and the final carry (``(m + 1) x`` at most). The ops before the loss count the
    final carry of the pieces' loop in the primal (``x``) where the member has one. A top
    level that splits the parameters adds, at each ``B`` op, the gradient chunks it holds
    then beside their parameter pieces (:func:`_chunk_gradients`). Every op counts the
    segment's ``k`` layers' parameters (``param_bytes`` each: slices of its unrolled
    layers, or for two levels its split pieces), but for two levels below a top level that
    splits the parameters the ``F_all`` and ``B`` ops after the loss outside a scan of
    equal top segments: there a segment's split pieces replace its top-level piece,
    freed at that split, which :func:`jaxremat.scan.family.loop_margin` counts with the
    others (``L`` layers' parameters). ``loop_margin`` adds what every phase holds."""
    runs = _runs_below(chain.length, tuple(k for k in member.sizes if k < chain.length))
    run_of = {}
    for start, n, checkpointed, scanned in runs:
        for layer in range(start, start + n):
            run_of[layer] = (n, checkpointed, scanned)
    x = float(chain.x_size[0])
    any_scan = any(run[3] for run in runs)
    sizes = tuple(k for k in member.sizes if k < chain.length)
    L = chain.length  # layers from ``inline`` on: the top level's last piece, run inline
    inline = L if reshaped(L, sizes) else L - pieces(L, sizes[0])[-1]
    last = member.sizes[-1]  # the length of a segment's last piece (two levels)
    chunk_grads = _chunk_gradients(L, sizes)
    replaced = len(sizes) == 2 and not reshaped(L, sizes)  # the top piece, by the split
    peak = grads_peak = initial_state(chain).memory
    done, after_loss = 0, False
    for op, candidate in _candidates(chain, member):
        peak = max(peak, candidate)
        kind = op[0]
        n, checkpointed, scanned = run_of.get(op[1], (0, False, 0))
        if not (replaced and after_loss and kind in (OpKind.F_ALL, OpKind.B)
                and not chunk_grads[op[1]]):
            candidate += sizes[0] * param_bytes  # the segment's parameters (docstring)
        if kind is OpKind.B:
            candidate += (done * n + (last if checkpointed else 0)
                          + chunk_grads[op[1]]) * param_bytes
            done += 1
        else:
            done = 0
        if scanned and kind in (OpKind.B, OpKind.F_ALL) and after_loss:
            candidate += 3 * x + scanned * n * param_bytes
        elif scanned and kind in (OpKind.F_CK, OpKind.F_NONE) and \
                (after_loss or op[1] >= inline):
            candidate += (scanned + 1) * x
        elif any_scan and not after_loss:
            candidate += x
        after_loss = after_loss or kind is OpKind.LOSS
        grads_peak = max(grads_peak, candidate)
    return float(peak), float(grads_peak)


def scanned_runs_peak(chain: Chain, member: NestedScan, param_bytes: float, common: float,
                      body: ScanBody | None = None) -> tuple[float, float, float]:
    """``(peak, runs, other)``: the chain's peak of ``member`` (two levels ``(k, j)``, its
    innermost runs scans of stored layers, none of its levels a scan of checkpointed
    pieces: :func:`jaxremat.scan.family.loop_margin`), the largest candidate of the ops of
    those runs after the loss with what their loops hold beside the chain, and the largest
    candidate of the other ops. A run of ``n`` layers allocates its stacked rows and its
    final carry before its forward loop's body, and keeps the stacked rows to the end of
    its backward loop, whose gradient rows and final carry are allocated before its body:
    at its ``i``-th ``F_all`` :func:`jaxremat.scan.loops.run_forward_excess` beside the
    loop invariants, at its ``i``-th layer's ``B``
    :func:`jaxremat.scan.loops.run_backward_excess` (its gradients concatenated into the
    segment's) beside the backward loop's (``body``, :class:`jaxremat.scan.loops.ScanBody`;
    without it one tape per row and body, no invariants); each op adds ``common`` (what
    the caller counts for every phase) and, in a checkpointed piece, its input stored
    again (``x``)."""
    L = chain.length
    where = {}
    for start, n, checkpointed, _ in _runs_below(L, tuple(k for k in member.sizes if k < L)):
        for layer in range(start, start + n):
            where[layer] = (start, n, checkpointed)
    x = float(chain.x_size[0])
    peak = other = runs = initial_state(chain).memory
    after_loss = False
    for op, candidate in _candidates(chain, member):
        peak = max(peak, candidate)
        kind = op[0]
        if after_loss and kind in (OpKind.F_ALL, OpKind.B):
            start, n, checkpointed = where[op[1]]
            i = op[1] - start
            if kind is OpKind.F_ALL:
                candidate += run_forward_excess(chain, member.option, n, i, body) + \
                    (0.0 if body is None else body.invariants)
            else:
                candidate += run_backward_excess(chain, member.option, n, i, param_bytes,
                                                 body) + \
                    (0.0 if body is None else body.backward_invariants)
            runs = max(runs, candidate + common + (x if checkpointed else 0.0))
        else:
            other = max(other, candidate)
        after_loss = after_loss or kind is OpKind.LOSS
    return float(peak), float(runs), float(other)
