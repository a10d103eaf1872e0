"""The program-order walk behind :mod:`jaxremat.measure.meter`: liveness over jaxprs, calls inlined.

:class:`Walker` implements the memory model stated in :mod:`jaxremat.measure.meter`'s docstring
(values freed after their last use, calls measured as if inlined, loops conservative). The
public entry points (``program_memory``, ``activation_memory``, ``inputs_read``) live in
:mod:`jaxremat.measure.meter`; this module holds the walk and the values it reports.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, NamedTuple

import jax
from jax.extend.core import DropVar, Jaxpr, Literal

from ..jax_compat import check_known, in_host_memory, is_call, sub_jaxprs
from ..trees import aval_nbytes

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



def device_nbytes(aval: Any) -> int:
    """Device bytes of one value: :func:`aval_nbytes`, or 0 for a value in host memory (a
    residual a checkpoint offload policy moved to ``pinned_host``,
    :func:`jaxremat.jax_compat.in_host_memory`). The meter counts device memory only."""
    return 0 if in_host_memory(aval) else aval_nbytes(aval)


def _aval_text(aval: Any) -> str:
    return aval.str_short() if hasattr(aval, "str_short") else str(aval)


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
# freed inside them. ``cond`` passes its operands but the first (the branch index) to each
# branch.
_LOOPS = ("scan", "while")


class _Sub(NamedTuple):
    """The sub-program of an equation that reaches the largest inner peak."""

    peak: _Peak
    jaxpr: Jaxpr
    inputs: _Inputs
    outputs: _Outputs
    loop: bool


_Key = tuple[int, _Inputs, _Outputs]


def _handover(eqn: Any) -> tuple[list[Jaxpr], int] | None:
    """``(bodies, first)`` for a call or ``cond`` ``eqn`` whose bodies' inputs are its
    operands ``first, first + 1, ...`` (``cond``'s operand 0 is the branch index), ``None``
    for loops, other primitives and mismatched arities (operands stay outside)."""
    first = 0 if is_call(eqn) else 1 if eqn.primitive.name == "cond" else None
    bodies = sub_jaxprs(eqn)
    if first is None or not bodies:
        return None
    if any(len(body.invars) != len(eqn.invars) - first for body in bodies):
        return None
    return bodies, first


def is_view(eqn: Any) -> bool:
    """Whether ``eqn`` only reinterprets its operand's buffer, which XLA compiles to a
    bitcast (row-major layouts, the default): a ``squeeze`` (drops size-1 axes), or a
    ``reshape`` without transposition that changes only the leading axes, i.e. the new and
    old shapes share all their axes but the first of one of them, such as
    ``(L, d) <-> (L / k, k, d)`` (how ``remat_scan`` regroups stacked parameters) or
    ``(1, d) <-> (d,)``. Other reshapes are counted as copies."""
    name = eqn.primitive.name
    if name == "squeeze":
        return True
    if name != "reshape" or eqn.params.get("dimensions") is not None:
        return False
    old, new = tuple(eqn.invars[0].aval.shape), tuple(eqn.outvars[0].aval.shape)
    common = 0
    while common < min(len(old), len(new)) and old[-1 - common] == new[-1 - common]:
        common += 1
    return common >= min(len(old), len(new)) - 1


class Walker:
    """Walks jaxprs in program order (model: :mod:`jaxremat.measure.meter`).

    ``peak`` is cached per (sub-)jaxpr and input and output counting, so a body shared by
    many call sites (counted alike) is walked once. ``live`` (for ``detail=True``) walks
    again up to the first equation that reaches the known peak and lists what is live
    there: one extra pass, no snapshot of the live set at every new maximum (quadratic on
    a long forward).
    """

    def __init__(self) -> None:
        # each cache entry keeps its Jaxpr, which keeps the id in the key valid
        self._peaks: dict[_Key, tuple[Jaxpr, _Peak]] = {}
        self._lives: dict[_Key, tuple[Jaxpr, tuple[LiveValue, ...]]] = {}
        self._summaries: dict[int, tuple[Jaxpr, tuple[bool, ...], tuple[int | None, ...]]] = {}

    def peak(self, jaxpr: Jaxpr, inputs: _Inputs, outputs: _Outputs) -> _Peak:
        """Peak of ``jaxpr`` with its inputs and outputs counted as ``inputs``/``outputs``
        say (:data:`_Inputs`, :data:`_Outputs`)."""
        key = (id(jaxpr), inputs, outputs)
        if key not in self._peaks:
            self._peaks[key] = (jaxpr, self._walk(jaxpr, inputs, outputs, None))
        return self._peaks[key][1]

    def live(self, jaxpr: Jaxpr, inputs: _Inputs, outputs: _Outputs) -> tuple[LiveValue, ...]:
        """The values live at the peak of ``jaxpr``, largest first."""
        key = (id(jaxpr), inputs, outputs)
        if key not in self._lives:
            target = self.peak(jaxpr, inputs, outputs).nbytes
            values = self._walk(jaxpr, inputs, outputs, target)
            self._lives[key] = (jaxpr, tuple(sorted(values, key=lambda v: -v.nbytes)))
        return self._lives[key][1]

    def summary(self, jaxpr: Jaxpr) -> tuple[tuple[bool, ...], tuple[int | None, ...]]:
        """``(reads, forwards)``: for each input of ``jaxpr``, whether an equation (through
        sub-programs: a call reads an operand only if its body does) or an output reads
        it; for each output, the index of the input it is (directly or passed through
        calls), or ``None`` for a value the program computes."""
        if id(jaxpr) not in self._summaries:
            read = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
            origin = {v: i for i, v in enumerate(jaxpr.invars)}
            for eqn in jaxpr.eqns:
                read.update(eqn.invars[m] for m in self.operands_read(eqn))
                for j, m in self.forwarded(eqn).items():
                    if not isinstance(eqn.invars[m], Literal) and eqn.invars[m] in origin:
                        origin[eqn.outvars[j]] = origin[eqn.invars[m]]
            forwards = tuple(None if isinstance(v, Literal) else origin.get(v)
                             for v in jaxpr.outvars)
            self._summaries[id(jaxpr)] = (jaxpr, tuple(v in read for v in jaxpr.invars), forwards)
        return self._summaries[id(jaxpr)][1:]

    def operands_read(self, eqn: Any) -> list[int]:
        """The indices of the operands of ``eqn`` (literals left out) that it reads: all of
        them, except those a call or every branch of a ``cond`` passes to a body that never
        reads them (after inlining, XLA removes them as dead code)."""
        handover = _handover(eqn)
        unread: set[int] = set()
        if handover is not None:
            bodies, first = handover
            reads = [self.summary(body)[0] for body in bodies]
            unread = {first + i for i in range(len(eqn.invars) - first)
                      if not any(read[i] for read in reads)}
        return [m for m, v in enumerate(eqn.invars)
                if not isinstance(v, Literal) and m not in unread]

    def forwarded(self, eqn: Any) -> dict[int, int]:
        """``{j: m}``: output ``j`` of the call (or of every branch of the ``cond``) ``eqn``
        is its operand ``m``, passed through: after inlining, the same buffer. An
        ``optimization_barrier`` passes every operand through (XLA copies nothing); a
        view (:func:`is_view`: leading-axis reshape, squeeze) is its operand's buffer."""
        if eqn.primitive.name == "optimization_barrier":
            return {j: j for j, out in enumerate(eqn.outvars) if not isinstance(out, DropVar)}
        if is_view(eqn):
            return {} if isinstance(eqn.outvars[0], DropVar) else {0: 0}
        handover = _handover(eqn)
        if handover is None:
            return {}
        bodies, first = handover
        forwards = [self.summary(body)[1] for body in bodies]
        return {j: first + i for j, i in enumerate(forwards[0])
                if i is not None and all(f[j] == i for f in forwards)
                and not isinstance(eqn.outvars[j], DropVar)}

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
        self, eqn: Any, outputs: _Outputs, handed: list[Any], buffer: Callable
    ) -> tuple[_Sub | None, set[Any]]:
        """The largest sub-program peak of ``eqn`` (``None`` if it has none) and the set of
        buffers handed to its sub-programs. ``handed``: the live buffers (counted, not
        used after ``eqn``) that ``eqn`` reads; ``buffer(v)``: the buffer of value ``v``."""
        name = eqn.primitive.name
        if name == "while":
            cond, body = eqn.params["cond_jaxpr"].jaxpr, eqn.params["body_jaxpr"].jaxpr
            subs = [self._sub(cond, None, (), True),  # its predicate is counted
                    self._sub(body, None, outputs, True)]
            return max(subs, key=lambda s: s.peak.nbytes), set()
        handover = _handover(eqn)
        if handover is None:  # loops and other primitives: operands stay outside
            check_known(eqn)
            subs = [self._sub(body, None, outputs, name in _LOOPS) for body in sub_jaxprs(eqn)]
            return (max(subs, key=lambda s: s.peak.nbytes) if subs else None), set()
        bodies, first = handover
        passed = [None if isinstance(v, Literal) else buffer(v) for v in eqn.invars[first:]]
        owned = set(handed) & set(passed)
        ids: dict[Any, int] = {}  # a buffer passed twice is one buffer inside too
        inputs = tuple(ids.setdefault(v, len(ids)) if v in owned else OUTSIDE for v in passed)
        subs = [self._sub(body, inputs, outputs, False) for body in bodies]
        return max(subs, key=lambda s: s.peak.nbytes), owned

    def _walk(self, jaxpr: Jaxpr, inputs: _Inputs, outputs: _Outputs, target: int | None) -> Any:
        """Without ``target``: the :class:`_Peak`. With it: the live values at the first
        candidate equal to ``target`` (the peak found by a first walk)."""
        end = len(jaxpr.eqns)
        # counted inputs sharing a buffer id are one buffer, kept under the first of them
        first: dict[int, Any] = {}
        aliases = {v: first.setdefault(b, v) for v, b in zip(jaxpr.invars, inputs)
                   if b != OUTSIDE}
        buffer = lambda v: aliases.get(v, v)  # noqa: E731
        # the buffers each equation reads (an operand a call's body never reads is no use);
        # a call's output that is its operand passed through is the operand's buffer
        reads = []
        for eqn in jaxpr.eqns:
            reads.append(list(dict.fromkeys(buffer(eqn.invars[m])
                                            for m in self.operands_read(eqn))))
            for j, m in self.forwarded(eqn).items():
                if not isinstance(eqn.invars[m], Literal):
                    aliases[eqn.outvars[j]] = buffer(eqn.invars[m])
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
        for i, (v, b) in enumerate(zip(jaxpr.invars, inputs)):
            if b != OUTSIDE and buffer(v) is v and v not in skipped:
                live[v] = device_nbytes(v.aval)
                total += live[v]
                names[v] = f"input {i}"
        if target is not None and total == target:
            return self._values(live, names)
        best = _Peak(total, ())
        for v in [v for v in live if v not in last_use]:
            total -= live.pop(v)

        for k, eqn in enumerate(jaxpr.eqns):
            name = eqn.primitive.name
            # new buffers (not passed-through operands, not uncounted program outputs)
            outs = [v for v in eqn.outvars
                    if not isinstance(v, DropVar) and buffer(v) is v and v not in skipped]
            out_bytes = sum(device_nbytes(v.aval) for v in outs)
            # how the sub-programs count their outputs (an uncounted output of this
            # program stays uncounted; one nothing reads after the call is dead)
            out_codes = tuple(
                UNCOUNTED if buffer(v) in skipped
                else KEPT if last_use.get(buffer(v), -1) > k else DEAD
                for v in eqn.outvars
            )
            # the live buffers this equation reads last: a call frees them inside its body
            handed = [v for v in reads[k] if v in live and last_use[v] == k]
            inner, owned = self._inner(eqn, out_codes, handed, buffer)
            outside = total - sum(live[v] for v in owned)
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
                    values += [
                        LiveValue(_name(eqn, v, k), _aval_text(v.aval), device_nbytes(v.aval))
                        for v in outs
                    ]
                if use_inner:
                    sub_live = self.live(inner.jaxpr, inner.inputs, inner.outputs)
                    values += _prefixed(f"eqn {k} {name}", sub_live)
                return values
            if outside + extra > best.nbytes:
                below = inner.peak.location if use_inner else ()
                best = _Peak(outside + extra, ((k, name),) + below)
            for v in outs:
                if v in last_use:
                    live[v] = device_nbytes(v.aval)
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
