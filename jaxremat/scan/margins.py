"""The sizes :func:`jaxremat.scan.family.loop_margin` takes, per option of a scanned layer's
menu (issue 18.1), measured on programs instantiated at each shape (issue 18.4).

Per option, :func:`margin_bytes` measures three programs (:mod:`jaxremat.scan.held`): the
gradient of a scan of two stored layers, the same under ``jax.checkpoint``, and the layer's
pullback. They are traced once with symbolic sizes and instantiated at each shape where
every option's policy allows it (:func:`jaxremat.scan.programs.programs_at`): a GPT-2
block's twelve programs at a new batch size in about 0.06 s of CPU instead of 0.5 s.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
from jax.extend.core import ClosedJaxpr

from .held import body_in, held_in, pullback_program, scan_program, stored_layer
from .programs import programs_at

__all__ = ["OptionPrograms", "margin_bytes", "margin_programs"]

@dataclasses.dataclass(frozen=True)
class OptionPrograms:
    """What :func:`margin_bytes` measures of one option: :func:`~jaxremat.scan.held.
    scan_program` of the layer stored under it (``stored``) and under ``jax.checkpoint``
    (``checkpointed``), and its :func:`~jaxremat.scan.held.pullback_program` (``None`` for
    the whole tape, option 0, whose held gradients ``loop_margin`` does not read)."""

    stored: ClosedJaxpr
    checkpointed: ClosedJaxpr
    pullback: ClosedJaxpr | None


def _traced(layer: Callable, params: Any, x: Any, policies: tuple[Callable | None, ...]
            ) -> tuple[ClosedJaxpr | None, ...]:
    stored = [stored_layer(layer, policy) for policy in policies]
    return tuple(program for option, f in enumerate(stored) for program in (
        scan_program(f, params, x), scan_program(jax.checkpoint(f, prevent_cse=False), params, x),
        pullback_program(f, params, x) if option else None))


def margin_programs(layer: Callable, params: Any, x: Any, policies: tuple[Callable | None, ...],
                    names: tuple[str, ...] | None = None) -> tuple[OptionPrograms, ...]:
    """Per option (``policies``, as :func:`jaxremat.scan.plan.option_policies` gives them;
    ``names`` their option names), the programs :func:`margin_bytes` measures at input
    ``x`` (abstract or concrete): instantiated from programs traced with symbolic sizes
    where the options allow it (:func:`jaxremat.scan.programs.programs_at`), else traced."""
    make = functools.partial(_traced, layer, params)
    if names is None or len(names) != len(policies):
        found = make(x, policies)
    else:
        found = programs_at(layer, params, x, ("margins", names), make, policies, names)
    return tuple(OptionPrograms(*found[i:i + 3]) for i in range(0, len(found), 3))


def margin_bytes(layer: Callable, params: Any, x: Any, policies: tuple[Callable | None, ...],
                 names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The keyword arguments :func:`jaxremat.scan.family.loop_margin` takes for ``layer``
    (one layer's ``params``, input ``x``; :mod:`jaxremat.scan.held`): ``param_bytes``; per
    option (``policies``, as :func:`jaxremat.scan.plan.option_policies` gives them;
    ``names``: their option names, which let the programs be instantiated from symbolic
    ones, :func:`margin_programs`), the parameter gradients its backward holds at its peak
    (``grad_bytes``; 0 for the whole tape, which loop_margin does not read), the loop
    invariants a scan of it hoists (``invariant_bytes``) and what such a scan holds
    (``scan_bodies``: :class:`jaxremat.scan.loops.ScanBody`), and a scan of it under
    ``jax.checkpoint`` (``checkpoint_bodies``)."""
    programs = margin_programs(layer, params, x, policies, names)
    bodies = tuple(body_in(option.stored, x) for option in programs)
    grads = len(jax.tree.leaves(params))
    return {"param_bytes": sum(math.prod(s.shape) * s.dtype.itemsize
                               for s in jax.tree.leaves(params)),
            "grad_bytes": (0,) + tuple(held_in(option.pullback, grads)
                                       for option in programs[1:]),
            "invariant_bytes": tuple(b.invariants for b in bodies), "scan_bodies": bodies,
            "checkpoint_bodies": tuple(body_in(option.checkpointed, x) for option in programs)}
