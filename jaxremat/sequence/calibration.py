"""Static costs of a layer's pieces at a new input shape without lowering them (issue 18.4).

A layer's profile needs ``cost_analysis()`` flops and bytes accessed of up to ``1 + 3 *
options`` programs (its plain forward; per option the tape-only forward, the vjp forward and
the pullback: :func:`jaxremat.sequence.layer.layer_costs`). Lowering each to XLA took most
of a profile's time (about 0.7 s of 1.0 s for a GPT-2 block's two profiles at a new batch
size), while counting the same program on its jaxpr (:func:`jaxremat.measure.costs.count_terms`)
takes milliseconds and traces nothing.

The count is not XLA's: it agrees on flops to 0.5% but misses what lowering adds (scalars
broadcast to full arrays, ``integer_pow`` expanded, implicit broadcasts as reshape +
broadcast pairs), so its bytes are 10-45% below XLA's on a GPT-2 block, and a plain
lowered/counted ratio moves by up to 2% between batch sizes (the weights' bytes do not scale
with the batch, the activations' do). A :class:`CostMeter` therefore lowers and counts each
piece at the first shape of a layer (the *calibration*, kept in the profile cache); at a
later shape of the same layer (same function, parameters, input structure, ranks and
dtypes, cost model and menu) whose jaxpr has the same equations, it counts the piece term
by term (flops per equation, bytes per operand and result) and splits the terms into
*fixed* (equal at both shapes: weights, masks) and *scaling* ones. Per field:

    lowered(new) = F + (lowered(old) - F) * S(new) / S(old)

with ``F`` the fixed terms' sum and ``S`` the scaling terms'. It is exact when XLA counts the
fixed terms as the jaxpr does and its scaling terms grow by one common factor, as all
activations do with the batch size; with the sequence length (attention is quadratic) it
is an approximation. A piece whose equations differ from the calibration's only in how
arrays are laid out (the same operations in the same order, reshapes and squeezes aside:
``jnp.einsum`` squeezes a batch dimension of size 1, so a batch of one is such a program) is
*estimated* as :func:`scaled_costs` with the operations' terms paired in order
(:func:`estimated_costs`). A piece whose operations differ from its calibration's while the
layer's plain forward was carried (:data:`FORWARD`: the layer did not branch on a shape, the
piece's policy keeps other equations at this shape: a searched policy whose shape keys
collide, :mod:`jaxremat.sequence.searched`) is *rated*: its count times the calibration's
lowered / counted ratio, per field (:func:`ratio_costs`; on 12 GPT-2 blocks at sequence length
32 after 64, within 0.03% of the lowered flops and 0.5-0.9% of the bytes). A piece the
calibration lacks, or whose layer branched on a shape, is lowered. Errors measured in
benchmarks/RESULTS.md ("Issue 18.4"). Measured costs (``costs="measured"``) always lower: their flops only bound the timed
backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Iterator, Mapping

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr

from ..measure.costs import CountTerms, count_terms, lowered_costs

__all__ = ["Calibration", "CostMeter", "FORWARD", "Uncalibrated", "estimated_costs",
           "lowered_once", "lowering_memo", "meter_for", "ratio_costs", "scaled_costs"]

FORWARD = "forward"
"""The piece name of a layer's plain forward (:func:`jaxremat.sequence.layer.forward_costs`),
costed before its options' pieces."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """One piece at the calibration shape: ``(flops, bytes accessed)`` as lowered
    (``cost_analysis()``), and the terms of its count on the jaxpr."""

    lowered: tuple[float, float]
    counted: CountTerms


def _carried(kept: float, new: float, old: float, lowered: float) -> float:
    """``lowered`` (at the old shape) carried to the new one (module docstring): ``kept`` the
    fixed terms' sum, ``new`` and ``old`` all terms' sums at the two shapes."""
    scaling_old = old - kept
    if scaling_old == 0:  # nothing changed size (or only zero terms)
        return lowered + new - kept
    return kept + (lowered - kept) * (new - kept) / scaling_old


def _scaled(new: np.ndarray, old: np.ndarray, lowered: float) -> float:
    """``lowered`` carried to the new shape, the terms paired in order."""
    return _carried(float(old[new == old].sum()), float(new.sum()), float(old.sum()), lowered)


def _paired(new: np.ndarray, old: np.ndarray, new_paired: np.ndarray, old_paired: np.ndarray,
            lowered: float) -> float:
    """``lowered`` carried to the new shape where the two programs differ in layout changes
    (:attr:`CountTerms.operations`): the operations' terms paired in order and carried as
    :func:`_scaled` carries all terms, the layout changes' terms counted as they are (XLA
    counts them as the count does: on a GPT-2 block at batch 1 this gives the lowered
    bytes to 1e-4, where scaling them too is 5% off)."""
    a, b = new[new_paired], old[old_paired]
    layout_new, layout_old = float(new.sum() - a.sum()), float(old.sum() - b.sum())
    if len(a) != len(b):
        return float(new.sum()) * (lowered / float(old.sum()) if old.sum() else 1.0)
    return _carried(float(b[a == b].sum()), float(a.sum()), float(b.sum()),
                    lowered - layout_old) + layout_new


def _same_terms(a: CountTerms, b: CountTerms) -> bool:
    """Whether two counts have the same equations and the same terms."""
    return (a.structure == b.structure and np.array_equal(a.flops, b.flops)
            and np.array_equal(a.bytes, b.bytes))


def scaled_costs(counted: CountTerms, reference: Calibration) -> tuple[float, float] | None:
    """``(flops, bytes accessed)`` at a new shape from its count and the calibration's, or
    ``None`` when the two jaxprs differ in their equations."""
    old = reference.counted
    if counted.structure != old.structure or len(counted.bytes) != len(old.bytes):
        return None
    return (_scaled(counted.flops, old.flops, reference.lowered[0]),
            _scaled(counted.bytes, old.bytes, reference.lowered[1]))


def estimated_costs(counted: CountTerms, reference: Calibration) -> tuple[float, float] | None:
    """``(flops, bytes accessed)`` at a new shape whose jaxpr has the calibration's operations
    laid out differently (:attr:`CountTerms.operations`): as :func:`scaled_costs`, with the
    fixed terms found among the operations' terms paired in order, and the layout changes'
    terms scaling; ``None`` when the operations differ."""
    old = reference.counted
    if counted.operations is None or counted.operations != old.operations:
        return None
    return (_paired(counted.flops, old.flops, counted.flops_paired, old.flops_paired,
                    reference.lowered[0]),
            _paired(counted.bytes, old.bytes, counted.bytes_paired, old.bytes_paired,
                    reference.lowered[1]))


_LOWERED = threading.local()  # .memo: a count's terms -> [[jaxpr, its text or None, costs], ...]


@contextlib.contextmanager
def lowering_memo() -> Iterator[None]:
    """A block (one :func:`jaxremat.sequence.profile.profile_sequence`) inside which
    :func:`lowered_once` lowers each program once; the programs it holds are let go at its
    end (kept longer, they slowed the garbage collector more than they saved)."""
    if getattr(_LOWERED, "memo", None) is not None:  # nested: the outer block's memo
        yield
        return
    _LOWERED.memo = {}
    try:
        yield
    finally:
        _LOWERED.memo = None


def _program_text(entry: list) -> str:
    """The printed program of a :data:`_LOWERED` entry, printed once, its outputs sorted:
    ``cost_analysis()`` counts operations, not the order of the results (a layer's forward
    traced without and with the input's gradient lists its residuals in another order)."""
    if entry[1] is None:
        text = str(entry[0])
        start, end = text.rfind(" in ("), text.rfind(")")
        if 0 <= start < end:
            outputs = sorted(text[start + 5:end].split(", "))
            text = text[:start] + " in (" + ", ".join(outputs) + text[end:]
        entry[1] = text
    return entry[1]


def lowered_once(fn: Callable, args: tuple, jaxpr: ClosedJaxpr, counted: CountTerms
                 ) -> tuple[float, float]:
    """``(flops, bytes accessed)`` of ``fn(*args)`` as lowered (``cost_analysis()``), whose
    jaxpr is ``jaxpr`` and its count ``counted``; inside a :func:`lowering_memo` block once
    per program: a piece whose printed
    jaxpr (equations, parameters, shapes and dtypes) equals one lowered before on the same
    backend takes that one's costs. A layer's first shape lowers its pieces without and
    with the input's gradient, whose forwards are the same programs traced twice (on 12
    GPT-2 blocks with ``"dots_plus"``, 15 of 62 lowerings). Printing a program (about 4 ms
    on a GPT-2 block's pullback, against 30 ms to lower it) is done only where the count
    matches an earlier piece's term by term."""
    memo = getattr(_LOWERED, "memo", None)
    if memo is None:
        found = lowered_costs(fn, *args)
        return found["flops"], found["bytes accessed"]
    key = (jax.default_backend(), counted.structure, counted.flops.tobytes(),
           counted.bytes.tobytes())
    entries = memo.get(key)
    if entries is not None:
        mine = [jaxpr, None, None]
        for entry in entries:
            if entry[0] is jaxpr or _program_text(entry) == _program_text(mine):
                return entry[2]
    found = lowered_costs(fn, *args)
    lowered = (found["flops"], found["bytes accessed"])
    entry = [jaxpr, None if entries is None else _program_text(mine), lowered]
    memo[key] = (entries or []) + [entry]
    return lowered


def ratio_costs(counted: CountTerms, reference: Calibration) -> tuple[float, float]:
    """``(flops, bytes accessed)`` of a piece whose operations differ from its calibration's
    while the layer's do not (a policy keyed by shapes that keeps other equations at this
    shape): its count times the calibration's lowered / counted ratio, per field."""
    return tuple(new * (lowered / old if old else 1.0) for new, old, lowered
                 in zip(counted.totals, reference.counted.totals, reference.lowered))


class Uncalibrated(Exception):
    """A :class:`CostMeter` with ``strict`` set met a piece it cannot take from its
    calibration (the caller redoes the profile the ordinary way)."""


@dataclasses.dataclass(frozen=True)
class CostMeter:
    """Costs of one layer profile's pieces (module docstring).

    Attributes:
      reference: the calibration of an earlier shape of the same layer, by piece name
        (``None``: lower every piece).
      found: the pieces this profile lowered, filled in as it goes (a calibration for later
        shapes).
      carried: ``{FORWARD}`` once the layer's plain forward was carried from its
        calibration (the layer's operations did not change: the ratio tier may serve).
      scale: whether to count and scale at all (``False`` for measured costs).
      strict: ``"scaled"``: raise :class:`Uncalibrated` instead of lowering a piece;
        ``"same"``: also where the piece's count differs from the calibration's in any
        term (a check of a profile derived without tracing, at the calibration's shape).
    """

    reference: Mapping[str, Calibration] | None = None
    found: dict[str, Calibration] = dataclasses.field(default_factory=dict)
    carried: set[str] = dataclasses.field(default_factory=set)
    scale: bool = True
    strict: str | None = None

    def costs(self, piece: str, fn: Callable, args: tuple, jaxpr: ClosedJaxpr | None,
              skip_outputs: int = 0) -> tuple[float, float]:
        """``(flops, bytes accessed)`` of ``fn(*args)``, whose jaxpr is ``jaxpr`` (its last
        ``skip_outputs`` outputs are not ``fn``'s: :func:`count_terms`); ``piece`` names it
        within the layer (e.g. ``"dots:backward"``)."""
        if not self.scale or jaxpr is None:
            found = lowered_costs(fn, *args)
            return found["flops"], found["bytes accessed"]
        counted = count_terms(jaxpr, skip_outputs)
        reference = (self.reference or {}).get(piece)
        if self.strict == "same" and not (reference is not None
                                          and _same_terms(counted, reference.counted)):
            raise Uncalibrated(piece)
        if reference is not None:
            scaled = scaled_costs(counted, reference) or estimated_costs(counted, reference)
            if scaled is not None:
                if piece == FORWARD:
                    self.carried.add(piece)
                return scaled
            if FORWARD in self.carried and self.strict != "same":
                return ratio_costs(counted, reference)
        if self.strict:
            raise Uncalibrated(piece)
        lowered = lowered_once(fn, args, jaxpr, counted)
        self.found[piece] = Calibration(lowered, counted)
        return lowered

    def calibration(self) -> dict[str, Calibration]:
        """The pieces to keep for later shapes: the reference's, and those lowered now that
        it lacks (a piece lowered because its equations differ keeps the reference's)."""
        return {**self.found, **(self.reference or {})}


def meter_for(reference: Mapping[str, Calibration] | None, costs: str) -> CostMeter:
    """A :class:`CostMeter` for a profile with ``costs`` (``"measured"``: lower everything)."""
    return CostMeter(reference=reference, scale=costs != "measured")
