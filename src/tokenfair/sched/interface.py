"""What crosses the scheduler/engine boundary: plain dataclasses, decide then apply.

    out = scheduler.schedule(now)            # decide: who runs, how many tokens, who is evicted
    result = engine.execute(out)             # the engine (simulated or real) runs the step
    done = scheduler.update_from_output(out, result, now + result.duration_s)   # apply

Every request in ``prefill`` with ``num_tokens == req.num_uncomputed`` (before the step)
and every request in ``decode`` samples exactly one token this step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..core.reasons import Reason
from ..core.request import Request, Status
from ..workloads.workload import TraceRow


# init=False: the constructors are written out, so that compiled they run as C (a generated
# dataclass __init__ stays interpreted); repr and equality are the dataclass's
@dataclass(slots=True, init=False)
class SchedulerOutput:
    prefill: list[tuple[Request, int]]      # (request, new tokens)
    decode: list[Request]
    preempted: list[tuple[Request, str]]    # (request, "recompute"|"swap")
    swapped_in: list[Request]
    aborted: list[Request]                  # ended by the scheduler; engine frees state
    # set by update_from_output when every request in ``decode`` decoded: (requests per
    # tenant, per class), in order of first appearance (the recorder reuses the count)
    decode_counts: tuple[dict[str, int], dict[str, int]] | None

    def __init__(self, prefill: list[tuple[Request, int]] | None = None, decode: list[Request] | None = None,
                 preempted: list[tuple[Request, str]] | None = None, swapped_in: list[Request] | None = None,
                 aborted: list[Request] | None = None,
                 decode_counts: tuple[dict[str, int], dict[str, int]] | None = None) -> None:
        self.prefill = [] if prefill is None else prefill
        self.decode = [] if decode is None else decode
        self.preempted = [] if preempted is None else preempted
        self.swapped_in = [] if swapped_in is None else swapped_in
        self.aborted = [] if aborted is None else aborted
        self.decode_counts = decode_counts

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.decode)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)


@dataclass(slots=True, init=False)
class StepResult:
    duration_s: float
    finished: list[Request]                 # generation ended (EOS/max/true length)
    failed: list[tuple[Request, Reason]]    # (request, why it failed)
    swap_s: float

    def __init__(self, duration_s: float, finished: list[Request] | None = None,
                 failed: list[tuple[Request, Reason]] | None = None, swap_s: float = 0.0) -> None:
        self.duration_s = duration_s
        self.finished = [] if finished is None else finished
        self.failed = [] if failed is None else failed
        self.swap_s = swap_s


class Engine(Protocol):
    """One continuous-batching engine as the run loop drives it.  The simulator's
    ``RowFedEngine`` and the PyTorch ``RealEngine`` implement it (checked by
    tests/test_interfaces.py)."""

    def add(self, req: Request, row: TraceRow) -> None:
        """Take a request the scheduler accepted (``row``: its trace row; the engine may read
        what the scheduler must not, such as the true output length)."""

    def execute(self, out: SchedulerOutput) -> StepResult:
        """Run one step as decided."""

    def forget(self, req: Request) -> None:
        """Drop a request that ended outside a step (aborted, expired): free its state."""


class Scheduler(Protocol):
    def add_request(self, req: Request, now: float) -> None: ...

    def reject(self, req: Request, reason: Reason, now: float) -> None: ...

    def has_work(self) -> bool: ...

    def schedule(self, now: float) -> SchedulerOutput: ...

    def update_from_output(self, out: SchedulerOutput, result: StepResult, now: float) -> list[Request]: ...

    def abort(self, req: Request, status: Status, reason: Reason, now: float) -> None: ...
