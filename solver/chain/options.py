"""Multi-option layers: several ways to run a layer in "save" mode (Rockmate's extension).

Rotor's chain (:mod:`solver.chain.chain`) gives each layer one "save" mode, ``F_all``, which
keeps the whole tape. Rockmate (Zhao et al., ICML 2023) lets layer ``i`` offer options
``k = 0 .. K_i - 1`` instead, each with its own tape and costs, and the dynamic program
picks, per ``F_all``, the fastest option that fits (ALGORITHMS.md section 2, "Multi-option
layers"). In JAX an option is a ``jax.checkpoint`` policy for the layer (section 8): option
0 saves everything (the chain's own fields), ``dots_saveable`` keeps only matrix products
and recomputes the rest in the backward, and so on.

Each field of :class:`LayerOptions` is an ``(L, K)`` array, ``K`` the most options of any
layer; entry ``[i, k]`` means for ``F_all(i)`` run with option ``k`` what the chain's field
of the same name means for the whole tape:

- ``xbar_size``: bytes ``F_all(i)`` stores, ``x[i+1]`` included (on its own when
  ``output_in_tape[i, k]`` is false), so ``xbar_size[i, k] >= x_size[i+1]``;
- ``fwd_time``, ``fwd_tape_time``: the forward, and the forward that builds only the tape
  (what ``F_all(i)`` costs while ``g[i+1]`` is held), ``fwd_tape_time <= fwd_time``;
- ``bwd_time``, ``bwd_tmp``: the backward, the recomputation the option implies included,
  and its transient bytes (negative down to ``-min(x_size[i], x_size[i+1])``, as the chain's:
  :func:`bwd_tmp_floor`); ``fwd_tmp``: the forward's transient bytes;
- ``output_in_tape``: whether ``B(i)`` reads ``x[i+1]`` under option ``k``;
- ``fwd_tape_tmp`` (optional): what ``F_all(i)`` peaks at beside the stored tape when
  ``g[i+1]`` is held (the base case, the forward that builds only the tape: :func:`base_forward_tmp`);
- ``x_read_size`` (optional, default the chain's ``x_read_size`` for every option): the
  bytes of ``x[i]`` that ``B(i)`` reads under option ``k`` (a policy that recomputes from
  the input reads all of it); ``F_all(i)`` with option ``k`` frees the rest
  (:class:`~solver.chain.chain.Chain`);
- ``x_own_read_size`` (optional, default the option's ``x_read_size``, column 0 the
  chain's ``x_own_read_size``): what ``B(i)`` alone reads under option ``k``, kept of a copy
  of ``x[i]`` stored on its own (``Chain.x_own_read_size``);
- ``valid``: which entries exist (``valid[:, 0]`` is all true); absent entries are stored
  as zeros (``output_in_tape`` true) and never read;
- ``names``: per layer, ``K`` names (``""`` where absent), ``names[i][0] == "everything"``
  by default.

Column 0 is the chain's own fields; :class:`~solver.chain.chain.Chain` checks it. ``F_ck``
and ``F_none`` run the layer without a tape and cost the chain's fields (column 0); their
transient is the chain's ``fwd_ck_tmp`` (``Chain.ck_tmp``), which has no per-option
counterpart: the plain forward they run does not depend on the save policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from ..errors import float_array

__all__ = ["LayerOptions", "LayerCosts", "layer_costs", "option_index", "base_forward_tmp",
           "full_forward_tmp", "bwd_tmp_floor", "check_bwd_tmp", "MAX_OPTIONS", "SIGNED_FIELDS"]

MAX_OPTIONS = 256  # options per layer; the simulator packs a tape's option in 8 bits

FLOAT_FIELDS = ("xbar_size", "fwd_time", "fwd_tape_time", "bwd_time", "fwd_tmp", "bwd_tmp")
_OPTIONAL = {"fwd_time", "fwd_tape_time", "fwd_tmp", "bwd_tmp", "output_in_tape", "name",
             "x_read_size", "fwd_tape_tmp", "x_own_read_size"}
_KEYS = set(FLOAT_FIELDS) | _OPTIONAL

SIGNED_FIELDS = frozenset({"bwd_tmp"})
"""The fields that may be negative, down to their own floor (:func:`bwd_tmp_floor`)."""


def bwd_tmp_floor(x_size: np.ndarray) -> np.ndarray:
    """``(L,)``: the least ``bwd_tmp[i]`` a chain takes, ``-min(x_size[i], x_size[i+1])``.

    ``B(i)``'s peak is what it holds once ``g[i]`` is stored plus ``bwd_tmp[i]``; a backward
    that frees its input or ``g[i+1]`` before ``g[i]`` is whole peaks lower, but never below
    what it holds as it starts (without ``g[i]``: ``bwd_tmp >= -x_size[i]``) or as it ends
    (without ``g[i+1]``). With this floor every op's peak is at least the states before and
    after it, which the simulator and Rotor's DP rely on (only op peaks are checked)."""
    x = np.asarray(x_size, dtype=np.float64)
    return -np.minimum(x[:-1], x[1:])


