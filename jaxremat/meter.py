"""Program-order memory of a JAX program: the meter that sees rematerialization on CPU.

XLA's CPU compiler undoes remat (ALGORITHMS.md section 7), so compiled memory numbers on
CPU cannot tell a checkpointed program from a plain one. This module measures memory on the
jaxpr instead, in the order JAX emits it: the forward, then the transposed backward, where a
``jax.checkpoint`` shows up as a ``remat`` equation whose body recomputes the forward of
its segment right before that segment's backward.

The model (a liveness analysis over the equations, in program order):

* A value is allocated when the equation producing it runs and freed right after the
  equation that uses it last (an equation's operands stay live while it runs). A value
  that nothing uses is allocated and freed by its own equation.
* The peak candidate of an equation is ``live bytes before it + bytes of its outputs``; the
  peak of the program is the largest candidate (and the live bytes at the start).
* *Excluded* inputs (parameters) and closed-over constants are never counted: they live
  before and after the program, whatever it does.
* Program outputs are not counted when ``count_outputs=False`` (for
  :func:`activation_memory` they are the parameter gradients, the size of the
  parameters and the same for every schedule). A value that is an output is then never
  counted, from the equation producing it to the end. With ``count_outputs=True`` an
  output is live from its equation to the end.
* Literals, ``DropVar`` outputs, tokens and ``float0`` values take no memory; a typed PRNG
  key array takes the bytes of its key data (``dtype.itemsize`` is the key data size). An
  output that nothing uses (jax 0.10 prints it as ``_`` too, but it is a ``Var``) is
  allocated by its equation and freed right after it.
* Sub-programs are entered, and a call is measured as if inlined, since XLA inlines calls
  (and remat bodies) before it assigns buffers. For a call (``jit``/``pjit``, ``remat``/
  ``checkpoint``, ``custom_jvp_call``, ``custom_vjp_call``, ``closed_call``, ``core_call``)
  and for each branch of a ``cond``:

  - an operand still used after the call (or an output of the program) stays live
    throughout the call, outside it;
  - an operand whose *last* use is this call is handed to the sub-program ("owned"): the
    sub-walk counts it from its start and frees it right after its last use inside the
    body (at the start if the body never reads it). An operand passed twice (or inputs
    aliasing one buffer) is one buffer, freed after the last use of any of its names.
    Ownership passes down nested calls level by level. A ``cond``'s branch index is not
    passed to the branches: it stays live during the cond;
  - an operand that the body (every branch of a ``cond``) never reads is no use at all:
    after inlining XLA removes it as dead code;
  - a call's output that nothing reads after the call is an ordinary value inside: freed
    after its last use there. The other outputs are live from their equation inside to
    the end (except uncounted program outputs outside, never counted).

  The candidate is ``live before, less the owned operands, + max(inner peak, outputs)``,
  where the inner peak counts what the sub-program creates and its owned operands while
  they live; ``cond`` takes its largest branch. A call thus measures what the same code
  inlined measures (tests/test_meter.py checks this on re-traced, inlined programs), with
  one exception: an output that is one of the call's operands (no new buffer when inlined)
  is counted as a new value when the operand is used after the call (JAX forwards such
  outputs out of ``jit`` when tracing, so this is rare). Sub-programs of other primitives
  (``shard_map``, whose body sees per-shard values, and any primitive not named above)
  keep the conservative rule: all operands stay live until the call returns.
* Loops (``scan``, ``while``) keep that conservative rule too: their constants and
  carries are read by every iteration, and a stacked ``xs`` is read until the last one, so
  no operand can be freed inside the body. The outputs (final carries, stacked ``ys``) are
  allocated before the body runs and the candidate is ``live before + outputs + body
  peak``; the body's new carry is counted beside the old one (double buffering), one
  iteration is measured (every iteration has the same peak) and a slice of ``xs`` is a
  view (not counted). ``while`` takes the larger of its ``cond`` and ``body`` peaks. (XLA
  may reuse a dead initial carry's buffer for the loop state; the model does not, so a
  loop can measure up to one carry more than XLA needs.)

It is a model, not XLA's allocator: XLA fuses element-wise chains (fewer temporaries) and
may reuse or donate buffers, so absolute numbers differ from a device's, but two schedules
of the same model compare the way they would on a GPU, where remat is kept.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, NamedTuple

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, DropVar, Jaxpr, Literal, jaxprs_in_params

from .budget import format_bytes

__all__ = [
    "LiveValue", "MemoryReport", "activation_memory", "aval_nbytes", "inputs_read",
    "program_memory",
]

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


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Where a program's memory peaks (returned with ``detail=True``).

    Attributes:
      peak: the peak in bytes (what the function returns without ``detail``).
      location: the path to the equation at the peak, from the top-level program down:
        ``((index, primitive name), ...)``; empty when the peak is at the start (inputs).
      live: the values live at the peak, largest first; their sizes add up to ``peak``.
      num_eqns: the number of top-level equations of the program.
    """

    peak: int
    location: tuple[tuple[int, str], ...]
    live: tuple[LiveValue, ...]
    num_eqns: int

    def where(self) -> str:
        """The peak's location as text: ``"eqn 40 (remat2) > eqn 3 (tanh)"`` or ``"start"``."""
        if not self.location:
            return "start"
        return " > ".join(f"eqn {index} ({name})" for index, name in self.location)

    def __str__(self) -> str:
        lines = [
            f"peak {self.peak} bytes ({format_bytes(self.peak)}) at {self.where()} "
            f"of {self.num_eqns} equations; {len(self.live)} values live:"
        ]
        for value in self.live:
            lines.append(f"  {format_bytes(value.nbytes):>12}  {value.aval:<20} {value.where}")
        return "\n".join(lines)


