"""A small bounded, thread-safe least-recently-used mapping (the plan and profile caches)."""

from __future__ import annotations

import collections
import threading
from typing import Any, Hashable

__all__ = ["LRU"]


class LRU:
    """At most ``maxsize`` entries; reading or writing one makes it the most recent, and a
    write beyond ``maxsize`` evicts the least recent. Every method holds one lock, so
    threads may share an instance (callers that must compute a missing entry once hold their
    own lock around get-compute-put)."""

    def __init__(self, maxsize: int, clears: tuple["LRU", ...] = ()) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}.")
        self.maxsize = maxsize
        self._clears = clears  # caches derived from this one: cleared with it
        self._data: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            if key not in self._data:
                return default
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def values(self) -> tuple[Any, ...]:
        with self._lock:
            return tuple(self._data.values())

    def clear(self) -> None:
        """Forget every entry, and those of the caches given as ``clears``."""
        with self._lock:
            self._data.clear()
        for other in self._clears:
            other.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