def check_bwd_tmp(bwd_tmp: np.ndarray, x_size: np.ndarray, where: str) -> None:
    """Raise ``ValueError`` where ``bwd_tmp`` (``(L,)`` or ``(L, K)``, absent options as 0)
    is below :func:`bwd_tmp_floor`; ``where`` names the field (``"Chain.bwd_tmp"``)."""
    floor = bwd_tmp_floor(x_size)
    values = bwd_tmp if bwd_tmp.ndim == 2 else bwd_tmp[:, None]
    low = np.argwhere(values < floor[:, None])
    if low.size:
        i, k = (int(v) for v in low[0])
        at = f"[{i}]" if bwd_tmp.ndim == 1 else f"[{i}, {k}]"
        raise ValueError(
            f"{where}{at} = {float(values[i, k])!r} is below -min(x_size[{i}], x_size[{i + 1}]) = "
            f"{float(floor[i])!r}: a backward peaks at least at what it holds as it starts or "
            f"ends; pass at least that bound."
        )


class ChainFields(Protocol):
    """What the options table reads of a chain (:class:`solver.chain.chain.Chain` has it;
    a protocol, so that this module does not import the chain that holds the table)."""

    length: int
    xbar_size: np.ndarray
    fwd_time: np.ndarray
    fwd_tape_time: np.ndarray
    bwd_time: np.ndarray
    fwd_tmp: np.ndarray
    bwd_tmp: np.ndarray
    output_in_tape: np.ndarray
    x_read_size: np.ndarray
    fwd_tape_tmp: np.ndarray | None
    x_own_read_size: np.ndarray | None


def _matrix(name: str, values: Any, shape: tuple[int, int], valid: np.ndarray) -> np.ndarray:
    array = float_array(values, f"LayerOptions.{name}")
    if array.shape != shape:
        raise ValueError(
            f"LayerOptions.{name} must have shape {shape} (layers, options), got {array.shape}."
        )
    array = np.where(valid, array, 0.0)
    signed = name in SIGNED_FIELDS  # its floor is checked against the chain's sizes
    bad = np.argwhere(~np.isfinite(array) | ((array < 0) & (not signed)))
    if bad.size:
        i, k = (int(v) for v in bad[0])
        raise ValueError(
            f"LayerOptions.{name}[{i}, {k}] = {float(array[i, k])!r}: sizes and times must be finite "
            "and non-negative."
        )
    array.setflags(write=False)
    return array


def _flags(name: str, values: Any, shape: tuple[int, int]) -> np.ndarray:
    raw = np.asarray(values)
    if raw.shape != shape:
        raise ValueError(
            f"LayerOptions.{name} must have shape {shape} (layers, options), got {raw.shape}."
        )
    if raw.dtype != bool and not np.all((raw == 0) | (raw == 1)):
        raise ValueError(f"LayerOptions.{name} must hold booleans (or 0/1).")
    return raw.astype(bool)


