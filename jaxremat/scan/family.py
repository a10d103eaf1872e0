"""Nested-scan plans for a homogeneous chain, and the exact choice among them.

A stack of ``L`` identical layers run with ``lax.scan`` can only be checkpointed in ways a
fixed number of nested scans expresses, so that the program does not grow with ``L``. This
module describes that family, turns each member into the equivalent ``solver.Plan`` of the
unrolled chain, costs it with the chain simulator (:func:`solver.make_schedule`, i.e.
:func:`solver.simulate`) and picks the fastest member that fits a budget.

The family (:class:`NestedScan`). A member is a tuple of segment lengths ``sizes = (k1, k2,
..., kd)``, ``k1 > k2 > ... > kd >= 1``, one per checkpointing level, and an option: the
``jax.checkpoint`` policy every layer that stores its tape runs under (option 0: the
whole tape; ``solver.chain.options``; one for all layers, since the scan body is one
program). ``d = 0`` stores every tape (a plain scan, under the option's policy).

* Top level, ``k1`` divides ``L`` (:func:`reshaped`): one scan over the parameters reshaped
  to ``(L / k1, k1, ...)``, every segment a ``jax.checkpoint`` (the last one too: it is
  recomputed right after it ran, one segment's forward of extra work) that applies level
  2 to its layers when recomputed. Nothing is copied: XLA makes a leading-axis reshape a
  bitcast (the meter counts it as a view, :func:`jaxremat.measure.liveness.is_view`), and
  each level is one loop. ``(1,)`` is ``jax.checkpoint`` per layer in one scan.
* Otherwise (a remainder; and every level below the top) a run of ``n`` layers is cut into
  pieces of ``kj`` layers plus, when ``kj`` does not divide ``n``, one remainder piece of
  ``n mod kj`` layers first (:func:`pieces`; first rather than last, so that the last
  piece, run inline and not recomputed, is a whole one). Every piece but the last is a
  ``jax.checkpoint`` segment (equal pieces run as one ``lax.scan`` over checkpointed
  segments), applying level ``j + 1`` to its own layers when it is recomputed; the last
  piece is not checkpointed: level ``j + 1`` applies to it inline (a segment body ending
  in a checkpoint would recompute it for nothing, and ``solver.validate_plan`` forbids
  it). These levels split the parameters (``lax.split``: copies, up to three loops per
  level). With ``k1 >= L / 2`` such a member is "checkpoint the first ``L - k1`` layers
  as one segment, store the tapes of the last ``k1``", the shape Rotor's plans take at
  generous budgets.

After the last level, a run of layers is a plain scan keeping its tapes. A level whose
``kj`` is not less than the run's length is skipped for that run.

The choice (:func:`choose`) is exact within the family, by best-first search on the
simulated time (:mod:`jaxremat.scan.simulate` runs the simulator, replaying the segments a
homogeneous chain repeats; the member chosen is simulated again op by op), plus
:func:`loop_margin` (what the meter counts for loops and split parameters) on the peak.
Adding a level below a member (``sizes + (k,)``) turns stored runs into nested ones, which
only adds forward operations (each checkpointed piece of ``p`` layers adds ``p - 1``
forwards and one tape-only forward), so a member's simulated time bounds the time of all
its descendants from below. Starting from every member with at most one level (every
option), the search pops members in order of time and expands the ones over budget; the
first member popped that fits is the fastest of the family. A member (with its
descendants) whose peak is bound to exceed both the budget and the least peak already seen
(:func:`_floor`: the inputs of the checkpointed top-level pieces, stored when the loss
runs, plus a lower bound on the margin) is not costed: it can neither be chosen nor be the least peak that
an infeasible budget reports. On a homogeneous chain the search first costs a member only
when it comes first in the queue, by a lower bound on its time (just below its time
counted from its ops, :func:`member_time`), and
prunes every member that cannot fit: the same member comes out, with a fraction of the
simulations (at 50% of a 128-layer chain, most members are slower than the one chosen);
only when nothing fits is the search run again costing every member, for the least peak.
The levels below ``k1`` take the divisor-like lengths
``ceil(k / m)`` (:func:`inner_sizes`), so that the family stays small: ``k1`` takes every
length. ``tests/test_scan.py`` checks the choice by brute force over the whole family
(:func:`family`) on small chains with random costs and options.

Reference: Beaumont et al., "Optimal checkpointing for heterogeneous chains" (Rotor,
arXiv:1911.13214) for the chain model and the persistent plans; the options are Rockmate's
extension of it (Zhao et al., ICML 2023; ALGORITHMS.md section 2, "Multi-option layers");
the nested-scan shape is that of ``jax.checkpoint`` inside ``lax.scan`` (MaxText's
``scan_layers``), cut into levels as in Chen et al.'s sqrt(L) checkpointing
(arXiv:1604.06174, section 4.2, recursion).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from typing import Callable

import solver
from solver import Chain, Schedule, make_schedule
from solver.chain.options import layer_costs

from .loops import (PerOption, ScanBody, checkpointed_loops_peak, per_option,
                    run_backward_excess, run_forward_excess, segments_margin)
from .members import (UNROLL, NestedScan, family, inner_sizes, pieces, reshaped, runs,
                      solver_plan)
from .simulate import (is_homogeneous, phase_peaks, scanned_runs_peak, simulate_member,
                       unrolled_peak)

__all__ = ["NestedScan", "pieces", "inner_sizes", "reshaped", "solver_plan", "family",
           "choose", "member_time", "chain_options", "loop_margin", "Choice", "member_schedule",
           "FamilyInfeasible"]

_PEAK_TOLERANCE = 1e-9  # as solver.solve: the DP and the simulator sum sizes in other orders


class FamilyInfeasible(solver.InfeasibleBudget):
    """No member fits; ``.member`` and ``.schedule`` are the member of least peak."""

    def __init__(self, budget: float, min_budget: float, member: NestedScan,
                 schedule: Schedule) -> None:
        super().__init__(budget, min_budget, "remat_scan")
        self.member, self.schedule = member, schedule


@dataclasses.dataclass(frozen=True)
class Choice:
    """The member :func:`choose` picked, its simulated schedule, and the search's effort."""

    member: NestedScan
    schedule: Schedule
    evaluated: int


