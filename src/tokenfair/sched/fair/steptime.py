"""The fair policy's recent step time: what a waiting request's service estimate
(``urgency.py``) and an urgent eviction's saved wait are measured in."""

from __future__ import annotations

from typing import Final

from ...core.costmodel import Profile

# weight of the newest step in the moving average (about the last 20 steps count)
STEP_EWMA_FACTOR: Final = 0.05
# the initial recent step time: one decode of this many tokens of context
INITIAL_STEP_CONTEXT: Final = 1024


def initial_step_s(profile: Profile) -> float:
    """The recent step time before any step was observed (the cost model's)."""
    return profile.step_s([], INITIAL_STEP_CONTEXT, 1)


class StepTimer:
    """Invariant: ``ewma_s`` is the exponentially weighted moving average of the durations
    observed, in order, starting from the initial estimate (the gateway may overwrite it
    with its measured TPOT, ``Policy.observe_step_time``)."""

    __slots__ = ("ewma_s",)

    def __init__(self, initial_s: float) -> None:
        self.ewma_s = initial_s

    def observe(self, duration_s: float) -> None:
        self.ewma_s += STEP_EWMA_FACTOR * (duration_s - self.ewma_s)

    def observe_all(self, durations_s: list[float], count: int) -> None:
        """The first ``count`` of ``durations_s``, one by one (the same float operations)."""
        ewma = self.ewma_s
        for j, dt in enumerate(durations_s):
            if j < count:
                ewma += STEP_EWMA_FACTOR * (dt - ewma)
        self.ewma_s = ewma
