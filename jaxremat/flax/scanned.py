"""Scanned NNX block stacks: ``nnx.vmap``-created blocks run by :func:`jaxremat.remat_scan`.

The idiomatic deep NNX model builds ``L`` blocks at once, their variables stacked on axis 0,
and runs them with ``nnx.scan`` (the Flax guide's "scan over layers")::

    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
        return Block(dim, rngs=rngs)
    self.blocks = create(rngs)
    ...
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def forward(h, block):
        return block(h)
    h = forward(h, self.blocks)

:func:`jaxremat.flax.remat_blocks` runs such a stack (``h = self.run_blocks(h)``) with
:func:`jaxremat.remat_scan`'s nested-scan plan; this module turns the stack into what
``remat_scan`` takes. The stack is split (``nnx.split(blocks, nnx.Param, ...)``) into its
graph definition -- one block's, the stacked axis is only in the arrays -- its stacked
parameters and its other stacked state (BatchNorm's ``BatchStat``, Dropout's ``RngKey`` and
``RngCount``). The scanned layer is the pure function

    ``((params_i, state_i, i), (h, updates)) -> (block_i(h), updates with row i replaced)``

with ``block_i = nnx.merge(graphdef, params_i, state_i)``: each layer reads its own slice of
the state, as under ``nnx.scan``, and writes the state it leaves (new batch statistics,
advanced RNG counters) into row ``i`` of the stacked ``updates`` it carries; the stack is
updated with them after the scan, as ``nnx.scan`` writes its scanned state back. So

* BatchNorm statistics are updated once per step, by the forward pass (a recomputation in
  the backward pass recomputes the carried ``updates`` too, but they are not used: the
  backward only needs the activations), and equal the plain ``nnx.scan`` model's;
* Dropout uses layer ``i``'s own key and counter (split per layer by ``nnx.split_rngs`` at
  creation): the masks equal the plain scan's, and the recomputation replays them;
* the updates are cut from the gradient (``lax.stop_gradient``): a step differentiates the
  parameters only (``nnx.grad``'s default), as the plain model does.

PRNG keys travel as their key data (``uint32``) and are wrapped again inside the layer. What
the carried ``updates`` cost is measured with everything else: every ``remat_scan`` plan is
measured by :func:`jaxremat.activation_memory` before it is used (at most ``L`` times one
block's non-parameter state per stored checkpoint: a BatchNorm's two statistics of
``width`` floats and 12 bytes per Dropout stream, per layer; 0.03-0.4% of the measured step
on tests/test_flax_scanned.py's model).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ..budget import check_budget
from ..lru import LRU
from ..scan.members import UNROLL
from ..scan.remat import RematScan, ScanPlan, remat_scan
from ..trace_state import vmap_batch_size
from ..trees import abstractify, signature
from .nnx import call_with_convention, shared_function

__all__ = ["ScannedPlan", "is_scanned_stack", "plan_scanned", "run_scanned"]

_SCANS = LRU(128)
"""One :class:`RematScan` per block definition, settings (and plan budget): bounded, locked."""


def is_scanned_stack(blocks: Any) -> bool:
    """Whether ``blocks`` is one module holding a stack (not a list of modules)."""
    return isinstance(blocks, nnx.Module) and not isinstance(blocks, (nnx.List, nnx.Sequential))


@dataclasses.dataclass(frozen=True)
class ScannedPlan:
    """The plan ``remat_blocks`` runs a scanned stack with: :func:`jaxremat.remat_scan`'s
    :class:`jaxremat.scan.remat.ScanPlan` and, for ``scope="model"``, what the whole step
    measured (:class:`jaxremat.flax.model_scope.ScopeNote`).

    Attributes:
      scan: the nested-scan plan (members, predicted and measured peaks, gap to Rotor).
      scope: the budget's scope note, or ``None``.
    """

    scan: ScanPlan
    scope: Any = None

    budget = property(lambda self: self.scan.budget, doc="Bytes, for the whole batch.")
    method = property(lambda self: self.scan.method, doc="remat_scan's method.")
    chain = property(lambda self: self.scan.chain, doc="The homogeneous chain.")
    schedule = property(lambda self: self.scan.schedule,
                        doc="The member's plan on the unrolled chain.")
    predicted_time = property(lambda self: self.scan.predicted_time,
                              doc="Predicted forward + backward time.")
    predicted_peak = property(lambda self: self.scan.predicted_peak, doc="Predicted peak bytes.")
    measured_peak = property(lambda self: self.scan.measured_peak,
                             doc="activation_memory of the blocks' program (bytes).")

    @property
    def no_remat_peak(self) -> float:
        """Predicted peak of the plain scan (every tape stored), loop margin included."""
        return self.scan.no_remat_peak

    def report(self) -> str:
        """remat_scan's report, with the scope's lines."""
        lines = self.scan.report().splitlines()
        if self.scope is not None:
            lines[1:1] = self.scope.lines()
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


@dataclasses.dataclass(frozen=True)
class _Stack:
    """A scanned stack split for :func:`remat_scan`: the stacked parameters, the other
    stacked state with keys as key data, the key implementations (one per state leaf,
    ``None`` for plain arrays), the number of layers and the block's class name."""

    graphdef: Any
    params: Any
    state: Any
    impls: tuple
    length: int
    kind: str