@dataclasses.dataclass(frozen=True, eq=False)
class LayerOptions:
    """Per layer and option, the costs of ``F_all`` (module docstring); ``(L, K)`` arrays.

    Build it with :meth:`from_columns` from a chain and each layer's extra options; the
    constructor takes the full arrays (column 0 included). Invalid input raises
    ``ValueError`` naming the field and the entry.
    """

    xbar_size: np.ndarray
    fwd_time: np.ndarray
    fwd_tape_time: np.ndarray
    bwd_time: np.ndarray
    fwd_tmp: np.ndarray
    bwd_tmp: np.ndarray
    output_in_tape: np.ndarray
    valid: np.ndarray
    names: tuple[tuple[str, ...], ...] | None = None
    x_read_size: np.ndarray | None = None
    fwd_tape_tmp: np.ndarray | None = None
    x_own_read_size: np.ndarray | None = None

    def __post_init__(self) -> None:
        first = float_array(self.xbar_size, "LayerOptions.xbar_size")
        if first.ndim != 2 or first.shape[0] == 0 or first.shape[1] == 0:
            raise ValueError(
                f"LayerOptions.xbar_size must be a 2-d array (layers, options), got shape "
                f"{first.shape}."
            )
        shape = (int(first.shape[0]), int(first.shape[1]))
        if shape[1] > MAX_OPTIONS:
            raise ValueError(f"At most {MAX_OPTIONS} options per layer, got {shape[1]}.")
        valid = _flags("valid", self.valid, shape)
        if not valid[:, 0].all():
            i = int(np.flatnonzero(~valid[:, 0])[0])
            raise ValueError(
                f"LayerOptions.valid[{i}, 0] is false: option 0 (the whole tape) always exists."
            )
        valid.setflags(write=False)
        object.__setattr__(self, "valid", valid)
        for name in FLOAT_FIELDS:
            object.__setattr__(self, name, _matrix(name, getattr(self, name), shape, valid))
        for name in ("x_read_size", "fwd_tape_tmp", "x_own_read_size"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _matrix(name, getattr(self, name), shape, valid))
        inside = _flags("output_in_tape", self.output_in_tape, shape) | ~valid
        inside.setflags(write=False)
        object.__setattr__(self, "output_in_tape", inside)
        dear = np.argwhere(self.fwd_tape_time > self.fwd_time)
        if dear.size:
            i, k = (int(v) for v in dear[0])
            raise ValueError(
                f"LayerOptions.fwd_tape_time[{i}, {k}] = {float(self.fwd_tape_time[i, k])!r} "
                f"exceeds fwd_time[{i}, {k}] = {float(self.fwd_time[i, k])!r}: pass at most "
                "fwd_time."
            )
        object.__setattr__(self, "names", self._check_names(shape, valid))

    def _check_names(self, shape: tuple[int, int], valid: np.ndarray) -> tuple[tuple[str, ...], ...]:
        if self.names is None:
            return tuple(
                tuple(("everything" if k == 0 else f"option {k}") if valid[i, k] else ""
                      for k in range(shape[1]))
                for i in range(shape[0])
            )
        names = tuple(tuple(row) for row in self.names)
        if len(names) != shape[0] or any(len(row) != shape[1] for row in names):
            raise ValueError(
                f"LayerOptions.names must hold {shape[0]} rows of {shape[1]} names (one per "
                "layer and option, '' where the option is absent)."
            )
        if not all(isinstance(n, str) for row in names for n in row):
            raise ValueError("LayerOptions.names must be strings.")
        return names

    @property
    def length(self) -> int:
        """Number of layers ``L``."""
        return int(self.valid.shape[0])

    @property
    def width(self) -> int:
        """``K``: the most options of any layer (the arrays' second axis)."""
        return int(self.valid.shape[1])

    @property
    def counts(self) -> np.ndarray:
        """Number of options of each layer (``K_i``)."""
        return self.valid.sum(axis=1)

    @classmethod
    def from_columns(cls, chain: ChainFields, extra: Sequence[Sequence[Mapping[str, Any]]]
                     ) -> "LayerOptions":
        """Option 0 from ``chain``'s fields, options ``1, 2, ...`` of layer ``i`` from ``extra[i]``.

        Each option is a mapping with ``xbar_size`` and ``bwd_time`` (required) and
        optionally ``fwd_time``, ``fwd_tmp``, ``bwd_tmp``, ``output_in_tape`` (default: the
        layer's own), ``fwd_tape_time`` (default: the option's ``fwd_time``),
        ``fwd_tape_tmp`` (default: as :func:`base_forward_tmp` says), ``x_read_size`` and
        ``name`` (default ``"option k"``). ``extra`` has one (possibly empty) sequence per
        layer.
        """
        L = chain.length
        if len(extra) != L:
            raise ValueError(
                f"LayerOptions.from_columns needs one sequence of options per layer ({L}), got "
                f"{len(extra)}."
            )
        K = 1 + max((len(row) for row in extra), default=0)
        own = {name: getattr(chain, name) for name in FLOAT_FIELDS + ("output_in_tape",)}
        arrays = {name: np.zeros((L, K)) for name in FLOAT_FIELDS}
        inside = np.ones((L, K), dtype=bool)
        valid = np.zeros((L, K), dtype=bool)
        read = np.zeros((L, K))
        own_read = np.zeros((L, K))  # x_own_read_size
        chain_own = chain.x_read_size if chain.x_own_read_size is None else \
            chain.x_own_read_size
        base = np.zeros((L, K))  # fwd_tape_tmp
        own_base = base_forward_tmp(chain)[:, 0]
        names = [["everything"] + [""] * (K - 1) for _ in range(L)]
        for i, row in enumerate(extra):
            columns = [{}] + list(row)
            for k, option in enumerate(columns):
                if k and not isinstance(option, Mapping):
                    raise ValueError(f"Option {k} of layer {i} must be a mapping, got {option!r}.")
                unknown = set(option) - _KEYS
                missing = {"xbar_size", "bwd_time"} - set(option)
                if k and (unknown or missing):
                    raise ValueError(
                        f"Option {k} of layer {i}: "
                        + (f"unknown keys {sorted(unknown)}" if unknown else
                           f"missing keys {sorted(missing)}")
                        + f"; the keys are {sorted(_KEYS)} (xbar_size and bwd_time required)."
                    )
                for name in FLOAT_FIELDS:
                    default = own[name][i]
                    if name == "fwd_tape_time":
                        default = option.get("fwd_time", own["fwd_time"][i]) if k else default
                    arrays[name][i, k] = option.get(name, default) if k else own[name][i]
                inside[i, k] = bool(option.get("output_in_tape", own["output_in_tape"][i]))
                read[i, k] = option.get("x_read_size", chain.x_read_size[i]) if k else \
                    chain.x_read_size[i]
                own_read[i, k] = option.get("x_own_read_size", read[i, k]) if k else \
                    chain_own[i]
                base[i, k] = own_base[i] if not k else option.get("fwd_tape_tmp", full_forward_tmp(
                    arrays["fwd_tmp"][i, k], bool(inside[i, k]), float(chain.x_size[i + 1])))
                valid[i, k] = True
                if k:
                    names[i][k] = str(option.get("name", f"option {k}"))
        same = bool(np.all(read[valid] == np.broadcast_to(chain.x_read_size[:, None],
                                                          read.shape)[valid]))
        own_same = bool(np.all((own_read == read)[:, 1:][valid[:, 1:]]))  # column 0: the chain's
        given = chain.fwd_tape_tmp is not None or any("fwd_tape_tmp" in o for row in extra
                                                       for o in row)
        return cls(output_in_tape=inside, valid=valid, names=tuple(map(tuple, names)),
                   x_read_size=None if same else np.where(valid, read, 0.0),
                   fwd_tape_tmp=np.where(valid, base, 0.0) if given else None,
                   x_own_read_size=None if own_same else np.where(valid, own_read, 0.0),
                   **arrays)

    @classmethod
    def of_chain(cls, chain: ChainFields) -> "LayerOptions":
        """The one-option table of a chain: column 0 only (its own fields)."""
        return cls(output_in_tape=chain.output_in_tape[:, None],
                   valid=np.ones((chain.length, 1), dtype=bool),
                   fwd_tape_tmp=None if chain.fwd_tape_tmp is None else chain.fwd_tape_tmp[:, None],
                   **{name: getattr(chain, name)[:, None] for name in FLOAT_FIELDS})

    def check_chain(self, chain: ChainFields) -> None:
        """Raise ``ValueError`` unless these options fit ``chain``: ``L`` rows, column 0 equal
        to the chain's fields, and every tape holding the layer's output."""
        if self.length != chain.length:
            raise ValueError(
                f"Chain.options has {self.length} layers but the chain has {chain.length}."
            )
        for name in FLOAT_FIELDS + ("output_in_tape",):
            own, column = getattr(chain, name), getattr(self, name)[:, 0]
            bad = np.flatnonzero(own != column)
            if bad.size:
                i = int(bad[0])
                own, column = own.tolist(), column.tolist()
                raise ValueError(
                    f"Chain.options.{name}[{i}, 0] = {column[i]!r} differs from the chain's "
                    f"{name}[{i}] = {own[i]!r}: option 0 is the chain's own whole tape. Build the "
                    "options with LayerOptions.from_columns(chain, extra)."
                )
        if self.x_read_size is not None:
            bad = np.flatnonzero(self.x_read_size[:, 0] != chain.x_read_size)
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"Chain.options.x_read_size[{i}, 0] = {float(self.x_read_size[i, 0])!r} "
                    f"differs from the chain's x_read_size[{i}] = {float(chain.x_read_size[i])!r}: "
                    "option 0 is the chain's own whole tape."
                )
        if self.x_own_read_size is not None:
            own = chain.x_read_size if chain.x_own_read_size is None else chain.x_own_read_size
            bad = np.flatnonzero(self.x_own_read_size[:, 0] != own)
            if bad.size:
                i = int(bad[0])
                raise ValueError(
                    f"Chain.options.x_own_read_size[{i}, 0] = "
                    f"{float(self.x_own_read_size[i, 0])!r} differs from the chain's "
                    f"{float(own[i])!r}: option 0 is the chain's own whole tape."
                )
        own, column = _own_base(chain), base_forward_tmp(chain, self)[:, 0]
        bad = np.flatnonzero(own != column)
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"Chain.options.fwd_tape_tmp[{i}, 0] = {float(column[i])!r} differs from the "
                f"chain's {float(own[i])!r} (fwd_tape_tmp, or fwd_tmp and the output outside the "
                "tape): option 0 is the chain's own whole tape."
            )
        check_bwd_tmp(self.bwd_tmp, chain.x_size, "Chain.options.bwd_tmp")
        short = np.argwhere(self.valid & (self.xbar_size < chain.x_size[1:, None]))
        if short.size:
            i, k = (int(v) for v in short[0])
            raise ValueError(
                f"Chain.options.xbar_size[{i}, {k}] = {float(self.xbar_size[i, k])!r} is smaller "
                f"than x_size[{i + 1}] = {float(chain.x_size[i + 1])!r}: every option's tape counts the "
                "layer's output."
            )

    def _key(self) -> tuple:
        optional = ("x_read_size", "fwd_tape_tmp", "x_own_read_size")
        return tuple(getattr(self, f.name).tobytes() for f in dataclasses.fields(self)
                     if f.name not in ("names",) + optional) + (
            self.valid.shape, self.names) + tuple(
            None if getattr(self, name) is None else getattr(self, name).tobytes()
            for name in optional)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LayerOptions):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"LayerOptions(length={self.length}, options per layer={self.counts.tolist()})"


