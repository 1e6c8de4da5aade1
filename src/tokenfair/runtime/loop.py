"""The one run loop: arrivals, one scheduler call per engine step, two clocks.

    while work remains:
        hand every arrival with arrival_s <= now to the scheduler
        out = scheduler.schedule(now); result = engine.execute(out)
        now = clock.after_step(now, result.duration_s)
        scheduler.update_from_output(out, result, now)

``VirtualClock`` jumps (simulation); ``WallClock`` reads and sleeps on real time (the
PyTorch engine).  Event order is deterministic: arrivals in trace order (ties by position),
then the step.  A request the engine can never hold (prompt beyond KV capacity) is rejected
at arrival; if nothing can run and nothing will arrive, the waiting requests fail with a
reason rather than hang.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from ..contracts.contract import Contract
from .intake import Intake
from .recorder import Recorder
from ..core.reasons import Reason, ReasonCode
from ..core.request import Request
from ..sched.interface import Engine
from ..sched.scheduler import IterationScheduler
from ..workloads.workload import TraceRow


class Clock(Protocol):
    def start(self) -> float: ...
    def now(self, sim_now: float) -> float: ...
    def after_step(self, now: float, duration_s: float) -> float: ...
    def idle_until(self, now: float, t: float) -> float: ...


class VirtualClock:
    def start(self) -> float:
        return 0.0

    def now(self, sim_now: float) -> float:
        return sim_now

    def after_step(self, now: float, duration_s: float) -> float:
        return now + duration_s

    def idle_until(self, now: float, t: float) -> float:
        return max(now, t)


@dataclass
class RunResult:
    requests: list[Request]
    recorder: Recorder
    scheduler: IterationScheduler
    end_s: float
    wall_s: float
    extra: dict[str, object] = field(default_factory=dict)


def run(rows: Sequence[TraceRow], contract: Contract, scheduler: IterationScheduler, engine: Engine,
        clock: Clock | None = None, progress: Callable[[int, int], None] | None = None,
        fast_forward: Callable[..., float] | None = None, recorder: Recorder | None = None) -> RunResult:
    """Run ``rows`` to completion.  ``fast_forward(scheduler, engine, recorder, now,
    next_arrival) -> now`` may advance runs of identical decode steps at once (simulation).
    ``recorder``: what records the timeline (default: a new :class:`Recorder`)."""
    clock = clock or VirtualClock()
    wall0 = time.perf_counter()
    rec = recorder if recorder is not None else Recorder(contract.costs)
    reqs: list[Request] = []
    capacity_tokens = scheduler.pool.num_blocks * scheduler.pool.block_size
    n = len(rows)
    i = 0
    now = clock.start()
    next_report = max(1, n // 20)
    intake = Intake(contract)
    while i < n or scheduler.has_work():
        now = clock.now(now)
        while i < n and rows[i].arrival_s <= now:
            row = rows[i]
            req, reject = intake.make(row, i)
            reqs.append(req)
            if reject is None and row.prompt_tokens + 1 > capacity_tokens:
                reject = Reason(ReasonCode.PROMPT_EXCEEDS_KV_CAPACITY, f"{row.prompt_tokens} tokens > {capacity_tokens}")
            if reject is not None:
                scheduler.reject(req, reject, row.arrival_s)
            else:
                engine.add(req, row)
                scheduler.add_request(req, row.arrival_s)
            i += 1
            if progress and i % next_report == 0:
                progress(i, n)
        if not scheduler.has_work():
            if i < n:
                now = clock.idle_until(now, rows[i].arrival_s)
            continue
        if fast_forward is not None:
            later = fast_forward(scheduler, engine, rec, now, rows[i].arrival_s if i < n else float("inf"))
            if later != now:
                now = later
                continue                      # hand over the arrivals due by now first
        out = scheduler.schedule(now)
        if out.is_empty and not out.preempted:
            if scheduler.running:
                raise RuntimeError(f"scheduler produced an empty step with {len(scheduler.running)} running requests")
            nxt = scheduler.after_empty_step(now, rows[i].arrival_s if i < n else float("inf"))
            if nxt != float("inf"):            # inf: the waiting requests failed (never admissible)
                now = clock.idle_until(now, nxt)
            continue
        result = engine.execute(out)
        now = clock.after_step(now, result.duration_s)
        scheduler.update_from_output(out, result, now)
        rec.record_step(out, now, result.duration_s, scheduler.policy.num_waiting(),
                        len(scheduler.running), scheduler.pool.usage)
        for req in out.aborted:
            engine.forget(req)
    if progress:
        progress(n, n)
    return RunResult(reqs, rec, scheduler, now, time.perf_counter() - wall0)
