"""What differs between the JAX versions jaxremat supports (0.10.1 to 0.12.x), in one place.

Every use of a JAX internal, and every fact about how a version writes its jaxprs, goes
through this module, with a fallback that is tested (tests/test_jax_compat.py):

* **Calls.** A call's body is entered by the meter (:mod:`jaxremat.measure.liveness`), the graph
  builder and the jaxpr cost count. JAX 0.10 writes ``closed_call``/``core_call``; 0.11+
  writes ``eval_jaxpr`` (param ``call_jaxpr``), which its own ``custom_jvp``/``custom_vjp``
  code emits too. Under the ``jax_remat3`` flag (0.11+, off by default) a checkpoint is a
  ``call_hi_primitive`` whose body is in ``params["_prim"].params["jaxpr"]``, not in the
  equation's params; :func:`sub_jaxprs` finds it. A ``call_hi_primitive`` whose body cannot
  be matched to its operands (``jax_custom_vjp3``'s rules) is refused by :func:`check_known`
  with an error that names the flag, rather than measured wrongly.
* **Closed jaxprs.** JAX 0.11 merged ``ClosedJaxpr`` into ``Jaxpr`` (constants attached to
  the leading constvars); ``ClosedJaxpr(jaxpr, consts)`` survives only as a compatibility
  shim. :func:`close_jaxpr` builds one on either.
* **Dead-code elimination** (``partial_eval.dce_jaxpr``, internal): :func:`dce_jaxpr`;
  without it a jaxpr is returned whole, which overestimates transients and tape-only
  forward costs but stays correct.
* **A checkpoint's partial evaluation** (``partial_eval.partial_eval_jaxpr_custom``,
  internal): :func:`checkpoint_split` splits a JVP program as ``jax.checkpoint`` does under a
  policy, to measure many policies without tracing each; ``None`` without it (callers then
  trace, :func:`jaxremat.measure.trace.trace_linearized`).
* **Tracer types** (``JVPTracer``, ``LinearizeTracer``, ``BatchTracer``, internal), read to
  see ``vmap`` batch sizes and autodiff at trace time: :data:`AD_TRACERS`,
  :data:`BATCH_TRACER` (empty / ``None`` when a refactor moves them; callers then assume the
  conservative answers).
* **Cost analysis.** ``Lowered.cost_analysis()`` returns a dict, a list of dicts (older
  JAX), ``None`` (GPU backends), or raises ``NotImplementedError``: :func:`lowered_cost_analysis`.
* **Scan constants.** A ``scan`` equation's leading operands are its loop constants:
  ``params["num_consts"]`` of them on JAX 0.10-0.11; on 0.12 the leaves of the first of
  ``params["ft_in"]``'s three groups (constants, carries, scanned inputs; a flat tree,
  ``unpack()``): :func:`scan_num_consts` (0 where neither is found).
* **New variables** (``jax.extend.core.Var(aval)`` on 0.10-0.12; 0.10 also takes quasi-dynamic
  data): :func:`new_var`, used to make a symbolic program concrete
  (:mod:`jaxremat.measure.symbolic`).
* **Memory spaces** (host offload, issue 17): a value offloaded by a checkpoint policy has an
  aval whose ``memory_space`` is ``MemorySpace.Host`` (0.10-0.12 print it ``f32<host>[4]``);
  :func:`in_host_memory` reads it (``False`` when avals have no memory space).
  :func:`host_memory_kind` says whether a device has a ``pinned_host`` memory
  (``Device.addressable_memories()``; ``None`` where the method or the kind is missing).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr, Var, jaxprs_in_params

__all__ = [
    "AD_TRACERS",
    "as_jaxpr",
    "BATCH_TRACER",
    "CALL_PRIMITIVES",
    "check_known",
    "close_jaxpr",
    "new_var",
    "checkpoint_split",
    "dce_jaxpr",
    "host_memory_kind",
    "in_host_memory",
    "is_call",
    "lowered_cost_analysis",
    "scan_num_consts",
    "sub_jaxprs",
]

# Calls whose sub-program's inputs are the equation's operands, one to one, and which XLA
# inlines. ``eval_jaxpr`` is JAX 0.11+'s ``closed_call``/``call``.
CALL_PRIMITIVES = frozenset({
    "jit", "pjit", "closed_call", "core_call", "eval_jaxpr", "remat2", "remat", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
})
_HI_CALL = "call_hi_primitive"
_HI_FLAGS = "jax_remat3, jax_custom_vjp3, jax_custom_jvp3"


def as_jaxpr(body: Any) -> Jaxpr | None:
    """The open jaxpr of ``body`` (a ``Jaxpr`` or ``ClosedJaxpr``: one class on JAX 0.11+),
    or ``None`` for anything else."""
    if isinstance(body, ClosedJaxpr):
        return body.jaxpr
    return body if isinstance(body, Jaxpr) else None


def _hi_body(eqn: Any) -> Jaxpr | None:
    """The body of a ``call_hi_primitive`` (JAX 0.11+'s ``jax_remat3``) whose inputs and
    outputs are the equation's, one to one; ``None`` otherwise."""
    prim = eqn.params.get("_prim")
    body = as_jaxpr(getattr(prim, "params", {}).get("jaxpr"))
    if body is None or len(body.invars) != len(eqn.invars) or len(body.outvars) != len(eqn.outvars):
        return None
    return body


def is_call(eqn: Any) -> bool:
    """Whether ``eqn`` is a call: its sub-program's inputs are its operands, one to one, and
    XLA inlines it (module docstring)."""
    name = eqn.primitive.name
    return name in CALL_PRIMITIVES or (name == _HI_CALL and _hi_body(eqn) is not None)


def sub_jaxprs(eqn: Any) -> list[Jaxpr]:
    """The sub-programs of ``eqn``: those in its params, or a hi primitive's body."""
    if eqn.primitive.name == _HI_CALL:
        body = _hi_body(eqn)
        return [] if body is None else [body]
    return list(jaxprs_in_params(eqn.params))


def check_known(eqn: Any) -> None:
    """Raise ``NotImplementedError`` for an equation whose sub-program jaxremat cannot see:
    a ``call_hi_primitive`` other than a checkpoint (e.g. ``jax_custom_vjp3``'s)."""
    if eqn.primitive.name == _HI_CALL and _hi_body(eqn) is None:
        kind = type(eqn.params.get("_prim")).__name__
        raise NotImplementedError(
            f"jaxremat cannot measure a {kind} equation: JAX's experimental flags ({_HI_FLAGS}) "
            f"turn custom derivatives into primitives whose program is not in the jaxpr. "
            f"Turn them off while measuring, e.g. jax.config.update('jax_custom_vjp3', False)."
        )


def close_jaxpr(jaxpr: Jaxpr, consts: Sequence[Any] = ()) -> ClosedJaxpr:
    """``jaxpr`` with ``consts`` bound to its constvars: a ``ClosedJaxpr`` on JAX 0.10, a
    ``Jaxpr`` with attached constants on 0.11+ (where ``ClosedJaxpr`` is ``Jaxpr``)."""
    if ClosedJaxpr is Jaxpr:  # JAX 0.11+: one class; the two-argument form is its shim
        return Jaxpr(jaxpr, list(consts))
    return ClosedJaxpr(jaxpr, list(consts))


try:  # JAX internal: dead-code elimination of a jaxpr's unused outputs
    from jax._src.interpreters.partial_eval import dce_jaxpr as _dce
except ImportError:  # pragma: no cover - exercised by monkeypatching _dce to None
    _dce = None


def dce_jaxpr(closed: ClosedJaxpr, used_outputs: Sequence[bool]) -> ClosedJaxpr:
    """``closed`` keeping only the outputs marked used and what computes them (all inputs
    kept), as ``jax.jit`` and ``jax.grad`` do; unchanged when JAX's internal
    ``dce_jaxpr`` is not available."""
    if _dce is None:
        return closed
    jaxpr, _ = _dce(closed.jaxpr, list(used_outputs), instantiate=True)
    return close_jaxpr(jaxpr, closed.consts)


try:  # JAX internal: the partial evaluation jax.checkpoint applies to a JVP program
    from jax._src.interpreters.partial_eval import partial_eval_jaxpr_custom as _pe_custom
except ImportError:  # pragma: no cover - exercised by monkeypatching _pe_custom to None
    _pe_custom = None


def checkpoint_split(jaxpr: Jaxpr, num_known: int, policy: Any
                     ) -> tuple[Jaxpr, Jaxpr, int] | None:
    """``(known, staged, number of residuals)``: ``jaxpr`` (no constvars; its first
    ``num_known`` inputs known, the rest unknown) split by the partial evaluation
    ``jax.checkpoint`` applies to its JVP under ``policy``, as JAX's ``remat_partial_eval``
    does: ``known`` computes the known outputs then the residuals, ``staged`` reads the
    residuals then the unknown inputs and recomputes what the policy did not save, both
    without dead code. ``None`` where JAX's internal partial evaluation is not available."""
    if _pe_custom is None or _dce is None:
        return None
    num_in = len(jaxpr.invars)
    unknown = [k >= num_known for k in range(num_in)]
    known, staged, out_unknown, out_inst, num_res = _pe_custom(
        jaxpr, unknown, [True] * num_in, False, False, policy)
    staged, staged_used = _dce(staged, [u for u, i in zip(out_unknown, out_inst) if i])
    used_res = list(staged_used[:num_res])
    known_outputs = len(out_unknown) - sum(out_unknown)
    known, _ = _dce(known, [True] * known_outputs + used_res)
    return known, staged, sum(used_res)


try:  # JAX internals used to read vmap batch sizes and autodiff state at trace time
    from jax._src.interpreters.ad import JVPTracer as _JVPTracer
    from jax._src.interpreters.ad import LinearizeTracer as _LinearizeTracer
    from jax._src.interpreters.batching import BatchTracer as _BatchTracer

    AD_TRACERS: tuple[type, ...] = (_JVPTracer, _LinearizeTracer)
    BATCH_TRACER: type | None = _BatchTracer
except ImportError:  # pragma: no cover - a JAX refactor: assume per example, input grads
    AD_TRACERS = ()
    BATCH_TRACER = None


def lowered_cost_analysis(lowered: Any) -> dict[str, float] | None:
    """``lowered.cost_analysis()`` as one dict of numbers with a ``"flops"`` entry, or
    ``None`` where the backend gives none (``None``, empty, or ``NotImplementedError``)."""
    try:
        analysis = lowered.cost_analysis()
    except NotImplementedError:
        return None
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per computation
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    return {key: float(value) for key, value in analysis.items() if isinstance(value, (int, float))}


def scan_num_consts(eqn: Any) -> int:
    """How many of a ``scan`` equation's leading operands are loop constants (module
    docstring); 0 where the version's params say neither way."""
    if "num_consts" in eqn.params:
        return int(eqn.params["num_consts"])
    groups = eqn.params.get("ft_in")  # a flat tree (jax._src.flattree) of three groups
    try:
        return len(groups.unpack()[0].vals)
    except (AttributeError, IndexError, TypeError):
        return 0


def scan_num_carry(eqn: Any, default: int) -> int:
    """How many of a ``scan`` equation's leading outputs are its final carry (``num_carry``
    on JAX 0.10-0.11, the first group of ``ft_out`` on 0.12); ``default`` where the
    version's params say neither way."""
    if "num_carry" in eqn.params:
        return int(eqn.params["num_carry"])
    groups = eqn.params.get("ft_out")  # a flat tree of two groups: carry, stacked outputs
    try:
        return len(groups.unpack()[0].vals)
    except (AttributeError, IndexError, TypeError):
        return default


HOST_MEMORY_KIND = "pinned_host"
"""The host memory kind offload policies move residuals to."""


def in_host_memory(aval: Any) -> bool:
    """Whether a value of abstract value ``aval`` lives in host memory (an offloaded residual:
    ``memory_space`` is ``MemorySpace.Host``), so it takes no device memory."""
    space = getattr(aval, "memory_space", None)
    return getattr(space, "name", None) == "Host"


def host_memory_kind(device: Any = None) -> str | None:
    """``"pinned_host"`` if ``device`` (default ``jax.devices()[0]``) has that memory, which
    checkpoint offload policies need; ``None`` otherwise (no such memory, or a JAX without
    ``Device.addressable_memories``)."""
    device = jax.devices()[0] if device is None else device
    try:
        kinds = {memory.kind for memory in device.addressable_memories()}
    except (AttributeError, NotImplementedError, RuntimeError):  # an older JAX or a stub
        return None
    return HOST_MEMORY_KIND if HOST_MEMORY_KIND in kinds else None


JAX_VERSION: tuple[int, ...] = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())
"""The running JAX version, e.g. ``(0, 12, 0)``: for messages and benchmarks only; the code
decides from the program, not from the version."""


def new_var(aval: Any) -> Any:
    """A fresh jaxpr variable of abstract value ``aval``."""
    return Var(aval)