class LayerCosts(NamedTuple):
    """What ``F_all(i)`` with one option stores and costs (one entry of the arrays)."""

    xbar_size: float
    tape_size: float  # xbar_size, less x[i+1] when the output is stored on its own
    output_in_tape: bool
    fwd_time: float
    fwd_tape_time: float
    bwd_time: float
    fwd_tmp: float
    bwd_tmp: float
    fwd_tape_tmp: float  # F_all's peak beside the stored tape while g[i+1] is held


def full_forward_tmp(fwd_tmp: Any, output_in_tape: Any, out: Any) -> Any:
    """The default ``fwd_tape_tmp`` (:func:`base_forward_tmp`): what a full forward peaks at
    above its input and stored tape, ``fwd_tmp`` plus the output where it is outside the tape
    (the forward computes it and drops it). Scalars (``output_in_tape`` a bool) or arrays."""
    if isinstance(output_in_tape, (bool, np.bool_)):
        return fwd_tmp + (0 if output_in_tape else out)
    return fwd_tmp + np.where(output_in_tape, 0.0, out)


def _own_base(chain: ChainFields) -> np.ndarray:
    """The chain's own (column 0) :func:`base_forward_tmp`, from its fields alone."""
    if chain.fwd_tape_tmp is not None:
        return np.asarray(chain.fwd_tape_tmp, dtype=np.float64)
    return full_forward_tmp(chain.fwd_tmp, chain.output_in_tape, chain.x_size[1:])