class _Search:
    """Members of one chain costed by the simulator: on a homogeneous chain through
    :func:`jaxremat.scan.simulate.simulate_member` (replays repeated segments, equals
    ``solver.simulate``), otherwise each distinct plan once by ``solver.make_schedule``."""

    def __init__(self, chain: Chain, margin: Callable[[NestedScan], float],
                 memo: dict | None) -> None:
        self.chain, self.margin = chain, margin
        self.memo: dict | None = None
        if is_homogeneous(chain):
            self.memo = {} if memo is None else memo
        self.seen: set = set()
        self.heap: list = []
        self.counter = itertools.count()
        self.min_peak = math.inf
        self.smallest: NestedScan | None = None
        self.smallest_counter = math.inf

    def push(self, member: NestedScan) -> None:
        self.evaluate(member, next(self.counter))

    def push_lazily(self, member: NestedScan, bound: float) -> None:
        """Queue ``member`` with a lower bound on its time, costed only when it comes first
        (:func:`choose`); it keeps its place in the push order for the tie-breaks."""
        heapq.heappush(self.heap, (bound, 0, 0.0, 0, next(self.counter), member))

    def evaluate(self, member: NestedScan, counter: int) -> None:
        if self.memo is None:
            plan = solver_plan(member, self.chain.length)
            if plan in self.seen:
                return
            self.seen.add(plan)
            schedule = make_schedule(self.chain, plan, method="remat_scan")
            time, peak = schedule.time, schedule.peak
        else:
            self.seen.add(member)
            time, peak = simulate_member(self.chain, member, self.memo)
        peak += self.margin(member)
        if (peak, counter) < (self.min_peak, self.smallest_counter):
            self.min_peak, self.smallest, self.smallest_counter = peak, member, counter
        heapq.heappush(self.heap, (time, 1, peak, member.levels, counter, member))


def chain_options(chain: Chain) -> int:
    """The options every layer of the homogeneous ``chain`` offers (1: the whole tape only).
    A member runs all its stored layers under one option, so only the options valid on
    every layer count (the first ``K`` columns, as ``LayerOptions`` lays them out)."""
    if chain.options is None:
        return 1
    valid = chain.options.valid.all(axis=0)
    return int(valid.argmin()) if not valid.all() else int(valid.size)


