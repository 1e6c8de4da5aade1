"""The clock of a real engine: the run loop's :class:`~tokenfair.runtime.loop.Clock` on real
time (the simulator's ``VirtualClock`` jumps instead)."""

from __future__ import annotations

import time


class WallClock:
    """Seconds since ``start()`` on a monotonic clock; idle waits really sleep."""

    def __init__(self) -> None:
        self._t0 = 0.0

    def start(self) -> float:
        self._t0 = time.perf_counter()
        return 0.0

    def now(self, sim_now: float) -> float:
        return time.perf_counter() - self._t0

    def after_step(self, now: float, duration_s: float) -> float:
        return self.now(now)

    def idle_until(self, now: float, t: float) -> float:
        delay = t - self.now(now)
        if delay > 0:
            time.sleep(delay)
        return self.now(now)
