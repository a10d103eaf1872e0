"""Running a call from several threads at once (the cache thread-safety tests).

Not a test module: tests import it (pytest puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable


def call_together(fn: Callable[[], Any], count: int = 4) -> list[Any]:
    """``fn()`` from ``count`` threads released together by a barrier; their results (in
    finishing order). Re-raises the first exception a thread met."""
    barrier = threading.Barrier(count)
    results: list[Any] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            barrier.wait()
            results.append(fn())
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    threads = [threading.Thread(target=call) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
