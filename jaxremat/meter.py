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
* Sub-programs are entered. For a call (``jit``, ``remat``/``checkpoint``,
  ``custom_jvp_call``, ``custom_vjp_call``, ``cond`` and any other primitive carrying
  jaxprs) the candidate is ``live before + max(inner peak, outputs)``, where the inner
  peak counts only what the sub-program creates (its inputs are live outside) including
  its outputs (except those that are uncounted program outputs outside), and ``cond``
  takes the largest branch. The operands of a call stay live until it returns, even those
  it uses last early on: a ``jit`` can measure more than the same code inlined. For a loop
  (``scan``, ``while``) the outputs (final carries, stacked ``ys``) are allocated before
  the body runs and the candidate is ``live before + outputs + body peak``; the body's new
  carry is counted beside the old one (double buffering), one iteration is measured (every
  iteration has the same peak) and a slice of ``xs`` is a view (not counted). ``while``
  takes the larger of its ``cond`` and ``body`` peaks.

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

__all__ = ["LiveValue", "MemoryReport", "activation_memory", "aval_nbytes", "program_memory"]

_LOOPS = ("scan", "while")


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


class _Sub(NamedTuple):
    """The sub-program of an equation that reaches the largest inner peak."""

    peak: _Peak
    jaxpr: Jaxpr
    out_mask: tuple[bool, ...]
    loop: bool


_Key = tuple[int, tuple[bool, ...], tuple[bool, ...]]


class _Meter:
    """Walks jaxprs in program order (model: module docstring).

    ``peak`` is cached per (sub-)jaxpr and masks, so a body shared by many call sites is
    walked once. ``live`` (for ``detail=True``) walks again up to the first equation that
    reaches the known peak and lists what is live there: one extra pass, no snapshot of
    the live set at every new maximum (quadratic on a long forward).
    """

    def __init__(self) -> None:
        self._peaks: dict[_Key, tuple[Jaxpr, _Peak]] = {}  # the Jaxpr keeps its id valid
        self._lives: dict[_Key, tuple[Jaxpr, tuple[LiveValue, ...]]] = {}

    def peak(
        self, jaxpr: Jaxpr, excluded: tuple[bool, ...], counted_out: tuple[bool, ...]
    ) -> _Peak:
        """Peak of ``jaxpr``; ``excluded[i]``: input ``i`` is not counted;
        ``counted_out[j]``: output ``j`` is counted (live to the end)."""
        key = (id(jaxpr), excluded, counted_out)
        if key not in self._peaks:
            self._peaks[key] = (jaxpr, self._walk(jaxpr, excluded, counted_out, None))
        return self._peaks[key][1]

    def live(
        self, jaxpr: Jaxpr, excluded: tuple[bool, ...], counted_out: tuple[bool, ...]
    ) -> tuple[LiveValue, ...]:
        """The values live at the peak of ``jaxpr``, largest first."""
        key = (id(jaxpr), excluded, counted_out)
        if key not in self._lives:
            target = self.peak(jaxpr, excluded, counted_out).nbytes
            values = self._walk(jaxpr, excluded, counted_out, target)
            self._lives[key] = (jaxpr, tuple(sorted(values, key=lambda v: -v.nbytes)))
        return self._lives[key][1]

    def _sub(self, sub: Jaxpr | ClosedJaxpr, out_mask: tuple[bool, ...], loop: bool) -> _Sub:
        jaxpr = sub.jaxpr if isinstance(sub, ClosedJaxpr) else sub
        if len(out_mask) != len(jaxpr.outvars):
            out_mask = (True,) * len(jaxpr.outvars)
        return _Sub(self.peak(jaxpr, (True,) * len(jaxpr.invars), out_mask), jaxpr, out_mask, loop)

    def _inner(self, eqn: Any, out_mask: tuple[bool, ...]) -> _Sub | None:
        """The largest sub-program peak of ``eqn``, or ``None`` if it has no sub-program."""
        name = eqn.primitive.name
        if name == "while":
            subs = [
                self._sub(eqn.params["cond_jaxpr"], (), True),  # its predicate is counted
                self._sub(eqn.params["body_jaxpr"], out_mask, True),
            ]
        else:
            subs = [self._sub(j, out_mask, name in _LOOPS) for j in jaxprs_in_params(eqn.params)]
        return max(subs, key=lambda s: s.peak.nbytes) if subs else None

    def _walk(
        self,
        jaxpr: Jaxpr,
        excluded: tuple[bool, ...],
        counted_out: tuple[bool, ...],
        target: int | None,
    ) -> Any:
        """Without ``target``: the :class:`_Peak`. With it: the live values at the first
        candidate equal to ``target`` (the peak found by a first walk)."""
        end = len(jaxpr.eqns)
        last_use: dict[Any, int] = {}
        for k, eqn in enumerate(jaxpr.eqns):
            for v in eqn.invars:
                if not isinstance(v, Literal):
                    last_use[v] = k
        kept = {v for v, c in zip(jaxpr.outvars, counted_out) if c and not isinstance(v, Literal)}
        skipped = {v for v in jaxpr.outvars if not isinstance(v, Literal)} - kept
        for v in kept:
            last_use[v] = end

        live: dict[Any, int] = {}
        names: dict[Any, str] = {}
        total = 0
        for i, (v, skip) in enumerate(zip(jaxpr.invars, excluded)):
            if not skip and v not in skipped and v not in live:
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
            outs = [v for v in eqn.outvars if not isinstance(v, DropVar) and v not in skipped]
            out_bytes = sum(aval_nbytes(v.aval) for v in outs)
            # an inner output is counted unless it is an uncounted output of this program
            out_mask = tuple(isinstance(v, DropVar) or v not in skipped for v in eqn.outvars)
            inner = self._inner(eqn, out_mask)
            if inner is None:
                extra, use_inner, use_outs = out_bytes, False, True
            elif inner.loop:  # output buffers plus one iteration of the body
                extra, use_inner, use_outs = out_bytes + inner.peak.nbytes, True, True
            elif inner.peak.nbytes > out_bytes:
                extra, use_inner, use_outs = inner.peak.nbytes, True, False
            else:
                extra, use_inner, use_outs = out_bytes, False, True
            if target is not None and total + extra == target:
                values = self._values(live, names)
                if use_outs:
                    values += [
                        LiveValue(_name(eqn, v, k), _aval_text(v.aval), aval_nbytes(v.aval))
                        for v in outs
                    ]
                if use_inner:
                    sub = inner.jaxpr
                    sub_live = self.live(sub, (True,) * len(sub.invars), inner.out_mask)
                    values += _prefixed(f"eqn {k} {name}", sub_live)
                return values
            if total + extra > best.nbytes:
                below = inner.peak.location if use_inner else ()
                best = _Peak(total + extra, ((k, name),) + below)
            for v in outs:
                if v in last_use:
                    live[v] = aval_nbytes(v.aval)
                    total += live[v]
                    if target is not None:
                        names[v] = _name(eqn, v, k)
            for v in eqn.invars:
                if not isinstance(v, Literal) and last_use.get(v) == k and v in live:
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
    counted_out = (bool(count_outputs),) * len(jaxpr.outvars)
    meter = _Meter()
    peak = meter.peak(jaxpr, excluded, counted_out)
    if not detail:
        return peak.nbytes
    live = meter.live(jaxpr, excluded, counted_out)
    return MemoryReport(peak.nbytes, peak.location, live, len(jaxpr.eqns))


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
