"""Python's cyclic garbage collector paused while a sequence is profiled (issue 18.4).

A re-plan at a new input shape allocates and frees some 100,000 objects (instantiated jaxprs,
their equations and variables), all freed by reference counting: a collection right after
one finds no cyclic garbage (12 GPT-2 blocks, batch sizes 2, 3 and 5: 0 objects). Yet the
allocations trigger the collector, and every third or fourth re-plan paid for a full
collection over the ~290,000 objects a JAX process holds (0.14 s of CPU, more than the
re-plan's 0.11-0.13 s of work). :func:`paused` turns automatic collection off for the
duration of a profile and back on after it, if it was on: nothing is left uncollected by a
re-plan, and a first plan's cyclic garbage (JAX's tracing: about 62,000 objects on those
blocks) is collected by the first automatic collection after it. Nested and concurrent
profiles share one pause (a counter under a lock); ``gc.collect()`` still works inside.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

__all__ = ["paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Automatic garbage collection off inside the block (module docstring)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
