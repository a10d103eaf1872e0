"""Trace one layer's vjp and read off what Rotor's chain needs: tape and transients.

See :mod:`jaxremat.sequence.profile` for the definitions (ALGORITHMS.md sections 1 and 6). A layer
``layer(p, x) -> y`` is traced with ``jax.make_jaxpr(lambda p, x: jax.vjp(layer, p, x))``:
the jaxpr's outputs are ``y`` then the pullback's residuals, and a residual that *is* a
parameter, the input or the output is the same jaxpr variable, which is how they are told
apart. The pullback is traced separately on the residuals; its jaxpr says which residuals
it reads, and both jaxprs are measured with the program-order meter
(:func:`jaxremat.measure.meter.program_memory`) so that the chain counts memory exactly as
:func:`jaxremat.activation_memory` does.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, jaxpr_as_fun

from ..jax_compat import dce_jaxpr, in_host_memory

from .liveness import device_nbytes
from .meter import aval_nbytes, inputs_read, program_memory
from ..trees import cotangent_struct, tree_bytes

__all__ = ["TracedLayer", "VjpPrograms", "trace_layer", "traced_programs", "vjp_programs",
           "trace_linearized", "trace_once", "replayed", "tape_forward",
           "tape_jaxpr", "tape_signature", "transients", "plain_forward_tmp",
           "without_input_grad", "mark_live"]


@dataclasses.dataclass(frozen=True)
class TracedLayer:
    """A layer traced on abstract inputs.

    Attributes:
      forward: the jaxpr of ``jax.vjp(layer, p, x)``: ``(p, x) -> (y, residuals)``.
      output: ``y`` as a pytree of ``ShapeDtypeStruct``.
      residuals: the pullback's leaves (``ShapeDtypeStruct``), in order.
      residual_used: whether the pullback reads each residual. ``jax.vjp`` may keep values
        its pullback never reads (e.g. the zeros of ``relu``'s derivative); in
        ``jax.grad`` of a whole loss they are dead code and not kept, so they are not tape.
      pullback: ``pullback(residuals, cotangent) -> (grad_p, grad_x)`` (``(grad_p,)`` when
        traced with ``input_grad=False``), a plain function.
      cotangent: the cotangent type of ``y`` (``float0`` for integer and key leaves).
      backward: the jaxpr of ``pullback`` on ``(residuals, cotangent of y)``, for memory
        measurement: it returns the parameter gradients and sums ``g[i]`` at the end.
      tape_bytes: ``xbar_size[i]``, as defined in :mod:`jaxremat.sequence.profile`.
      output_in_tape: whether the pullback reads the output (some leaf of ``y`` is a read
        residual): ``Chain.output_in_tape[i]``.
      host_bytes: bytes of the counted residuals in host memory (moved there by an offload
        policy): not in ``tape_bytes``, which counts device memory only.
      input_read, output_read: per leaf of ``x`` / ``y``, whether the pullback reads it (it
        is a read residual). ``jax.grad`` frees the leaves of ``x`` no pullback reads once the
        forward has run: ``solver.Chain.x_read_size``.
      tape_deps: per leaf of ``x``, whether the tape-only forward (:func:`tape_forward`)
        reads it; output_deps: per leaf of ``y``, the leaves of ``x`` computing it reads
        (``()``: not measured). They give ``solver.Chain.x_rec_size``.
    """

    forward: ClosedJaxpr
    output: Any
    residuals: tuple[jax.ShapeDtypeStruct, ...]
    residual_used: tuple[bool, ...]
    pullback: Callable[..., Any]
    cotangent: Any
    backward: ClosedJaxpr
    tape_bytes: int
    output_in_tape: bool = True
    host_bytes: int = 0
    input_read: tuple[bool, ...] = ()
    output_read: tuple[bool, ...] = ()
    tape_deps: tuple[bool, ...] = ()
    output_deps: tuple[tuple[bool, ...], ...] = ()


def input_deps(forward: ClosedJaxpr, num_outputs: int, used: Sequence[bool], num_x: int
               ) -> tuple[tuple[bool, ...], tuple[tuple[bool, ...], ...]]:
    """Which leaves of the input ``x`` (the last ``num_x`` inputs of ``forward``) the
    forward reads to compute the residuals the pullback reads, and to compute each output
    leaf alone: JAX's dead-code elimination (:func:`_dead_code_removed`) then the meter's
    reads (:func:`jaxremat.measure.meter.inputs_read`)."""
    num_res = len(forward.jaxpr.outvars) - num_outputs

    def reads(outputs: Sequence[bool]) -> tuple[bool, ...]:
        return tuple(inputs_read(_dead_code_removed(forward, outputs))[-num_x:]) if num_x else ()

    tape = reads([False] * num_outputs + list(used))
    outputs = tuple(reads([j == o for j in range(num_outputs)] + [False] * num_res)
                    for o in range(num_outputs))
    return tape, outputs


def _layer_error(index: int, x: Any, error: Exception) -> Exception:
    """Re-raise an exception from tracing layer ``index`` with the layer named."""
    source = "the sequence input x" if index == 0 else f"the output of layer {index - 1}"
    shapes = jax.tree.map(lambda s: f"{s.dtype}{list(s.shape)}", x)
    message = (
        f"layer {index} failed when traced on {source} (structure and shapes: {shapes}): "
        f"{type(error).__name__}: {error}"
    )
    kind = TypeError if isinstance(error, TypeError) else ValueError
    raised = kind(message)
    raised.layer_index = index  # read by jaxremat.flax.nnx to explain Sequential's convention
    return raised


def _counted_residuals(forward: ClosedJaxpr, num_outputs: int, used: Sequence[bool]) -> list[Any]:
    """The residual variables counted in the tape: read by the pullback, not a literal, a
    parameter, the input, a constant or an output, each once."""
    jaxpr = forward.jaxpr
    outside = set(jaxpr.invars) | set(jaxpr.constvars)
    outputs = {v for v in jaxpr.outvars[:num_outputs] if not isinstance(v, Literal)}
    counted: list[Any] = []
    for v, read in zip(jaxpr.outvars[num_outputs:], used):
        if not read or isinstance(v, Literal) or v in outside or v in outputs or v in counted:
            continue
        counted.append(v)
    return counted


def _tape_bytes(forward: ClosedJaxpr, num_outputs: int, output_bytes: int,
                used: Sequence[bool]) -> int:
    """Device bytes of the residuals the pullback reads, minus params/input/constants, plus
    the output (residuals in host memory take none). ``used[k]``: the pullback reads
    residual ``k``."""
    counted = _counted_residuals(forward, num_outputs, used)
    return sum(device_nbytes(v.aval) for v in counted) + output_bytes


def _host_bytes(forward: ClosedJaxpr, num_outputs: int, used: Sequence[bool]) -> int:
    """Bytes of the residuals the pullback reads that live in host memory (offloaded)."""
    counted = _counted_residuals(forward, num_outputs, used)
    return sum(aval_nbytes(v.aval) for v in counted if in_host_memory(v.aval))


def tape_signature(traced: "TracedLayer") -> tuple:
    """What identifies a layer's tape across traces: the shapes, dtypes and memory (device or
    host) of its counted residuals (sorted) and whether it holds the output. Two policies
    with equal signatures keep the same values (:mod:`jaxremat.sequence.policies`)."""
    counted = _counted_residuals(traced.forward, len(jax.tree.leaves(traced.output)),
                                 traced.residual_used)
    shapes = sorted((tuple(v.aval.shape), str(v.aval.dtype), in_host_memory(v.aval))
                    for v in counted)
    return tuple(shapes), traced.output_in_tape


def _reads_output(forward: ClosedJaxpr, num_outputs: int, used: Sequence[bool]) -> bool:
    """Whether the pullback reads some leaf of the layer's output (a read residual that is
    the same jaxpr variable as an output)."""
    jaxpr = forward.jaxpr
    outputs = {v for v in jaxpr.outvars[:num_outputs] if not isinstance(v, Literal)}
    return any(read and not isinstance(v, Literal) and v in outputs
               for v, read in zip(jaxpr.outvars[num_outputs:], used))


def _leaves_read(forward: ClosedJaxpr, num_outputs: int, used: Sequence[bool],
                 candidates: Sequence[Any]) -> tuple[bool, ...]:
    """Per variable of ``candidates`` (inputs or outputs of ``forward``), whether it is a
    residual the pullback reads (the same jaxpr variable, as :func:`_reads_output` tells)."""
    read = {v for v, r in zip(forward.jaxpr.outvars[num_outputs:], used)
            if r and not isinstance(v, Literal)}
    return tuple(not isinstance(v, Literal) and v in read for v in candidates)


def _dead_code_removed(closed: ClosedJaxpr, used_outputs: Sequence[bool]) -> ClosedJaxpr:
    """``closed`` keeping only the outputs marked used and what computes them (all inputs
    kept), as ``jax.grad`` does before running a forward pass: values that only feed
    residuals the pullback never reads are not computed at all.

    Uses JAX's own dead-code elimination (:func:`jaxremat.jax_compat.dce_jaxpr`); without
    it the jaxpr is returned unchanged, which overestimates the transients.
    """
    found = dce_jaxpr(closed, used_outputs)
    with _LIVE_LOCK:
        _LIVE.add(found.jaxpr)
    return found


_LIVE: "weakref.WeakSet[Jaxpr]" = weakref.WeakSet()
"""The jaxprs :func:`_dead_code_removed` returned (held weakly): free of dead code."""
_LIVE_LOCK = threading.Lock()


def mark_live(*jaxprs: Jaxpr) -> None:
    """Record that ``jaxprs`` are results of JAX's dead-code elimination (``dce_jaxpr`` with
    every output they keep used), so that :func:`live_jaxpr` takes them as they are: the
    split of :func:`jaxremat.measure.policy_costs.policy_costs`, counted about 200 times a
    layer by the ``"dots_plus"`` search."""
    with _LIVE_LOCK:
        _LIVE.update(jaxprs)


def live_jaxpr(closed: ClosedJaxpr) -> ClosedJaxpr:
    """``closed`` with its dead code removed, every output kept (what ``jit`` lowers):
    ``closed`` itself when it is already the result of a dead-code elimination (removing
    dead code again keeps every equation: a profile's tape-only forwards and pullbacks
    without the input's gradient are counted without a second pass over them)."""
    with _LIVE_LOCK:
        known = closed.jaxpr in _LIVE
    return closed if known else _dead_code_removed(closed, [True] * len(closed.jaxpr.outvars))


def tape_forward(traced: "TracedLayer", *, with_output: bool = False
                 ) -> Callable[[Any, Any], list[Any]]:
    """The forward that builds only the tape: ``(p, x) -> read residuals``.

    It is ``jax.vjp``'s forward cut down to the residuals the pullback reads; the output is
    computed only where it is one of them. This is what JAX runs for the last layer of a
    recomputed segment (``g[i+1]`` exists, so nothing else reads ``x[i+1]``, and the rest
    is dead code): ``solver.Chain.fwd_tape_time``. A residual block's last matmul, for
    instance, is not in it.

    With ``with_output=True`` it returns the output too: the forward that ``jax.grad``
    runs for a layer that keeps its tape (``F_all``), which computes the derivative factors
    the pullback reads (gelu's, tanh's ``1 - y**2``) on top of the plain forward.
    """
    def forward(p: Any, x: Any) -> list[Any]:  # built when called: a profile at a later
        # shape counts the jaxpr and never calls it (jaxremat.sequence.calibration)
        run = jaxpr_as_fun(tape_jaxpr(traced, with_output=with_output))
        return run(*jax.tree.leaves((p, x)))

    return forward


def tape_jaxpr(traced: "TracedLayer", *, with_output: bool = False) -> ClosedJaxpr:
    """The jaxpr of :func:`tape_forward` (``with_output`` likewise): the vjp forward with
    dead code removed, keeping the read residuals (and the output)."""
    num_out = len(jax.tree.leaves(traced.output))
    return _dead_code_removed(traced.forward, [with_output] * num_out + list(traced.residual_used))


def transients(traced: "TracedLayer", num_params: int, input_bytes: int
               ) -> tuple[int, int, int, int]:
    """``(fwd_tmp, bwd_tmp, bwd_tmp_freed, fwd_tape_tmp)`` of a traced layer, as defined in
    :mod:`jaxremat.sequence.profile`: ``bwd_tmp`` with the layer's input held through the
    backward, ``bwd_tmp_freed`` with the input's leaves freed at their last read in it (what
    JAX does when nothing after the backward reads them), at least
    ``-min(input bytes, output bytes)`` (``solver.chain.options.bwd_tmp_floor``);
    ``fwd_tape_tmp``: the forward that builds only the tape (:func:`tape_forward`), above
    its input and the tape it stores (``solver.Chain.fwd_tape_tmp``)."""
    forward = traced.forward.jaxpr
    num_out = len(jax.tree.leaves(traced.output))
    live_forward = tape_jaxpr(traced, with_output=True)
    fwd_peak = program_memory(live_forward, exclude_inputs=range(num_params), count_outputs=True)
    fwd_tmp = max(0, int(fwd_peak) - input_bytes - traced.tape_bytes)
    tape_peak = program_memory(tape_jaxpr(traced), exclude_inputs=range(num_params),
                               count_outputs=True)
    stored = traced.tape_bytes - (0 if traced.output_in_tape else tree_bytes(traced.output))
    fwd_tape_tmp = max(0, int(tape_peak) - input_bytes - stored)

    backward = traced.backward.jaxpr
    # Not counted in the backward: parameters and constants (live anyway), the input x[i]
    # (the simulator holds it through B(i)), residuals the pullback never reads, literal
    # residuals (gelu's 0.5: constants in the training step's program, as in the tape), and
    # residuals in host memory (offloaded; the pullback's jaxpr, traced on shapes, sees them
    # as device values, but only their copies back to the device take device memory).
    outside = set(forward.invars) | set(forward.constvars)
    residual_vars = forward.outvars[num_out:]
    excluded = [
        k for k, (v, read) in enumerate(zip(residual_vars, traced.residual_used))
        if not read or isinstance(v, Literal) or v in outside or in_host_memory(v.aval)
    ]
    bwd_peak = program_memory(traced.backward, exclude_inputs=excluded, count_outputs=False)
    held = sum(aval_nbytes(v.aval) for k, v in enumerate(backward.invars) if k not in excluded)
    bwd_tmp = max(0, int(bwd_peak) - held - input_bytes)
    # The input's leaves the pullback reads, counted as its inputs (freed at their last read):
    # the backward's peak may then come before g[i] is whole, below held + g[i].
    inputs = set(forward.invars[num_params:])
    read_inputs = [k for k in excluded if k < len(residual_vars) and traced.residual_used[k]
                   and not isinstance(residual_vars[k], Literal) and residual_vars[k] in inputs]
    if read_inputs:
        freed_peak = program_memory(traced.backward, count_outputs=False,
                                    exclude_inputs=sorted(set(excluded) - set(read_inputs)))
        held += sum(aval_nbytes(backward.invars[k].aval) for k in read_inputs)
    else:
        freed_peak = bwd_peak
    floor = -min(input_bytes, tree_bytes(traced.output))
    bwd_tmp_freed = min(bwd_tmp, max(floor, int(freed_peak) - held - input_bytes))
    return fwd_tmp, bwd_tmp, bwd_tmp_freed, fwd_tape_tmp


def plain_forward_tmp(traced: "TracedLayer") -> int:
    """``fwd_ck_tmp`` of a traced layer: the peak of its plain forward (no tape: what
    ``jax.checkpoint`` runs for ``F_ck`` / ``F_none``, the vjp forward with every residual
    dead) above its input, held throughout, and its output, at least 0
    (``solver.Chain.fwd_ck_tmp``). Parameters and constants are not counted; the output from
    the equation making each leaf on (a leaf that is an input leaf adds nothing, so the
    difference may go below the true one, hence the floor)."""
    num_out = len(jax.tree.leaves(traced.output))
    plain = _dead_code_removed(traced.forward,
                               [True] * num_out + [False] * len(traced.residual_used))
    peak = program_memory(plain, exclude_inputs=True, count_outputs=True)
    return max(0, int(peak) - tree_bytes(traced.output))


def _pullback_for_memory(pullback: Callable) -> Callable:
    """``pullback`` whose input gradient stays live to the end, parameter gradients not.

    In the training step the parameter gradients are outputs (not counted by
    :func:`jaxremat.activation_memory`) but ``g[i]`` is an activation gradient (counted).
    ``program_memory`` counts all outputs or none, so ``g[i]`` is not returned but summed
    at the very end: it is then live from its creation to the end (the sums add 4 bytes per
    leaf, and their scalar outputs are not counted).
    """

    def wrapped(res: Sequence[Any], cotangent: Any) -> Any:
        grad_params, *grad_x = pullback(res, cotangent)
        sink = [jnp.sum(g) for g in jax.tree.leaves(grad_x) if g.dtype != jax.dtypes.float0]
        return grad_params, sink

    return wrapped


def trace_once(layer: Callable, p: Any, x: Any, index: int
               ) -> tuple[Callable[[Any, Any], Any], ClosedJaxpr]:
    """``layer`` traced once on abstract ``p`` and ``x``: a function ``(p, x) -> y`` that
    evaluates the traced jaxpr instead of the layer's Python (``jax.vjp``, ``jax.checkpoint``
    and ``jax.jit`` of it build the same programs as of ``layer``, without tracing the
    layer again: Flax modules and ``jax.numpy`` code are slow to trace), and the jaxpr.

    Raises ``ValueError``/``TypeError`` naming ``index``, as :func:`trace_layer`.
    """
    try:
        closed, output = jax.make_jaxpr(layer, return_shape=True)(p, x)
    except Exception as error:  # noqa: BLE001 - re-raised naming the layer
        raise _layer_error(index, x, error) from error
    return replayed(closed, jax.tree.structure(output), getattr(layer, "__name__", "layer")), closed


def _traced_with_function(make: Callable[[Any, Any], tuple[Any, Any]], p: Any, x: Any
                          ) -> tuple[ClosedJaxpr, Any, list[Any], Any]:
    """``(jaxpr, y, leaves, treedef)`` of ``make(p, x) -> (y, f)`` traced on abstract ``p`` and
    ``x``, where ``f`` is ``jax.vjp``'s or ``jax.linearize``'s function, a pytree: the jaxpr's
    outputs are ``y``'s leaves then ``f``'s (its residuals), ``f`` is
    ``jax.tree.unflatten(treedef, leaves)``. ``f`` is flattened inside the trace and only
    its leaves are returned: returned whole, its treedef (whose static part holds the linear
    jaxpr) became the traced function's output structure, which ``jit``'s caches keep
    (``pjit._check_and_canonicalize_out_shardings``): about 11,000 objects kept per re-plan
    of 12 GPT-2 blocks at a new batch size (32,000 with ``"dots_plus"``), which every full
    garbage collection then walked."""
    found = []

    def flat(p: Any, x: Any) -> tuple[Any, list[Any]]:
        y, f = make(p, x)
        leaves, treedef = jax.tree.flatten(f)
        found.append(treedef)
        return y, leaves

    closed, (output, leaves) = jax.make_jaxpr(flat, return_shape=True)(p, x)
    return closed, output, leaves, found[-1]


@dataclasses.dataclass(frozen=True)
class VjpPrograms:
    """The programs of ``jax.vjp(layer, p, x)`` traced on abstract ``p`` and ``x``, before
    anything is measured on them (shapes may be symbolic: :mod:`jaxremat.measure.symbolic`).
    Fields as :class:`TracedLayer`'s of the same names."""

    forward: ClosedJaxpr
    output: Any
    residuals: tuple[Any, ...]
    pullback: Callable[..., Any]
    cotangent: Any
    backward: ClosedJaxpr
    pure: ClosedJaxpr | None = None
    pure_tree: Any = None


def vjp_programs(layer: Callable, p: Any, x: Any, index: int, *, input_grad: bool = True,
                 pure: bool = False) -> VjpPrograms:
    """The forward and backward jaxprs of ``jax.vjp(layer, p, x)`` (:func:`trace_layer`);
    with ``pure``, also the pullback's own jaxpr (``backward`` is it with the input
    gradient kept live, :func:`_pullback_for_memory`) and its output structure, from which
    :func:`replayed` makes the pullback again (a few ms: JAX has the transposition then)."""
    if input_grad:
        vjp = lambda p, x: jax.vjp(layer, p, x)  # noqa: E731
    else:
        vjp = lambda p, x: jax.vjp(lambda q: layer(q, x), p)  # noqa: E731
    try:
        forward, output, residuals, treedef = _traced_with_function(vjp, p, x)
    except Exception as error:  # noqa: BLE001 - re-raised naming the layer
        raise _layer_error(index, x, error) from error

    def pullback(res: Sequence[Any], cotangent: Any) -> Any:
        return jax.tree.unflatten(treedef, res)(cotangent)

    cotangent = jax.tree.map(cotangent_struct, output)
    backward = jax.make_jaxpr(_pullback_for_memory(pullback))(residuals, cotangent)
    found = VjpPrograms(forward, output, tuple(residuals), pullback, cotangent, backward)
    if not pure:
        return found
    own, shape = jax.make_jaxpr(pullback, return_shape=True)(list(residuals), cotangent)
    return dataclasses.replace(found, pure=own, pure_tree=jax.tree.structure(shape))


def replayed(closed: ClosedJaxpr, treedef: Any, name: str = "layer") -> Callable[..., Any]:
    """A function evaluating ``closed`` on the leaves of its arguments, its outputs put in
    ``treedef``: JAX's transformations of it build the programs they build of the function
    ``closed`` was traced from, without running that function's Python again."""
    run = jaxpr_as_fun(closed)

    def replay(*args: Any) -> Any:
        return jax.tree.unflatten(treedef, run(*jax.tree.leaves(args)))

    replay.__name__ = name
    return replay


def trace_layer(
    layer: Callable, p: Any, x: Any, index: int, *, input_grad: bool = True
) -> TracedLayer:
    """Trace ``jax.vjp(layer, p, x)`` and its pullback on abstract ``p`` and ``x``.

    With ``input_grad=False`` only the parameters are differentiated (``x`` is a constant
    of the vjp), as ``jax.grad`` does for the first layer when the sequence's input is not
    differentiated: the backward then computes no ``g[0]``.

    Raises ``ValueError``/``TypeError`` naming ``index`` when the layer cannot be traced on
    ``x`` (e.g. the previous layer's output does not fit it).
    """
    return traced_programs(vjp_programs(layer, p, x, index, input_grad=input_grad),
                           len(jax.tree.leaves(x)))


def trace_linearized(layer: Callable, p: Any, x: Any) -> tuple[ClosedJaxpr, ClosedJaxpr, int]:
    """``(forward, linear, tape bytes)`` of ``jax.linearize(layer, p, x)`` on abstract ``p``
    and ``x``: the jaxpr computing ``y`` and the residuals, the jaxpr of the linearized
    function on ``(residuals, tangent of p, tangent of x)``, and the tape as
    :func:`trace_layer` counts it.

    The cheap half of :func:`trace_layer`: the same residuals (``jax.vjp`` linearizes the
    same way), without transposing. The linear jaxpr holds what the pullback recomputes
    (a ``jax.checkpoint``'s unsaved values) and the tangent of each operation where the
    pullback has its transpose, so its flops differ from the pullback's by an amount that
    does not depend on what a checkpoint policy saves: differences of flops between two
    policies of one layer are the pullback's (``tests/test_policy_costs.py``), at a fifth of
    the tracing time."""
    forward, output, residuals, treedef = _traced_with_function(
        lambda p, x: jax.linearize(layer, p, x), p, x)
    tangents = jax.tree.map(cotangent_struct, (p, x))
    linear = jax.make_jaxpr(lambda res, tp, tx: jax.tree.unflatten(treedef, res)(tp, tx))(
        residuals, *tangents)
    used = inputs_read(linear)[:len(residuals)]
    return forward, linear, _tape_bytes(forward, len(jax.tree.leaves(output)),
                                        tree_bytes(output), used)


def traced_programs(programs: VjpPrograms, num_x: int) -> TracedLayer:
    """The :class:`TracedLayer` of a vjp's programs on concrete shapes (what the pullback
    reads, the tape, the input and output leaves it reads, the inputs the tape needs);
    ``num_x``: the number of the input's leaves."""
    return _traced_layer(programs.forward, programs.output, programs.residuals,
                         programs.pullback, programs.cotangent, programs.backward, num_x)


def _traced_layer(forward: ClosedJaxpr, output: Any, residuals: tuple, pullback: Callable,
                  cotangent: Any, backward: ClosedJaxpr, num_x: int) -> TracedLayer:
    used = tuple(inputs_read(backward)[:len(residuals)])
    num_outputs = len(jax.tree.leaves(output))
    tape = _tape_bytes(forward, num_outputs, tree_bytes(output), used)
    x_vars = forward.jaxpr.invars[len(forward.jaxpr.invars) - num_x:]
    tape_deps, output_deps = input_deps(forward, num_outputs, used, num_x)
    return TracedLayer(forward, output, residuals, used, pullback, cotangent, backward,
                       tape, _reads_output(forward, num_outputs, used),
                       _host_bytes(forward, num_outputs, used),
                       _leaves_read(forward, num_outputs, used, x_vars),
                       _leaves_read(forward, num_outputs, used,
                                    forward.jaxpr.outvars[:num_outputs]),
                       tape_deps, output_deps)


def without_input_grad(traced: TracedLayer, num_params: int, num_x: int) -> TracedLayer:
    """``traced`` (traced with ``input_grad=True``) with the input's gradient removed as
    dead code: the pullback's jaxpr keeps only the parameter gradients (JAX's dead-code
    elimination, :func:`jaxremat.jax_compat.dce_jaxpr`), so it reads only the residuals
    they need, and the tape, transients and costs follow from that as for
    ``trace_layer(..., input_grad=False)``. Not the same jaxprs as that trace (the forward
    still carries the residuals of ``g[i]``, unread): :mod:`jaxremat.sequence.profile` uses
    it only where the profile it gives was checked equal to the traced one."""
    backward = traced.backward
    outputs = len(backward.jaxpr.outvars)
    backward = _dead_code_removed(backward, [k < num_params for k in range(outputs)])
    whole = traced.pullback

    def pullback(res: Sequence[Any], cotangent: Any) -> Any:
        return (whole(res, cotangent)[0],)

    return _traced_layer(traced.forward, traced.output, traced.residuals, pullback,
                         traced.cotangent, backward, num_x)