def aval_nbytes(aval: Any) -> int:
    """Bytes of one value of abstract value ``aval``: ``size * dtype.itemsize``.

    Tokens and other shapeless avals take 0 bytes, so does ``float0``; a typed PRNG key
    array takes its key data's bytes (its key dtype's ``itemsize`` is the key data size).
    """
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None or dtype == jax.dtypes.float0:
        return 0
    try:
        size = int(math.prod(shape))
    except (TypeError, jax.errors.InconclusiveDimensionOperation) as error:  # symbolic dims
        raise TypeError(
            f"Cannot measure a value of shape {shape}: the memory meter needs concrete "
            f"shapes. Trace the program with concrete input shapes (no shape polymorphism)."
        ) from error
    return size * int(dtype.itemsize)


def _aval_text(aval: Any) -> str:
    return aval.str_short() if hasattr(aval, "str_short") else str(aval)


class _Peak(NamedTuple):
    nbytes: int
    location: tuple[tuple[int, str], ...]


# How a (sub-)program's inputs are counted, one entry per input: ``_OUTSIDE`` for an input
# not counted (an excluded input, or an operand live outside the call), otherwise the id of
# the buffer it holds: the input is counted from the start to its last use, and inputs with
# the same id alias one buffer (counted once, freed after the last use of any).
_Inputs = tuple[int, ...]
_OUTSIDE = -1
# How its outputs are counted, one entry per output: live to the end (``_KEPT``), never
# counted (``_UNCOUNTED``: an uncounted output of the program outside), or an ordinary value
# freed after its last use inside (``_DEAD``: nothing reads it after the call).
_Outputs = tuple[int, ...]
_KEPT, _UNCOUNTED, _DEAD = 0, 1, 2

# Calls whose sub-program's inputs are the equation's operands, one to one, and which XLA
# inlines: an operand they use last can be freed inside them. ``cond`` passes its operands
# but the first (the branch index) to each branch.
_CALLS = frozenset({
    "jit", "pjit", "closed_call", "core_call", "remat2", "remat", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
})
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
    first = 0 if eqn.primitive.name in _CALLS else 1 if eqn.primitive.name == "cond" else None
    bodies = list(jaxprs_in_params(eqn.params))
    if first is None or not bodies:
        return None
    if any(len(body.invars) != len(eqn.invars) - first for body in bodies):
        return None
    return bodies, first