def loop_margin(chain: Chain, member: NestedScan, param_bytes: float = 0.0,
                unroll: int = UNROLL, grad_bytes: PerOption | None = None,
                invariant_bytes: PerOption = 0.0, floor: bool = False,
                scan_bodies: tuple[ScanBody, ...] | None = None,
                checkpoint_bodies: tuple[ScanBody, ...] | None = None) -> float:
    """Bytes to add to the unrolled chain's simulated peak of ``member`` for its loops and
    parameter slices: what the program-order meter (:func:`jaxremat.activation_memory`,
    loops as in :mod:`jaxremat.measure.meter`) counts and the chain does not, an upper bound
    on the meter's peak (measurements: benchmarks/RESULTS.md, "Scanned stacks" sections).
    ``param_bytes``: one layer's parameters (``P``); ``grad_bytes``: the parameter gradients
    the layer's backward holds at its peak under the member's policy
    (:func:`jaxremat.scan.held.held_gradient_bytes`; ``param_bytes`` when not given);
    ``invariant_bytes``: the loop invariants a scan of the layer hoists
    (:func:`jaxremat.scan.held.loop_invariant_bytes`); ``scan_bodies``: per option, what a
    scan of the layer holds (:class:`jaxremat.scan.loops.ScanBody`, measured by
    :func:`jaxremat.scan.held.scan_body`; replaces ``invariant_bytes`` and the guesses
    below where given); ``checkpoint_bodies``: per option, what a scan of the layer under
    ``jax.checkpoint`` holds (the same, measured on the checkpointed layer);
    ``floor``: a lower bound on the margin instead, computed without simulating (what
    :func:`choose` prunes with). ``x``: one activation; ``tape``: one layer's tape under the
    member's option.

    The meter allocates a loop's outputs (stacked residuals or gradients, final carry)
    before its body runs, and counts the body's own values beside them: one iteration's
    outputs twice, and the new carry beside the old. So, by member kind:

    * plain scan (no level), by phase (:func:`jaxremat.scan.simulate.phase_peaks`): the
      forward loop's tape and carry on the chain's forward peak; the backward loop's tape
      on its ``B`` peak (the body reads its tape as a slice, live to the loop's end, and
      cannot free it early as ``bwd_tmp`` credits); with ``scan_bodies`` what its loops
      hold measured on the layer where that is more (the loops' rows, carries, body and
      constants, :func:`jaxremat.scan.loops.checkpointed_loops_peak`'s sum: the bias-free
      ``x + relu(x @ w) @ v`` block's hoisted zeros, 256 B over the by-phase term at width 8,
      1.09-1.21 of the prediction, tests/test_scan_margin.py).
    * ``jax.checkpoint`` per layer (``(1,)``): the backward loop's final carry on the ``B``
      peak, or with ``checkpoint_bodies`` what the loops hold measured on the layer
      (:func:`jaxremat.scan.loops.checkpointed_loops_peak`) where that is more.
    * unrolled pieces (one level of at most ``unroll`` layers, or two with ``j <=
      unroll``), by op (:func:`jaxremat.scan.simulate.unrolled_peak`): the outer loop's
      carry and the segment's ``k P`` on every op, each ``B`` op's parameter gradients,
      and a scan of ``m >= 2`` equal checkpointed pieces' loop terms where it runs.
    * two levels ``(k, j)`` of scanned stored runs under a reshaped top level, without a
      scan of checkpointed pieces, by op (:func:`jaxremat.scan.simulate.scanned_runs_peak`):
      what the runs' loops hold where they run (:mod:`jaxremat.scan.loops`: stacked rows,
      carry, body, the invariants; without ``scan_bodies``, one tape per row and body and
      ``3 x``, which covered the GPT-2 block's invariants), the outer loop's carry, the
      segment's ``k P`` once (and the policy's gradients without ``scan_bodies``); the
      least of that and the whole-peak terms below.
    * the others, on the whole peak: ``2 x`` per level (the segment's input and the
      carry); one ``tape`` for a scan of stored layers, or, where the innermost runs are
      unrolled, one carry less and ``k P`` for their parameter slices (copies); a top level
      that splits the parameters (not :func:`jaxremat.scan.members.reshaped`) twice
      ``L P`` (pieces and gradient pieces before their concatenation; once for unrolled
      pieces, whose gradients are counted by op), two levels twice ``k P``. One reshaped
      level of scanned stored runs with ``scan_bodies`` by phase instead
      (:func:`jaxremat.scan.loops.segments_margin`); without, at least the chain's peak in
      the recomputations (:func:`jaxremat.scan.simulate.phase_peaks`) plus one ``tape``,
      the outer loop's carry and ``invariant_bytes`` (the whole-peak terms missed the GPT-2
      block's hoisted causal mask broadcasts by 512 B where that phase peaks).
    * under a policy (option >= 1), every kind but the first two: ``grad_bytes``, the
      gradients a backward loop's body holds at its layer's backward peak beside the
      stacked rows (``bwd_tmp`` counts none).

    ``floor=True``: what every phase holds (``x``, the split, ``k P`` but for two levels
    below a splitting top); for scanned runs and segments what the ops where the chain may
    peak add at least. Where the margin is loose, :meth:`RematScan._fit` still measures the
    member chosen and names its measured peak as the least budget."""
    x = float(chain.x_size[0])
    L = chain.length
    sizes = tuple(k for k in member.sizes if k < L)
    tape = float(chain.xbar_size[0] if chain.options is None or not member.option
                 else chain.options.xbar_size[0, member.option])
    if sizes in ((), (1,)):  # the loop terms by phase (docstring)
        forward, recompute, backward = phase_peaks(chain, member)
        peak = max(forward, recompute, backward)
        if not sizes:  # the plain scan
            loops = max(forward + tape + x, backward + tape)
            if scan_bodies is not None:  # its loops measured on the layer (hoisted values)
                loops = max(loops, checkpointed_loops_peak(L, x, scan_bodies[member.option]))
            return loops - peak
        loops = max(forward, recompute, backward + x)  # jax.checkpoint per layer
        if checkpoint_bodies is not None:
            loops = max(loops, checkpointed_loops_peak(L, x, checkpoint_bodies[member.option]))
        return loops - peak
    # under a policy, the gradients the backward loop's body holds at its peak (docstring)
    option = member.option
    grads = (param_bytes if grad_bytes is None else per_option(grad_bytes, option)) \
        if option else 0.0
    body = None if scan_bodies is None else scan_bodies[option]
    invariants = per_option(invariant_bytes, option) if body is None else body.invariants
    split = grads
    if not reshaped(L, sizes):
        split += 2 * L * param_bytes
    if _unrolled_pieces(sizes, unroll):  # by phase (docstring)
        if not reshaped(L, sizes):  # the split pieces once, their gradients by phase
            split -= L * param_bytes
        if floor:  # the terms every phase holds: the chain's peak is one of the phases'
            replaced = len(sizes) == 2 and not reshaped(L, sizes)  # (unrolled_peak)
            return x + (0.0 if replaced else sizes[0] * param_bytes) + split
        peak, with_gradients = unrolled_peak(chain, member, param_bytes)
        return with_gradients - peak + x + split
    loops = 2 * x * len(sizes)
    if sizes[-1] <= unroll:  # the innermost runs are unrolled: no loop inside the last
        tape = 0.0  # level's pieces (its loop holds one carry), each unrolled layer's
        loops += sizes[-1] * param_bytes - x  # parameter slices (copies) until its backward
    if len(sizes) > 1:
        split += 2 * sizes[0] * param_bytes
    whole = tape + loops + split
    if len(sizes) == 1 and tape and reshaped(L, sizes):  # scanned segments (docstring)
        if body is not None:
            return segments_margin(chain, option, sizes[0], whole,
                                   None if floor else phase_peaks(chain, member), body)
        if invariants and not floor:
            forward, recompute, backward = phase_peaks(chain, member)
            whole = max(whole, recompute + tape + x + invariants + split
                        - max(forward, recompute, backward))
    if not _scanned_runs(L, sizes, unroll):
        return whole
    # by op (docstring): the split pieces once, the outer loop's carry, the runs' loops
    # where they run. Without measured bodies, the guess 3 x: on the GPT-2 block's 4 > 2
    # (whole tapes, the peak a run's last F_all) the invariants (4.5 x) and the outer
    # carry less what its rows and body hold under one tape each (2.5 x); on the MLP
    # blocks (no invariants) 2 x loose (RESULTS.md, "Scanned stacks (CPU), session 18")
    common = sizes[0] * param_bytes + (3 * x + grads if body is None else x)
    invariants = (0.0, 0.0) if body is None else (body.invariants, body.backward_invariants)
    if floor:  # where the chain peaks: at a run's last layer or elsewhere
        return min(whole, common + min(
            min(run_forward_excess(chain, option, n, n - 1, body) + invariants[0],
                run_backward_excess(chain, option, n, n - 1, param_bytes, body) + invariants[1])
            for n in set(pieces(sizes[0], sizes[1]))))
    peak, in_runs, other = scanned_runs_peak(chain, member, param_bytes, common, body)
    return min(whole, max(in_runs, other + whole) - peak)


