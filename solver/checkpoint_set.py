"""The result type of the minimum-peak checkpoint selectors (chains and graphs)."""

from __future__ import annotations

import dataclasses
from typing import Hashable

__all__ = ["CheckpointSet"]


@dataclasses.dataclass(frozen=True)
class CheckpointSet:
    """Which tensors to keep during the forward pass.

    Attributes:
      checkpoints: the kept tensors (sorted indices for chains, vertex names for graphs).
      segments: the groups of tensors that are not kept, each recomputed together from the
        checkpoints around it (for chains: maximal runs of consecutive non-kept indices).
      peak: the predicted memory of the solver's model (for chains, the sum of kept sizes
        plus the largest segment sum; for graphs, Feng & Huang's training memory).
      recompute: extra compute the segments cost when rebuilt (0 where not modelled).
      recompute_lower_bound: where a solver looked for the least ``recompute`` under a
        memory budget (``solver.checkpoint_search(graph, budget=...)``), a proven lower
        bound on that least recompute: equal to ``recompute`` when the set is proven
        optimal, below it when the search stopped early (time limit, ``gap``). ``None``
        where no such search ran.
    """

    checkpoints: tuple[Hashable, ...]
    segments: tuple[tuple[Hashable, ...], ...]
    peak: float
    recompute: float = 0.0
    recompute_lower_bound: float | None = None
