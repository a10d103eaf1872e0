"""Re-planning at a new batch size without tracing the layer's options again (issue 18.4).

At the first shape a layer is profiled at, each option whose policy does not look at sizes
(:func:`jaxremat.sequence.policies.shape_free`) is also traced with the input's leading axis
a symbolic batch size (:mod:`jaxremat.measure.symbolic`); the symbolic programs are kept
(:data:`PROGRAMS`) for each option whose instantiation at that shape is the very program
traced there (:func:`jaxremat.measure.symbolic.same_program`, forward and backward). At a later
shape differing only in the batch size (at least 2), the layer's plain forward is traced as
before (:func:`jaxremat.measure.trace.trace_once`) and, where it is the symbolic plain
forward's instantiation, every kept option is instantiated instead of traced: about 4 ms
instead of 30-50 ms an option on a GPT-2 block. Everything measured on the programs (tape,
transients, counted costs) is then measured as on traced ones. Options not kept (searched,
ranked, user policies, those that differed) are traced as before, and where a piece's cost
would need lowering (the calibration cannot scale its count) the whole profile is traced as
before (:class:`jaxremat.sequence.calibration.Uncalibrated`).

The cost: one more trace per such option at a layer's first shape, and the programs kept,
per layer function and input structure (not per shape), in a bounded cache.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable

import jax
from jax.extend.core import ClosedJaxpr

from ..lru import LRU
from ..measure.symbolic import (SymbolicInput, batch_env, instantiate, instantiate_tree,
                                same_program, symbolic_input)
from ..measure.trace import TracedLayer, VjpPrograms, traced_programs, vjp_programs
from .calibration import Uncalibrated
from .options import Tracer
from .policies import shape_free

__all__ = ["PROGRAMS", "instantiating_tracer", "recording_symbolic"]

PROGRAMS = LRU(64)
"""Symbolic programs by layer (its id, parameter signature, input structure, whether the
input is differentiated, costs and menu: the key of its calibration), with a weak reference
to the layer: ``(ref, LayerPrograms)``. Cleared with :func:`jaxremat.sequence.profile.profile_cache`."""


@dataclasses.dataclass(frozen=True)
class LayerPrograms:
    """A layer's plain forward and the vjp programs of its options (by ``(option name,
    input_grad)``), traced on ``symbolic.x``."""

    symbolic: SymbolicInput
    plain: ClosedJaxpr
    options: dict[tuple[str, bool], VjpPrograms]


def _concrete(programs: VjpPrograms, env: dict[str, int]) -> VjpPrograms:
    memo: dict = {}  # a nested program shared by the forward and the backward, made once
    return VjpPrograms(
        forward=instantiate(programs.forward, env, memo),
        output=instantiate_tree(programs.output, env),
        residuals=tuple(instantiate_tree(programs.residuals, env)),
        pullback=_not_lowered, cotangent=instantiate_tree(programs.cotangent, env),
        backward=instantiate(programs.backward, env, memo))


def _not_lowered(*args: Any) -> Any:
    """The pullback of an instantiated program: not lowered (its costs are the calibration's
    scaled counts); a piece that would be makes the profile traced as before."""
    raise Uncalibrated("backward")


def _same(traced: TracedLayer, programs: VjpPrograms) -> bool:
    return (same_program(traced.forward, programs.forward)
            and same_program(traced.backward, programs.backward))


def recording_symbolic(layer: Callable, p: Any, x: Any, key: tuple, inner: Tracer
                       ) -> tuple[Tracer, Callable[[], None]]:
    """At a layer's first shape: a tracer that traces with ``inner`` and also symbolically
    (the shape-free options), and a function to call once the profile is made, which keeps
    the programs that matched under ``key``. Where the batch cannot be made symbolic or the
    layer does not trace so, ``inner`` itself and a no-op."""
    symbolic = symbolic_input(x)
    if symbolic is None:
        return inner, lambda: None
    try:
        plain = jax.make_jaxpr(layer)(p, symbolic.x)
    except Exception:  # noqa: BLE001 - the layer's Python needs concrete sizes: trace as before
        return inner, lambda: None
    env = batch_env(symbolic, x)
    kept: dict[tuple[str, bool], VjpPrograms] = {}

    def tracer(fn: Callable, p: Any, x: Any, index: int, input_grad: bool, name: str
               ) -> TracedLayer:
        found = inner(fn, p, x, index, input_grad, name)
        if shape_free(name) and env is not None:
            try:
                programs = vjp_programs(fn, p, symbolic.x, index, input_grad=input_grad)
            except Exception:  # noqa: BLE001 - this option is traced at every shape
                return found
            if _same(found, _concrete(programs, env)):
                kept[(name, input_grad)] = programs
        return found

    def keep() -> None:
        if not kept:
            return
        try:
            ref = weakref.ref(layer)
        except TypeError:
            return
        PROGRAMS.put(key, (ref, LayerPrograms(symbolic, plain, kept)))

    return tracer, keep


def instantiating_tracer(layer: Callable, x: Any, key: tuple, memo: dict, inner: Tracer
                         ) -> Tracer | None:
    """At a later shape: a tracer that instantiates the programs kept under ``key`` and
    traces the others with ``inner``, once the layer's plain forward (``memo["trace_once"]``,
    traced by the profile before its first option) is checked to be the symbolic one's
    instantiation; ``None`` where nothing is kept or ``x`` is not a batch size of them."""
    found = PROGRAMS.get(key)
    if found is None or found[0]() is not layer:
        return None
    programs: LayerPrograms = found[1]
    env = batch_env(programs.symbolic, x)
    if env is None:
        return None
    checked: list[bool] = []

    def tracer(fn: Callable, p: Any, x: Any, index: int, input_grad: bool, name: str
               ) -> TracedLayer:
        kept = programs.options.get((name, input_grad))
        if kept is not None and not checked:
            once = memo.get("trace_once")
            checked.append(once is not None
                           and same_program(once[1], instantiate(programs.plain, env)))
        if kept is None or not checked[0]:
            return inner(fn, p, x, index, input_grad, name)
        return traced_programs(_concrete(kept, env), len(jax.tree.leaves(x)))

    return tracer