def _scanned_runs(length: int, sizes: tuple[int, ...], unroll: int) -> bool:
    """Whether :func:`loop_margin` takes ``sizes`` (levels below ``length``) by op as two
    levels ``(k, j)`` whose innermost runs are scans of stored layers (``j > unroll``):
    a top level that reshapes the parameters, and no level running equal checkpointed
    pieces as a ``lax.scan`` (:func:`jaxremat.scan.members.runs`)."""
    if len(sizes) != 2 or sizes[-1] <= unroll or not reshaped(length, sizes):
        return False
    return all(count == 1 for _, count in runs(pieces(sizes[0], sizes[1])[:-1]))


def _unrolled_pieces(sizes: tuple[int, ...], unroll: int) -> bool:
    """Whether :func:`loop_margin` takes ``sizes`` (levels below ``L``) by phase as unrolled
    pieces: one level of segments of at most ``unroll`` layers (``(1,)`` aside), or two,
    ``(k, j)`` with ``j <= unroll`` (a scan of the segment's checkpointed pieces where
    ``k > 2 j``, :func:`jaxremat.scan.simulate.unrolled_peak`)."""
    return bool(sizes) and sizes != (1,) and sizes[-1] <= unroll and len(sizes) <= 2


def _floor(chain: Chain, member: NestedScan, margin: Callable[[NestedScan], float],
           deeper: int) -> float:
    """A lower bound on the peak plus margin of ``member`` (``deeper=0``) and every member
    below it (its levels and more, ``deeper=1``): when the loss runs, the input of each
    checkpointed top-level piece is stored (``x`` each, whatever the levels below do), plus
    the least ``margin`` of the member (``deeper=0``) or of its children (``deeper=1``:
    every ``sizes + (k,)``, ``k`` in :func:`inner_sizes`; the children of unrolled pieces
    take their terms by phase, which depend on ``k`` and the chain, so no one child bounds
    the others). ``margin``: the margin or a lower bound on it (:func:`choose`'s
    ``margin_floor``; ``loop_margin(..., floor=True)`` does not simulate). A member three
    levels down keeps the terms on the whole peak, which grow with the levels."""
    sizes, L = member.sizes, chain.length
    if reshaped(L, sizes):
        pieces_stored = L // sizes[0]
    else:
        pieces_stored = len(pieces(L, sizes[0])) - 1
    below = [member]
    if deeper:  # every child: those of unrolled pieces take their terms by phase
        below = [NestedScan(sizes + (k,), member.option) for k in inner_sizes(sizes[-1])] \
            or [member]
    return pieces_stored * float(chain.x_size[0]) + min(map(margin, below))


