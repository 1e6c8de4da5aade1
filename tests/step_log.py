"""A scheduler that keeps what each step it schedules looked like, for tests that read the
steps (which chunks, which decodes) rather than the requests' records."""

from typing import Any, Callable

from tokenfair.sched.interface import SchedulerOutput
from tokenfair.sched.scheduler import IterationScheduler


class StepLog(IterationScheduler):
    """``steps``: ``describe(out)`` for every step scheduled, in order (``out`` just built:
    its requests already hold the blocks of this step's chunks)."""

    def __init__(self, describe: Callable[[SchedulerOutput], Any], *args) -> None:
        super().__init__(*args)
        self.describe = describe
        self.steps: list[Any] = []

    def schedule(self, now: float) -> SchedulerOutput:
        out = super().schedule(now)
        self.steps.append(self.describe(out))
        return out
