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
* A view is its operand's buffer, not a new value: a ``squeeze``, or a ``reshape``
  (without transposition) that changes only the leading axes, e.g. stacked parameters
  ``(L, ...) -> (L / k, k, ...)``; XLA compiles both to bitcasts of the row-major buffer
  (:func:`jaxremat.measure.liveness.is_view`). Other reshapes count as copies.
* Literals, ``DropVar`` outputs, tokens and ``float0`` values take no memory; a typed PRNG
  key array takes the bytes of its key data (``dtype.itemsize`` is the key data size). An
  output that nothing uses (jax 0.10 prints it as ``_`` too, but it is a ``Var``) is
  allocated by its equation and freed right after it.
* Device memory only: a value in host memory (a residual that an offload policy such as
  ``save_and_offload_only_these_names(..., offload_dst="pinned_host")`` moved off the
  device; its aval prints ``f32<host>[...]``) takes no bytes. The ``device_put`` that
  brings it back in the backward creates an ordinary device value, counted as usual.
* Sub-programs are entered, and a call is measured as if inlined, since XLA inlines calls
  (and remat bodies) before it assigns buffers. For a call (``jit``/``pjit``, ``remat``/
  ``checkpoint``, ``custom_jvp_call``, ``custom_vjp_call``, ``closed_call``, ``core_call``)
  and for each branch of a ``cond``:

  - an operand still used after the call (or an output of the program) stays live
    throughout the call, outside it;
  - an operand whose *last* use is this call is handed to the sub-program ("owned"): the
    sub-walk counts it from its start and frees it right after its last use inside the
    body (at the start if the body never reads it). An operand passed twice (or inputs
    aliasing one buffer) is one buffer, freed after the last use of any of its names.
    Ownership passes down nested calls level by level. A ``cond``'s branch index is not
    passed to the branches: it stays live during the cond;
  - an operand that the body (every branch of a ``cond``) never reads is no use at all:
    after inlining XLA removes it as dead code;
  - a call's output that nothing reads after the call is an ordinary value inside: freed
    after its last use there. The other outputs are live from their equation inside to
    the end (except uncounted program outputs outside, never counted).

  The candidate is ``live before, less the owned operands, + max(inner peak, outputs)``,
  where the inner peak counts what the sub-program creates and its owned operands while
  they live; ``cond`` takes its largest branch. A call thus measures what the same code
  inlined measures (tests/test_meter.py checks this on re-traced, inlined programs), with
  one exception: an output that is one of the call's operands (no new buffer when inlined)
  is counted as a new value when the operand is used after the call (JAX forwards such
  outputs out of ``jit`` when tracing, so this is rare). Sub-programs of other primitives
  (``shard_map``, whose body sees per-shard values, and any primitive not named above)
  keep the conservative rule: all operands stay live until the call returns.
* Loops (``scan``, ``while``) keep that conservative rule too: their constants and
  carries are read by every iteration, and a stacked ``xs`` is read until the last one, so
  no operand can be freed inside the body. The outputs (final carries, stacked ``ys``) are
  allocated before the body runs and the candidate is ``live before + outputs + body
  peak``; the body's new carry is counted beside the old one (double buffering), one
  iteration is measured (every iteration has the same peak) and a slice of ``xs`` is a
  view (not counted). ``while`` takes the larger of its ``cond`` and ``body`` peaks. (XLA
  may reuse a dead initial carry's buffer for the loop state; the model does not, so a
  loop can measure up to one carry more than XLA needs.)

It is a model, not XLA's allocator: XLA fuses element-wise chains (fewer temporaries) and
may reuse or donate buffers, so absolute numbers differ from a device's, but two schedules
of the same model compare the way they would on a GPU, where remat is kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr

from ..budget import format_bytes
from .liveness import KEPT, OUTSIDE, UNCOUNTED, LiveValue, Walker, aval_nbytes

__all__ = [
    "LiveValue", "MemoryReport", "activation_memory", "aval_nbytes", "inputs_read",
    "program_memory",
]


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
    inputs = tuple(OUTSIDE if skip else i for i, skip in enumerate(excluded))
    outputs = ((KEPT if count_outputs else UNCOUNTED),) * len(jaxpr.outvars)
    meter = Walker()
    peak = meter.peak(jaxpr, inputs, outputs)
    if not detail:
        return peak.nbytes
    live = meter.live(jaxpr, inputs, outputs)
    return MemoryReport(peak.nbytes, peak.location, live, len(jaxpr.eqns))


def inputs_read(jaxpr: ClosedJaxpr | Jaxpr) -> tuple[bool, ...]:
    """For each input of ``jaxpr``: whether the program reads it, as the meter counts uses.

    An input is read when an equation takes it as an operand or it is an output, except
    that a call (``jit``, ``remat``, ``custom_jvp_call``, ...) or a ``cond`` whose bodies
    never read an operand does not read it (after inlining, XLA removes it as dead code; a
    ``jnp.where`` backward, say, passes its forward's zeros to a ``jit`` that ignores them).
    Use it to tell which residuals a pullback really needs.
    """
    return Walker().summary(jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr)[0]


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
      params: a pytree of arrays (integer leaves, such as step counters, get ``float0``
        gradients of no size).
      *args: the other arguments (pytrees of arrays).
      detail: return a :class:`MemoryReport` (peak, where, values live) instead of an int.

    Returns:
      The peak in bytes, or a :class:`MemoryReport` when ``detail`` is true.
    """
    closed = jax.make_jaxpr(jax.grad(fn, allow_int=True))(params, *args)  # int leaves: float0
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
