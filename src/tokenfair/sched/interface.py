"""What crosses the scheduler/engine boundary: plain dataclasses, decide then apply.

    out = scheduler.schedule(now)            # decide: who runs, how many tokens, who is evicted
    result = engine.execute(out)             # the engine (simulated or real) runs the step
    done = scheduler.update_from_output(out, result, now + result.duration_s)   # apply

Every request in ``prefill`` with ``num_tokens == req.num_uncomputed`` (before the step)
and every request in ``decode`` samples exactly one token this step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..request import Request, Status


@dataclass(slots=True)
class SchedulerOutput:
    prefill: list[tuple[Request, int]] = field(default_factory=list)   # (request, new tokens)
    decode: list[Request] = field(default_factory=list)
    preempted: list[tuple[Request, str]] = field(default_factory=list)  # (request, "recompute"|"swap")
    swapped_in: list[Request] = field(default_factory=list)
    aborted: list[Request] = field(default_factory=list)  # ended by the scheduler; engine frees state
    # set by update_from_output when every request in ``decode`` decoded: (requests per
    # tenant, per class), in order of first appearance (the recorder reuses the count)
    decode_counts: tuple[dict[str, int], dict[str, int]] | None = None

    @property
    def is_empty(self) -> bool:
        return not (self.prefill or self.decode)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)


@dataclass(slots=True)
class StepResult:
    duration_s: float
    finished: list[Request] = field(default_factory=list)        # generation ended (EOS/max/true length)
    failed: list[tuple[Request, str]] = field(default_factory=list)
    swap_s: float = 0.0


class Engine(Protocol):
    """One continuous-batching engine.  The simulator and the PyTorch engine implement it."""

    def add(self, req: Request) -> None: ...

    def execute(self, out: SchedulerOutput) -> StepResult: ...


class Scheduler(Protocol):
    def add_request(self, req: Request, now: float) -> None: ...

    def has_work(self) -> bool: ...

    def schedule(self, now: float) -> SchedulerOutput: ...

    def update_from_output(self, out: SchedulerOutput, result: StepResult, now: float) -> list[Request]: ...

    def abort(self, req: Request, status: Status, reason: str, now: float) -> None: ...
