"""One pass over the running requests while a step is built (the mechanics' running side).

:class:`RunningPass` is built by :meth:`IterationScheduler.schedule
<tokenfair.sched.scheduler.IterationScheduler.schedule>` for each pass and holds what the
pass has built so far.  Running requests go in admission order.  The ``bulk`` leading ones,
known to decode, go at once (``bulk.bulk_decodes``); then decodes take the fast path (O(1)
each: a new KV block only when the context crosses a block boundary), prefills and KV
shortage the general one.  Decodes the policy holds for this step (``Policy.decode_hold``)
wait, never two steps in a row.  A request whose KV cannot grow evicts a victim the policy
picks among the not-yet-scheduled running requests, or itself (``Admitter.make_room``).
"""

from __future__ import annotations

from ..core.request import Request, Status
from .admit import Admitter
from .bulk import bulk_decodes
from .interface import SchedulerOutput
from .policy import Budget
from .state import RunningSet


class RunningPass:
    """Invariants while ``run`` goes: ``running[:i]`` have been visited, and each visited
    request still RUNNING is in ``kept`` once, in running order (a victim evicted by
    ``make_room`` is removed from ``running``, so ``n_running`` follows it); ``out.decode``
    and ``out.prefill`` hold only kept requests, with their KV grown for the step."""

    def __init__(self, runs: RunningSet, admitter: Admitter, out: SchedulerOutput, budget: Budget,
                 max_consecutive_prefill_steps: int, step_no: int, now: float,
                 honor_cap: bool, deferred: list[Request] | None) -> None:
        self.runs = runs
        self.admitter = admitter
        self.out = out
        self.budget = budget
        self.cap = max_consecutive_prefill_steps
        self.step_no = step_no              # numbers held decodes
        self.now = now
        self.honor_cap = honor_cap          # False: serve prefills past the consecutive cap
        self.deferred = deferred            # None: no prefill may be deferred this pass
        self.running = runs.requests
        self.kept: list[Request] = []
        self.prefilling: list[Request] = []
        self.capped: list[Request] = []     # prefills that sat this pass out for the cap
        policy = admitter.policy
        self.num_prefilling = len(runs.step_stats[2]) + policy.num_waiting()   # prefills last step (O(1))
        self.hold = policy.decode_hold()
        self.ctx_sum = 0                    # context of the decodes scheduled
        self.num_held = 0                   # decodes held: still part of the batch to plan for
        self.ctx_held = 0
        self.i = 0
        self.n_running = len(self.running)

    def run(self, bulk: int = 0) -> None:
        """Schedule every running request; then record this step's decode count, context sum
        and running prefills in ``runs.step_stats`` for the policy's next budget decision."""
        running, kept = self.running, self.kept
        if bulk:
            self.i, self.ctx_sum, self.num_held, self.ctx_held = bulk_decodes(
                running, self.runs.pool, self.out, self.budget, bulk, self.hold, self.step_no)
            kept.extend(running[:self.i])
        while self.i < self.n_running:
            req = running[self.i]
            self.i += 1
            if req.num_output and req.prompt_tokens + req.num_output - req.num_computed == 1:
                self._decode(req)
            else:
                self._prefill(req)
        self.runs.requests = kept
        self.runs.step_stats = (len(self.out.decode) + self.num_held, self.ctx_sum + self.ctx_held,
                                self.prefilling)

    def _decode(self, req: Request) -> None:
        """The decode fast path: one token, one more block if its context fills the last."""
        budget, hold = self.budget, self.hold
        left = budget.prefill_left if budget.shared else budget.decode_left
        if (hold is not None and hold.num_to_hold > 0 and req.tenant in hold.tenants
                and req.last_held_step != self.step_no - 1):   # never two steps in a row
            req.last_held_step = self.step_no
            hold.num_to_hold -= 1
            self.kept.append(req)
            self.num_held += 1
            self.ctx_held += req.num_computed
            return
        if left <= 0:
            self.kept.append(req)
            return
        pool = self.runs.pool
        if pool.needs_block(req):
            while not pool.can_add_blocks(1) and self.admitter.make_room(
                    req, self.running, self.i, self.out, self.now):
                pass
            self.n_running = len(self.running)
            if req.status is not Status.RUNNING:
                return
            pool.add_block(req)
        budget.take_decode()
        self.kept.append(req)
        self.out.decode.append(req)
        self.ctx_sum += req.num_computed

    def _prefill(self, req: Request) -> None:
        """A prefill's next chunk (unless deferred or capped), evicting for its KV if needed."""
        policy, now = self.admitter.policy, self.now
        self.prefilling.append(req)
        if self.deferred is not None and policy.defer_prefill(req, now):
            self.deferred.append(req)
            self.kept.append(req)
            return
        budget = self.budget
        n = min(req.num_uncomputed, policy.chunk_for(req, now), budget.prefill_left)
        if n <= 0 or (self.honor_cap and req.consecutive_prefill >= self.cap and self.num_prefilling > 1):
            if n > 0:
                self.capped.append(req)
            req.consecutive_prefill = 0
            self.kept.append(req)
            return
        pool = self.runs.pool
        while not pool.can_grow(req, n):
            if not self.admitter.make_room(req, self.running, self.i, self.out, now):
                break
        self.n_running = len(self.running)
        if req.status is not Status.RUNNING:
            return
        pool.grow(req, n)
        self.kept.append(req)
        budget.take_prefill(n)
        req.consecutive_prefill += 1
        self.out.prefill.append((req, n))
