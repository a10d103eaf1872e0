"""Programs traced once with a symbolic batch size, made concrete at each size (issue 18.4).

Re-planning a layer at a new batch size traced its vjp again under every checkpoint policy
of its menu: JAX's linearization and transposition, 30-50 ms a policy on a GPT-2 block,
two thirds of a re-plan. The programs differ between batch sizes only in their shapes, so
this module traces them once with the input's leading axis a symbolic dimension (JAX's
shape polymorphism, ``jax.export.symbolic_shape``, the machinery of ``jax.export``), and
axis 1 of inputs of rank 3 or more (a sequence) another where the caller asks, and
substitutes each later size into the traced jaxprs (:func:`instantiate`: every
aval's shape and every shape parameter, such as ``reshape``'s ``new_sizes``, in nested
jaxprs too): about 4 ms a policy instead of a trace.

Exactness is checked, not assumed: :func:`same_program` compares two jaxprs equation by
equation (primitives, the dataflow between them, shapes and dtypes, parameters), and
:mod:`jaxremat.sequence.polymorphic` uses a symbolic trace only where, at the shape traced
concretely, its instantiation equals the concrete trace, and at each later shape only where
the layer's plain forward, traced concretely as before, equals the symbolic one's
instantiation (a layer's Python may branch on a shape). The symbols are at least 2: at a batch
of one JAX lays programs out differently (``jnp.einsum`` squeezes the axis, a transpose sums
over broadcast unit axes), so a batch of one is always traced.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import numpy as np
from jax import export
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from ..jax_compat import close_jaxpr, new_var

__all__ = ["SEQUENCE", "SYMBOL", "SymbolicInput", "instantiate", "instantiate_tree",
           "same_program", "shape_env", "symbolic_input"]

SYMBOL = "b"
"""The name of the symbolic batch size (the leading axis)."""
SEQUENCE = "t"
"""The name of the symbolic sequence length (axis 1 of inputs of rank 3 or more)."""
_SIZES = "sizes"  # instantiate's memo: the _Sizes of its env (its other keys are ids)


@dataclasses.dataclass(frozen=True)
class SymbolicInput:
    """An input pytree of ``ShapeDtypeStruct`` leaves with some axes symbolic: ``symbols``
    gives, per leaf and axis, the symbol's name or ``None`` (a leaf's axis given a symbol
    had the size every other axis given it had)."""

    x: Any
    symbols: tuple[tuple[str | None, ...], ...]
    shapes: tuple[tuple[int, ...], ...]  # the concrete shapes it was made from


def _common(leaves: list, axis: int, rank: int) -> int | None:
    """The size of ``axis`` of the first leaf of at least ``rank`` axes, if at least 2."""
    sizes = [leaf.shape[axis] for leaf in leaves if len(leaf.shape) >= rank]
    return sizes[0] if sizes and sizes[0] >= 2 else None


def symbolic_input(x: Any, sequence: bool = False) -> SymbolicInput | None:
    """``x`` (``ShapeDtypeStruct`` leaves) with the leading axis of each leaf whose leading
    size is the first leaf's made the symbol :data:`SYMBOL` (``>= 2``) and, with
    ``sequence``, axis 1 of each leaf of rank 3 or more whose size there is the first such
    leaf's made :data:`SEQUENCE` (``>= 2``); ``None`` when no size of 2 or more is found."""
    leaves, treedef = jax.tree.flatten(x)
    wanted = [(SYMBOL, 0, 1, _common(leaves, 0, 1))]
    if sequence:
        wanted.append((SEQUENCE, 1, 3, _common(leaves, 1, 3)))
    wanted = [w for w in wanted if w[3] is not None]
    if not wanted or wanted[0][0] != SYMBOL:
        return None
    names = ", ".join(w[0] for w in wanted)
    dims = export.symbolic_shape(names, constraints=tuple(f"{w[0]} >= 2" for w in wanted))
    found = dict(zip((w[0] for w in wanted), dims))
    symbols, new = [], []
    for leaf in leaves:
        marks = [None] * len(leaf.shape)
        for name, axis, rank, size in wanted:
            if len(leaf.shape) >= rank and leaf.shape[axis] == size:
                marks[axis] = name
        symbols.append(tuple(marks))
        shape = tuple(found[m] if m else d for m, d in zip(marks, leaf.shape))
        new.append(jax.ShapeDtypeStruct(shape, leaf.dtype,
                                        weak_type=getattr(leaf, "weak_type", False))
                   if any(marks) else leaf)
    return SymbolicInput(jax.tree.unflatten(treedef, new), tuple(symbols),
                         tuple(tuple(leaf.shape) for leaf in leaves))


