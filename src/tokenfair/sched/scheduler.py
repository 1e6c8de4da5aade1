"""Iteration-level mechanics shared by every policy (decide, then apply).

One call to :meth:`IterationScheduler.schedule` builds one engine step:

1. the policy expires waiting requests that can no longer meet their deadline;
2. running requests first, oldest first: a decode token each (decode budget), or the next
   prefill chunk (prefill budget, ``chunk_size``, at most ``max_consecutive_prefill_steps``
   in a row while others wait); a request whose KV cannot grow evicts a victim the policy
   picks among the not-yet-scheduled running requests (or itself); decodes the policy
   holds for this step (``Policy.decode_hold``) wait, never two steps in a row;
3. waiting requests in the policy's order while slots, prefill budget and KV allow
   (swapped ones are swapped back in); a candidate that does not fit blocks the queue
   (``hol_blocking``) or only its tenant for this step;
4. if the policy names an urgent waiting request that could not start, it may evict one
   running request for it (cost-checked by the policy).  Steps 3-4 and eviction live in
   ``sched/admit.py``.

:meth:`update_from_output` applies the engine's result (``sched/apply.py``).  Invariants
(checked by ``check_invariants`` in tests): every non-terminal request is in exactly one of
running / waiting; KV blocks are conserved (``kv.BlockPool``); each request ends in exactly
one terminal status with a reason.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.kv import BlockPool
from ..core.request import Request, Status
from .admit import AdmitMixin
from .bulk import bulk_decodes, leading_decodes
from .interface import SchedulerOutput
from .policy import Budget, Policy
from .predictor import OnlinePredictor, Predictor


@mypyc_attr(allow_interpreted_subclasses=True)     # tests wrap it with invariant checks
class IterationScheduler(AdmitMixin):
    def __init__(self, policy: Policy, contract: Contract, profile: Profile,
                 predictor: Predictor | None = None) -> None:
        self.policy = policy
        self.contract = contract
        self.profile = profile
        self.pool = BlockPool(profile.num_blocks, profile.block_size,
                              profile.swap_capacity_tokens // profile.block_size)
        self.predictor = predictor or OnlinePredictor()
        policy.bind(contract, profile, self.pool, self.predictor)
        self.running: list[Request] = []
        self.ended: list[Request] = []          # terminal requests not yet collected by the loop
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.num_swapped_blocks = 0
        self.num_steps = 0                      # schedule() calls (numbers held-decode runs)
        self.num_fast_forwarded_steps = 0       # of num_steps, those applied by sim/fastforward.py
        self.step_stats: tuple[int, int, list[Request]] = (0, 0, [])   # last step: decodes, ctx sum, prefills
        # after the last step: the only running requests that may not be decoding (None: unknown)
        self.maybe_prefilling: list[Request] | None = []

    # -- intake -------------------------------------------------------------------------
    def add_request(self, req: Request, now: float) -> None:
        req.predicted_output = self.predictor.predict(req)
        reason = self.policy.on_arrival(req, now)
        if reason is not None:
            self._end(req, Status.REJECTED, reason, now)
            return
        req.status = Status.WAITING
        self.policy.enqueue(req, now)

    def reject(self, req: Request, reason: str, now: float) -> None:
        """End a request refused at intake, before it ever entered the queue."""
        self._end(req, Status.REJECTED, reason, now)

    def has_work(self) -> bool:
        return bool(self.running) or self.policy.num_waiting() > 0

    def abort(self, req: Request, status: Status, reason: str, now: float) -> None:
        """End a request from outside (client gone, shutdown): frees its slot and KV at once."""
        if req.status.is_terminal:
            return
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self.pool.release(req)
        else:
            if req.status is Status.SWAPPED:
                self.pool.host_used -= self.pool.blocks_for(req.num_computed)
            self.policy.discard(req)
        self._end(req, status, reason, now)

    # -- decide -------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        out = SchedulerOutput()
        self.num_steps += 1
        eng = self.contract.engine
        policy = self.policy
        pool = self.pool
        for req, reason in policy.expire(now):
            if req.status is Status.SWAPPED:
                pool.host_used -= pool.blocks_for(req.num_computed)
            self._end(req, Status.EXPIRED, reason, now)
            out.aborted.append(req)
        budget = Budget(policy.prefill_budget(self.step_stats, now), eng.decode_token_budget, policy.shared_budget)
        max_chunk = policy.max_chunk()
        deferred: list[Request] = []
        hint, self.maybe_prefilling = self.maybe_prefilling, None
        self._schedule_running(out, budget, max_chunk, now, honor_cap=True, deferred=deferred,
                               bulk=leading_decodes(self.running, hint))
        if out.is_empty and self.running and not out.preempted:
            # every running prefill hit the consecutive-service cap: serve them anyway
            self._schedule_running(out, budget, max_chunk, now, honor_cap=False, deferred=None)
            deferred = []
        if not out.preempted or policy.admit_after_preemption:
            self._admit(out, budget, max_chunk, now)
        for req in deferred:
            # prefills the policy put after new admissions get what budget is left
            if req.status is not Status.RUNNING:
                continue                      # evicted while admitting
            n = min(req.num_uncomputed, policy.chunk_for(req, now), budget.prefill_left)
            if n > 0 and self.pool.can_grow(req, n):
                self.pool.grow(req, n)
                budget.take_prefill(n)
                req.consecutive_prefill += 1
                out.prefill.append((req, n))
        if budget.prefill_left > 0 and out.prefill:
            self._top_up_prefills(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: Budget, max_chunk: int, now: float,
                          honor_cap: bool, deferred: list[Request] | None, bulk: int = 0) -> None:
        """Running requests in admission order.  The ``bulk`` leading ones, known to decode,
        go at once (``bulk.bulk_decodes``); then decodes take the fast path (O(1) each: a new KV
        block only when the context crosses a block boundary), prefills and KV shortage the
        general one.  Also records this step's decode count, context sum and running
        prefills in ``step_stats`` for the policy's next budget decision."""
        eng = self.contract.engine
        policy, pool, running = self.policy, self.pool, self.running
        bs = pool.block_size
        kept: list[Request] = []
        decode = out.decode
        prefilling: list[Request] = []
        num_prefilling = len(self.step_stats[2]) + policy.num_waiting()   # prefills last step (O(1))
        cap = eng.max_consecutive_prefill_steps
        shared = budget.shared
        ctx_sum = 0
        i = 0
        hold = policy.decode_hold()
        held = hold.tenants if hold is not None else None
        step_no = self.num_steps
        num_held = ctx_held = 0
        if bulk:
            i, ctx_sum, num_held, ctx_held = bulk_decodes(running, pool, out, budget, bulk, hold, step_no)
            kept.extend(running[:i])
        n_running = len(running)
        while i < n_running:
            req = running[i]
            i += 1
            if req.num_output and req.prompt_tokens + req.num_output - req.num_computed == 1:
                # decode fast path
                left = budget.prefill_left if shared else budget.decode_left
                if (hold is not None and held is not None and hold.num_to_hold > 0 and req.tenant in held
                        and req.last_held_step != step_no - 1):   # never two steps in a row
                    req.last_held_step = step_no
                    hold.num_to_hold -= 1
                    kept.append(req)
                    num_held += 1                   # still part of the decode batch to plan for
                    ctx_held += req.num_computed
                    continue
                if left <= 0:
                    kept.append(req)
                    continue
                if req.num_computed >= req.blocks * bs:
                    while pool.num_free == 0 and self._make_room(req, running, i, out, now):
                        pass
                    n_running = len(running)
                    if req.status is not Status.RUNNING:
                        continue
                    pool.num_free -= 1
                    req.blocks += 1
                    pool.held[req.tenant] += 1
                if shared:
                    budget.prefill_left -= 1
                else:
                    budget.decode_left -= 1
                kept.append(req)
                decode.append(req)
                ctx_sum += req.num_computed
                continue
            prefilling.append(req)
            if deferred is not None and policy.defer_prefill(req, now):
                deferred.append(req)
                kept.append(req)
                continue
            n = min(req.num_uncomputed, policy.chunk_for(req, now), budget.prefill_left)
            if n <= 0 or (honor_cap and req.consecutive_prefill >= cap and num_prefilling > 1):
                req.consecutive_prefill = 0
                kept.append(req)
                continue
            while not pool.can_grow(req, n):
                if not self._make_room(req, running, i, out, now):
                    break
            n_running = len(running)
            if req.status is not Status.RUNNING:
                continue
            pool.grow(req, n)
            kept.append(req)
            budget.take_prefill(n)
            req.consecutive_prefill += 1
            out.prefill.append((req, n))
        self.running = kept
        self.step_stats = (len(decode) + num_held, ctx_sum + ctx_held, prefilling)

    def policy_wakeup(self, now: float) -> float:
        """When a blocked waiting request may become admissible without an arrival."""
        return self.policy.next_wakeup(now)

    def fail_waiting(self, reason: str, now: float) -> None:
        while True:
            req = self.policy.pick(now, set())
            if req is None:
                return
            self.policy.take(req)
            if req.status is Status.SWAPPED:
                self.pool.host_used -= self.pool.blocks_for(req.num_computed)
            self._end(req, Status.FAILED, reason, now)

    def check_invariants(self) -> None:
        held = sum(r.blocks for r in self.running)
        assert held + self.pool.num_free == self.pool.num_blocks, (held, self.pool.num_free)
        per_tenant: dict[str, int] = {}
        for r in self.running:
            per_tenant[r.tenant] = per_tenant.get(r.tenant, 0) + r.blocks
        assert {t: b for t, b in self.pool.held.items() if b} == {t: b for t, b in per_tenant.items() if b}
        assert all(r.status is Status.RUNNING for r in self.running)
        assert len({id(r) for r in self.running}) == len(self.running)
        assert len(self.running) <= self.contract.engine.max_running
