"""The parts of pytree activations a chain holds: ``x_read_size`` and ``x_rec_size``.

From the per-leaf flags of each layer's profile (:class:`jaxremat.sequence.layer.LayerProfile`:
which input and output leaves its pullback and its tape-only forwards read), the bytes of
``x[i]`` that the backward reads (``solver.Chain.x_read_size``, per option) and that a
recomputation from layer ``i`` reads (``solver.Chain.x_rec_size``), as JAX keeps only the
leaves its pullbacks and ``jax.checkpoint``'s recomputations read (module docstring of
:mod:`jaxremat.sequence.profile`).
"""

from __future__ import annotations

from typing import Sequence

from .layer import LayerProfile

__all__ = ["inputs_freed", "own_read_sizes", "read_sizes", "rec_sizes"]


def _leaves_read(flags: Sequence[tuple[bool, ...]], count: int) -> list[bool]:
    """Leaf-wise union of flags (``()``: not measured, all read)."""
    read = [False] * count
    for found in flags:
        if len(found) != count:
            return [True] * count
        read = [a or b for a, b in zip(read, found)]
    return read


def read_sizes(profiles: Sequence[LayerProfile],
                sizes: Sequence[Sequence[int]]) -> list[list[float]]:
    """``x_read_size`` per layer and option (option 0 first): the bytes of the leaves of
    ``x[i]`` that ``B(i)`` under the option, or ``B(i-1)`` under any of its options, reads;
    at least ``x_size[i]`` less the option's tape (what ``F_all(i)`` may free). One value
    (the options' union) where some option of layer ``i-1`` reads its output: ``x[i]`` may
    then sit in that layer's tape, and :class:`solver.Chain` asks it."""
    result = []
    for i, (profile, leaves) in enumerate(zip(profiles, sizes)):
        before = [False] * len(leaves)
        shared = False
        if i > 0:
            prev = profiles[i - 1]
            before = _leaves_read([prev.output_read] + [o.output_read for o in prev.options],
                                  len(leaves))
            shared = prev.output_in_tape or any(o.output_in_tape for o in prev.options)
        flags = [profile.input_read] + [o.input_read for o in profile.options]
        tapes = [profile.tape_bytes] + [o.tape_bytes for o in profile.options]
        total = float(sum(leaves))
        if shared:
            flags = [tuple(_leaves_read(flags, len(leaves)))] * len(flags)
        reads = []
        for found in flags:
            read = [a or b for a, b in zip(_leaves_read([found], len(leaves)), before)]
            reads.append(float(sum(n for n, r in zip(leaves, read) if r)))
        if shared:  # one value: at least what the smallest tape allows to free
            floor = total - min(tapes)
            reads = [max(max(reads), floor)] * len(reads)
        else:
            reads = [max(r, total - t) for r, t in zip(reads, tapes)]
        result.append(reads)
    return result


def own_read_sizes(profiles: Sequence[LayerProfile], sizes: Sequence[Sequence[int]],
                   reads: Sequence[Sequence[float]]) -> list[list[float]]:
    """``x_own_read_size`` per layer and option (option 0 first): the bytes of the leaves of
    ``x[i]`` that ``B(i)`` alone reads under the option, at least ``x_size[i]`` less the
    option's tape and at most its ``reads`` entry (:func:`read_sizes`). ``F_all(i)`` cuts a
    copy of ``x[i]`` stored on its own to it: ``B(i-1)`` reads its recomputed output, or
    none (``solver.Chain.x_own_read_size``)."""
    result = []
    for profile, leaves, read in zip(profiles, sizes, reads):
        flags = [profile.input_read] + [o.input_read for o in profile.options]
        tapes = [profile.tape_bytes] + [o.tape_bytes for o in profile.options]
        total = float(sum(leaves))
        own = [float(sum(n for n, r in zip(leaves, _leaves_read([found], len(leaves))) if r))
               for found in flags]
        result.append([min(max(o, total - t), r) for o, t, r in zip(own, tapes, read)])
    return result


def inputs_freed(profiles: Sequence[LayerProfile], sizes: Sequence[Sequence[int]]
                 ) -> list[bool]:
    """Per layer, whether ``B(i)`` frees the leaves of ``x[i]`` it reads as it goes (the chain
    takes its ``bwd_tmp_freed``): nothing after it reads them, as no option of layer ``i-1``
    reads its output (``B(i-1)`` would read ``x[i]``), and ``x[i]`` is not the sequence's
    input (``x[0]``: the caller's array, live through the step)."""
    freed = [False]
    for prev, leaves in zip(profiles[:-1], sizes[1:]):
        read = _leaves_read([prev.output_read] + [o.output_read for o in prev.options],
                            len(leaves))
        freed.append(not (any(read) or prev.output_in_tape
                          or any(o.output_in_tape for o in prev.options)))
    return freed


def rec_sizes(profiles: Sequence[LayerProfile], sizes: Sequence[Sequence[int]],
               reads: Sequence[Sequence[float]]) -> list[float]:
    """``x_rec_size`` per layer: the bytes of the leaves of ``x[i]`` a recomputation from
    layer ``i`` reads. Backwards from the last layer (whose recomputation builds only its
    tape): the leaves the tape-only forward of any option reads, those computing the leaves
    of ``x[i+1]`` the next layer's recomputation reads need, and the leaves ``B(i-1)`` reads
    as its output; at least every option's ``x_read_size``. An upper bound for a segment
    ending before the last layer, exact where the needed leaves are the same for every
    segment (a stack of equal blocks)."""
    result = [0.0] * len(profiles)
    needed: list[bool] | None = None  # leaves of x[i+1] a recomputation reads (None: all)
    for i in range(len(profiles) - 1, -1, -1):
        profile, leaves = profiles[i], sizes[i]
        tapes = [profile.tape_deps] + [o.tape_deps for o in profile.options]
        reads_in = [profile.input_read] + [o.input_read for o in profile.options]
        deps = profile.output_deps
        measured = all(len(t) == len(leaves) for t in tapes) and (
            needed is not None and len(deps) == len(needed)
            or i == len(profiles) - 1)
        if not measured:
            read = [True] * len(leaves)
        else:
            read = _leaves_read(tapes + reads_in, len(leaves))
            for flags in (deps[o] for o, n in enumerate(needed or ()) if n):
                read = [a or (b if len(flags) == len(read) else True)
                        for a, b in zip(read, flags)]
            if i > 0:
                prev = profiles[i - 1]
                before = _leaves_read([prev.output_read] + [o.output_read for o in prev.options],
                                      len(leaves))
                read = [a or b for a, b in zip(read, before)]
        result[i] = max(float(sum(n for n, r in zip(leaves, read) if r)), max(reads[i]))
        needed = read
    return result