def shape_env(symbolic: SymbolicInput, x: Any) -> dict[str, int] | None:
    """``{symbol: size}`` making ``symbolic`` into ``x``'s shapes, or ``None`` where ``x``
    differs from the shapes it was made from elsewhere than in the symbolic axes, gives one
    symbol two sizes, or one below 2."""
    leaves = jax.tree.leaves(x)
    if len(leaves) != len(symbolic.shapes):
        return None
    env: dict[str, int] = {}
    for leaf, marks, old in zip(leaves, symbolic.symbols, symbolic.shapes):
        shape = tuple(leaf.shape)
        if len(shape) != len(old):
            return None
        for mark, new, was in zip(marks, shape, old):
            if mark is None:
                if new != was:
                    return None
            elif env.setdefault(mark, int(new)) != new or new < 2:
                return None
    return env


def _dim(d: Any, env: Mapping[str, int]) -> Any:
    evaluate = getattr(d, "_evaluate", None)  # jax._src.export.shape_poly._DimExpr
    if evaluate is None or isinstance(d, (int, np.integer)):
        return d
    dims = getattr(env, "dims", None)
    if dims is None:
        return int(evaluate(dict(env)))
    found = dims.get(d)
    if found is None:  # an expression's value, once per instantiation
        found = dims[d] = int(evaluate(dict(env)))
    return found


class _Sizes(dict):
    """An environment ``{name: size}`` that remembers each expression's value (``dims``) and
    each aval's instantiation (``avals``)."""

    def __init__(self, env: Mapping[str, int]) -> None:
        super().__init__(env)
        self.dims: dict[Any, int] = {}
        self.avals: dict[Any, Any] = {}


def _shape(shape: Any, env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(_dim(d, env) for d in shape)


def _aval(aval: Any, env: Mapping[str, int]) -> Any:
    shape = getattr(aval, "shape", None)
    if shape is None or not hasattr(aval, "update"):
        return aval
    new = _shape(shape, env)
    return aval if new == tuple(shape) else aval.update(shape=new)


def _param(value: Any, env: Mapping[str, int], memo: dict) -> Any:
    if isinstance(value, ClosedJaxpr):
        return _closed(value, env, memo)
    if isinstance(value, Jaxpr):
        return _jaxpr(value, env, memo)
    if isinstance(value, (tuple, list)):
        new = [_param(v, env, memo) for v in value]
        if all(a is b for a, b in zip(new, value)):
            return value
        if isinstance(value, list):
            return new
        return type(value)(*new) if hasattr(value, "_fields") else tuple(new)
    return _dim(value, env)


def _jaxpr(jaxpr: Jaxpr, env: _Sizes, memo: dict) -> Jaxpr:
    if id(jaxpr) in memo:
        return memo[id(jaxpr)][1]
    names: dict[Any, Any] = {}
    avals = env.avals  # a _Sizes: each distinct aval evaluated once per instantiation

    def var(v: Any) -> Any:
        if isinstance(v, Literal):
            return v
        found = names.get(v)
        if found is None:
            try:
                a = avals.get(v.aval)
                if a is None:
                    a = avals[v.aval] = _aval(v.aval, env)
            except TypeError:  # an unhashable aval
                a = _aval(v.aval, env)
            found = names[v] = new_var(a)
        return found

    constvars = [var(v) for v in jaxpr.constvars]
    invars = [var(v) for v in jaxpr.invars]
    eqns = [eqn.replace(invars=[var(v) for v in eqn.invars],
                        outvars=[var(v) for v in eqn.outvars],
                        params={k: _param(v, env, memo) for k, v in eqn.params.items()})
            for eqn in jaxpr.eqns]
    new = jaxpr.replace(constvars=constvars, invars=invars,
                        outvars=[var(v) for v in jaxpr.outvars], eqns=eqns)
    memo[id(jaxpr)] = (jaxpr, new)  # the original kept alive: its id stays its own
    return new


def _closed(closed: ClosedJaxpr, env: Mapping[str, int], memo: dict) -> ClosedJaxpr:
    return close_jaxpr(_jaxpr(closed.jaxpr, env, memo), closed.consts)


def instantiate(closed: ClosedJaxpr, env: Mapping[str, int], memo: dict | None = None
                ) -> ClosedJaxpr:
    """``closed`` with every symbolic dimension evaluated in ``env`` (``{name: size}``):
    the avals of its variables and every shape in its equations' parameters, nested jaxprs
    included. ``memo`` shares nested jaxprs (and evaluated shapes) between the programs of
    one layer at one ``env``."""
    memo = {} if memo is None else memo
    sizes = memo.get(_SIZES)
    if sizes is None or sizes != env:
        sizes = memo[_SIZES] = _Sizes(env)
    return _closed(closed, sizes, memo)


def instantiate_tree(tree: Any, env: Mapping[str, int]) -> Any:
    """A pytree of ``ShapeDtypeStruct`` leaves with symbolic dimensions evaluated."""
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(_shape(s.shape, env), s.dtype,
                                       weak_type=getattr(s, "weak_type", False)), tree)