def base_forward_tmp(chain: ChainFields, table: "LayerOptions | None" = None) -> np.ndarray:
    """``(L, K)``: what ``F_all(i)`` with option ``k`` peaks at above its stored tape (and
    ``x[i]``) when ``g[i+1]`` is held: Rotor's base case, the last layer of a recomputed
    segment, whose forward needs to build only the tape (``fwd_tape_time``). The given
    ``fwd_tape_tmp`` where there is one (``Chain.fwd_tape_tmp``, ``LayerOptions.fwd_tape_tmp``);
    else the full forward's: ``fwd_tmp``, plus the output where it is outside the tape (the
    forward computes it and drops it). ``table``: the options (default ``chain.options``, or
    column 0 alone)."""
    table = chain.options if table is None else table
    if table is None:
        return _own_base(chain)[:, None]
    if table.fwd_tape_tmp is not None:
        return np.where(table.valid, table.fwd_tape_tmp, 0.0)
    out = np.asarray(chain.x_size[1:], float)[:, None]
    return np.where(table.valid, full_forward_tmp(table.fwd_tmp, table.output_in_tape, out), 0.0)


def option_index(chain: ChainFields, i: int, option: Any) -> int:
    """``option`` as an int if layer ``i`` of ``chain`` offers it, else ``ValueError``."""
    if isinstance(option, bool) or not hasattr(option, "__index__"):
        raise ValueError(f"Layer {i}'s option must be an integer, got {option!r}.")
    k = int(option)
    table = chain.options
    if k == 0 or (table is not None and 0 < k < table.width and table.valid[i, k]):
        return k
    count = 1 if table is None else int(table.counts[i])
    offered = "0" if count == 1 else f"{sorted(np.flatnonzero(table.valid[i]).tolist())}"
    raise ValueError(
        f"Layer {i} offers {count} option(s) ({offered}), got option {k}"
        + ("" if table is not None else " (the chain has no options: Chain.with_options adds them)")
        + "."
    )