def member_time(chain: Chain, member: NestedScan) -> float:
    """The simulated time of ``member`` on the homogeneous ``chain``, counted instead of
    simulated: every op's time is its layer's (``solver.apply_op``), so it is a sum over
    the ops of the member's plan. A checkpointed segment runs ``F_ck`` / ``F_none`` on its
    layers (``fwd_time``), then its body in its backward; a run of stored layers runs
    ``F_all`` under the member's option and ``B`` on each, its last ``F_all`` the
    tape-only forward (``fwd_tape_time``) where its output's gradient is already there
    (the run ends a segment's body). Equals :func:`jaxremat.scan.simulate.simulate_member`'s
    time up to rounding (tests/test_scan.py)."""
    cost = layer_costs(chain, 0, member.option)
    forward = float(chain.fwd_time[0])

    def run(n: int, sizes: tuple[int, ...], top: bool, gradient_after: bool) -> float:
        """Layers ``n`` under ``sizes`` (:func:`jaxremat.scan.members.skeleton`'s cuts)."""
        while sizes and sizes[0] >= n:
            sizes = sizes[1:]
        if not sizes:
            last = cost.fwd_tape_time if gradient_after else cost.fwd_time
            return (n - 1) * cost.fwd_time + last + n * cost.bwd_time
        if top and reshaped(n, sizes):
            return n // sizes[0] * segment(sizes[0], sizes[1:])
        parts = pieces(n, sizes[0])
        head = parts[:-1]  # a remainder and pieces of sizes[0]: two lengths at most
        return (sum(head.count(part) * segment(part, sizes[1:]) for part in sorted(set(head)))
                + run(parts[-1], sizes[1:], False, gradient_after))

    def segment(n: int, sizes: tuple[int, ...]) -> float:
        """A checkpointed segment: its forward without tapes, then its body."""
        return n * forward + run(n, sizes, False, True)

    return run(chain.length, member.sizes, True, False)


