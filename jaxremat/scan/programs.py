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
from typing import Any, Callable, Hashable

import jax
from jax.extend.core import ClosedJaxpr

from ..lru import LRU
from ..sequence.cache import SCAN_CHECKS, SCAN_PROGRAMS, cached, remember
from ..sequence.policies import shape_free
from ..sequence.searched import SearchedPolicy, moved_policy
from ..measure.symbolic import (SEQUENCE, SymbolicInput, instantiate, same_program, shape_env,
                                symbolic_input)
from ..trees import signature

__all__ = ["programs_at", "symbolic_programs"]

Make = Callable[[Any, tuple], tuple[ClosedJaxpr | None, ...]]
"""``make(x, policies)``: the programs at input ``x`` (``ShapeDtypeStruct`` leaves, concrete
or symbolic sizes) with the layer under ``policies`` (those given to :func:`programs_at`, or
on a symbolic ``x`` their symbolic counterparts)."""


@dataclasses.dataclass(frozen=True)
class _Symbolic:
    symbolic: SymbolicInput
    plain: ClosedJaxpr  # the layer's forward, traced on symbolic.x
    policies: tuple  # the policies the programs were made with
    programs: tuple[ClosedJaxpr | None, ...]
    moved: dict = dataclasses.field(default_factory=dict)  # (x, policies) -> they move here


_SYMBOLIC = SCAN_PROGRAMS  # (what, layer id, params, input structure) -> (ref, _Symbolic | None)
_CHECKED = SCAN_CHECKS  # (layer id, params, x) -> (ref, (symbolic forward, forward at x or None));
# ("forward", layer id, params, x) -> (ref, forward at x)


def _moved(policies: tuple, names: tuple[str, ...], plain: ClosedJaxpr, symbolic: ClosedJaxpr
           ) -> tuple | None:
    """``policies`` (option ``names``) for the program traced on a symbolic input whose
    forward is ``symbolic``, the concrete one ``plain``: a shape-free policy as it is, a
    searched one moved to the same equations (:func:`jaxremat.sequence.searched.
    moved_policy`); ``None`` where one cannot be (a ranked or user policy, keys that tell
    the equations apart differently)."""
    moved = []
    for policy, name in zip(policies, names, strict=True):
        if shape_free(name):
            moved.append(policy)
        elif isinstance(policy, SearchedPolicy):
            moved.append(moved_policy(policy, plain, symbolic))
            if moved[-1] is None:
                return None
        else:
            return None
    return tuple(moved)


def _forward(layer: Callable, params: Any, x: Any) -> ClosedJaxpr:
    """``layer``'s forward traced at ``x`` (once per layer, parameters and shape)."""
    key = ("forward", id(layer), signature(params), signature(x))
    found = _alive(_CHECKED, key, layer)
    if found is None:
        found = jax.make_jaxpr(layer)(params, x)
        _keep(_CHECKED, key, layer, found)
    return found


def _symbolic(layer: Callable, params: Any, x: Any, make: Make, policies: tuple,
              names: tuple[str, ...]) -> _Symbolic | None:
    """The programs made on ``x`` with the batch and sequence length symbolic, else the
    batch alone; ``None`` where the layer needs those sizes concrete or a policy cannot be
    moved to the symbolic program."""
    for sequence in (True, False):
        symbolic = symbolic_input(x, sequence)
        if symbolic is None or (sequence and not any(SEQUENCE in s for s in symbolic.symbols)):
            continue
        try:
            forward = jax.make_jaxpr(layer)(params, symbolic.x)
            plain = None if all(map(shape_free, names)) else _forward(layer, params, x)
            moved = _moved(policies, names, plain, forward)
            if moved is None:
                continue
            return _Symbolic(symbolic, forward, moved, make(symbolic.x, moved))
        except Exception:  # noqa: BLE001 - the layer's Python needs those sizes concrete
            continue
    return None


def _structure(x: Any) -> tuple:
    treedef, leaves = signature(x)
    return treedef, tuple((len(leaf[0]),) + leaf[1:] for leaf in leaves)


def _keep(store: LRU, key: tuple, layer: Callable, value: Any) -> None:
    remember(key, layer, value, None, store)


def _alive(store: LRU, key: tuple, layer: Callable) -> Any:
    found = cached(key, layer, store)
    return None if found is None else found[0]


def _forward_at(layer: Callable, params: Any, x: Any, entry: _Symbolic, env: dict[str, int]
                ) -> ClosedJaxpr | None:
    """``layer``'s forward traced at ``x`` where it is ``entry``'s instantiated at ``env``,
    else ``None`` (once per layer, parameters, shape and symbolic program)."""
    key = (id(layer), signature(params), signature(x))
    found = _alive(_CHECKED, key, layer)
    if found is not None and found[0] is entry.plain:
        return found[1]
    plain = _forward(layer, params, x)
    same = same_program(plain, instantiate(entry.plain, env))
    _keep(_CHECKED, key, layer, (entry.plain, plain if same else None))
    return plain if same else None


def symbolic_programs(layer: Callable, params: Any, x: Any, what: Hashable, make: Make,
                      policies: tuple = (), names: tuple[str, ...] = ()
                      ) -> tuple[_Symbolic | None, dict[str, int] | None]:
    """The symbolic programs kept for ``what`` of ``layer`` (one layer's ``params``) and the
    sizes making them ``x``'s, made on ``x`` where none are kept or ``x`` is not one of
    their shapes; ``(None, None)`` where they cannot serve ``x`` (module docstring;
    ``policies`` and their option ``names``: :func:`programs_at`)."""
    key = (what, id(layer), signature(params), _structure(x))
    entry = _alive(_SYMBOLIC, key, layer)
    env = None if entry is None else shape_env(entry.symbolic, x)
    if env is None:  # a first shape, or one the symbolic input was not made for
        made = _symbolic(layer, params, x, make, policies, names)
        if made is not None or entry is None:  # a batch of one keeps what it cannot use
            _keep(_SYMBOLIC, key, layer, made)
        entry = made
        env = None if entry is None else shape_env(entry.symbolic, x)
    if env is None:
        return None, None
    plain = _forward_at(layer, params, x, entry, env)
    if plain is None:
        return None, None
    if not all(map(shape_free, names)):  # each policy keeps here what its counterpart kept
        moves = entry.moved.get((signature(x), policies))
        if moves is None:
            moves = entry.moved[(signature(x), policies)] = \
                _moved(policies, names, plain, entry.plain) == entry.policies
        if not moves:
            return None, None
    return entry, env


def programs_at(layer: Callable, params: Any, x: Any, what: Hashable, make: Make,
                policies: tuple, names: tuple[str, ...]) -> tuple[ClosedJaxpr | None, ...]:
    """``make(x, policies)``, the programs named ``what`` of ``layer`` (one layer's
    ``params``) at input ``x`` under ``policies`` (their option ``names``): instantiated
    from those made once on a symbolic ``x`` where the layer's forward at ``x`` is the
    symbolic one's instantiation and each policy keeps at ``x`` what its symbolic
    counterpart kept (module docstring), else ``make(x, policies)``. ``make`` must build
    its programs from ``layer`` and ``policies`` alone."""
    entry, env = symbolic_programs(layer, params, x, what, make, policies, names)
    if entry is None:
        return make(x, policies)
    memo: dict = {}  # nested programs shared between the instantiations
    return tuple(None if program is None else instantiate(program, env, memo)
                 for program in entry.programs)
