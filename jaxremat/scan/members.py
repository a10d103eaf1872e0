"""The nested-scan family: plans a fixed number of nested ``lax.scan`` levels express.

See :mod:`jaxremat.scan.family` for the family, the choice among its members and the
references; this module only describes members and turns them into ``solver.Plan`` objects.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import solver
from solver import Checkpoint, Layer

__all__ = ["UNROLL", "UNROLL_MAX_EQUATIONS", "auto_unroll", "check_unroll", "NestedScan",
           "pieces", "runs", "inner_sizes", "reshaped", "skeleton", "body_items", "solver_plan", "family",
           "loop_bodies"]


UNROLL = 2
"""Inner runs of at most this many layers are unrolled rather than scanned (the top level is
always a scan: a program flat in depth). XLA compiles a loop body per nested scan, five for
one checkpointing level against two for a scan with a policy: segments of two layers
unrolled compiled at 1.3-1.4x the scan with ``nothing_saveable`` against 2.0x as inner scans,
and held less memory (no loop outputs beside the body); four layers unrolled compiled as
slowly as the scan (CPU seconds, benchmarks/RESULTS.md)."""

UNROLL_MAX_EQUATIONS = 44
"""``unroll="auto"`` unrolls runs of at most :data:`UNROLL` layers for a layer whose jaxpr
has at most this many equations (sub-programs included), and scans them for a larger one.
An unrolled run puts each of its layers' equations into the segment's body, forward and
backward; an inner scan costs a few loop bodies whatever the layer. Measured on one member,
segments of two layers under ``dots_saveable``, at L = 32 and 64 (``benchmarks/scan_depth.py
--crossover``; CPU s of trace + compile of the gradient over the scan with
``nothing_saveable``; benchmarks/RESULTS.md, session 14): unrolled runs compile at 0.66-0.76x
the inner scans' time for layers of 6 and 14 equations (residual MLPs), at 0.97-1.02x for 31
(a pre-LayerNorm GELU MLP: the crossover), at 1.15-1.21x for 62 (two of them), and hold
2-9% less memory throughout. 44 is the geometric mean of 31 and 62. (The GPT-2 block, 89
equations, compiled alike both ways at L = 32: the count is a proxy for compile work, not
a measure of it.)"""


def auto_unroll(equations: int) -> int:
    """The ``unroll`` that ``unroll="auto"`` takes for a layer of ``equations`` jaxpr
    equations: :data:`UNROLL` for a small layer, 0 (every run a scan) for a large one
    (:data:`UNROLL_MAX_EQUATIONS`)."""
    return UNROLL if equations <= UNROLL_MAX_EQUATIONS else 0


def check_unroll(unroll: int | str) -> int | str:
    """``unroll`` if it is ``"auto"`` or an integer >= 0, else a ``ValueError`` naming both."""
    if unroll == "auto" and isinstance(unroll, str):
        return unroll
    if isinstance(unroll, bool) or not isinstance(unroll, int) or unroll < 0:
        raise ValueError(f"unroll must be \"auto\" (chosen from the layer's size) or an "
                         f"integer >= 0 (runs of at most that many layers unrolled; 0 scans "
                         f"every run), got {unroll!r}.")
    return unroll


@dataclasses.dataclass(frozen=True)
class NestedScan:
    """One member of the nested-scan family (module docstring).

    Attributes:
      sizes: segment lengths per checkpointing level, outermost first, strictly decreasing,
        each at least 1; ``()`` stores every tape (a plain scan).
      option: the chain option (:mod:`solver.chain.options`) every layer that stores its
        tape runs with: 0 the whole tape, ``k >= 1`` the layer under ``jax.checkpoint`` with
        the policy of option ``k`` (the same for every layer: the scan body is one program).
    """

    sizes: tuple[int, ...] = ()
    option: int = 0

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in sizes):
            raise ValueError(f"NestedScan sizes must be positive integers, got {sizes!r}.")
        if any(a <= b for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"NestedScan sizes must decrease from level to level, got {sizes!r}.")
        if isinstance(self.option, bool) or not isinstance(self.option, int) or self.option < 0:
            raise ValueError(f"NestedScan option must be an integer >= 0, got {self.option!r}.")
        object.__setattr__(self, "sizes", sizes)

    @property
    def levels(self) -> int:
        """Number of checkpointing levels (``lax.scan`` nests one deeper)."""
        return len(self.sizes)

    def __str__(self) -> str:
        policy = f", layers under option {self.option}" if self.option else ""
        if not self.sizes:
            return "plain scan (every tape stored)" + policy
        return "segments of " + " > ".join(map(str, self.sizes)) + " layers" + policy


def pieces(length: int, size: int) -> list[int]:
    """The piece lengths one level cuts a run of ``length`` layers into: ``size``-layer
    pieces, after one remainder piece of ``length mod size`` layers unless ``size`` divides
    ``length``. ``[length]`` when ``size >= length``."""
    if size >= length:
        return [length]
    count, rest = divmod(length, size)
    return ([rest] if rest else []) + [size] * count


def runs(parts: list[int]) -> list[tuple[int, int]]:
    """Consecutive equal piece lengths grouped as ``(length, count)``: ``[1, 4, 4] ->
    [(1, 1), (4, 2)]`` (a level runs each group of ``count >= 2`` as one ``lax.scan``)."""
    groups: list[tuple[int, int]] = []
    for part in parts:
        if groups and groups[-1][0] == part:
            groups[-1] = (part, groups[-1][1] + 1)
        else:
            groups.append((part, 1))
    return groups


def inner_sizes(size: int) -> list[int]:
    """The lengths a level below one of ``size`` layers may take: ``ceil(size / m)`` for
    ``m = 2 .. size`` (every distinct way to cut ``size`` layers into ``m`` near-equal
    pieces), largest first; about ``2 sqrt(size)`` values."""
    return sorted({-(-size // m) for m in range(2, size + 1)}, reverse=True)


def reshaped(length: int, sizes: tuple[int, ...]) -> bool:
    """Whether the top level of a stack of ``length`` layers under ``sizes`` is one scan over
    the stacked parameters reshaped to ``(length / k, k, ...)``: ``k = sizes[0]`` divides
    ``length`` (and is less). Then every segment, the last one included, is checkpointed,
    so that the parameters are never split (a leading-axis reshape is a bitcast in XLA)."""
    return bool(sizes) and sizes[0] < length and length % sizes[0] == 0


def skeleton(start: int, length: int, sizes: tuple[int, ...], option: int = 0,
             top: bool = True) -> list[tuple]:
    """The items for layers ``start .. start+length-1`` under the levels ``sizes``:
    ``("ck", a, b, body_sizes, option)`` for a checkpointed segment (its body: the same for
    ``b - a`` layers under ``body_sizes``, below the top level), ``("run", a, b, option)``
    for layers that store their tapes (option ``option``). At the top level (``top``) a
    size that divides ``length`` checkpoints every segment (:func:`reshaped`); otherwise
    every piece but the last is checkpointed, the last runs the next level inline."""
    while sizes and sizes[0] >= length:
        sizes = sizes[1:]
    if not sizes:
        return [("run", start, start + length, option)]
    if top and reshaped(length, sizes):
        size = sizes[0]
        return [("ck", a, a + size, sizes[1:], option) for a in range(start, start + length, size)]
    parts = pieces(length, sizes[0])
    items: list[tuple] = []
    for part in parts[:-1]:
        items.append(("ck", start, start + part, sizes[1:], option))
        start += part
    return items + skeleton(start, parts[-1], sizes[1:], option, top=False)


def body_items(item: tuple) -> list[tuple]:
    """The items a checkpointed segment ``("ck", a, b, body_sizes, option)`` recomputes."""
    _, a, b, sizes, option = item
    return skeleton(a, b - a, sizes, option, top=False)


def _plan(items: list[tuple]) -> list:
    plan: list = []
    for item in items:
        kind, a, b = item[:3]
        if kind == "run":
            plan.extend(Layer(i, item[3]) for i in range(a, b))
        else:
            plan.append(Checkpoint(a, b, tuple(_plan(body_items(item)))))
    return plan


def solver_plan(member: NestedScan, length: int) -> solver.Plan:
    """The ``solver.Plan`` of the unrolled chain of ``length`` layers that ``member``'s
    nested scans run (same checkpoints, same recomputations, same order)."""
    return tuple(_plan(skeleton(0, length, member.sizes, member.option)))


def loop_bodies(member: NestedScan, length: int, unroll: int = UNROLL) -> int:
    """The number of loops (``lax.scan`` bodies, nested ones included) in the gradient of
    ``member``'s program on ``length`` layers, inner runs of at most ``unroll`` layers
    unrolled (:func:`jaxremat.scan.realize.run_member`): what XLA compiles a loop body for, each
    with its per-leaf slicing and stacking. 2 for the plain scan and ``jax.checkpoint`` per
    layer (forward, backward), 5 for segments whose layers run as an inner scan.

    Counted from the items' primal loops ``P`` and gradient loops ``G`` (linearized
    forward and transpose): a scan of stored layers has ``P = 1, G = 2`` (unrolled: none); a
    checkpointed piece with body ``b`` runs ``b``'s primal in the forward and ``b``'s
    gradient when recomputed, ``P = P(b), G = P(b) + G(b)``; equal pieces as one scan add
    a loop to each, ``P = 1 + P(b), G = 2 + P(b) + G(b)``. Equals the scans of the
    gradient's jaxpr on every member (tests/test_scan.py); XLA inlines those of one
    iteration (a remainder of one layer scanned with ``unroll=0``)."""

    def run(n: int, sizes: tuple[int, ...], top: bool) -> tuple[int, int]:
        while sizes and sizes[0] >= n:
            sizes = sizes[1:]
        if not sizes:
            return (0, 0) if not top and n <= unroll else (1, 2)
        if top and reshaped(n, sizes):
            if sizes[0] == 1:  # jax.checkpoint per layer: the segment is the layer
                return 1, 2
            p, g = run(sizes[0], sizes[1:], False)
            return 1 + p, 2 + p + g
        parts = pieces(n, sizes[0])
        primal = gradient = 0
        for size, count in runs(parts[:-1]):
            p, g = run(size, sizes[1:], False)
            scan = count > 1
            primal, gradient = primal + scan + p, gradient + 2 * scan + p + g
        p, g = run(parts[-1], sizes[1:], False)
        return primal + p, gradient + g

    return run(length, member.sizes, True)[1]


def family(length: int, max_levels: int, options: int = 1) -> Iterator[NestedScan]:
    """Every member with at most ``max_levels`` levels on a chain of ``length`` layers whose
    layers offer ``options`` options (the brute-force reference for :func:`choose`; members
    may give equal plans)."""

    def extend(sizes: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        yield sizes
        if len(sizes) < max_levels:
            for k in inner_sizes(sizes[-1]):
                yield from extend(sizes + (k,))

    for option in range(options):
        yield NestedScan((), option)
        if max_levels >= 1:
            for k1 in range(1, length):
                for sizes in extend((k1,)):
                    yield NestedScan(sizes, option)


