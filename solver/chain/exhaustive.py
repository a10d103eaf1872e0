"""The exhaustive oracle: the fastest of ALL op sequences under a budget, for short chains.

Rotor's dynamic program (ALGORITHMS.md section 2) is optimal among *persistent* schedules,
where a stored value stays until its last use. An arbitrary sequence may instead drop a
value early and recompute it later, which sometimes fits a tighter budget or runs faster
(ALGORITHMS.md quotes about 5% of small random (chain, budget) pairs, by up to 30%). This
module finds the true optimum by a shortest-path search over memory states: the states are
:class:`~solver.chain.simulator.MemoryState` values, the moves are the five ops
(:func:`~solver.chain.simulator.apply_op`, cost = the op's time) and freeing any stored value at any
moment (:func:`~solver.chain.simulator.drop`, cost 0), so the rules are exactly the simulator's.
A move is allowed only if its peak candidate stays within the budget.

The search is A* (Hart, Nilsson, Raphael 1968) with a consistent lower bound: every layer
still to be reversed needs its backward, and a forward for each tape it lacks (at least
``fwd_tape_time``, what ``F_all`` costs at best); before the loss, every layer above the
highest available activation also needs a forward that computes its output (``fwd_time``).
With options (:mod:`solver.chain.options`) ``F_all(i)`` is tried with each option the layer
offers (the state records each stored tape's option) and the bound takes, per layer, the
cheapest option (:meth:`_Search.lower_bound`).

Three reductions keep the state space small without losing the optimum (each replaces a
move by one that is never worse, so some optimal sequence survives):

- one gradient lineage: the loss runs once and no gradient is dropped. The ``g[0]`` that
  ends a sequence descends from one loss through ``B(L-1) .. B(0)``; any other loss or
  backward op only stores gradients nobody reads, and freeing what it frees is a drop.
- useless values are freed at once: once ``g[j]`` is the live gradient, only
  ``B(j-1) .. B(0)`` remain, so ``x[k]`` on its own and ``tape[k]`` for ``k >= j`` are never
  read again; dropping them only lowers memory. Forward ops that produce only such values
  are not tried (their effect is a drop plus wasted time), except ``F_ck(j-1)`` where it
  cuts ``x[j-1]`` to what its recomputation reads (``Chain.x_rec_size``), which no drop
  does (a hypothesis draw found a schedule that needs it).
- ``x[0]`` is never freed before ``B(0)``: it cannot be recomputed, so nothing finishes
  after that (the search skips such states).

The result is a sequence of *steps*: ops ``(OpKind, i)`` and drops ``("drop", (name, k))``.
It is not a plan (a non-persistent schedule is not a tree), so no JAX plan comes with it;
:func:`replay` checks and costs it with the simulator's functions.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from typing import Iterable, Iterator, Union

import numpy as np

from ..errors import check_real
from .chain import Chain
from .options import layer_costs
from .schedule import Op, OpKind
from .simulator import MemoryState, apply_op, drop, initial_state

__all__ = [
    "MAX_EXHAUSTIVE_LAYERS",
    "Step",
    "ExhaustiveResult",
    "exhaustive_search",
    "exhaustive_optimum",
    "replay",
]

MAX_EXHAUSTIVE_LAYERS = 6

Drop = tuple  # ("drop", (name, k)) with name in "x", "tape", "g"
Step = Union[Op, Drop]

_FORWARDS = (OpKind.F_ALL, OpKind.F_CK, OpKind.F_NONE)


@dataclasses.dataclass(frozen=True)
class ExhaustiveResult:
    """An optimal sequence found by :func:`exhaustive_search`.

    Attributes:
      time: its total time (the least over all sequences that fit the budget).
      peak: its peak memory, ``x[0]`` included.
      steps: ops ``(OpKind, i)`` (``(OpKind.F_ALL, i, k)`` with option ``k >= 1``) and early
        frees ``("drop", (name, k))``, in order.
    """

    time: float
    peak: float
    steps: tuple[Step, ...]

    @property
    def ops(self) -> tuple[Op, ...]:
        """The ops alone, without the drops."""
        return tuple(step for step in self.steps if step[0] != "drop")

    @property
    def drops(self) -> int:
        """How many values the sequence frees early."""
        return sum(1 for step in self.steps if step[0] == "drop")


def replay(chain: Chain, steps: Iterable[Step]) -> tuple[float, float]:
    """``(time, peak)`` of a sequence of ops and drops, applied with the simulator's rules.

    Like :func:`~solver.chain.simulator.simulate` (which takes ops only), and likewise raising
    ``ValueError`` for an invalid step or a sequence that never computes ``g[0]``.
    """
    state = initial_state(chain)
    peak, time = state.memory, 0.0
    for position, step in enumerate(steps):
        try:
            if step[0] == "drop":
                state = drop(chain, state, step[1])
            else:
                state, candidate, op_time = apply_op(chain, state, step)
                peak, time = max(peak, candidate), time + op_time
        except ValueError as error:
            raise ValueError(f"Invalid step at position {position}: {error}") from None
    if not state.g & 1:
        raise ValueError("The sequence never computes g[0]: it does not finish the backward pass.")
    return float(time), float(peak)


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class _Search:
    """A* over memory states for one chain and budget (see the module docstring)."""

    def __init__(self, chain: Chain, budget: float) -> None:
        self.chain, self.budget, self.L = chain, budget, chain.length
        self.inside = chain.output_in_tape if chain.options is None else chain.options.output_in_tape
        self.ck_cuts = chain.x_rec_free > 0  # F_ck(i) also cuts x[i] (Chain.x_rec_size)
        self.options = [[k for k in range(len(counts)) if counts[k]] for counts in
                        (np.ones((chain.length, 1), bool) if chain.options is None
                         else chain.options.valid)]
        costs = [[layer_costs(chain, i, k) for k in ks] for i, ks in enumerate(self.options)]
        # Per layer, least time still owed (module docstring): a missing tape ``tb`` (the
        # cheapest tape-only forward and backward), a stored one ``stored[k]`` (its backward,
        # or dropping it and redoing ``tb``), and before the loss, above the highest
        # available activation, ``pre`` (a forward computing the output, then the rest).
        self.tb = [min(c.bwd_time + c.fwd_tape_time for c in row) for row in costs]
        self.stored = [{k: min(c.bwd_time, tb) for k, c in zip(ks, row)}
                       for ks, row, tb in zip(self.options, costs, self.tb)]
        self.pre = [
            min(float(chain.fwd_time[i]) + min(c.bwd_time for c in row),
                min(c.fwd_time + self.stored[i][k] for k, c in zip(self.options[i], row)))
            for i, row in enumerate(costs)
        ]

    def live_gradient(self, state: MemoryState) -> int:
        """``j`` with ``g[j]`` stored (one lineage), or ``L + 1`` before the loss."""
        return state.g.bit_length() - 1 if state.g else self.L + 1

    def _owed(self, state: MemoryState, i: int) -> float:
        return self.stored[i][state.option(i)] if state.tape >> i & 1 else self.tb[i]

    def lower_bound(self, state: MemoryState) -> float:
        """Time still needed from ``state`` at least (a consistent A* heuristic).

        After the loss, with ``g[j]`` live: the sum over ``i < j`` of what layer ``i`` still
        owes (``stored`` or ``tb``). Before it, with ``x[top]`` the highest available
        activation: ``min(owed, pre)`` for ``i < top`` and ``pre`` above. Without options
        these are the backward, plus the tape-only forward for a missing tape, plus the
        forward above ``top``. Each move lowers the bound by at most its time (a tape drop
        or a lower ``top`` only raises it).
        """
        j = self.live_gradient(state)
        if j <= self.L:
            return sum(self._owed(state, i) for i in range(j))
        top = max(k for k in range(self.L + 1) if state.has_x(k, self.inside))
        return (sum(min(self._owed(state, i), self.pre[i]) for i in range(top))
                + sum(self.pre[top:]))

    def clean(self, state: MemoryState) -> tuple[MemoryState, tuple[Step, ...]]:
        """Drop the values no remaining op reads (own ``x[k]``, ``tape[k]``, ``k >= j``)."""
        j = self.live_gradient(state)
        if j > self.L:
            return state, ()
        steps = tuple(
            ("drop", (name, k))
            for name, mask in (("x", state.x >> j << j), ("tape", state.tape >> j << j))
            for k in _bits(mask)
        )
        for _, value in steps:
            state = drop(self.chain, state, value)
        return state, steps

    def ops(self, state: MemoryState) -> Iterator[Op]:
        """Ops worth trying: inputs available, outputs still useful."""
        L, j = self.L, self.live_gradient(state)
        for i in range(min(L, j)):
            if state.has_x(i, self.inside):
                yield (OpKind.F_ALL, i)
                for k in self.options[i][1:]:
                    yield (OpKind.F_ALL, i, k)
                if i + 1 < j:
                    yield (OpKind.F_CK, i)
                    yield (OpKind.F_NONE, i)
                elif i + 1 == j and self.ck_cuts[i]:
                    yield (OpKind.F_CK, i)  # for its cut of x[i]: its x[j] is dropped at once
        if j > L and state.has_x(L, self.inside):
            yield (OpKind.LOSS, L)
        if 0 < j <= L:
            yield (OpKind.B, j - 1)

    def moves(self, state: MemoryState) -> Iterator[tuple[MemoryState, tuple[Step, ...], float]]:
        """``(next state, steps, time)`` for every move that fits the budget."""
        for op in self.ops(state):
            try:
                after, candidate, time = apply_op(self.chain, state, op)
            except ValueError:  # e.g. storing a value that is already stored
                continue
            if candidate > self.budget:
                continue
            after, cleanup = self.clean(after)
            yield after, (op,) + cleanup, time
        for name, mask in (("x", state.x & ~1), ("tape", state.tape)):  # never x[0], never g
            for k in _bits(mask):
                yield drop(self.chain, state, (name, k)), (("drop", (name, k)),), 0.0

    def run(self) -> ExhaustiveResult | None:
        start = initial_state(self.chain)
        if start.memory > self.budget:
            return None
        key = lambda s: (s.x, s.tape, s.g, s.tape_options, s.cut, s.cut_options, s.rec)  # noqa: E731
        best = {key(start): 0.0}
        parent: dict[tuple, tuple[tuple, tuple[Step, ...]] | None] = {key(start): None}
        counter = itertools.count()
        heap = [(self.lower_bound(start), next(counter), 0.0, start)]
        closed = set()
        while heap:
            _, _, cost, state = heapq.heappop(heap)
            here = key(state)
            if here in closed:
                continue
            closed.add(here)
            if state.g & 1:
                return self._result(parent, here)
            for after, steps, time in self.moves(state):
                there = key(after)
                if not after.has_x(0) and not after.g & 1:
                    continue  # x[0] lost before B(0): nothing can finish
                total = cost + time
                if there in closed or total >= best.get(there, math.inf):
                    continue
                best[there], parent[there] = total, (here, steps)
                heapq.heappush(heap, (total + self.lower_bound(after), next(counter), total, after))
        return None

    def _result(self, parent: dict, goal: tuple) -> ExhaustiveResult:
        pieces = []
        while parent[goal] is not None:
            goal, steps = parent[goal]
            pieces.append(steps)
        steps = tuple(step for piece in reversed(pieces) for step in piece)
        time, peak = replay(self.chain, steps)
        return ExhaustiveResult(time=time, peak=peak, steps=steps)


def exhaustive_search(chain: Chain, budget: float) -> ExhaustiveResult | None:
    """The fastest sequence of ops and early frees whose peak stays within ``budget``.

    Exact over all sequences of Rotor's five ops plus freeing any stored value at any
    moment (see the module docstring); ``None`` when no sequence fits. Takes well under a
    second up to 4 layers and seconds at 6.

    Raises:
      TypeError: ``chain`` is not a :class:`Chain`.
      ValueError: ``budget`` is not a finite number ``>= 0``, or the chain has more than
        ``MAX_EXHAUSTIVE_LAYERS`` layers (the number of memory states grows like ``8**L``;
        use ``solver.solve`` for longer chains).
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"exhaustive_search expects a solver.Chain, got {type(chain).__name__}.")
    budget = check_real(budget, "budget", hint="Pass the memory available, in the chain's units.")
    if chain.length > MAX_EXHAUSTIVE_LAYERS:
        raise ValueError(
            f"exhaustive search handles chains of at most {MAX_EXHAUSTIVE_LAYERS} layers, got "
            f"{chain.length}: the memory states grow like 8**L. Use solver.solve for longer "
            "chains."
        )
    return _Search(chain, budget).run()


def exhaustive_optimum(chain: Chain, budget: float) -> float:
    """The least time of any sequence fitting ``budget`` (``inf`` when none fits)."""
    result = exhaustive_search(chain, budget)
    return math.inf if result is None else result.time