def choose(chain: Chain, budget: float, *, max_levels: int = 2,
           margin: Callable[[NestedScan], float] | None = None,
           memo: dict | None = None,
           margin_floor: Callable[[NestedScan], float] | None = None) -> Choice:
    """The fastest member of the family with at most ``max_levels`` levels whose simulated
    peak, plus ``margin(member)`` (none by default; :func:`loop_margin` for the meter's
    loops), fits ``budget`` (ties: the lower peak, then fewer levels). ``memo``: a dict to
    keep the simulator's segment records in between calls on the same chain.
    ``margin_floor``: a lower bound on ``margin``, cheaper to compute, for the search's
    pruning (:func:`_floor`; ``margin`` itself by default; ``loop_margin(..., floor=True)``
    for :func:`loop_margin`, which simulates the members it takes by phase).

    Raises:
      FamilyInfeasible (a ``solver.InfeasibleBudget``): no member fits; ``.min_budget`` is
        the least peak (margin included) in the family (every member was costed by then),
        ``.member`` the member that has it.
    """
    margin = margin or (lambda member: 0.0)
    floor = margin_floor or margin
    if is_homogeneous(chain):  # first costing only what may fit
        found = _search(_Search(chain, margin, memo), budget, max_levels, True, floor)
        if found is not None:
            return found
    search = _Search(chain, margin, memo)  # every member, for the least peak too
    found = _search(search, budget, max_levels, False, floor)
    if found is not None:
        return found
    smallest = search.smallest
    raise FamilyInfeasible(budget, search.min_peak, smallest, member_schedule(chain, smallest))


def _search(search: _Search, budget: float, max_levels: int, lazy: bool,
            margin_floor: Callable[[NestedScan], float] | None = None) -> Choice | None:
    """Best-first search (module docstring) for the fastest member that fits, or ``None``.

    ``lazy`` (homogeneous chains): a member is queued with a lower bound on its time (just
    below :func:`member_time`) and costed only when it comes first, and members that
    cannot fit are pruned whatever their peak: the member returned is the same (costed
    members leave the queue in the same order), but the least peak is not known when
    nothing fits. Otherwise every member is costed
    when queued and pruned only when it cannot fit *and* cannot have the least peak, so
    that ``search.min_peak`` is the family's least peak when ``None`` is returned.
    ``margin_floor``: the lower bound on the margin :func:`_floor` prunes with (by default
    ``search.margin``)."""
    chain, margin_floor = search.chain, margin_floor or search.margin
    L, limit = chain.length, budget * (1 + _PEAK_TOLERANCE)
    lazy = lazy and search.memo is not None

    def hopeless(member: NestedScan, deeper: int) -> bool:
        floor = _floor(chain, member, margin_floor, deeper)
        return floor > limit and (lazy or floor >= search.min_peak)

    def dead(member: NestedScan) -> bool:  # neither it nor a member below it can serve
        below = len(member.sizes) < max_levels and member.sizes[-1] > 1
        return hopeless(member, 0) and (not below or hopeless(member, 1))

    roots = [NestedScan((k,) if k else (), option) for option in range(chain_options(chain))
             for k in (range(L) if max_levels >= 1 else (0,))]
    # the reshaped ones first: they set a low least peak, below the floor of many others
    for root in sorted(roots, key=lambda m: not (not m.sizes or reshaped(L, m.sizes))):
        if root.sizes and dead(root):
            continue  # neither it nor a descendant fits or has less peak than one costed
        if lazy:  # a bound just below the time: ties are costed, then ranked by peak
            search.push_lazily(root, member_time(chain, root) * (1 - 1e-9))
        else:
            search.push(root)
    while search.heap:
        time, costed, peak, levels, counter, member = heapq.heappop(search.heap)
        if not costed:
            search.evaluate(member, counter)
            continue
        if peak <= limit:
            return Choice(member, member_schedule(chain, member), len(search.seen))
        if 1 <= levels < max_levels and member.sizes[-1] > 1:
            if hopeless(member, 1):
                continue  # no descendant fits, none has less peak than one already costed
            for k in inner_sizes(member.sizes[-1]):
                child = NestedScan(member.sizes + (k,), member.option)
                if lazy:
                    if not dead(child):
                        search.push_lazily(child, member_time(chain, child) * (1 - 1e-9))
                else:
                    search.push(child)
    return None


def member_schedule(chain: Chain, member: NestedScan) -> Schedule:
    """``member``'s plan on ``chain``, costed by the simulator."""
    return make_schedule(chain, solver_plan(member, chain.length), method="remat_scan")
