"""Program-order memory of an NNX module's training step.

:func:`jaxremat.activation_memory` measures a pure function ``fn(params, *args)``. An NNX
model is not one: its state lives in ``nnx.Variable`` objects, and BatchNorm (running
statistics) and Dropout (RNG counters) write to them during the step. The obvious route --
``nnx.merge`` the model inside the loss from state captured outside -- fails once the loss
writes: ``TraceContextError: Cannot mutate BatchStat from a different trace level`` (the
merged Variables belong to the trace that built them, not to ``jax.grad``'s).

:func:`activation_memory` does what a hand-written pure step does: split the model outside
the trace (``nnx.split(model, nnx.Param, ...)``: parameters and the rest of the state,
batch statistics and RNG keys and counters), hand the state's *arrays* to a pure function
of ``(params, rest, *batch)``, and build fresh Variables from them inside it, at the trace
level of the gradient, before calling ``loss_fn(model, *batch)``. The updated state is
discarded: the model passed in is not changed. The gradient is taken with respect to the
parameters, as ``nnx.value_and_grad`` (``wrt=nnx.Param``) does, so what is measured is the
same quantity as :func:`jaxremat.activation_memory`: everything live in the training step
except the parameters and their gradients (the batch, activations, BatchNorm statistics,
Dropout masks and keys, gradients flowing back), in program order.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

from ..measure.meter import MemoryReport
from ..measure.meter import activation_memory as _activation_memory

__all__ = ["activation_memory", "pure_step"]


def _abstract(leaf: Any) -> Any:
    """Shapes and dtypes only, so that a model inside another trace can be measured."""
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype)
    return leaf


def pure_step(
    model: nnx.Module, loss_fn: Callable[..., Any], *, wrt: Any = nnx.Param, has_aux: bool = False
) -> tuple[Callable[..., Any], list, list]:
    """The training step of ``model`` as a pure function, and the arrays to call it on.

    Returns ``(step, params, rest)``: ``step(params, rest, *batch)`` merges a fresh copy of
    the model from the two lists of arrays (its ``wrt`` state and the rest) and returns
    ``loss_fn(model, *batch)`` (its first element when ``has_aux``). ``model`` itself is
    never written to.
    """
    graphdef, params, rest = nnx.split(model, wrt, ...)
    param_leaves, param_tree = jax.tree.flatten(params)
    rest_leaves, rest_tree = jax.tree.flatten(rest)

    def step(param_leaves: list, rest_leaves: list, *batch: Any) -> Any:
        # Variables built here belong to this trace level, so the step may write to them.
        fresh = nnx.merge(graphdef, jax.tree.unflatten(param_tree, param_leaves),
                          jax.tree.unflatten(rest_tree, rest_leaves))
        loss = loss_fn(fresh, *batch)
        return loss[0] if has_aux else loss

    return step, param_leaves, rest_leaves


def activation_memory(
    model: nnx.Module,
    loss_fn: Callable[..., Any],
    *batch: Any,
    wrt: Any = nnx.Param,
    has_aux: bool = False,
    detail: bool = False,
) -> int | MemoryReport:
    """Peak bytes live in program order while ``nnx.grad(loss_fn)(model, *batch)`` runs,
    except the parameters and their gradients (module docstring).

    Args:
      model: an NNX module; BatchNorm, Dropout and any other state are handled. It is not
        modified (the step's state updates are discarded). It may hold tracers (a call
        inside ``nnx.jit``): only shapes and dtypes are used.
      loss_fn: ``loss_fn(model, *batch)`` returning a scalar, or ``(scalar, aux)`` with
        ``has_aux=True`` -- what you pass to ``nnx.value_and_grad``.
      *batch: the batch (arrays or pytrees of arrays, or their ``jax.ShapeDtypeStruct``).
      wrt: the state differentiated (an ``nnx`` filter; ``nnx.Param`` as
        ``nnx.value_and_grad`` uses by default).
      has_aux: whether ``loss_fn`` returns ``(loss, aux)``.
      detail: return a :class:`jaxremat.measure.meter.MemoryReport` instead of the peak.

    Returns:
      The peak in bytes (:func:`jaxremat.activation_memory` of the equivalent pure step), or
      the report when ``detail`` is true.
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(
            f"activation_memory(model, loss_fn, *batch) measures an nnx.Module, got "
            f"{type(model).__name__}; for a pure function use jaxremat.activation_memory(fn, "
            "params, *args)."
        )
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable as loss_fn(model, *batch), got {loss_fn!r}.")
    step, params, rest = pure_step(model, loss_fn, wrt=wrt, has_aux=has_aux)
    abstract = lambda tree: jax.tree.map(_abstract, tree)  # noqa: E731
    return _activation_memory(step, abstract(params), abstract(rest), *abstract(batch),
                              detail=detail)
