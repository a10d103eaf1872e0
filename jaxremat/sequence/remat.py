"""``remat_sequence``: a layer sequence that rematerializes optimally under a memory budget.

``seq = remat_sequence(layers, budget)`` returns a callable ``seq(params, x)`` equal to
running ``layers[i](params[i], x)`` in order. The first time it is traced for an input
signature (pytree structures, shapes and dtypes of ``params`` and ``x``) it profiles the
layers into a ``solver.Chain`` (:mod:`jaxremat.sequence.profile`), solves for the fastest schedule
whose peak fits the budget (``solver.solve``), caches the result, and applies it
(:mod:`jaxremat.sequence.apply`). Later calls with the same signature reuse the cached plan.

What the budget bounds (the chain's model, ALGORITHMS.md section 1): everything live while
the sequence runs forward and backward, except the parameters and their gradients -- the
input ``x`` (``x_size[0]``), the stored activations and tapes, the gradients flowing back,
and the layers' transients. It does not include what the loss function after the sequence
needs beyond the gradient of the sequence's output, nor memory outside the sequence.

``jax.vmap``: when the sequence is traced directly under ``jax.vmap`` (``vmap(seq)``,
``vmap(grad(loss))``, ``jit(vmap(...))``...), the layers are traced per example, and the
batch size is read from the batched inputs. Activation memory grows linearly with the batch,
so the schedule is solved on the per-example chain with ``budget / batch``, and the budget
keeps meaning the whole batch. When a ``jax.jit`` boundary sits between the ``vmap`` and the
sequence (``vmap(jit(f))``), JAX traces ``f`` per example before batching and the batch
cannot be seen: the budget then bounds *one example*; pass ``budget / batch`` yourself.
Under a ``jax.vmap`` the sequence sees, the searched options (``"searched"``,
``"dots_plus"``) are left off the menu (``profile_sequence(vmapped=True)``; the plan says
so). Under ``vmap(jit(f))`` that cannot be seen either: pass a menu without them
(``policies=("dots", "dots_no_batch", "names")``).

Whether ``x`` is being differentiated is also read at trace time (``jax.grad`` with respect
to the parameters only does not compute the gradient of the sequence's input, so the first
layer's backward is cheaper); it is part of the cache key. Inside a user's own
``jax.checkpoint`` around the sequence this cannot be seen and the input is taken as not
differentiated.

Sharding: shapes are the global (logical) shapes JAX traces with, so the budget bounds the
global arrays. For data parallelism over ``n`` devices pass ``n`` times the per-device
budget. The sharding is not part of the cache key.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Sequence

import solver

from .apply import BACKENDS, apply_plan
from ..budget import check_budget
from ..lru import LRU
from .plan import Plan, check_settings, solve_plan
from .policies import check_policies
from .profile import profile_sequence
from ..trace_state import is_differentiated, vmap_batch_size
from ..trees import abstractify, check_layers, check_params, leaf_shapes, signature

__all__ = ["METHODS", "RematSequence", "remat_sequence"]

METHODS = solver.METHODS

PLAN_CACHE_SIZE = 64
"""Plans a :class:`RematSequence` keeps (least recently used first out)."""


class RematSequence:
    """A sequence of layers applied with an optimal rematerialization schedule.

    Create it with :func:`remat_sequence`. ``seq(params, x)`` runs the layers; ``seq.plan(
    params, x)`` returns the :class:`jaxremat.Plan` that call uses. ``profile_count`` counts
    how many times layers were profiled (once per new input signature).

    Plans are cached per input signature in a bounded LRU (:data:`PLAN_CACHE_SIZE`); making
    a missing plan holds a lock, so threads calling with the same shapes profile and solve
    once. Layer profiles are also cached across sequences (:func:`jaxremat.sequence.profile.
    profile_cache`): the same layers in a new sequence, or identical blocks, are profiled once.
    """

    def __init__(
        self,
        layers: Sequence[Callable],
        budget: int | float | str,
        *,
        method: str = "rotor",
        backend: str = "checkpoint",
        costs: str = "static",
        slots: int = 500,
        policies: Any = None,
    ) -> None:
        self._layers = check_layers(layers)
        self._policies = check_policies(policies)
        self._budget = check_budget(budget)
        check_settings(method, costs, slots)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
        self._method, self._backend, self._costs, self._slots = method, backend, costs, slots
        self._cache = LRU(PLAN_CACHE_SIZE)
        self._lock = threading.RLock()  # reentrant: a layer may itself run a RematSequence
        self.profile_count = 0

    layers = property(lambda self: self._layers, doc="The layer functions.")
    budget = property(lambda self: self._budget,
                      doc="The budget: bytes, or a share of the no-remat memory such as '40%'.")
    method = property(lambda self: self._method, doc="The solver method.")
    backend = property(lambda self: self._backend, doc="How checkpoints are applied.")
    costs = property(lambda self: self._costs, doc="How layer costs are obtained.")
    slots = property(lambda self: self._slots, doc="Memory discretisation of the solver.")
    policies = property(lambda self: self._policies,
                        doc="The menu of checkpoint policies (jaxremat.sequence.policies).")

    def __len__(self) -> int:
        return len(self._layers)

    def __repr__(self) -> str:
        return (
            f"RematSequence({len(self._layers)} layers, budget={self._budget}, "
            f"method={self._method!r}, backend={self._backend!r}, costs={self._costs!r})"
        )

    def _plan(self, params: tuple, x: Any) -> Plan:
        batch = vmap_batch_size((params, x))  # an ensemble batches the params only
        input_grad = is_differentiated(x)
        abstract_params = [abstractify(p, f"params[{i}]") for i, p in enumerate(params)]
        abstract_x = abstractify(x, "the sequence input x")
        key = (signature(abstract_params), signature(abstract_x), batch, input_grad)
        plan = self._cache.get(key)
        if plan is not None:
            return plan
        with self._lock:
            plan = self._cache.get(key)  # another thread may have made it meanwhile
            if plan is None:
                plan = self._solve(key, abstract_params, abstract_x, batch, input_grad)
        return plan

    def _solve(self, key: tuple, abstract_params: list, abstract_x: Any, batch: int,
               input_grad: bool) -> Plan:
        profile = profile_sequence(self._layers, abstract_params, abstract_x, costs=self._costs,
                                   input_grad=input_grad, policies=self._policies,
                                   vmapped=batch > 1)
        self.profile_count += 1
        plan = solve_plan(profile, self._budget, method=self._method, slots=self._slots,
                          backend=self._backend, batch_size=batch, input_grad=input_grad,
                          input_shapes=leaf_shapes(abstract_x))
        self._cache.put(key, plan)
        return plan

    def plan(self, params: Sequence[Any], x: Any) -> Plan:
        """The :class:`jaxremat.Plan` used for inputs like ``params`` and ``x`` (cached).

        Called outside any transformation, ``x`` counts as not differentiated (as under
        ``jax.grad`` with respect to the parameters); call it inside ``jax.vmap`` or on
        differentiated inputs to see the plan of those contexts.
        """
        return self._plan(check_params(params, len(self._layers)), x)

    def __call__(self, params: Sequence[Any], x: Any) -> Any:
        """Run the layers on ``x``; the result and its gradients equal the plain sequence's.

        Raises:
          solver.InfeasibleBudget: no schedule of the method fits the budget; the message
            gives the smallest budget that does, in bytes and binary units.
          ValueError / TypeError: ``params`` does not have one entry per layer, a leaf is
            not an array, or a layer cannot be traced on its input (the layer is named).
        """
        params = check_params(params, len(self._layers))
        plan = self._plan(params, x)
        backend = self._backend
        if backend == "custom_vjp" and vmap_batch_size(x) > 1:
            warnings.warn(
                "backend='custom_vjp' under jax.vmap: JAX batches a custom_vjp's backward whole, "
                "so each segment would hold per-example parameter gradients (batch x the "
                "parameters) that the plan does not count; this call uses backend='checkpoint'.",
                UserWarning, stacklevel=2,
            )
            backend = "checkpoint"
        return apply_plan(plan.schedule.plan, self._layers, params, x, backend=backend,
                          policies=plan.policies)

    @property
    def cached_plans(self) -> tuple[Plan, ...]:
        """The plans solved so far, one per input signature seen."""
        return self._cache.values()

    def cache_clear(self) -> None:
        """Forget the cached plans (the next call profiles and solves again)."""
        self._cache.clear()


def remat_sequence(
    layers: Sequence[Callable],
    budget: int | float | str,
    *,
    method: str = "rotor",
    backend: str = "checkpoint",
    costs: str = "static",
    slots: int = 500,
    policies: Any = None,
) -> RematSequence:
    """A callable running ``layers`` under an activation-memory ``budget`` (module docstring).

    Args:
      layers: pure functions ``layers[i](params_i, x) -> y``; activations and parameters are
        arbitrary pytrees of arrays, and each layer's output feeds the next.
      budget: bytes (int), a string such as ``"512MiB"`` (:func:`jaxremat.parse_budget`), or
        a share of the memory the sequence needs without remat, such as ``"40%"``: the bound on input, activations, tapes, gradients and transients of the sequence's
        forward and backward passes, parameters and their gradients excluded.
      method: ``"rotor"`` (optimal persistent schedule, Rotor's dynamic program), or a
        baseline: ``"none"`` (store everything), ``"every_layer"`` (checkpoint each layer),
        ``"sqrt"`` (Chen's sqrt(L) segments), ``"revolve"`` (binomial checkpointing), or
        ``"uniform:<policy>"`` (every layer under one policy of the menu, e.g.
        ``"uniform:dots"``: what ``jax.checkpoint(layer, policy=dots_saveable)`` on every
        layer does, for comparison).
      backend: ``"checkpoint"`` (nested ``jax.checkpoint``) or ``"custom_vjp"``
        (:mod:`jaxremat.sequence.apply`).
      costs: ``"static"`` (roofline from ``cost_analysis``), ``"flops"`` (its flop term
        alone: the least recomputed flops) or ``"measured"`` (timed on the device);
        :mod:`jaxremat.sequence.profile`.
      slots: memory discretisation of the dynamic program at 200 layers; shorter chains get
        finer units for the same work (:func:`solver.scaled_slots`, at most 20000 slots).
      policies: the ``jax.checkpoint`` policies a layer may also be saved with, each an
        option between keeping its whole tape and keeping only its input
        (:mod:`jaxremat.sequence.policies`): ``None`` for the default menu (``"dots"``,
        ``"dots_no_batch"``, and ``"names"``: ``save_only_these_names`` for the names a
        layer marks with ``jax.ad_checkpoint.checkpoint_name``), a sequence of those names
        and callable policies, or ``()`` for the whole tape only. The plan chooses per
        layer and applies the choice as ``jax.checkpoint(layer, policy=...)``. Off the
        default menu, ``"offload_dots_no_batch"`` and ``"offload_names"`` keep residuals
        in host memory where the device has it (:mod:`jaxremat.measure.offload`).

    Returns:
      A :class:`RematSequence`; call it as ``seq(params, x)`` with one parameter pytree per
      layer, under ``jax.jit``, ``jax.grad``, ``jax.vmap`` as usual.

    Raises:
      ValueError / TypeError: non-callable layers, a bad budget (zero, negative, NaN,
        unparsable), or an unknown method, backend, costs or policy name.
    """
    return RematSequence(layers, budget, method=method, backend=backend, costs=costs, slots=slots,
                         policies=policies)
