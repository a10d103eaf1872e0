"""Programs of a scanned layer traced once with a symbolic batch size (and sequence length)
and instantiated at each input shape (issue 18.4, for ``remat_scan``).

A ``remat_scan`` plan measures programs built from its layer at the input's shape: per
option, what a scan of it holds (:mod:`jaxremat.scan.margins`), and the memory of the
members it considers (:func:`jaxremat.scan.realize.measured_memory`). Traced at every new
shape they were four fifths of a re-plan (a GPT-2 block: 0.15 s a program), while the
layer's profile is instantiated (:mod:`jaxremat.sequence.polymorphic`). :func:`programs_at`
traces them once with the input's leading axis, and axis 1 of inputs of rank 3 or more
where the layer allows it, symbolic (:mod:`jaxremat.measure.symbolic`), and substitutes each
later shape's sizes (each at least 2) into them.

Exactness is checked as the profile checks it: at every shape, the first included, the
layer's plain forward traced there must equal the symbolic one's instantiation (a layer's
Python may branch on a size), else the programs are traced there as before. The callers
use it only where every policy involved decides without looking at sizes
(:func:`jaxremat.sequence.policies.shape_free`); the instantiated programs were checked to
measure what the traced ones measure on the test suite's blocks
(``tests/test_scan_programs.py``), not at run time.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, Hashable

import jax
from jax.extend.core import ClosedJaxpr

from ..lru import LRU
from ..sequence.cache import SCAN_CHECKS, SCAN_PROGRAMS
from ..measure.symbolic import (SEQUENCE, SymbolicInput, instantiate, same_program, shape_env,
                                symbolic_input)
from ..trees import signature

__all__ = ["programs_at", "symbolic_programs"]

Make = Callable[[Any], tuple[ClosedJaxpr | None, ...]]
"""``make(x)``: the programs at input ``x`` (``ShapeDtypeStruct`` leaves, concrete or
symbolic sizes)."""


@dataclasses.dataclass(frozen=True)
class _Symbolic:
    symbolic: SymbolicInput
    plain: ClosedJaxpr  # the layer's forward, traced on symbolic.x
    programs: tuple[ClosedJaxpr | None, ...]


_SYMBOLIC = SCAN_PROGRAMS  # (what, layer id, params, input structure) -> (ref, _Symbolic | None)
_CHECKED = SCAN_CHECKS  # (layer id, params, x) -> (ref, the plain forward's symbolic, same?)


def _symbolic(layer: Callable, params: Any, x: Any, make: Make) -> _Symbolic | None:
    """The programs made on ``x`` with the batch and sequence length symbolic, else the
    batch alone; ``None`` where the layer needs those sizes concrete."""
    for sequence in (True, False):
        symbolic = symbolic_input(x, sequence)
        if symbolic is None or (sequence and not any(SEQUENCE in s for s in symbolic.symbols)):
            continue
        try:
            return _Symbolic(symbolic, jax.make_jaxpr(layer)(params, symbolic.x),
                             make(symbolic.x))
        except Exception:  # noqa: BLE001 - the layer's Python needs those sizes concrete
            continue
    return None


def _structure(x: Any) -> tuple:
    treedef, leaves = signature(x)
    return treedef, tuple((len(leaf[0]),) + leaf[1:] for leaf in leaves)


def _keep(store: LRU, key: tuple, layer: Callable, value: Any) -> None:
    try:
        store.put(key, (weakref.ref(layer), value))
    except TypeError:  # no weak references: not kept across calls
        pass


def _alive(store: LRU, key: tuple, layer: Callable) -> Any:
    found = store.get(key)
    return found[1] if found is not None and found[0]() is layer else None


def _same_forward(layer: Callable, params: Any, x: Any, entry: _Symbolic,
                  env: dict[str, int]) -> bool:
    """Whether ``layer``'s forward traced at ``x`` is ``entry``'s instantiated at ``env``
    (once per layer, parameters, shape and symbolic program)."""
    key = (id(layer), signature(params), signature(x))
    found = _alive(_CHECKED, key, layer)
    if found is not None and found[0] is entry.plain:
        return found[1]
    same = same_program(jax.make_jaxpr(layer)(params, x), instantiate(entry.plain, env))
    _keep(_CHECKED, key, layer, (entry.plain, same))
    return same


def symbolic_programs(layer: Callable, params: Any, x: Any, what: Hashable, make: Make
                      ) -> tuple[_Symbolic | None, dict[str, int] | None]:
    """The symbolic programs kept for ``what`` of ``layer`` (one layer's ``params``) and the
    sizes making them ``x``'s, made on ``x`` where none are kept or ``x`` is not one of
    their shapes; ``(None, None)`` where they cannot serve ``x``."""
    key = (what, id(layer), signature(params), _structure(x))
    entry = _alive(_SYMBOLIC, key, layer)
    env = None if entry is None else shape_env(entry.symbolic, x)
    if env is None:  # a first shape, or one the symbolic input was not made for
        made = _symbolic(layer, params, x, make)
        if made is not None or entry is None:  # a batch of one keeps what it cannot use
            _keep(_SYMBOLIC, key, layer, made)
        entry = made
        env = None if entry is None else shape_env(entry.symbolic, x)
    if env is None or not _same_forward(layer, params, x, entry, env):
        return None, None
    return entry, env


def programs_at(layer: Callable, params: Any, x: Any, what: Hashable, make: Make
                ) -> tuple[ClosedJaxpr | None, ...]:
    """``make(x)``, the programs named ``what`` of ``layer`` (one layer's ``params``) at
    input ``x``: instantiated from those made once on a symbolic ``x`` where the layer's
    forward at ``x`` is the symbolic one's instantiation (module docstring), else
    ``make(x)``. ``make`` must build its programs from ``layer`` alone, with policies that
    do not look at sizes."""
    entry, env = symbolic_programs(layer, params, x, what, make)
    if entry is None:
        return make(x)
    memo: dict = {}  # nested programs shared between the instantiations
    return tuple(None if program is None else instantiate(program, env, memo)
                 for program in entry.programs)