class _Meter:
    """Walks jaxprs in program order (model: module docstring).

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
        is its operand ``m``, passed through: after inlining, the same buffer."""
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
            outputs = (_KEPT,) * len(jaxpr.outvars)
        if loop:  # a loop body's outputs are the next carries and the stacked ys
            outputs = tuple(_KEPT if c == _DEAD else c for c in outputs)
        if inputs is None:
            inputs = (_OUTSIDE,) * len(jaxpr.invars)
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
            subs = [self._sub(body, None, outputs, name in _LOOPS)
                    for body in jaxprs_in_params(eqn.params)]
            return (max(subs, key=lambda s: s.peak.nbytes) if subs else None), set()
        bodies, first = handover
        passed = [None if isinstance(v, Literal) else buffer(v) for v in eqn.invars[first:]]
        owned = set(handed) & set(passed)
        ids: dict[Any, int] = {}  # a buffer passed twice is one buffer inside too
        inputs = tuple(ids.setdefault(v, len(ids)) if v in owned else _OUTSIDE for v in passed)
        subs = [self._sub(body, inputs, outputs, False) for body in bodies]
        return max(subs, key=lambda s: s.peak.nbytes), owned

    def _walk(self, jaxpr: Jaxpr, inputs: _Inputs, outputs: _Outputs, target: int | None) -> Any:
        """Without ``target``: the :class:`_Peak`. With it: the live values at the first
        candidate equal to ``target`` (the peak found by a first walk)."""
        end = len(jaxpr.eqns)
        # counted inputs sharing a buffer id are one buffer, kept under the first of them
        first: dict[int, Any] = {}
        aliases = {v: first.setdefault(b, v) for v, b in zip(jaxpr.invars, inputs)
                   if b != _OUTSIDE}
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
        kept = {v for v, c in outvars if c == _KEPT}
        skipped = {v for v, c in outvars if c == _UNCOUNTED} - kept
        for v in kept:
            last_use[v] = end

        live: dict[Any, int] = {}
        names: dict[Any, str] = {}
        total = 0
        for i, (v, b) in enumerate(zip(jaxpr.invars, inputs)):
            if b != _OUTSIDE and buffer(v) is v and v not in skipped:
                live[v] = aval_nbytes(v.aval)
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
            out_bytes = sum(aval_nbytes(v.aval) for v in outs)
            # how the sub-programs count their outputs (an uncounted output of this
            # program stays uncounted; one nothing reads after the call is dead)
            out_codes = tuple(
                _UNCOUNTED if buffer(v) in skipped
                else _KEPT if last_use.get(buffer(v), -1) > k else _DEAD
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
                        LiveValue(_name(eqn, v, k), _aval_text(v.aval), aval_nbytes(v.aval))
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
                    live[v] = aval_nbytes(v.aval)
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


def _input_mask(exclude_inputs: bool | Iterable[int], num_inputs: int) -> tuple[bool, ...]:
    if isinstance(exclude_inputs, (bool, np.bool_)):
        return (bool(exclude_inputs),) * num_inputs
    mask = [False] * num_inputs
    for i in exclude_inputs:
        index = int(i)
        if not -num_inputs <= index < num_inputs:
            raise IndexError(
                f"exclude_inputs names input {i}, but the program has {num_inputs} inputs "
                f"(valid indices 0..{num_inputs - 1}); pass indices of jaxpr.invars, or "
                f"True/False for all/none."
            )
        mask[index] = True
    return tuple(mask)


def program_memory(
    jaxpr: ClosedJaxpr | Jaxpr,
    *,
    exclude_inputs: bool | Iterable[int] = True,
    count_outputs: bool = False,
    detail: bool = False,
) -> int | MemoryReport:
    """Peak bytes live while ``jaxpr`` runs, in program order (model: module docstring).

    This is the reusable core of :func:`activation_memory`. With the defaults (inputs and
    outputs not counted) it measures the transient memory a program needs beyond its inputs
    and outputs, e.g. a layer's ``fwd_tmp``/``bwd_tmp`` in Rotor's model (ALGORITHMS.md
    section 1): ``program_memory(jax.make_jaxpr(layer)(w, x))``.

    Args:
      jaxpr: a ``ClosedJaxpr`` (``jax.make_jaxpr(f)(*args)``) or a ``Jaxpr``. Its constants
        are never counted.
      exclude_inputs: ``True`` (default): no input is counted; ``False``: every input is
        counted while live (from the start to its last use); or the indices into
        ``jaxpr.invars`` of the inputs not to count.
      count_outputs: count the program's outputs, from the equation producing each to the
        end (default ``False``: outputs are never counted).
      detail: return a :class:`MemoryReport` (peak, where, values live) instead of an int.

    Returns:
      The peak in bytes, or a :class:`MemoryReport` when ``detail`` is true.
    """
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    if not isinstance(jaxpr, Jaxpr):
        raise TypeError(
            f"program_memory expects a ClosedJaxpr or Jaxpr, got {type(jaxpr).__name__}; "
            f"build one with jax.make_jaxpr(f)(*args)."
        )
    excluded = _input_mask(exclude_inputs, len(jaxpr.invars))
    inputs = tuple(_OUTSIDE if skip else i for i, skip in enumerate(excluded))
    outputs = ((_KEPT if count_outputs else _UNCOUNTED),) * len(jaxpr.outvars)
    meter = _Meter()
    peak = meter.peak(jaxpr, inputs, outputs)
    if not detail:
        return peak.nbytes
    live = meter.live(jaxpr, inputs, outputs)
    return MemoryReport(peak.nbytes, peak.location, live, len(jaxpr.eqns))


def inputs_read(jaxpr: ClosedJaxpr | Jaxpr) -> tuple[bool, ...]:
    """For each input of ``jaxpr``: whether the program reads it, as the meter counts uses.

    An input is read when an equation takes it as an operand or it is an output, except
    that a call (``jit``, ``remat``, ``custom_jvp_call``, ...) or a ``cond`` whose bodies
    never read an operand does not read it (after inlining, XLA removes it as dead code; a
    ``jnp.where`` backward, say, passes its forward's zeros to a ``jit`` that ignores them).
    Use it to tell which residuals a pullback really needs.
    """
    return _Meter().summary(jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr)[0]


def activation_memory(
    fn: Callable[..., Any], params: Any, *args: Any, detail: bool = False
) -> int | MemoryReport:
    """Peak bytes live while ``jax.grad(fn)(params, *args)`` runs, except ``params`` and the
    gradients it returns.

    The program ``jax.make_jaxpr(jax.grad(fn))(params, *args)`` (forward, then the
    transposed backward, with each ``jax.checkpoint`` recomputing its segment inside the
    backward) is walked in program order (model: module docstring). The leaves of ``args``
    (the batch ``x``, ...) are counted while live: they are part of the activation budget.
    Use it on CPU, where compiled memory statistics do not show remat (ALGORITHMS.md
    section 7), to check that a schedule saves memory.

    Args:
      fn: a scalar loss ``fn(params, *args)``, differentiated with respect to ``params``.
        Bind non-array arguments with ``functools.partial``.
      params: a pytree of arrays.
      *args: the other arguments (pytrees of arrays).
      detail: return a :class:`MemoryReport` (peak, where, values live) instead of an int.

    Returns:
      The peak in bytes, or a :class:`MemoryReport` when ``detail`` is true.
    """
    closed = jax.make_jaxpr(jax.grad(fn))(params, *args)
    num_params = len(jax.tree.leaves(params))
    num_inputs = len(jax.tree.leaves((params, *args)))
    if len(closed.jaxpr.invars) != num_inputs:  # pragma: no cover - a JAX tracing change
        raise RuntimeError(
            f"jax.make_jaxpr gave {len(closed.jaxpr.invars)} inputs for {num_inputs} array "
            f"leaves; cannot tell the parameters apart. Please report this with your JAX "
            f"version ({jax.__version__})."
        )
    return program_memory(
        closed, exclude_inputs=range(num_params), count_outputs=False, detail=detail
    )