def layer_costs(chain: ChainFields, i: int, k: int = 0) -> LayerCosts:
    """The costs of ``F_all(i)`` with option ``k`` (checked with :func:`option_index` first)."""
    out = float(chain.x_size[i + 1])  # the output, dropped in the base case's default charge
    if k == 0:
        xbar, inside = float(chain.xbar_size[i]), bool(chain.output_in_tape[i])
        given = chain.fwd_tape_tmp
        base = full_forward_tmp(chain.fwd_tmp[i], inside, out) if given is None else given[i]
        times = (chain.fwd_time[i], chain.fwd_tape_time[i], chain.bwd_time[i],
                 chain.fwd_tmp[i], chain.bwd_tmp[i], base)
    else:
        o = chain.options
        xbar, inside = float(o.xbar_size[i, k]), bool(o.output_in_tape[i, k])
        given = o.fwd_tape_tmp
        base = full_forward_tmp(o.fwd_tmp[i, k], inside, out) if given is None else given[i, k]
        times = (o.fwd_time[i, k], o.fwd_tape_time[i, k], o.bwd_time[i, k], o.fwd_tmp[i, k],
                 o.bwd_tmp[i, k], base)
    tape = xbar if inside else xbar - out
    return LayerCosts(xbar, tape, inside, *(float(t) for t in times))
