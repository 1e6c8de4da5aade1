"""Iteration-level mechanics shared by every policy (decide, then apply).

:class:`IterationScheduler` is a composition of parts that each hold their own state:

* :class:`~tokenfair.sched.state.RunningSet` (``sched/state.py``): the running requests and
  the KV block pool they hold, with the last step's statistics;
* :class:`~tokenfair.sched.admit.Admitter` (``sched/admit.py``): admission from the policy's
  waiting queue and eviction back into it, with the eviction counters;
* :class:`~tokenfair.sched.apply.Applier` (``sched/apply.py``): a step's outcome applied, and
  every request's one terminal state;
* :class:`~tokenfair.sched.running_pass.RunningPass` (``sched/running_pass.py``): one pass
  over the running requests while a step is built.

One call to :meth:`IterationScheduler.schedule` builds one engine step:

1. the policy expires waiting requests that can no longer meet their deadline;
2. running requests first, oldest first: a decode token each (decode budget), or the next
   prefill chunk (prefill budget, ``chunk_size``, at most ``max_consecutive_prefill_steps``
   in a row while others wait), evicting for KV when needed (``RunningPass``);
3. waiting requests in the policy's order while slots, prefill budget and KV allow
   (swapped ones are swapped back in); a candidate that does not fit blocks the queue
   (``hol_blocking``) or only its tenant for this step, as does one the policy gives no
   chunk (``chunk_for`` 0);
4. if the policy names an urgent waiting request that could not start, it may evict one
   running request for it (cost-checked by the policy).  Steps 3-4 are ``Admitter.admit``;
5. with a policy whose cap only yields to other prefills (``cap_yields_only_to_prefill``):
   if the step carries no prefill after admission, the prefills the cap held get its
   budget: the cap hands a step to other prefills, never leaves its prefill budget idle.

:meth:`update_from_output` applies the engine's result (``Applier``).  Invariants (checked
by ``check_invariants`` in tests): every non-terminal request is in exactly one of running /
waiting; KV blocks are conserved (``kv.BlockPool``); each request ends in exactly one
terminal status with a reason.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.kv import BlockPool
from ..core.reasons import NEVER_ADMITTED, Reason
from ..core.request import Request, Status
from .admit import Admitter
from .arrival import arrive
from .apply import Applier
from .bulk import leading_decodes
from .interface import SchedulerOutput, StepResult
from .policy import Budget, Policy, end_each_waiting
from .predictor import OnlinePredictor, Predictor
from .running_pass import RunningPass
from .state import RunningSet


@mypyc_attr(allow_interpreted_subclasses=True)     # tests wrap it with invariant checks
class IterationScheduler:
    def __init__(self, policy: Policy, contract: Contract, profile: Profile,
                 predictor: Predictor | None = None) -> None:
        self.policy = policy
        self.set_contract(contract)
        self.profile = profile
        pool = BlockPool(profile.num_blocks, profile.block_size,
                         profile.swap_capacity_tokens // profile.block_size)
        self.predictor = predictor or OnlinePredictor()
        policy.bind(contract, profile, pool, self.predictor)
        self.runs = RunningSet(pool)
        self.admitter = Admitter(policy, self.runs, profile.kv_bytes_per_token)
        self.applier = Applier(policy, self.predictor, self.runs)
        self.num_steps = 0                      # schedule() calls (numbers held-decode runs)
        self.num_fast_forwarded_steps = 0       # of num_steps, those applied by sim/fastforward.py

    def set_contract(self, contract: Contract) -> None:
        """The contract (replaced by a live contract change, ``serve/contract_live.py``) and
        the engine limits every step reads, as plain fields (performance: a contract field
        read is a pydantic attribute lookup)."""
        self.contract = contract
        eng = contract.engine
        self.decode_token_budget = eng.decode_token_budget
        self.max_running = eng.max_running
        self.max_consecutive_prefill_steps = eng.max_consecutive_prefill_steps

    # -- the parts' state, read-only ------------------------------------------------------
    @property
    def pool(self) -> BlockPool:
        return self.runs.pool

    @property
    def running(self) -> list[Request]:
        return self.runs.requests

    @property
    def step_stats(self) -> tuple[int, int, list[Request]]:
        return self.runs.step_stats

    @property
    def num_preemptions(self) -> int:
        return self.admitter.num_preemptions

    @property
    def num_recomputed_tokens(self) -> int:
        return self.admitter.num_recomputed_tokens

    @property
    def num_swapped_blocks(self) -> int:
        return self.admitter.num_swapped_blocks

    # -- intake -------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> None:
        reason = arrive(self.policy, self.predictor, req, now)
        if reason is not None:
            self.applier.end(req, Status.REJECTED, reason, now)

    def reject(self, req: Request, reason: Reason, now: float) -> None:
        """End a request refused at intake, before it ever entered the queue."""
        self.applier.end(req, Status.REJECTED, reason, now)

    def has_work(self) -> bool:
        return bool(self.runs.requests) or self.policy.num_waiting() > 0

    def take_ended(self) -> list[Request]:
        """The requests that reached a terminal state since the last call (or step)."""
        return self.applier.take_ended()

    def forget_ended(self, req: Request) -> None:
        """Drop ``req`` from the ended requests not yet collected (the caller reports it)."""
        self.applier.ended = [r for r in self.applier.ended if r is not req]

    def abort(self, req: Request, status: Status, reason: Reason, now: float) -> None:
        """End a request from outside (client gone, shutdown): frees its slot and KV at once."""
        if req.status.is_terminal:
            return
        if req.status is Status.RUNNING:
            self.runs.remove(req)
        else:
            if req.status is Status.SWAPPED:
                self.runs.pool.drop_swapped(req)
            self.policy.discard(req)
        self.applier.end(req, status, reason, now)

    # -- decide -------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        self.num_steps += 1
        policy, runs = self.policy, self.runs
        for req, reason in policy.expire(now):
            if req.status is Status.SWAPPED:
                runs.pool.drop_swapped(req)
            self.applier.end(req, Status.EXPIRED, reason, now)
            out.aborted.append(req)
        budget = Budget(policy.prefill_budget(runs.step_stats, now), self.decode_token_budget, policy.shared_budget)
        deferred: list[Request] = []
        hint, runs.maybe_prefilling = runs.maybe_prefilling, None
        first = self._pass(out, budget, now, True, deferred)
        first.run(leading_decodes(runs.requests, hint))
        if out.is_empty and runs.requests and not out.preempted:
            # every running prefill hit the consecutive-service cap: serve them anyway
            self._pass(out, budget, now, False, None).run()
            deferred = []
        if not out.preempted or policy.admit_after_preemption:
            self.admitter.admit(out, budget, self.max_running, now)
        self._serve_held(deferred, out, budget, now)
        if not out.prefill and first.capped and policy.cap_yields_only_to_prefill:
            self._serve_held(first.capped, out, budget, now)      # step 5: nobody took the step
        if out.prefill:
            budget.add_prefill(policy.extra_prefill_budget(out.prefill))
            if budget.prefill_left > 0:
                goes_first = policy.prefill_first(out.prefill, now) if len(out.prefill) > 1 else None
                self.admitter.top_up_prefills(out, budget, goes_first)
        return out

    def _pass(self, out: SchedulerOutput, budget: Budget, now: float, honor_cap: bool,
              deferred: list[Request] | None) -> RunningPass:
        return RunningPass(self.runs, self.admitter, out, budget,
                           self.max_consecutive_prefill_steps, self.num_steps, now,
                           honor_cap, deferred)

    def _serve_held(self, held: list[Request], out: SchedulerOutput, budget: Budget,
                    now: float) -> None:
        """Running prefills held back in the pass (the ones the policy put after new
        admissions, or the ones the cap held) get what budget is left, in running order."""
        pool = self.runs.pool
        for req in held:
            if req.status is not Status.RUNNING:
                continue                      # evicted while admitting
            n = min(req.num_uncomputed, self.policy.chunk_for(req, now), budget.prefill_left)
            if n > 0 and pool.can_grow(req, n):
                pool.grow(req, n)
                budget.take_prefill(n)
                req.consecutive_prefill += 1
                out.prefill.append((req, n))

    # -- apply --------------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, result: StepResult, now: float) -> list[Request]:
        """Apply the engine's result for ``out``; the requests that ended (``Applier``)."""
        return self.applier.update_from_output(out, result, now)

    def retire(self, failed: list[tuple[Request, Reason]], finished: list[Request],
               reached_max: list[Request], now: float) -> None:
        """End failed, finished and ``max_tokens`` requests and free their slots and KV."""
        self.applier.retire(failed, finished, reached_max, now)

    def count_by_tenant_and_class(self, reqs: list[Request]) -> tuple[dict[str, int], dict[str, int]]:
        """``reqs`` per tenant and per class, each dict in first-seen order (the applier's
        ``NameCounts``: what ``core.request.count_by_tenant_and_class`` gives, faster)."""
        return self.applier.name_counts.count(reqs)

    def record_decode_run(self, num_steps: int, num_decodes: int, ctx_sum: int) -> None:
        """``num_steps`` decode-only steps of ``num_decodes`` requests were applied at once
        (fast-forward), the last with context sum ``ctx_sum``: the counters and the last
        step's statistics are what stepping them would leave."""
        self.runs.step_stats = (num_decodes, ctx_sum, [])
        self.num_steps += num_steps       # as that many schedule() calls (numbers decode holds)
        self.num_fast_forwarded_steps += num_steps
        self.runs.maybe_prefilling = []   # every running request decodes

    def policy_wakeup(self, now: float) -> float:
        """When a blocked waiting request may become admissible without an arrival."""
        return self.policy.next_wakeup(now)

    def after_empty_step(self, now: float, next_arrival_s: float = float("inf")) -> float:
        """A step that scheduled and preempted nothing: when this scheduler can next make
        progress (the policy's next wake-up or ``next_arrival_s``, whichever comes first).
        When that is never and nothing runs, the waiting requests can never be admitted:
        they fail (``NEVER_ADMITTED``).  The simulator's run loop and serve's worker both
        take their empty steps here."""
        nxt = min(next_arrival_s, self.policy_wakeup(now))
        if nxt == float("inf") and not self.running:
            self.fail_waiting(NEVER_ADMITTED, now)
        return nxt

    def fail_waiting(self, reason: Reason, now: float) -> None:
        """Nothing can ever admit what still waits: end it with ``reason``."""
        def fail(req: Request) -> None:
            if req.status is Status.SWAPPED:
                self.runs.pool.drop_swapped(req)
            self.applier.end(req, Status.FAILED, reason, now)
        end_each_waiting(self.policy, now, fail)

    def check_invariants(self) -> None:
        self.runs.check(self.max_running)
