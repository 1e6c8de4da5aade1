"""``gc_paused``: the cyclic garbage collector off while a bulk of long-lived objects is built.

Performance hack: building a workload's rows (a tiled, re-spread, rate-scaled trace makes a
new :class:`~tokenfair.workloads.workload.TraceRow` per row and transform) allocates objects
that all survive, so the collector's young-generation passes trace every one of them again
and again for nothing: about half the time of such a transform.  The rows hold no reference
cycles; with the collector paused they are traced once, at its next pass.  Nothing else
changes (``tests/test_whole_speed.py``: the same rows, the collector back as it was).
"""

from __future__ import annotations

import functools
import gc
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside the block, then as it was (on error too)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def with_gc_paused(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run inside :func:`gc_paused`."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs) -> T:
        with gc_paused():
            return fn(*args, **kwargs)
    return wrapped
