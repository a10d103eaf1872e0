"""The nested-scan family: plans a fixed number of nested ``lax.scan`` levels express.

See :mod:`jaxremat.scan.family` for the family, the choice among its members and the
references; this module only describes members and turns them into ``solver.Plan`` objects.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import solver
from solver import Checkpoint, Layer

__all__ = ["NestedScan", "pieces", "inner_sizes", "skeleton", "solver_plan", "family"]


@dataclasses.dataclass(frozen=True)
class NestedScan:
    """One member of the nested-scan family (module docstring).

    Attributes:
      sizes: segment lengths per checkpointing level, outermost first, strictly decreasing,
        each at least 1; ``()`` stores every tape (a plain scan).
    """

    sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        sizes = tuple(self.sizes)
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in sizes):
            raise ValueError(f"NestedScan sizes must be positive integers, got {sizes!r}.")
        if any(a <= b for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"NestedScan sizes must decrease from level to level, got {sizes!r}.")
        object.__setattr__(self, "sizes", sizes)

    @property
    def levels(self) -> int:
        """Number of checkpointing levels (``lax.scan`` nests one deeper)."""
        return len(self.sizes)

    def __str__(self) -> str:
        if not self.sizes:
            return "plain scan (every tape stored)"
        return "segments of " + " > ".join(map(str, self.sizes)) + " layers"


def pieces(length: int, size: int) -> list[int]:
    """The piece lengths one level cuts a run of ``length`` layers into: ``size``-layer
    pieces, after one remainder piece of ``length mod size`` layers unless ``size`` divides
    ``length``. ``[length]`` when ``size >= length``."""
    if size >= length:
        return [length]
    count, rest = divmod(length, size)
    return ([rest] if rest else []) + [size] * count


def inner_sizes(size: int) -> list[int]:
    """The lengths a level below one of ``size`` layers may take: ``ceil(size / m)`` for
    ``m = 2 .. size`` (every distinct way to cut ``size`` layers into ``m`` near-equal
    pieces), largest first; about ``2 sqrt(size)`` values."""
    return sorted({-(-size // m) for m in range(2, size + 1)}, reverse=True)


def skeleton(start: int, length: int, sizes: tuple[int, ...]) -> list[tuple]:
    """The items for layers ``start .. start+length-1`` under the levels ``sizes``:
    ``("ck", a, b, body_sizes)`` for a checkpointed segment (its body: the same for
    ``b - a`` layers under ``body_sizes``), ``("run", a, b)`` for layers that store their
    tapes; every piece but the last is checkpointed, the last runs the next level inline."""
    while sizes and sizes[0] >= length:
        sizes = sizes[1:]
    if not sizes:
        return [("run", start, start + length)]
    parts = pieces(length, sizes[0])
    items: list[tuple] = []
    for part in parts[:-1]:
        items.append(("ck", start, start + part, sizes[1:]))
        start += part
    return items + skeleton(start, parts[-1], sizes[1:])


def _plan(items: list[tuple]) -> list:
    plan: list = []
    for kind, a, b, *rest in items:
        if kind == "run":
            plan.extend(Layer(i) for i in range(a, b))
        else:
            plan.append(Checkpoint(a, b, tuple(_plan(skeleton(a, b - a, rest[0])))))
    return plan


def solver_plan(member: NestedScan, length: int) -> solver.Plan:
    """The ``solver.Plan`` of the unrolled chain of ``length`` layers that ``member``'s
    nested scans run (same checkpoints, same recomputations, same order)."""
    return tuple(_plan(skeleton(0, length, member.sizes)))


def family(length: int, max_levels: int) -> Iterator[NestedScan]:
    """Every member with at most ``max_levels`` levels on a chain of ``length`` layers (the
    brute-force reference for :func:`choose`; members may give equal plans)."""
    yield NestedScan()

    def extend(sizes: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        yield sizes
        if len(sizes) < max_levels:
            for k in inner_sizes(sizes[-1]):
                yield from extend(sizes + (k,))

    if max_levels >= 1:
        for k1 in range(1, length):
            yield from map(NestedScan, extend((k1,)))


