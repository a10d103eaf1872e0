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
    """

    checkpoints: tuple[Hashable, ...]
    segments: tuple[tuple[Hashable, ...], ...]
    peak: float
    recompute: float = 0.0
