"""For the tests that drive a service from several threads: calls made at once, and waiting
for a condition another thread makes true."""

from __future__ import annotations

import threading
import time
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


def wait_until(cond: Callable[[], object], timeout_s: float = 10.0, every_s: float = 0.01) -> bool:
    """Whether ``cond()`` became true within ``timeout_s``, checked every ``every_s`` (and once
    more at the end)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(every_s)
    return bool(cond())
