"""A layer's options traced once with a symbolic batch size (and sequence length),
instantiated at each size (issue 18.4).

At the first shape a layer is profiled at (its input differentiated), each option whose
policy does not look at sizes (:func:`jaxremat.sequence.policies.shape_free`) is traced with
the input's leading axis a symbolic batch size (:mod:`jaxremat.measure.symbolic`), and axis
1 of inputs of rank 3 or more a symbolic sequence length where the layer traces so, and
instantiated at that shape, instead of traced there; the symbolic programs are kept
(:data:`jaxremat.sequence.cache.PROGRAMS`). The whole tape is traced from the layer both ways, and its instantiation
must be the very program traced (:func:`jaxremat.measure.symbolic.same_program`, forward and
backward): where it is not, the layer is traced as before at every shape. The checkpointed
options are traced from the layer's symbolic jaxpr (:func:`jaxremat.measure.trace.replayed`,
no Python of the layer's), one trace each, as before; their instantiations were checked equal
to tracing them on the test suite's blocks (``tests/test_polymorphic.py``), not at run time.

At a later shape differing only in those sizes (each at least 2), the layer's plain forward is
traced as before (:func:`jaxremat.measure.trace.trace_once`) and, where it is the symbolic
plain forward's instantiation (a layer's Python may branch on a shape), every kept option is
instantiated instead of traced: about 4 ms instead of 30-50 ms an option on a GPT-2 block.
Everything measured on the programs (tape, transients, costs) is measured as on traced
ones; the pullback is replayed from its own instantiated jaxpr where a cost is lowered.
A searched option (``"dots_plus"``, its policy keyed by operand shapes) is traced with its
policy moved to the symbolic program's equations, the same ones by position
(:func:`jaxremat.sequence.searched.moved_policy`), and instantiated only where the policy
found at the later shape moves to that same one. Options not kept (ranked, a user's
policies, a check that failed) are traced as before.

The programs are kept per layer function and input structure (not per shape), in a bounded
cache cleared with :func:`jaxremat.sequence.profile.profile_cache`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
from jax.extend.core import ClosedJaxpr

from ..lru import LRU
from ..measure.symbolic import (SEQUENCE, SymbolicInput, instantiate, instantiate_tree,
                                same_program, shape_env, symbolic_input)
from ..measure.trace import TracedLayer, VjpPrograms, replayed, traced_programs, vjp_programs
from .cache import PROGRAMS, cached, remember
from .options import Tracer
from .policies import PolicyOption, shape_free
from .searched import SearchedPolicy, moved_policy

__all__ = ["LayerPrograms", "instantiating_tracer", "recording_symbolic"]


@dataclasses.dataclass(frozen=True)
class LayerPrograms:
    """A layer's plain forward and the vjp programs of its options (by ``(option name,
    input_grad)``), traced on ``symbolic.x``."""

    symbolic: SymbolicInput
    plain: ClosedJaxpr
    options: dict[tuple[str, bool], VjpPrograms]
    searched: dict[tuple[str, bool], SearchedPolicy]  # the policy traced, on ``plain``


def _concrete(programs: VjpPrograms, env: dict[str, int]) -> VjpPrograms:
    memo: dict = {}  # a nested program shared by the forward and the backward, made once

    def pullback(*args: Any) -> Any:  # its program made only where a cost is lowered
        return replayed(instantiate(programs.pure, env, memo), programs.pure_tree,
                        "pullback")(*args)

    return VjpPrograms(
        forward=instantiate(programs.forward, env, memo),
        output=instantiate_tree(programs.output, env),
        residuals=tuple(instantiate_tree(programs.residuals, env)),
        pullback=pullback, cotangent=instantiate_tree(programs.cotangent, env),
        backward=instantiate(programs.backward, env, memo))


def _same(traced: TracedLayer, programs: VjpPrograms) -> bool:
    return (same_program(traced.forward, programs.forward)
            and same_program(traced.backward, programs.backward))


def _symbolic_policy(option: PolicyOption, plain: ClosedJaxpr, symbolic: ClosedJaxpr
                     ) -> Any:
    """The policy to trace ``option`` with on the symbolic program: its own where it does
    not look at sizes, a searched policy moved to the symbolic equations
    (:func:`jaxremat.sequence.searched.moved_policy`, ``plain`` the concrete program it was
    found on), else ``None``."""
    if shape_free(option.name):
        return option.policy
    if isinstance(option.policy, SearchedPolicy) and plain is not None:
        return moved_policy(option.policy, plain, symbolic)
    return None


def recording_symbolic(layer: Callable, p: Any, x: Any, key: tuple, memo: dict, inner: Tracer
                       ) -> tuple[Tracer, Callable[[], None]]:
    """At a layer's first shape: a tracer that traces the shape-free options symbolically and
    instantiates them (checking the whole tape against ``inner``'s trace), and a function to
    call once the profile is made, which keeps the programs under ``key``. Searched options
    are traced with their policy moved to the symbolic program (``memo["plain"]``: the
    concrete plain forward it was found on). Where the batch cannot be made symbolic, the
    layer does not trace so, or a check fails: ``inner``'s traces, and nothing kept."""
    for sequence in (True, False):  # the batch and sequence length, else the batch alone
        symbolic = symbolic_input(x, sequence)
        if symbolic is None or (sequence and not any(SEQUENCE in s for s in symbolic.symbols)):
            continue
        try:
            plain, shape = jax.make_jaxpr(layer, return_shape=True)(p, symbolic.x)
        except Exception:  # noqa: BLE001 - the layer's Python needs those sizes concrete
            continue
        break
    else:
        return inner, lambda: None
    env = shape_env(symbolic, x)
    if env is None:
        return inner, lambda: None
    replay = replayed(plain, jax.tree.structure(shape), getattr(layer, "__name__", "layer"))
    kept: dict[tuple[str, bool], VjpPrograms] = {}
    searched: dict[tuple[str, bool], SearchedPolicy] = {}
    state = {"failed": False}

    def tracer(fn: Callable, p: Any, x: Any, index: int, input_grad: bool,
               option: PolicyOption) -> TracedLayer:
        policy = _symbolic_policy(option, memo.get("plain"), plain)
        if state["failed"] or (policy is None and option.policy is not None):
            return inner(fn, p, x, index, input_grad, option)
        checkpointed = option.policy is not None
        source = (jax.checkpoint(replay, policy=policy, prevent_cse=True)
                  if checkpointed else fn)  # the whole tape from the layer itself
        try:
            programs = vjp_programs(source, p, symbolic.x, index, input_grad=input_grad,
                                    pure=True)
            found = _concrete(programs, env)
        except Exception:  # noqa: BLE001 - traced as before (which raises if it must)
            state["failed"] = state["failed"] or not checkpointed
            return inner(fn, p, x, index, input_grad, option)
        if not checkpointed:  # the whole tape, traced from the layer both ways
            traced = inner(fn, p, x, index, input_grad, option)
            state["failed"] = not _same(traced, found)
            if not state["failed"]:
                kept[(option.name, input_grad)] = programs
            return traced
        kept[(option.name, input_grad)] = programs
        if isinstance(policy, SearchedPolicy):
            searched[(option.name, input_grad)] = policy
        return traced_programs(found, len(jax.tree.leaves(x)))

    def keep() -> None:
        if kept and not state["failed"]:
            remember(key, layer, LayerPrograms(symbolic, plain, dict(kept), dict(searched)),
                     None, PROGRAMS)

    return tracer, keep


def _same_policy(option: PolicyOption, programs: LayerPrograms, input_grad: bool,
                 once: Any) -> bool:
    """Whether ``option``'s policy at this shape keeps what its symbolic programs kept: a
    searched option's, moved to the symbolic program from the plain forward traced here
    (``once``), must be the policy traced."""
    traced = programs.searched.get((option.name, input_grad))
    return traced is None or (isinstance(option.policy, SearchedPolicy)
                              and moved_policy(option.policy, once[1], programs.plain) == traced)


def instantiating_tracer(layer: Callable, x: Any, key: tuple, memo: dict, inner: Tracer
                         ) -> Tracer | None:
    """At a later shape: a tracer that instantiates the programs kept under ``key`` and
    traces the others with ``inner``, once the layer's plain forward (``memo["trace_once"]``,
    traced by the profile before its first option) is checked to be the symbolic one's
    instantiation; ``None`` where nothing is kept or ``x`` is not a batch size of them."""
    found = cached(key, layer, PROGRAMS)
    if found is None:
        return None
    programs: LayerPrograms = found[0]
    env = shape_env(programs.symbolic, x)
    if env is None:
        return None
    checked: list[bool] = []

    def tracer(fn: Callable, p: Any, x: Any, index: int, input_grad: bool,
               option: PolicyOption) -> TracedLayer:
        kept = programs.options.get((option.name, input_grad))
        once = memo.get("trace_once")
        if kept is not None and not checked:
            checked.append(once is not None
                           and same_program(once[1], instantiate(programs.plain, env)))
        if kept is None or not checked[0] or not _same_policy(option, programs, input_grad,
                                                                once):
            return inner(fn, p, x, index, input_grad, option)
        return traced_programs(_concrete(kept, env), len(jax.tree.leaves(x)))

    return tracer
