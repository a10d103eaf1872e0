"""The heterogeneous chain: Rotor's cost model of a sequence of layers.

A chain of ``L`` layers, 0-based: layer ``i`` maps activation ``x[i]`` to ``x[i+1]``, and
``x[L]`` feeds the loss. Sizes are in any unit (bytes in practice) and times in any unit
(seconds or flops); the solvers never mix the two.

Reference: Beaumont, Eyraud-Dubois, Herrmann, Joly, Shilova, "Optimal checkpointing for
heterogeneous chains: how to train deep neural networks with limited memory" (Rotor,
arXiv:1911.13214), section 3.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Sequence

import numpy as np

from ..errors import float_array
from .options import SIGNED_FIELDS, LayerOptions, check_bwd_tmp

__all__ = ["Chain"]


def _as_vector(name: str, values: Sequence[float] | np.ndarray, length: int) -> np.ndarray:
    array = float_array(values, f"Chain.{name} ({length} entries)")
    if array.ndim != 1:
        raise ValueError(f"Chain.{name} must be one-dimensional, got shape {array.shape}.")
    if array.shape[0] != length:
        raise ValueError(f"Chain.{name} must have {length} entries, got {array.shape[0]}.")
    signed = name in SIGNED_FIELDS  # its own lower bound is checked with the sizes
    bad = np.flatnonzero(~np.isfinite(array) | ((array < 0) & (not signed)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"Chain.{name}[{i}] = {array[i]!r}: sizes and times must be finite and non-negative."
        )
    array.setflags(write=False)
    return array


def _as_flags(values: Sequence[bool] | np.ndarray | None, length: int) -> np.ndarray:
    if values is None:
        array = np.ones(length, dtype=bool)
    else:
        raw = np.asarray(values)
        if raw.shape != (length,):
            raise ValueError(
                f"Chain.output_in_tape must have {length} entries (one per layer), got shape "
                f"{raw.shape}."
            )
        if raw.dtype != bool and not np.all((raw == 0) | (raw == 1)):
            raise ValueError("Chain.output_in_tape must hold booleans (or 0/1).")
        array = raw.astype(bool)
    array.setflags(write=False)
    return array


def _first(mask: np.ndarray) -> tuple[int, int] | None:
    """The first ``(layer, option)`` where ``mask`` holds, or ``None``."""
    found = np.argwhere(mask)
    return (int(found[0][0]), int(found[0][1])) if found.size else None


@dataclasses.dataclass(frozen=True, eq=False)
class Chain:
    """Costs of a chain of ``L`` layers (ALGORITHMS.md section 1).

    Attributes:
      fwd_time: ``L`` forward times.
      bwd_time: ``L`` backward times.
      x_size: ``L + 1`` activation sizes; ``x_size[k]`` is the size of ``x[k]`` and of its
        gradient ``g[k]``. ``x_size[L]`` is the output fed to the loss.
      xbar_size: ``L`` tape sizes: everything layer ``i``'s backward needs when its forward
        ran in "save all" mode, **including its output** ``x[i+1]`` and excluding its input
        ``x[i]``. Hence ``xbar_size[i] >= x_size[i + 1]``.
      fwd_tmp: ``L`` transient sizes while a forward runs (default zeros).
      bwd_tmp: ``L`` transient sizes while a backward runs (default zeros): ``B(i)``'s peak is
        what it holds once ``g[i]`` is stored, plus ``bwd_tmp[i]``. It may be negative, down to
        ``-min(x_size[i], x_size[i+1])``: a backward that frees what it reads (its input, its
        tape, ``g[i+1]``) before ``g[i]`` is whole peaks below that sum, and no lower than
        what it holds as it starts (``g[i+1]`` and the tape, no ``g[i]`` yet) or ends
        (``g[i]``), which is what the bound keeps: the op's peak is never below the states
        before and after it.
      output_in_tape: ``L`` booleans (default all true): whether layer ``i``'s backward
        reads its output ``x[i+1]``. When it does not (a linear layer, a convolution, a
        layer norm's affine output), ``F_all(i)`` stores ``x[i+1]`` *on its own* beside a
        tape of ``xbar_size[i] - x_size[i+1]`` bytes: the output is freed by the next
        layer's backward, which reads it, instead of staying with the tape until
        ``B(i)``, and it is not stored at all when nothing ahead reads it (the last layer
        of a recomputed segment, whose output's gradient already exists). This is what
        JAX does: a residual the pullback does not read is dead code. :mod:`solver.chain.simulator`
        applies it, and Rotor's dynamic program models it exactly (:mod:`solver.chain.rotor`);
        the baselines' plans are costed by the simulator.
      fwd_tape_time: ``L`` times of a forward that only builds the tape (default
        ``fwd_time``), at most ``fwd_time``. It is what ``F_all(i)`` costs when ``g[i+1]``
        is already stored, i.e. when ``B(i)`` comes next (Rotor's base case, the last layer
        of every recomputed segment): nothing ahead reads ``x[i+1]`` then, so the forward
        needs to compute only what the backward reads. JAX does exactly this (the
        output is dead code unless it is a residual): a residual block's last matmul is
        skipped. Profiled from the forward of ``jax.vjp`` cut down to the residuals the
        pullback reads (:mod:`jaxremat.sequence.profile`).
      x_read_size: ``L`` sizes (default ``x_size[:L]``): the bytes of ``x[i]`` that ``B(i)``
        (or ``B(i-1)``, which may read ``x[i]`` as its output) reads. ``F_all(i)`` frees the
        rest of ``x[i]``, ``x_free[i] = x_size[i] - x_read_size[i]``, once it has run: nothing
        else reads those leaves before ``B(i)``, and JAX frees a pytree leaf no pullback
        reads (the ``skip`` leaf of a pre-norm stack, the input of a layer whose backward
        reads only its normalised input). ``x_free[i]`` may not exceed ``xbar_size[i]`` (nor
        any option's tape). :mod:`solver.chain.simulator` and Rotor's dynamic program apply it.
      x_rec_size: ``L`` sizes (default ``x_size[:L]``): the bytes of ``x[i]`` that the
        recomputation of a segment starting at layer ``i`` reads (its tape-only forwards read
        the leaves the tapes need and, through later layers, the leaves of ``x[i+1]`` they
        read), with every byte ``B(i)`` or ``B(i-1)`` reads: at least ``x_read_size[i]`` (and
        every option's). ``F_ck(i)`` cuts ``x[i]`` to it once it has run: a checkpoint holds
        only what its recomputation reads (JAX's checkpoint keeps those input leaves as its
        residuals, e.g. not the ``skip`` leaf of a ``{h, skip}`` activation that only
        outputs need). Unlike the ``x_read_size`` cut, a recomputation's forwards may read the
        cut ``x[i]``. :mod:`solver.chain.simulator` applies it.
      x_own_read_size: ``L`` sizes (default ``x_read_size``): the bytes of ``x[i]`` that
        ``B(i)`` alone reads, at most ``x_read_size[i]`` (per option:
        ``LayerOptions.x_own_read_size``). ``F_all(i)`` cuts a copy of ``x[i]`` stored *on its
        own* to it, not to ``x_read_size``: ``B(i-1)`` never reads that copy. Layer ``i-1``
        either ran ``F_ck`` / ``F_none`` (a checkpointed segment: its backward reads the
        output of its recomputation, a new copy) or stored its output outside its tape (its
        backward reads no output leaf). The copy inside ``tape[i-1]`` is cut to
        ``x_read_size`` as before. :mod:`solver.chain.simulator` and Rotor's dynamic programs
        apply it (:func:`solver.chain.rotor.dp_contexts`).
      fwd_tape_tmp: ``L`` sizes or ``None`` (default): what ``F_all(i)`` peaks at beside its
        stored tape (and ``x[i]``) when ``g[i+1]`` is held, i.e. when only ``B(i)`` reads
        what it computes (Rotor's base case, the last layer of a recomputed segment). JAX
        then runs the forward that builds only the tape (as ``fwd_tape_time`` says): the
        output is dead code unless the tape holds it, and so may be the full forward's
        transients. ``None`` charges the full forward there: ``fwd_tmp``, plus the output
        when it is outside the tape (computed, then dropped)
        (:func:`solver.chain.options.base_forward_tmp`). The simulator and Rotor's DP charge it
        exactly there.
      fwd_ck_tmp: ``L`` sizes or ``None`` (default): what ``F_ck(i)`` and ``F_none(i)`` peak
        at above ``x[i]`` (held whole) and the ``x[i+1]`` they store: the transient of the
        layer's plain forward, which keeps no tape (JAX's ``jax.checkpoint`` runs it, and the
        ``custom_vjp`` backend). ``fwd_tmp`` is measured on the forward that builds the tape,
        above the input and the *whole* tape, much of which (the output, for one) is not made
        yet at that forward's peak; the plain forward can peak higher above ``x[i] + x[i+1]``
        (a layer norm holds its input, ``x - mean``, the scaled ``rsqrt`` and their product at
        once). One value per layer, whatever the options: the plain forward does not depend
        on a save policy. ``None`` charges ``fwd_tmp`` (:attr:`ck_tmp`). The simulator, Rotor's
        DP, the min-peak DP and revolve charge it there.
      options: ``None`` (each layer's one "save" mode is its whole tape) or a
        :class:`~solver.chain.options.LayerOptions`: layer ``i`` offers ``K_i`` ways to run
        ``F_all(i)``, option 0 being the fields above (Rockmate's multi-option layers,
        ALGORITHMS.md section 2). :meth:`with_options` adds them.

    The float arrays are stored as read-only float64 numpy vectors, ``output_in_tape`` as
    a read-only bool vector. Invalid input raises ``ValueError`` naming the field and the
    offending index.
    """

    fwd_time: np.ndarray
    bwd_time: np.ndarray
    x_size: np.ndarray
    xbar_size: np.ndarray
    fwd_tmp: np.ndarray | None = None
    bwd_tmp: np.ndarray | None = None
    output_in_tape: np.ndarray | None = None
    fwd_tape_time: np.ndarray | None = None
    options: LayerOptions | None = None
    x_read_size: np.ndarray | None = None
    x_rec_size: np.ndarray | None = None
    fwd_tape_tmp: np.ndarray | None = None
    x_own_read_size: np.ndarray | None = None
    fwd_ck_tmp: np.ndarray | None = None

    def __post_init__(self) -> None:
        fwd = float_array(self.fwd_time, "Chain.fwd_time (one entry per layer)")
        if fwd.ndim != 1 or fwd.shape[0] == 0:
            raise ValueError(
                f"Chain.fwd_time must be a non-empty 1-d sequence (one entry per layer), "
                f"got shape {fwd.shape}."
            )
        length = int(fwd.shape[0])
        fields = {
            "fwd_time": (self.fwd_time, length),
            "bwd_time": (self.bwd_time, length),
            "x_size": (self.x_size, length + 1),
            "xbar_size": (self.xbar_size, length),
            "fwd_tmp": (np.zeros(length) if self.fwd_tmp is None else self.fwd_tmp, length),
            "bwd_tmp": (np.zeros(length) if self.bwd_tmp is None else self.bwd_tmp, length),
            "fwd_tape_time": (self.fwd_time if self.fwd_tape_time is None else self.fwd_tape_time,
                              length),
            "x_read_size": (np.asarray(self.x_size, dtype=np.float64)[:length]
                            if self.x_read_size is None else self.x_read_size, length),
            "x_rec_size": (np.asarray(self.x_size, dtype=np.float64)[:length]
                           if self.x_rec_size is None else self.x_rec_size, length),
        }
        if self.fwd_tape_tmp is not None:
            fields["fwd_tape_tmp"] = (self.fwd_tape_tmp, length)
        for name in ("x_own_read_size", "fwd_ck_tmp"):
            if getattr(self, name) is not None:
                fields[name] = (getattr(self, name), length)
        for name, (values, n) in fields.items():
            object.__setattr__(self, name, _as_vector(name, values, n))
        object.__setattr__(self, "output_in_tape", _as_flags(self.output_in_tape, length))
        with np.errstate(over="ignore"):
            totals = [float(np.sum(getattr(self, name))) for name in fields]
        if not all(np.isfinite(totals)):
            raise ValueError(
                "Chain: the sizes or times sum to infinity in float64; express them in larger "
                "units (e.g. MiB instead of bytes, ms instead of ns)."
            )
        check_bwd_tmp(self.bwd_tmp, self.x_size, "Chain.bwd_tmp")
        short = np.flatnonzero(self.xbar_size < self.x_size[1:])
        if short.size:
            i = int(short[0])
            raise ValueError(
                f"Chain.xbar_size[{i}] = {self.xbar_size[i]!r} is smaller than x_size[{i + 1}] = "
                f"{self.x_size[i + 1]!r}: a layer's tape includes its output."
            )

        for name, reader in (("x_read_size", "B({i})"), ("x_rec_size", "a recomputation")):
            part = getattr(self, name)
            over = np.flatnonzero(part > self.x_size[:-1])
            if over.size:
                i = int(over[0])
                raise ValueError(
                    f"Chain.{name}[{i}] = {float(part[i])!r} exceeds x_size[{i}] = "
                    f"{float(self.x_size[i])!r}: {reader.format(i=i)} reads a part of x[{i}]; "
                    f"pass at most x_size[{i}]."
                )
        dear = np.flatnonzero(self.fwd_tape_time > self.fwd_time)
        if dear.size:
            i = int(dear[0])
            raise ValueError(
                f"Chain.fwd_tape_time[{i}] = {float(self.fwd_tape_time[i])!r} exceeds fwd_time[{i}] = "
                f"{float(self.fwd_time[i])!r}: the tape-only forward does a part of the forward's work; "
                f"pass at most fwd_time (or leave fwd_tape_time out)."
            )
        if self.options is not None:
            if not isinstance(self.options, LayerOptions):
                raise ValueError(
                    f"Chain.options must be a solver.chain.options.LayerOptions or None, got "
                    f"{type(self.options).__name__}."
                )
            self.options.check_chain(self)
        self._check_x_free()

    def _check_x_free(self) -> None:
        """``x_free[i, k]`` at most option ``k``'s tape; and one value over the options of a
        layer whose input may sit in the previous layer's tape (some option of that layer
        reads its output), as Rotor's DP needs (:mod:`solver.chain.rotor`)."""
        free = self.option_x_free
        if self.options is None:
            tapes, valid, inside = self.xbar_size[:, None], np.ones_like(free, bool), \
                self.output_in_tape[:, None]
        else:
            tapes, valid, inside = (self.options.xbar_size, self.options.valid,
                                    self.options.output_in_tape & self.options.valid)
        wide = _first(valid & (free > tapes))
        if wide is not None:
            i, k = wide
            raise ValueError(
                f"Chain.x_read_size[{i}] (option {k}) = {float(self.x_size[i] - free[i, k])!r} "
                f"leaves {float(free[i, k])!r} of x[{i}] to free, more than layer {i}'s tape "
                f"({float(tapes[i, k])!r}): raise x_read_size[{i}] to at least x_size[{i}] - "
                f"{float(tapes[i, k])!r}."
            )
        own = self.option_x_own_free
        bad = _first(valid & ((own < free) | (own > tapes)))
        if bad is not None:
            i, k = bad
            raise ValueError(
                f"Chain.x_own_read_size[{i}] (option {k}) = {float(self.x_size[i] - own[i, k])!r} "
                f"must lie between x_size[{i}] less layer {i}'s tape "
                f"({float(self.x_size[i] - tapes[i, k])!r}) and x_read_size[{i}] "
                f"({float(self.x_size[i] - free[i, k])!r}): B({i}) alone reads part of what "
                f"B({i}) and B({i - 1}) read."
            )
        short = _first(valid & (free < self.x_rec_free[:, None]))
        if short is not None:
            i, k = short
            raise ValueError(
                f"Chain.x_rec_size[{i}] = {float(self.x_rec_size[i])!r} is smaller than what "
                f"B({i}) reads of x[{i}] (option {k}: {float(self.x_size[i] - free[i, k])!r}): "
                f"the recomputation reads at least that; raise x_rec_size[{i}]."
            )
        for i in range(1, self.length):
            row = free[i][valid[i]]
            if inside[i - 1].any() and (row != row[0]).any():
                raise ValueError(
                    f"Chain.options.x_read_size[{i}] differs between options although layer "
                    f"{i - 1}'s backward reads x[{i}]: give layer {i} one x_read_size (the "
                    f"largest) for every option."
                )

    @functools.cached_property
    def option_x_free(self) -> np.ndarray:
        """``(L, K)``: the bytes of ``x[i]`` that ``F_all(i)`` with option ``k`` frees
        (``Chain.options.x_read_size``, else ``x_free`` for every option; 0 where absent)."""
        width = 1 if self.options is None else self.options.width
        if self.options is None or self.options.x_read_size is None:
            free = np.repeat(self.x_free[:, None], width, axis=1)
        else:
            free = self.x_size[:-1, None] - self.options.x_read_size
        if self.options is not None:
            free = np.where(self.options.valid, free, 0.0)
        free.setflags(write=False)
        return free

    @functools.cached_property
    def option_x_own_free(self) -> np.ndarray:
        """``(L, K)``: the bytes of a copy of ``x[i]`` stored on its own that ``F_all(i)``
        with option ``k`` frees: ``x_size[i]`` less ``Chain.options.x_own_read_size``, where
        given, else less the option's ``x_read_size`` (column 0: the chain's
        ``x_own_read_size``); :attr:`option_x_free` where neither is given."""
        free = self.option_x_free
        table = None if self.options is None else self.options.x_own_read_size
        if table is not None:
            result = np.where(self.options.valid, self.x_size[:-1, None] - table, 0.0)
        elif self.x_own_read_size is not None:
            result = free.copy()
            result[:, 0] = self.x_size[:-1] - self.x_own_read_size
        else:
            return free
        result.setflags(write=False)
        return result

    @property
    def ck_tmp(self) -> np.ndarray:
        """What ``F_ck(i)`` / ``F_none(i)`` peak at above ``x[i]`` and ``x[i+1]``:
        ``fwd_ck_tmp``, else ``fwd_tmp``."""
        return self.fwd_tmp if self.fwd_ck_tmp is None else self.fwd_ck_tmp

    @property
    def x_free(self) -> np.ndarray:
        """Bytes of ``x[i]`` that ``F_all(i)`` frees: ``x_size[i] - x_read_size[i]``."""
        return self.x_size[:-1] - self.x_read_size

    @property
    def x_rec_free(self) -> np.ndarray:
        """Bytes of ``x[i]`` that ``F_ck(i)`` frees: ``x_size[i] - x_rec_size[i]``."""
        return self.x_size[:-1] - self.x_rec_size

    def with_options(self, options: LayerOptions | None) -> "Chain":
        """This chain with per-layer options (``None``: none), checked against its fields."""
        return dataclasses.replace(self, options=options)

    def with_full_forwards(self) -> "Chain":
        """This chain charging every ``F_all`` its full forward, also in the base case
        (``fwd_tape_tmp`` dropped, the chain's and its options'): for a backend that runs
        the whole forward there (``jax.vjp`` of the layer computes its output and drops it)."""
        if self.fwd_tape_tmp is None and (self.options is None
                                          or self.options.fwd_tape_tmp is None):
            return self
        options = self.options
        if options is not None and options.fwd_tape_tmp is not None:
            options = dataclasses.replace(options, fwd_tape_tmp=None)
        return dataclasses.replace(self, fwd_tape_tmp=None, options=options)

    @property
    def num_options(self) -> np.ndarray:
        """Number of options of each layer (all ones without options)."""
        if self.options is None:
            return np.ones(self.length, dtype=np.int64)
        return self.options.counts

    @property
    def tape_size(self) -> np.ndarray:
        """Bytes of ``tape[i]`` as stored: ``xbar_size[i]``, less ``x_size[i+1]`` when the
        output is stored on its own (``output_in_tape[i]`` false)."""
        return self.xbar_size - np.where(self.output_in_tape, 0.0, self.x_size[1:])

    @property
    def length(self) -> int:
        """Number of layers ``L``."""
        return int(self.fwd_time.shape[0])

    def __len__(self) -> int:
        return self.length

    @property
    def is_integral(self) -> bool:
        """Whether every size is an integer (then the DP can run without rounding)."""
        sizes = [self.x_size, self.xbar_size, self.fwd_tmp, self.bwd_tmp, self.x_read_size,
                 self.x_rec_size]
        for extra in (self.fwd_tape_tmp, self.x_own_read_size, self.fwd_ck_tmp):
            if extra is not None:
                sizes.append(extra)
        if self.options is not None:
            o = self.options
            sizes += [o.xbar_size.ravel(), o.fwd_tmp.ravel(), o.bwd_tmp.ravel()]
            for extra in (o.x_read_size, o.fwd_tape_tmp, o.x_own_read_size):
                if extra is not None:
                    sizes.append(extra.ravel())
        sizes = np.concatenate(sizes)
        return bool(np.all(sizes == np.floor(sizes)))

    @classmethod
    def homogeneous(
        cls,
        length: int,
        *,
        fwd_time: float = 1.0,
        bwd_time: float = 2.0,
        x_size: float = 1.0,
        xbar_size: float | None = None,
    ) -> "Chain":
        """A chain of ``length`` identical layers (the setting of revolve)."""
        if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1:
            raise ValueError(f"A chain needs at least one layer, got length={length}.")
        return cls(
            fwd_time=np.full(length, fwd_time),
            bwd_time=np.full(length, bwd_time),
            x_size=np.full(length + 1, x_size),
            xbar_size=np.full(length, x_size if xbar_size is None else xbar_size),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Chain):
            return NotImplemented
        return self.options == other.options and all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self) if f.name != "options"
        )

    def __hash__(self) -> int:
        def data(value: np.ndarray | None) -> bytes | None:
            return None if value is None else value.tobytes()

        return hash(tuple(data(getattr(self, f.name)) for f in dataclasses.fields(self)
                          if f.name != "options") + (self.options,))

    def __repr__(self) -> str:
        return (
            f"Chain(length={self.length}, total_fwd={self.fwd_time.sum():.4g}, "
            f"total_bwd={self.bwd_time.sum():.4g}, max_x={self.x_size.max():.4g}, "
            f"total_xbar={self.xbar_size.sum():.4g}"
            + ("" if self.options is None else f", options={self.num_options.tolist()}")
            + ")"
        )
