"""Facts about a jaxpr that do not depend on how it is measured, computed once per jaxpr.

The meter (:mod:`jaxremat.measure.liveness`) walks the same jaxprs many times: a layer's
forward and pullback once per counting of their inputs and outputs, their call bodies from
every call site, ``inputs_read`` on each dead-code-eliminated variant of a forward (whose
call bodies JAX shares). What each walk needs of an equation besides the counting (its
sub-programs, which operands it reads, which outputs are operands passed through, its
results' sizes) depends on the jaxpr alone, and jaxprs are immutable: :func:`facts` computes
it once per jaxpr object and keeps it while the jaxpr lives (:func:`per_jaxpr`: a cache keyed
by identity, held weakly), with the memory model's rules of :mod:`jaxremat.measure.meter`
(calls inlined, operands a body never reads are dead, views and passed-through operands are
one buffer).

A jaxpr's dead-code-eliminated variants (a forward cut to its tape, to its tape and outputs,
to one output; a pullback without the input's gradient) are new jaxprs that share most of
their equation objects with it, so a profile met each equation two to three times. Inside a
:func:`shared_equations` block, what depends on one equation alone (its facts here, its
count terms in :mod:`jaxremat.measure.costs`) is computed once per equation object
(:func:`per_equation`).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, NamedTuple, TypeVar

from jax.extend.core import DropVar, Jaxpr, Literal

from ..jax_compat import in_host_memory, is_call, sub_jaxprs
from ..trees import aval_nbytes

__all__ = ["DROPPED", "JaxprFacts", "device_nbytes", "equation_copy_key", "facts", "is_view",
           "per_equation", "per_jaxpr", "shared_equations"]

T = TypeVar("T")


class _Ref(weakref.ref):
    """A weak reference that knows its cache key (one callback serves every entry)."""

    __slots__ = ("key",)


def per_jaxpr(compute: Callable[[Jaxpr], T]) -> Callable[[Jaxpr], T]:
    """``compute`` cached per jaxpr object: its value is computed once and kept while the
    jaxpr lives (a weak reference removes the entry when the jaxpr is collected, so ids are
    never confused). The value must not refer to the jaxpr itself (it would never be freed).
    A jaxpr that takes no weak references is computed each time."""
    cache: dict[int, tuple[_Ref, T]] = {}
    lock = threading.Lock()

    def forget(ref: _Ref) -> None:
        with lock:
            if ref.key in cache and cache[ref.key][0] is ref:
                del cache[ref.key]

    def cached(jaxpr: Jaxpr) -> T:
        key = id(jaxpr)
        found = cache.get(key)
        if found is not None and found[0]() is jaxpr:
            return found[1]
        value = compute(jaxpr)
        try:
            ref = _Ref(jaxpr, forget)
        except TypeError:  # pragma: no cover - JAX's Jaxpr takes weak references
            return value
        ref.key = key
        with lock:
            cache[key] = (ref, value)
        return value

    cached.__doc__ = compute.__doc__
    cached.__name__ = compute.__name__
    return cached


_SHARED = threading.local()


@contextlib.contextmanager
def shared_equations() -> Iterator[None]:
    """Within the block (this thread), :func:`per_equation` computes each function's value
    once per equation object. The memo keeps the equations it has seen alive (so that their
    ids stay theirs) and is dropped when the outermost block exits."""
    if getattr(_SHARED, "memo", None) is not None:  # nested: the outer block's memo
        yield
        return
    _SHARED.memo = ({}, [])  # values by function then by equation id; the equations seen
    try:
        yield
    finally:
        _SHARED.memo = None


_MISSING = object()


def per_equation(compute: Callable[[Any], T], eqns: Iterable[Any],
                 same: Callable[[Any], Any] | None = None) -> list[T]:
    """``[compute(eqn) for eqn in eqns]`` for a function of the equation alone (JAX's
    equations are immutable), each value computed once per equation object inside a
    :func:`shared_equations` block, each time outside one. (Equations take no weak
    references, so the memo cannot outlive the block the way :func:`per_jaxpr`'s entries
    outlive a call; an id in it is that of an equation it holds, no other.) ``same(eqn)``,
    where given, keys equations on which ``compute`` agrees though they are distinct
    objects (:func:`equation_copy_key`); its key may hold ids of what the equation holds."""
    memo = getattr(_SHARED, "memo", None)
    if memo is None:
        return [compute(eqn) for eqn in eqns]
    by_function, seen = memo
    values = by_function.get(compute)
    if values is None:
        values = by_function[compute] = {}
    found = []
    for eqn in eqns:
        value = values.get(id(eqn), _MISSING)
        if value is _MISSING:
            key = None if same is None else same(eqn)
            value = _MISSING if key is None else values.get(key, _MISSING)
            if value is _MISSING:
                value = compute(eqn)
                if key is not None:
                    values[key] = value
            values[id(eqn)] = value
            seen.append(eqn)
        found.append(value)
    return found


def equation_copy_key(eqn: Any) -> tuple:
    """What an equation and the copies JAX's partial evaluation makes of it share (the
    staged copy of a recomputed or tangent equation is ``eqn.replace(invars=...)``, its
    operands instantiated): its parameters and results (the same objects) and its operands'
    avals. A function of the primitive, parameters and avals alone (the count's terms)
    agrees on equations with equal keys; the memo of :func:`per_equation` holds them, so
    the ids stay theirs."""
    return ("copy", id(eqn.params), tuple([id(v) for v in eqn.outvars]),
            tuple([getattr(v, "aval", None) for v in eqn.invars]))


def device_nbytes(aval: Any) -> int:
    """Device bytes of one value: :func:`aval_nbytes`, or 0 for a value in host memory (a
    residual a checkpoint offload policy moved to ``pinned_host``,
    :func:`jaxremat.jax_compat.in_host_memory`). The meter counts device memory only."""
    return 0 if in_host_memory(aval) else aval_nbytes(aval)


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


DROPPED = -1
""":attr:`JaxprFacts.out_bytes` of a dropped output (``DropVar``): no value at all."""


class JaxprFacts(NamedTuple):
    """What the meter needs of one jaxpr, whatever the counting: per equation (one entry
    per equation in each of the first five fields, stored by field rather than by equation
    so that a cached jaxpr keeps few objects for Python's garbage collector to scan) and
    per input and output.

    Attributes:
      bodies: each equation's sub-programs (:func:`jaxremat.jax_compat.sub_jaxprs`).
      first: for a call or ``cond`` whose bodies' inputs are its operands ``first,
        first + 1, ...`` (``cond``'s operand 0 is the branch index), ``first``: its bodies
        are handed its operands; ``None`` for loops, other primitives and mismatched arities
        (operands stay outside).
      reads: the indices of the operands each equation reads (literals left out): all of
        them, except those a call or every branch of a ``cond`` passes to a body that never
        reads them (after inlining, XLA removes them as dead code).
      forwarded: ``(j, m)`` pairs: output ``j`` is operand ``m`` (not a literal) passed
        through, after inlining the same buffer: an ``optimization_barrier`` passes every
        operand through, a view (:func:`is_view`) is its operand's buffer, and a call (every
        branch of a ``cond``) may return an operand unchanged. Dropped outputs left out.
      out_bytes: the device bytes of each output, :data:`DROPPED` for a dropped one, and
        ``None`` where it cannot be measured (:func:`device_nbytes` raises when the walk
        needs it).
      input_bytes: the device bytes of each input (``None`` likewise).
      input_read: for each input, whether an equation (through sub-programs) or an output
        reads it.
      forwards: for each output, the index of the input it is (directly or passed through
        calls), or ``None`` for a value the program computes.
      peaks, lives: the meter's results per counting of inputs and outputs
        (:class:`jaxremat.measure.liveness.Walker`), filled as it measures.
    """

    bodies: tuple[tuple[Jaxpr, ...], ...]
    first: tuple[int | None, ...]
    reads: tuple[tuple[int, ...], ...]
    forwarded: tuple[tuple[tuple[int, int], ...], ...]
    out_bytes: tuple[tuple[int | None, ...], ...]
    input_bytes: tuple[int | None, ...]
    input_read: tuple[bool, ...]
    forwards: tuple[int | None, ...]
    peaks: dict
    lives: dict


def _nbytes(var: Any) -> int | None:
    """:func:`device_nbytes` of ``var``, or ``None`` where it raises (symbolic shapes): the
    error is raised by the walk that needs the size, as before these facts were cached."""
    try:
        return device_nbytes(var.aval)
    except TypeError:
        return None


def _first(eqn: Any, bodies: tuple[Jaxpr, ...]) -> int | None:
    first = 0 if is_call(eqn) else 1 if eqn.primitive.name == "cond" else None
    if first is None or not bodies:
        return None
    if any(len(body.invars) != len(eqn.invars) - first for body in bodies):
        return None
    return first


def _eqn_facts(eqn: Any) -> tuple:
    """``(bodies, first, reads, forwarded, out_bytes)`` of one equation (:class:`JaxprFacts`)."""
    invars, outvars = eqn.invars, eqn.outvars
    bodies = tuple(sub_jaxprs(eqn))
    first = _first(eqn, bodies)
    unread: set[int] = set()
    if first is not None:
        body_reads = [facts(body).input_read for body in bodies]
        unread = {first + i for i in range(len(invars) - first)
                  if not any(read[i] for read in body_reads)}
    reads = tuple(m for m, v in enumerate(invars) if not isinstance(v, Literal) and m not in unread)
    if eqn.primitive.name == "optimization_barrier":
        forwarded = [(j, j) for j, out in enumerate(outvars) if not isinstance(out, DropVar)]
    elif is_view(eqn):
        forwarded = [] if isinstance(outvars[0], DropVar) else [(0, 0)]
    elif first is None:
        forwarded = []
    else:
        forwards = [facts(body).forwards for body in bodies]
        forwarded = [(j, first + i) for j, i in enumerate(forwards[0])
                     if i is not None and all(f[j] == i for f in forwards)
                     and not isinstance(outvars[j], DropVar)]
    forwarded = tuple((j, m) for j, m in forwarded if not isinstance(invars[m], Literal))
    out_bytes = tuple(DROPPED if isinstance(v, DropVar) else _nbytes(v) for v in outvars)
    return bodies, first, reads, forwarded, out_bytes


@per_jaxpr
def facts(jaxpr: Jaxpr) -> JaxprFacts:
    """The :class:`JaxprFacts` of ``jaxpr`` (computed once per jaxpr object)."""
    columns = tuple(zip(*per_equation(_eqn_facts, jaxpr.eqns))) or ((),) * 5
    read = {v for v in jaxpr.outvars if not isinstance(v, Literal)}
    origin = {v: i for i, v in enumerate(jaxpr.invars)}
    for eqn, reads, forwarded in zip(jaxpr.eqns, columns[2], columns[3]):
        read.update(eqn.invars[m] for m in reads)
        for j, m in forwarded:
            if eqn.invars[m] in origin:
                origin[eqn.outvars[j]] = origin[eqn.invars[m]]
    forwards = tuple(None if isinstance(v, Literal) else origin.get(v) for v in jaxpr.outvars)
    return JaxprFacts(*columns, tuple(_nbytes(v) for v in jaxpr.invars),
                      tuple(v in read for v in jaxpr.invars), forwards, {}, {})
