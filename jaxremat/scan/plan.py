"""The plan :func:`jaxremat.remat_scan` applies for one input signature (:class:`ScanPlan`):
the nested-scan member chosen, its predicted and measured memory, and how it compares to
the plain scan and to Rotor's optimum on the unrolled chain (Beaumont et al.,
arXiv:1911.13214)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import solver
from solver import Chain, Schedule, format_bytes, format_plan

from ..sequence.layer import LayerProfile
from ..sequence.policies import DEFAULT_POLICIES, without_searched
from ..sequence.searched import SEARCHED, WIDEST, SearchedPolicy
from .family import loop_margin, member_schedule
from .members import NestedScan, loop_bodies, pieces, reshaped

__all__ = ["ScanPlan", "option_policies"]


def option_policies(profile: LayerProfile) -> tuple[Callable | None, ...]:
    """The ``jax.checkpoint`` policy of each chain option of the layer: ``None`` (the whole
    tape) for option 0, then those of ``profile.options``."""
    return (None,) + tuple(option.policy for option in profile.options)


def _format_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


@dataclasses.dataclass(frozen=True)
class ScanPlan:
    """The nested-scan plan for one input signature, and how it compares.

    Attributes:
      member: the nested-scan family member applied (:class:`jaxremat.scan.family.NestedScan`).
      chain: the homogeneous chain (per example under ``jax.vmap``): the layer's profile
        repeated ``L`` times.
      schedule: the member's plan on the unrolled chain, costed by ``solver.simulate``.
      layer: the layer's profile (:class:`jaxremat.sequence.profile.LayerProfile`).
      budget: bytes, for the whole batch; method, costs: how it was chosen.
      batch_size: the ``jax.vmap`` batch (1 without vmap).
      loop_margin: bytes per example added to the chain's peak for the member's loops
        (:func:`jaxremat.scan.family.loop_margin`).
      measured_peak: :func:`jaxremat.activation_memory` of the gradient of the plan's
        program (the sum of the output as the loss), for the whole batch: what the budget
        was checked against.
      unroll: inner runs of at most this many layers run unrolled (0: every run a scan),
        ``remat_scan``'s ``unroll`` or what ``"auto"`` chose for the layer.
    """

    member: NestedScan
    chain: Chain
    schedule: Schedule
    layer: LayerProfile
    budget: int
    method: str
    costs: str
    batch_size: int = 1
    loop_margin: float = 0.0
    measured_peak: int = 0
    unroll: int = 0

    @property
    def length(self) -> int:
        """Number of layers ``L``."""
        return self.chain.length

    @property
    def policy(self) -> Callable | None:
        """The ``jax.checkpoint`` policy the layers that store their tapes run under
        (``None``: the whole tape), from the member's option."""
        return option_policies(self.layer)[self.member.option]

    @property
    def option_name(self) -> str:
        """The name of the member's option (``"everything"``, ``"dots"``, ...)."""
        return "everything" if not self.member.option else \
            self.layer.options[self.member.option - 1].name

    @property
    def loop_bodies(self) -> int:
        """Loops in the gradient's program (:func:`jaxremat.scan.members.loop_bodies`): 2
        for the plain scan and ``jax.checkpoint`` per layer, more for nested scans. XLA
        compiles each body with its own slicing and stacking of every parameter leaf, so
        on a small layer compile time grows with it (benchmarks/RESULTS.md)."""
        return loop_bodies(self.member, self.length, self.unroll)

    @property
    def predicted_peak(self) -> float:
        """Predicted peak bytes of the step through the stack (the budget's quantity): the
        simulated peak of the unrolled chain plus the member's loop margin."""
        return (float(self.schedule.peak) + self.loop_margin) * self.batch_size

    @property
    def predicted_time(self) -> float:
        """Predicted forward + backward time, recomputation included (chain time unit)."""
        return float(self.schedule.time) * self.batch_size

    @property
    def no_remat(self) -> Schedule:
        """The plain scan (every tape stored) on the same chain."""
        return member_schedule(self.chain, NestedScan())

    @property
    def no_remat_peak(self) -> float:
        """Predicted peak bytes of the plain scan (every tape stored) on the same chain, its
        loop margin included, for the whole batch."""
        return (float(self.no_remat.peak) + loop_margin(self.chain, NestedScan())) * self.batch_size

    @functools.cached_property
    def rotor(self) -> Schedule | None:
        """Rotor's optimum on the unrolled chain at this budget (``solver.solve``), or
        ``None`` where it finds none."""
        try:
            return solver.solve(self.chain, self.budget / self.batch_size, method="rotor")
        except solver.InfeasibleBudget:
            return None

    @property
    def gap_to_rotor(self) -> float | None:
        """Predicted time over Rotor's on the unrolled chain, minus one (``0.02``: 2% slower)."""
        rotor = self.rotor
        return None if rotor is None else self.schedule.time / rotor.time - 1.0

    def levels(self) -> list[str]:
        """Per checkpointing level, how the runs of layers are cut (remainder first)."""
        lines = []
        runs = [self.length]
        for depth, size in enumerate(self.member.sizes, start=1):
            cuts = sorted({tuple(pieces(n, size)) for n in runs if n > size}, reverse=True)
            if not cuts:
                continue
            text = "; ".join(f"{n} = " + " + ".join(map(str, cut)) for n, cut in
                             ((sum(cut), cut) for cut in cuts))
            how = ("every one checkpointed, parameters reshaped" if depth == 1 and
                   reshaped(self.length, self.member.sizes) else "all but the last checkpointed")
            lines.append(f"level {depth}: segments of {size} layers ({text}; {how})")
            runs = sorted({p for cut in cuts for p in cut} | {n for n in runs if n <= size})
        lines = lines or ["no checkpoints: one scan storing every tape"]
        return lines + [f"layers that store their tapes keep: {self.option_name}"
                        + ("" if self.member.option else " (the whole tape)")]

    def report(self) -> str:
        """A readable summary: levels, predicted peak and time, gap to Rotor."""
        no_remat = self.no_remat
        gap = self.gap_to_rotor
        lines = [
            f"jaxremat scan plan: {self.length} layers, method={self.method!r}, "
            f"costs={self.costs!r}" + (f", vmap batch {self.batch_size}" if self.batch_size > 1
                                       else ""),
            f"  budget          {format_bytes(self.budget)} ({self.budget} bytes)",
            f"  nested scans    {self.member}" + (f" (inner runs of <= {self.unroll} layers "
                                                      f"unrolled)" if self.unroll else "")
            + f"; {self.loop_bodies} loops in the gradient (the plain scan: 2)",
        ] + [f"    {line}" for line in self.levels()] + [
            f"  predicted peak  {format_bytes(self.predicted_peak)} "
            f"({self.predicted_peak / self.budget:.0%} of budget, of which loop margin "
            f"{format_bytes(self.loop_margin * self.batch_size)}; no remat: "
            f"{format_bytes(self.no_remat_peak)})",
            f"  measured peak   {format_bytes(self.measured_peak)} (activation_memory, "
            f"program order)",
            f"  predicted time  {_format_time(self.predicted_time)} "
            f"({self.schedule.time / max(no_remat.time, 1e-300):.3f}x no remat)",
            "  Rotor unrolled  " + ("no schedule at this budget" if gap is None else
                                    f"{self.rotor.time / max(no_remat.time, 1e-300):.3f}x no "
                                    f"remat; nested scans are {gap:+.1%} slower"),
            f"  unrolled plan   {format_plan(self.schedule.plan, max_depth=2)[:300]}",
        ]
        room = self.room_hint()
        return "\n".join(lines + ([f"  room            {room}"] if room else []))

    def room_hint(self) -> str | None:
        """What to do where the plan recomputes while leaving a fifth of the budget or more
        unused, with no searched policy on the menu, outside ``jax.vmap``: a scan runs one
        policy in every layer, so between two uniform policies' memories only policies that
        keep more than the lesser and less than the next (``"dots_plus"``'s searched unions)
        use the room. ``None`` elsewhere."""
        used = self.measured_peak / max(self.budget, 1)
        recomputes = self.schedule.time > self.no_remat.time * (1 + 1e-9)
        searched = (any(isinstance(o.policy, SearchedPolicy) for o in self.layer.options)
                    or any(entry in (SEARCHED, WIDEST) for entry, _ in self.layer.dropped))
        if self.method != "rotor" or self.batch_size > 1 or searched or not recomputes \
                or used > 0.8:
            return None
        menu = ", ".join(f'"{entry}"' for entry in without_searched(DEFAULT_POLICIES)
                         + (SEARCHED,))
        return (f"{1 - used:.0%} of the budget unused: the next policy up on this menu does "
                f"not fit; policies=({menu}) adds policies searched in between (a first "
                f"plan about 3x longer; README, \"Scanned stacks\")")

    def __str__(self) -> str:
        return self.report()