def _stack_length(blocks: nnx.Module, owner: str) -> int:
    """The common leading axis of the stack's arrays, or an error naming the leaves that
    disagree."""
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(blocks))[0]
    if not leaves:
        raise ValueError(f"{owner} holds no arrays: a scanned stack (nnx.vmap over a block) has "
                         f"its variables stacked on axis 0.")
    named = [(owner + _dotted(path), jnp.shape(leaf)) for path, leaf in leaves]
    first, first_shape = named[0]
    axis = lambda shape: f"L = {shape[0]}" if shape else "no axis 0"
    for name, shape in named:
        if not shape or not first_shape or shape[0] != first_shape[0]:
            raise ValueError(
                f"{owner} is not a scanned stack: its variables must all stack the L blocks on "
                f"axis 0 (nnx.vmap over the block's constructor), but {first} has "
                f"{axis(first_shape)} (shape {tuple(first_shape)}) and {name} has "
                f"{axis(shape)} (shape {tuple(shape)}). Stack every variable, or give the "
                f"blocks as a list (nnx.List) for remat_blocks.")
    return int(first_shape[0])


def _dotted(path: tuple) -> str:
    names = [getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path]
    return "".join(f".{n}" for n in names if n != "value")


def _is_key(leaf: Any) -> bool:
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impls(state: Any) -> tuple:
    return tuple(jax.random.key_impl(leaf) if _is_key(leaf) else None
                 for leaf in jax.tree.leaves(state))


def _as_data(state: Any) -> Any:
    """``state`` with PRNG keys replaced by their key data (``uint32`` arrays)."""
    return jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, state)


def _as_keys(state: Any, impls: tuple) -> Any:
    """The inverse of :func:`_as_data`."""
    leaves, treedef = jax.tree.flatten(state)
    return jax.tree.unflatten(treedef, [leaf if impl is None else
                                        jax.random.wrap_key_data(leaf, impl=impl)
                                        for leaf, impl in zip(leaves, impls)])


def split_stack(blocks: nnx.Module, owner: str) -> _Stack:
    """The stack as :func:`remat_scan` takes it (module docstring)."""
    length = _stack_length(blocks, owner)
    graphdef, params, state = nnx.split(blocks, nnx.Param, ...)
    return _Stack(graphdef, params, _as_data(state), _key_impls(state), length,
                  type(blocks).__name__)


def _scanned_layer(graphdef: Any, impls: tuple, layer_params: tuple, carry: tuple) -> tuple:
    """One block of the stack as ``remat_scan``'s layer (module docstring)."""
    params, state, index = layer_params
    h, updates = carry
    block = nnx.merge(graphdef, params, _as_keys(state, impls))
    out = call_with_convention(block, h)
    _, _, left = nnx.split(block, nnx.Param, ...)
    left = jax.lax.stop_gradient(_as_data(left))
    updates = jax.tree.map(
        lambda rows, row: jax.lax.dynamic_update_index_in_dim(rows, row.astype(rows.dtype),
                                                              index, 0), updates, left)
    return out, updates


def _remember(key: tuple, scan: RematScan) -> RematScan:
    _SCANS.put(key, scan)
    return scan


def _remat_scan(stack: _Stack, budget: Any, method: str, costs: str, policies: Any,
                inputs: tuple) -> RematScan:
    """One :class:`RematScan` per block definition and settings (its plans are cached per
    input signature). A budget in bytes that a plan for these ``inputs`` resolved to (a
    share such as ``"50%"``, or the whole-step fit's) finds the ``RematScan`` that made the
    plan: the same choice, not planned and measured again."""
    key = (stack.graphdef, stack.impls, budget, method, costs, policies)
    scan = _SCANS.get(key + (inputs,)) or _SCANS.get(key)
    if scan is None:
        layer = shared_function(("scanned", stack.graphdef, stack.impls), lambda: functools.partial(
            _scanned_layer, stack.graphdef, stack.impls))  # one profile per block definition
        # runs of <= 2 blocks unrolled, not remat_scan's "auto": an NNX block's jaxpr counts
        # its RNG and state updates (80 equations for tests/test_flax_scanned.py's), and its
        # whole step measured 0.78x unrolled (benchmarks/RESULTS.md, branch unrollfit)
        scan = _remember(key, remat_scan(layer, budget, method=method, costs=costs,
                                           policies=policies, unroll=UNROLL))
    return scan


