"""The mechanics' apply side: a step's outcome applied to the requests, the pool and the policy.

Mixed into :class:`~tokenfair.sched.scheduler.IterationScheduler` (it uses its policy, pool,
predictor, running list and ``ended``); split out so each file keeps one job.

* ``update_from_output``: prefill chunks and decode tokens computed, first tokens stamped,
  the policy told what was served (``on_served`` / batched ``on_decoded``), then ``retire``
  and ``on_step_end``: O(prefills + decodes), the per-decode work in one loop;
* ``retire``: the step's failed, finished and ``max_tokens`` requests end and free their
  slots and KV (also the simulator's fast-forward, for a run's finishing step);
* ``_end``: a request's one terminal state, with its reason.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ..core.request import Request, Status, count_names
from .interface import SchedulerOutput, StepResult
from .state import SchedulerState


@mypyc_attr(allow_interpreted_subclasses=True)
class ApplyMixin(SchedulerState):
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
        tenant_names: list[str] = []
        class_names: list[str] = []
        reached_max: list[Request] = []
        for req in out.decode:                      # hot loop: O(1) per decoding request
            if req.status is not running:
                continue                            # evicted or aborted since scheduling
            decoded.append(req)
            tenant_names.append(req.tenant)
            class_names.append(req.klass)
            req.num_computed += 1
            num_output = req.num_output + 1
            req.num_output = num_output
            if req.first_token_s is None:
                req.first_token_s = now
            if num_output >= req.max_tokens:
                reached_max.append(req)
        tenants, classes = count_names(tenant_names), count_names(class_names)   # decoding per name
        if len(decoded) == len(out.decode):
            out.decode_counts = (tenants, classes)
        policy.on_decoded(decoded, now, tenant_counts=tenants)
        self.retire(result.failed, result.finished, reached_max, now)
        policy.on_step_end(now, result.duration_s)
        # running requests that may still be prefilling: every other one is decoding (O(prefills))
        self.maybe_prefilling = [r for r, _ in out.prefill] + out.swapped_in + self.step_stats[2]
        ended, self.ended = self.ended, []
        return ended

    def retire(self, failed: list[tuple[Request, str]], finished: list[Request],
               reached_max: list[Request], now: float) -> None:
        """End the step's failed, finished (engine) and ``max_tokens`` requests, in that order,
        and free their slots and KV: O(running) when any ended, else O(1).  Also used by the
        simulator's fast-forward for a run's finishing step."""
        done: list[Request] = []
        for req, reason in failed:
            if req.status is Status.RUNNING:
                done.append(req)
                self._end(req, Status.FAILED, reason, now)
        for req in finished:
            if req.status is Status.RUNNING:
                done.append(req)
                self._end(req, Status.FINISHED, "eos_or_length", now)
        for req in reached_max:
            if req.status is Status.RUNNING:
                done.append(req)
                self._end(req, Status.FINISHED, "max_tokens", now)
        if done:
            # every running request is RUNNING (invariant) and _end just ended these
            running = Status.RUNNING        # a local: Python 3.11 does not cache class attributes
            self.running = [r for r in self.running if r.status is running]
            for req in done:
                self.pool.release(req)

    def _end(self, req: Request, status: Status, reason: str, now: float) -> None:
        req.status = status
        req.reason = reason
        req.finish_s = now
        if status is Status.FINISHED:
            self.predictor.observe(req, req.num_output)
            self.policy.on_finish(req, now)
        elif req.num_output or req.num_computed:
            self.policy.on_finish(req, now)
        self.ended.append(req)
