"""Every persistent plan of a small chain, for brute-force checks of the solvers.

Not a test module: tests import it (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from solver import Checkpoint, Layer


def plans(start: int, stop: int, body: bool = False):
    """Every plan over layers ``start .. stop-1`` (a checkpoint's body ends with a Layer)."""
    if start == stop:
        yield ()
        return
    for rest in plans(start + 1, stop):
        yield (Layer(start),) + rest
    for end in range(start + 1, stop + (0 if body else 1)):
        for inner in plans(start, end, body=True):
            if isinstance(inner[-1], Layer):
                for rest in plans(end, stop):
                    yield (Checkpoint(start, end, inner),) + rest
