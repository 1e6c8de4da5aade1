"""The mechanics' apply side: a step's outcome applied to the requests, the pool and the policy.

:class:`Applier` is the part of :class:`~tokenfair.sched.scheduler.IterationScheduler` that
ends requests; it holds the terminal requests not yet collected.

* ``update_from_output``: prefill chunks and decode tokens computed (``decode.advance_decodes``),
  first tokens stamped, the policy told what was served (``on_served`` / batched
  ``on_decoded``), then ``retire`` and ``on_step_end``: O(prefills + decodes), the
  per-decode work in two flat loops;
* ``retire``: the step's failed, finished and ``max_tokens`` requests end and free their
  slots and KV (also the simulator's fast-forward, for a run's finishing step);
* ``end``: a request's one terminal state, with its reason.
"""

from __future__ import annotations

from ..core.reasons import ENDED_BY_ENGINE, REACHED_MAX_TOKENS, Reason
from ..core.name_counts import NameCounts
from ..core.request import Request, Status
from .decode import advance_decodes
from .interface import SchedulerOutput, StepResult
from .policy import Policy
from .predictor import Predictor
from .state import RunningSet


class Applier:
    """Applies steps' outcomes to ``runs`` and ends requests.

    Invariants: ``end`` is the only place a request gets a terminal status here, and each
    ended request is appended to ``ended`` once, in the order ended, until ``take_ended``
    hands the list over; a request ended while running leaves ``runs`` (``retire``).
    """

    def __init__(self, policy: Policy, predictor: Predictor, runs: RunningSet) -> None:
        self.policy = policy
        self.predictor = predictor
        self.runs = runs
        self.ended: list[Request] = []          # terminal requests not yet collected
        self.name_counts = NameCounts()          # counts requests by tenant and class (fast)

    def take_ended(self) -> list[Request]:
        """The requests ended since the last call (and forget them here)."""
        ended, self.ended = self.ended, []
        return ended

    def update_from_output(self, out: SchedulerOutput, result: StepResult, now: float) -> list[Request]:
        policy = self.policy
        for req, n in out.prefill:
            if req.status is not Status.RUNNING:
                continue
            sampled = n == req.num_uncomputed
            req.num_computed += n
            if sampled:
                req.num_output += 1
                if req.first_token_s is None:
                    req.first_token_s = now
            policy.on_served(req, n, 1 if sampled else 0, now)
        running = Status.RUNNING
        decoded: list[Request] = []
        for req in out.decode:                      # hot loop: O(1) per decoding request
            if req.status is not running:
                continue                            # evicted or aborted since scheduling
            decoded.append(req)
        reached_max = advance_decodes(decoded, 1, now)
        tenants, classes = self.name_counts.count(decoded)      # decoding per name
        if len(decoded) == len(out.decode):
            out.decode_counts = (tenants, classes)
        policy.on_decoded(decoded, now, tenant_counts=tenants)
        self.retire(result.failed, result.finished, reached_max, now)
        policy.on_step_end(now, result.duration_s)
        # running requests that may still be prefilling: every other one is decoding (O(prefills))
        runs = self.runs
        runs.maybe_prefilling = [r for r, _ in out.prefill] + out.swapped_in + runs.step_stats[2]
        return self.take_ended()

    def retire(self, failed: list[tuple[Request, Reason]], finished: list[Request],
               reached_max: list[Request], now: float) -> None:
        """End the step's failed, finished (engine) and ``max_tokens`` requests, in that order,
        and free their slots and KV: O(running) when any ended, else O(1).  Also used by the
        simulator's fast-forward for a run's finishing step."""
        done: list[Request] = []
        for req, reason in failed:
            if req.status is Status.RUNNING:
                done.append(req)
                self.end(req, Status.FAILED, reason, now)
        for req in finished:
            if req.status is Status.RUNNING:
                done.append(req)
                self.end(req, Status.FINISHED, ENDED_BY_ENGINE, now)
        for req in reached_max:
            if req.status is Status.RUNNING:
                done.append(req)
                self.end(req, Status.FINISHED, REACHED_MAX_TOKENS, now)
        if done:
            self.runs.release_ended(done)   # every running request is RUNNING but these

    def end(self, req: Request, status: Status, reason: Reason, now: float) -> None:
        """Give ``req`` its one terminal ``status`` with its ``reason`` (it leaves no slot or KV
        here: the caller frees those); the policy and the predictor learn of it."""
        req.status = status
        req.end_reason = reason
        req.finish_s = now
        if status is Status.FINISHED:
            self.predictor.observe(req, req.num_output)
            self.policy.on_finish(req, now)
        elif req.num_output or req.num_computed:
            self.policy.on_finish(req, now)
        self.ended.append(req)
