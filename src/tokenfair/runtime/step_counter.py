"""A :class:`~tokenfair.runtime.recorder.Recorder` that keeps no timeline: for runs whose
per-request states are all that is read (a tenant's isolated baseline).

The loop and the fast-forward call it as they call a recorder, and nothing in a run reads a
recorder back, so a run with one ends with the same requests, bit for bit
(``tests/test_isolated.py``); it counts steps only, O(1) per call instead of the recorder's
per-step bucket work.
"""

from __future__ import annotations

from typing import Callable, ClassVar

from ..contracts.contract import CostWeights
from ..sched.interface import SchedulerOutput
from .recorder import Recorder


class StepCounter(Recorder):
    """Invariant: ``num_steps`` counts the steps recorded; every series stays empty;
    ``num_counted_runs`` counts the decode runs recorded by :meth:`record_steps`."""

    reads_steps: ClassVar[bool] = False      # decode runs call record_steps

    def __init__(self, costs: CostWeights, bucket_s: float = 1.0) -> None:
        super().__init__(costs, bucket_s)
        self.num_counted_runs = 0

    def record_step(self, out: SchedulerOutput, t_end: float, duration_s: float,
                    num_waiting: int, num_running: int, kv_usage: float) -> None:
        self.num_steps += 1

    def record_run(self, tenants: dict[str, int], classes: dict[str, int], step_ends: list[float],
                   step_durations: list[float], usage_after: Callable[[int], float],
                   running_after: int) -> None:
        self.num_steps += len(step_ends)

    def record_steps(self, num_steps: int) -> None:
        """A fast-forwarded run of ``num_steps`` decode-only steps (``record_run`` without the
        times it does not read)."""
        self.num_steps += num_steps
        self.num_counted_runs += 1