def _read_as_stack(stack: _Stack, owner: str) -> str:
    return (f"{owner} is one {stack.kind}, not a list of modules, so remat_blocks reads it as a "
            f"scanned stack of {stack.length} blocks (built with nnx.vmap, variables stacked on "
            f"axis 0)")


def _check_carried(stack: _Stack, h: Any, owner: str) -> None:
    """Raise, naming the fix, unless a block maps ``h`` to the same structure, shapes and
    dtypes (``nnx.scan`` carries it from block to block)."""
    one = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(jnp.shape(leaf)[1:], leaf.dtype),
                       (stack.params, stack.state))
    try:
        out = jax.eval_shape(
            lambda p, s, x: call_with_convention(nnx.merge(stack.graphdef, p,
                                                           _as_keys(s, stack.impls)), x),
            *one, h)
    except Exception as error:
        raise TypeError(
            f"{_read_as_stack(stack, owner)}; but one block, its variables sliced on axis 0, "
            f"does not run on the input: {type(error).__name__}: {error}. If it is one block "
            f"and not a stack, give the blocks as a list (nnx.List) of modules.") from error
    shapes = lambda tree: [(a.shape, a.dtype) for a in jax.tree.leaves(tree)]
    if jax.tree.structure(out) != jax.tree.structure(h) or shapes(out) != shapes(h):
        describe = lambda tree: str(jax.tree.map(lambda a: f"{a.dtype}{list(a.shape)}", tree))
        raise ValueError(
            f"{_read_as_stack(stack, owner)}, whose blocks must map the carried activation to "
            f"one of the same structure, shapes and dtypes, but a block maps {describe(h)} to "
            f"{describe(out)}. For blocks that change shapes build them as a list "
            f"(nnx.List([Block(...) for _ in range(L)])) and run it with "
            f"jaxremat.flax.remat_blocks, or use jaxremat.remat_sequence.")


def _inputs(stack: _Stack, args: tuple, owner: str) -> tuple[tuple, tuple]:
    if not args:
        raise TypeError(f"run the scanned stack {owner} on its input: run_blocks(h).")
    h = args[0] if len(args) == 1 else tuple(args)
    _check_carried(stack, jax.eval_shape(lambda t: t, h), owner)
    stacked = (stack.params, stack.state, jnp.arange(stack.length, dtype=jnp.int32))
    return stacked, (h, stack.state)


def _signature(stacked: tuple, carry: tuple) -> tuple:
    """What a plan depends on besides the settings: shapes, dtypes and the vmap batch."""
    return (signature(abstractify((stacked, carry), "the scanned stack and its input")),
            vmap_batch_size((stacked, carry)))


def plan_scanned(blocks: nnx.Module, *args: Any, budget: Any, method: str = "rotor",
                 costs: str = "static", policies: Any = None, owner: str = "blocks"
                 ) -> ScannedPlan:
    """The :class:`ScannedPlan` for running the scanned stack ``blocks`` on ``args``.

    Raises ``solver.InfeasibleBudget`` (naming the least budget of the nested-scan family)
    and ``ValueError`` for a stack whose arrays disagree on ``L`` or whose block changes
    the carried activation's shape."""
    check_budget(budget)
    stack = split_stack(blocks, owner)
    stacked, carry = _inputs(stack, args, owner)
    inputs = _signature(stacked, carry)
    scan = _remat_scan(stack, budget, method, costs, policies, inputs)
    plan = scan.plan(stacked, carry)
    _remember((stack.graphdef, stack.impls, plan.budget, method, costs, policies, inputs), scan)
    return ScannedPlan(plan)


def run_scanned(blocks: nnx.Module, *args: Any, budget: Any, method: str = "rotor",
                costs: str = "static", policies: Any = None, owner: str = "blocks") -> Any:
    """Run the scanned stack ``blocks`` on ``args`` with :func:`jaxremat.remat_scan`'s
    plan; outputs, gradients and the stack's state updates equal ``nnx.scan``'s."""
    check_budget(budget)
    stack = split_stack(blocks, owner)
    stacked, carry = _inputs(stack, args, owner)
    scan = _remat_scan(stack, budget, method, costs, policies, _signature(stacked, carry))
    out, updates = scan(stacked, carry)
    nnx.update(blocks, _as_keys(updates, stack.impls))
    return out