_PLAIN = (bool, int, float, complex, str, bytes, type(None), np.dtype, np.generic, np.ndarray)


def _same_array(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()  # NaN too


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (ClosedJaxpr, Jaxpr)):  # closed over its own variables: its own pairs
        return type(a) is type(b) and _same_jaxpr(getattr(a, "jaxpr", a), getattr(b, "jaxpr", b),
                                                  {})
    if isinstance(a, (tuple, list)):
        return (isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(_same_value(x, y) for x, y in zip(a, b)))
    if isinstance(a, (np.ndarray, np.generic)):
        return isinstance(b, (np.ndarray, np.generic)) and _same_array(a, b)
    try:
        if a == b:
            return True
    except Exception:  # noqa: BLE001 - values that do not compare: told apart by type below
        pass
    # Plain data must be equal; anything else of one type is an object a trace makes anew
    # (custom_jvp/custom_vjp thunks, wrapped functions, policies), whose programs are the
    # nested jaxprs compared beside it.
    return type(a) is type(b) and not isinstance(a, _PLAIN)


def _same_var(a: Any, b: Any, pairs: dict) -> bool:
    if isinstance(a, Literal) or isinstance(b, Literal):
        return (isinstance(a, Literal) and isinstance(b, Literal) and a.aval == b.aval
                and _same_array(a.val, b.val))
    if a.aval != b.aval:
        return False
    found = pairs.setdefault(a, b)
    return found is b


def _same_jaxpr(a: Jaxpr, b: Jaxpr, pairs: dict) -> bool:
    if (len(a.eqns) != len(b.eqns) or len(a.invars) != len(b.invars)
            or len(a.constvars) != len(b.constvars) or len(a.outvars) != len(b.outvars)):
        return False
    if not all(_same_var(x, y, pairs) for x, y in zip(a.constvars + a.invars,
                                                     b.constvars + b.invars)):
        return False
    for e, f in zip(a.eqns, b.eqns):
        if (e.primitive is not f.primitive or len(e.invars) != len(f.invars)
                or len(e.outvars) != len(f.outvars) or e.params.keys() != f.params.keys()):
            return False
        if not all(_same_var(x, y, pairs) for x, y in zip(e.invars, f.invars)):
            return False
        if not all(_same_value(e.params[k], f.params[k]) for k in e.params):
            return False
        if not all(_same_var(x, y, pairs) for x, y in zip(e.outvars, f.outvars)):
            return False
    return all(_same_var(x, y, pairs) for x, y in zip(a.outvars, b.outvars))


def same_program(a: ClosedJaxpr, b: ClosedJaxpr) -> bool:
    """Whether two jaxprs are the same program: equal primitives in the same order, the
    same dataflow, equal avals (shape, dtype, weak type) and parameters, nested jaxprs
    compared alike; constants by shape and dtype (their values come from the same code),
    callable parameters (``custom_jvp`` thunks, policies) not compared beyond the jaxprs
    they come with."""
    if [np.shape(c) for c in a.consts] != [np.shape(c) for c in b.consts]:
        return False
    return _same_jaxpr(a.jaxpr, b.jaxpr, {})
