"""The cache of layer profiles, and the keys of what is kept beside them (issue 18.4).

Profiles are kept across calls by layer function and abstract signature
(:func:`profile_cache`); beside them, per layer and input structure (shapes left out), the
calibration of its costs (:mod:`jaxremat.sequence.calibration`), the mark that its profile
without the input's gradient may be derived (:mod:`jaxremat.sequence.derive`), and, in a
cache of their own cleared with it (:data:`PROGRAMS`), its symbolic programs
(:mod:`jaxremat.sequence.polymorphic`).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

from ..lru import LRU
from ..measure.offload import offload_key
from ..trees import signature
from .layer import LayerProfile
from .policies import OFFLOAD_POLICIES

__all__ = ["PROFILE_CACHE_SIZE", "PROGRAMS", "SCAN_CHECKS", "SCAN_MARGINS", "SCAN_PROGRAMS",
           "cache_key", "cached", "calibration_key",
           "derived_key", "profile_cache", "remember", "symbolic_key", "with_input_grad"]

PROFILE_CACHE_SIZE = 1024
"""Layer profiles kept across calls (:func:`profile_cache`)."""

PROGRAMS = LRU(64)
"""Symbolic programs by layer, under :func:`symbolic_key`
(:class:`jaxremat.sequence.polymorphic.LayerPrograms`, kept with :func:`remember` in this
store): per layer function and input structure, not per shape. Cleared with
:func:`profile_cache`."""

SCAN_MARGINS = LRU(256)
"""``remat_scan``'s loop-margin sizes per layer, shapes and options
(:func:`jaxremat.scan.remat.RematScan`), and the measured memory of its members
(:func:`jaxremat.scan.realize.measured_memory`): numbers only. Cleared with
:func:`profile_cache`."""

SCAN_PROGRAMS = LRU(64)
"""``remat_scan``'s programs traced with symbolic sizes (:mod:`jaxremat.scan.programs`).
Cleared with :func:`profile_cache`."""

SCAN_CHECKS = LRU(64)
"""Whether a layer's forward at a shape is its symbolic forward's instantiation
(:mod:`jaxremat.scan.programs`). Cleared with :func:`profile_cache`."""

PROFILES = LRU(PROFILE_CACHE_SIZE, clears=(PROGRAMS, SCAN_MARGINS, SCAN_PROGRAMS, SCAN_CHECKS))


def profile_cache() -> LRU:
    """The module-wide cache of layer profiles (bounded LRU, thread-safe).

    Keyed by the layer function's identity and the abstract signature of its parameters and
    input (pytree structures, shapes, dtypes), whether its input is differentiated, the
    cost model and the policy menu. An entry holds only numbers and shapes: the
    :class:`LayerProfile` (with index 0), the output's ``ShapeDtypeStruct`` tree, and a weak
    reference to the layer that tells a reused ``id`` from the same function (no traced
    program, no closure over arrays). Identical blocks, and the same layers in a new
    :class:`jaxremat.RematSequence`, are profiled once. Entries whose key starts with
    ``"calibration"`` hold, per layer and input structure (shapes left out), the lowered and
    counted costs of its pieces at the first shape profiled, from which later shapes scale
    their counts instead of lowering (:mod:`jaxremat.sequence.calibration`); those starting
    with ``"derived"`` mark a layer whose profile without the input's gradient is derived from
    the one with it at later shapes (:mod:`jaxremat.sequence.derive`; a flag, no program).
    A layer's symbolic programs, from which later batch sizes are instantiated, are kept in
    a smaller cache of their own (:data:`PROGRAMS`), and so are ``remat_scan``'s
    (:data:`SCAN_MARGINS`, :data:`SCAN_PROGRAMS`, :data:`SCAN_CHECKS`).
    ``profile_cache().clear()`` forgets them all (e.g. after redefining a layer's behaviour
    through global state).
    """
    return PROFILES


def cache_key(layer: Callable, p: Any, x: Any, input_grad: bool, costs: str, menu: tuple,
              repeats: int) -> tuple:
    """The key of a layer's profile (:func:`profile_cache`)."""
    menu_key = tuple(m if isinstance(m, str) else ("callable", id(m)) for m in menu)
    if any(m in OFFLOAD_POLICIES for m in menu):  # offload options depend on the device
        menu_key += offload_key(costs)
    return (id(layer), signature(p), signature(x), input_grad, costs, menu_key,
            repeats if costs == "measured" else 0)


def calibration_key(key: tuple) -> tuple:
    """The key of a layer's cost calibration (:mod:`jaxremat.sequence.calibration`): the
    profile's key with the input's shapes left out (its structure and dtypes kept)."""
    treedef, leaves = key[2]
    return ("calibration", key[0], key[1],
            (treedef, tuple((len(leaf[0]),) + leaf[1:] for leaf in leaves)), *key[3:])


def cached(key: tuple, layer: Callable, store: LRU = PROFILES) -> tuple[Any, Any] | None:
    """The value and output kept under ``key`` for ``layer`` in ``store``, or ``None``."""
    found = store.get(key)
    if found is None or found[0]() is not layer:  # a dead function's id, reused
        return None
    return found[1], found[2]


def remember(key: tuple, layer: Callable, value: Any, output: Any, store: LRU = PROFILES
             ) -> None:
    """Keep ``value`` and ``output`` under ``key`` in ``store`` while ``layer`` lives (a
    profile with index 0)."""
    try:
        ref = weakref.ref(layer)
    except TypeError:  # no weak references (e.g. some builtins): do not keep it across calls
        return
    if isinstance(value, LayerProfile):
        value = dataclasses.replace(value, index=0)
    store.put(key, (ref, value, output))


def symbolic_key(key: tuple) -> tuple:
    """The key of a layer's symbolic programs (:mod:`jaxremat.sequence.polymorphic`)."""
    return ("symbolic",) + calibration_key(key)[1:]


def with_input_grad(key: tuple, input_grad: bool) -> tuple:
    """``key`` (:func:`cache_key`) with ``input_grad`` set."""
    return key[:3] + (input_grad,) + key[4:]


def derived_key(key: tuple) -> tuple:
    """The key of the mark that ``key``'s layer (any input shapes) may be derived."""
    return ("derived",) + calibration_key(with_input_grad(key, False))
