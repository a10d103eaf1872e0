"""The program-order walk behind :mod:`jaxremat.measure.meter`: liveness over jaxprs, calls inlined.

:class:`Walker` implements the memory model stated in :mod:`jaxremat.measure.meter`'s docstring
(values freed after their last use, calls measured as if inlined, loops conservative). The
public entry points (``program_memory``, ``activation_memory``, ``inputs_read``) live in
:mod:`jaxremat.measure.meter`; this module holds the walk and the values it reports.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, NamedTuple

from jax.extend.core import Jaxpr, Literal

from ..jax_compat import check_known
from ..trees import aval_nbytes
from .jaxpr_facts import DROPPED, device_nbytes, facts, is_view

__all__ = ["LiveValue", "Walker", "aval_nbytes", "device_nbytes", "is_view", "KEPT", "UNCOUNTED",
           "DEAD", "OUTSIDE"]

@dataclasses.dataclass(frozen=True)
class LiveValue:
    """One value live at the peak.

    Attributes:
      where: what produced it: ``"input 1"``, or ``"eqn 7 tanh"`` (the 8th equation of the
        top-level program, a ``tanh``); ``>`` separates nesting levels, e.g.
        ``"eqn 40 remat2 > eqn 3 tanh"``; ``"[out 1]"`` marks an equation's second output.
      aval: its abstract value, e.g. ``"float32[32,512]"``.
      nbytes: its size in bytes.
    """

    where: str
    aval: str
    nbytes: int


def _aval_text(aval: Any) -> str:
    return aval.str_short() if hasattr(aval, "str_short") else str(aval)


def _size(v: Any, nbytes: int | None) -> int:
    """``nbytes`` (:class:`jaxremat.measure.jaxpr_facts.JaxprFacts`), or measured now where
    it could not be (which raises the meter's error for symbolic shapes)."""
    return device_nbytes(v.aval) if nbytes is None else nbytes


class _Peak(NamedTuple):
    nbytes: int
    location: tuple[tuple[int, str], ...]


# How a (sub-)program's inputs are counted, one entry per input: ``OUTSIDE`` for an input
# not counted (an excluded input, or an operand live outside the call), otherwise the id of
# the buffer it holds: the input is counted from the start to its last use, and inputs with
# the same id alias one buffer (counted once, freed after the last use of any).
_Inputs = tuple[int, ...]
OUTSIDE = -1
# How its outputs are counted, one entry per output: live to the end (``KEPT``), never
# counted (``UNCOUNTED``: an uncounted output of the program outside), or an ordinary value
# freed after its last use inside (``DEAD``: nothing reads it after the call).
_Outputs = tuple[int, ...]
KEPT, UNCOUNTED, DEAD = 0, 1, 2

# Calls (:func:`jaxremat.jax_compat.is_call`): their sub-program's inputs are the
# equation's operands, one to one, and XLA inlines them: an operand they use last can be
# freed inside them (:attr:`jaxremat.measure.jaxpr_facts.JaxprFacts.first`). ``cond``
# passes its operands but the first (the branch index) to each branch.
_LOOPS = ("scan", "while")
_NONE: frozenset = frozenset()


class _Sub(NamedTuple):
    """The sub-program of an equation that reaches the largest inner peak."""

    peak: _Peak
    jaxpr: Jaxpr
    inputs: _Inputs
    outputs: _Outputs
    loop: bool


class Walker:
    """Walks jaxprs in program order (model: :mod:`jaxremat.measure.meter`).

    ``peak`` is cached per (sub-)jaxpr and input and output counting, with the jaxpr's
    other facts (:func:`jaxremat.measure.jaxpr_facts.facts`, kept while the jaxpr lives),
    so a body shared by many call sites (counted alike), or a program measured again, is
    walked once. ``live`` (for ``detail=True``) walks again up to the first equation that
    reaches the known peak and lists what is live there: one extra pass, no snapshot of the
    live set at every new maximum (quadratic on a long forward).
    """

    def peak(self, jaxpr: Jaxpr, inputs: _Inputs, outputs: _Outputs) -> _Peak:
        """Peak of ``jaxpr`` with its inputs and outputs counted as ``inputs``/``outputs``
        say (:data:`_Inputs`, :data:`_Outputs`)."""
        peaks = facts(jaxpr).peaks
        key = (inputs, outputs)
        found = peaks.get(key)
        if found is None:
            found = peaks[key] = self._walk(jaxpr, inputs, outputs, None)
        return found

    def live(self, jaxpr: Jaxpr, inputs: _Inputs, outputs: _Outputs) -> tuple[LiveValue, ...]:
        """The values live at the peak of ``jaxpr``, largest first."""
        lives = facts(jaxpr).lives
        key = (inputs, outputs)
        if key not in lives:
            target = self.peak(jaxpr, inputs, outputs).nbytes
            values = self._walk(jaxpr, inputs, outputs, target)
            lives[key] = tuple(sorted(values, key=lambda v: -v.nbytes))
        return lives[key]

    def summary(self, jaxpr: Jaxpr) -> tuple[tuple[bool, ...], tuple[int | None, ...]]:
        """``(reads, forwards)``: for each input of ``jaxpr``, whether an equation (through
        sub-programs: a call reads an operand only if its body does) or an output reads
        it; for each output, the index of the input it is (directly or passed through
        calls), or ``None`` for a value the program computes."""
        found = facts(jaxpr)
        return found.input_read, found.forwards

    def _sub(self, jaxpr: Jaxpr, inputs: _Inputs | None, outputs: _Outputs,
             loop: bool) -> _Sub:
        if len(outputs) != len(jaxpr.outvars):
            outputs = (KEPT,) * len(jaxpr.outvars)
        if loop:  # a loop body's outputs are the next carries and the stacked ys
            outputs = tuple(KEPT if c == DEAD else c for c in outputs)
        if inputs is None:
            inputs = (OUTSIDE,) * len(jaxpr.invars)
        return _Sub(self.peak(jaxpr, inputs, outputs), jaxpr, inputs, outputs, loop)

    def _inner(
        self, eqn: Any, bodies: tuple[Jaxpr, ...], first: int | None, outputs: _Outputs,
        handed: list[Any], buffer: Callable
    ) -> tuple[_Sub | None, set[Any]]:
        """The largest sub-program peak of ``eqn`` (``None`` if it has none) and the set of
        buffers handed to its sub-programs. ``bodies``, ``first``: its sub-programs and
        where their operands start (:class:`jaxremat.measure.jaxpr_facts.JaxprFacts`);
        ``handed``: the live
        buffers (counted, not used after ``eqn``) that ``eqn`` reads; ``buffer(v)``: the
        buffer of value ``v``."""
        name = eqn.primitive.name
        if name == "while":
            cond, body = eqn.params["cond_jaxpr"].jaxpr, eqn.params["body_jaxpr"].jaxpr
            subs = [self._sub(cond, None, (), True),  # its predicate is counted
                    self._sub(body, None, outputs, True)]
            return max(subs, key=lambda s: s.peak.nbytes), set()
        if first is None:  # loops and other primitives: operands stay outside
            check_known(eqn)
            subs = [self._sub(body, None, outputs, name in _LOOPS) for body in bodies]
            return (max(subs, key=lambda s: s.peak.nbytes) if subs else None), set()
        passed = [None if isinstance(v, Literal) else buffer(v) for v in eqn.invars[first:]]
        owned = set(handed) & set(passed)
        ids: dict[Any, int] = {}  # a buffer passed twice is one buffer inside too
        inputs = tuple(ids.setdefault(v, len(ids)) if v in owned else OUTSIDE for v in passed)
        subs = [self._sub(body, inputs, outputs, False) for body in bodies]
        return max(subs, key=lambda s: s.peak.nbytes), owned

    def _walk(self, jaxpr: Jaxpr, inputs: _Inputs, outputs: _Outputs, target: int | None) -> Any:
        """Without ``target``: the :class:`_Peak`. With it: the live values at the first
        candidate equal to ``target`` (the peak found by a first walk)."""
        info = facts(jaxpr)
        eqns = jaxpr.eqns
        end = len(eqns)
        # counted inputs sharing a buffer id are one buffer, kept under the first of them
        first: dict[int, Any] = {}
        aliases = {v: first.setdefault(b, v) for v, b in zip(jaxpr.invars, inputs)
                   if b != OUTSIDE}
        get = aliases.get
        buffer = lambda v: get(v, v)  # noqa: E731
        # the buffers each equation reads (an operand a call's body never reads is no use);
        # a call's output that is its operand passed through is the operand's buffer
        reads = []
        for eqn, read, forwarded in zip(eqns, info.reads, info.forwarded):
            invars = eqn.invars
            reads.append(list(dict.fromkeys(get(invars[m], invars[m]) for m in read)))
            for j, m in forwarded:
                aliases[eqn.outvars[j]] = get(invars[m], invars[m])
        last_use = {v: k for k, read in enumerate(reads) for v in read}
        outvars = [(buffer(v), c) for v, c in zip(jaxpr.outvars, outputs)
                   if not isinstance(v, Literal)]
        kept = {v for v, c in outvars if c == KEPT}
        skipped = {v for v, c in outvars if c == UNCOUNTED} - kept
        for v in kept:
            last_use[v] = end

        live: dict[Any, int] = {}
        names: dict[Any, str] = {}
        total = 0
        for i, (v, b, n) in enumerate(zip(jaxpr.invars, inputs, info.input_bytes)):
            if b != OUTSIDE and get(v, v) is v and v not in skipped:
                live[v] = _size(v, n)
                total += live[v]
                names[v] = f"input {i}"
        if target is not None and total == target:
            return self._values(live, names)
        best = _Peak(total, ())
        for v in [v for v in live if v not in last_use]:
            total -= live.pop(v)

        for k, (eqn, bodies, out_sizes) in enumerate(zip(eqns, info.bodies, info.out_bytes)):
            # new buffers (not passed-through operands, not uncounted program outputs)
            outs = [(v, n) for v, n in zip(eqn.outvars, out_sizes)
                    if n != DROPPED and get(v, v) is v and v not in skipped]
            out_bytes = sum(_size(v, n) for v, n in outs)
            # the live buffers this equation reads last: a call frees them inside its body
            handed = [v for v in reads[k] if v in live and last_use[v] == k]
            if bodies or eqn.primitive.name == "while":
                # how the sub-programs count their outputs (an uncounted output of this
                # program stays uncounted; one nothing reads after the call is dead)
                out_codes = tuple(
                    UNCOUNTED if buffer(v) in skipped
                    else KEPT if last_use.get(buffer(v), -1) > k else DEAD
                    for v in eqn.outvars
                )
                inner, owned = self._inner(eqn, bodies, info.first[k], out_codes, handed,
                                           buffer)
            else:
                check_known(eqn)
                inner, owned = None, _NONE
            outside = total - sum(live[v] for v in owned) if owned else total
            if inner is None:
                extra, use_inner, use_outs = out_bytes, False, True
            elif inner.loop:  # output buffers plus one iteration of the body
                extra, use_inner, use_outs = out_bytes + inner.peak.nbytes, True, True
            elif inner.peak.nbytes > out_bytes:
                extra, use_inner, use_outs = inner.peak.nbytes, True, False
            else:
                extra, use_inner, use_outs = out_bytes, False, True
            if target is not None and outside + extra == target:
                values = self._values({v: n for v, n in live.items() if v not in owned}, names)
                if use_outs:
                    values += [LiveValue(_name(eqn, v, k), _aval_text(v.aval), _size(v, n))
                               for v, n in outs]
                if use_inner:
                    sub_live = self.live(inner.jaxpr, inner.inputs, inner.outputs)
                    values += _prefixed(f"eqn {k} {eqn.primitive.name}", sub_live)
                return values
            if outside + extra > best.nbytes:
                below = inner.peak.location if use_inner else ()
                best = _Peak(outside + extra, ((k, eqn.primitive.name),) + below)
            for v, n in outs:
                if v in last_use:
                    live[v] = _size(v, n)
                    total += live[v]
                    if target is not None:
                        names[v] = _name(eqn, v, k)
            for v in handed:
                total -= live.pop(v)
        if target is not None:  # pragma: no cover - the first walk found this target
            raise AssertionError(f"peak {target} not reached again in the detail walk")
        return best

    @staticmethod
    def _values(live: dict[Any, int], names: dict[Any, str]) -> list[LiveValue]:
        return [LiveValue(names[v], _aval_text(v.aval), n) for v, n in live.items()]


def _name(eqn: Any, v: Any, k: int) -> str:
    """``"eqn 7 tanh"``, or ``"eqn 7 scan [out 1]"`` for one of several outputs."""
    if len(eqn.outvars) == 1:
        return f"eqn {k} {eqn.primitive.name}"
    return f"eqn {k} {eqn.primitive.name} [out {eqn.outvars.index(v)}]"


def _prefixed(prefix: str, values: Iterable[LiveValue]) -> list[LiveValue]:
    return [dataclasses.replace(v, where=f"{prefix} > {v.where}") for v in values]
