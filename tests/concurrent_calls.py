"""Calls made at once from threads, for the tests that load a service concurrently."""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def call_at_once(call: Callable[[int], T], n: int, timeout_s: float) -> list[T]:
    """``call(0)`` ... ``call(n - 1)``, each in its own thread, all started before any is
    joined; what they returned, in the order they returned (a call that raised or is still
    running after ``timeout_s``, per thread, is missing)."""
    results: list[T] = []
    threads = [threading.Thread(target=lambda i=i: results.append(call(i))) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return results
