"""Layer 1: tenant quota and class reservation (admission).

Checks, each O(1) except the KV quota (O(running requests of the tenant)):
  * bounded queue: a request beyond ``max_queued`` waiting requests is rejected at arrival;
  * concurrency: ``len(running) < max_concurrency``;
  * token rate: a bucket in cost units refilled at ``tokens_per_s`` up to ``burst_tokens``;
    a request may start while the bucket is >= 0 and is charged its predicted cost (the
    bucket may go negative once, so a request larger than the burst still runs);
  * KV quota: blocks held + blocks for prompt and predicted output <= quota;
  * reservations: tenant i reserves ``r_i = floor(min_share_i * max_running)`` slots.  Idle
    reserved slots are lent (borrowing enabled); when an owner has waiting requests and runs
    fewer than r_i, other tenants' *new* requests are not admitted into its unmet
    reservation (reclaim by not admitting, never by killing running requests; with
    ``reclaim: preempt`` the preemption layer may also evict a borrower).
"""

from __future__ import annotations

import math

from ...contracts.contract import Contract
from ...core.kv import BlockPool
from ...core.reasons import Reason, ReasonCode
from ...core.request import Request
from .tenant import TenantState


class AdmissionControl:
    def __init__(self, contract: Contract, pool: BlockPool) -> None:
        self.contract = contract
        self.pool = pool
        self.max_running = contract.engine.max_running
        self.owners: list[TenantState] = []   # tenants with a reservation

    def rebind(self, new: Contract, tenants: list[TenantState]) -> None:
        """A live contract change: the new bounds; ``tenants`` (with their new specs) decide
        who owns a reservation."""
        self.contract = new
        self.max_running = new.engine.max_running
        self.owners = [t for t in tenants if self.reserved_slots(t) > 0]

    def register(self, t: TenantState) -> None:
        if self.reserved_slots(t) > 0:
            self.owners.append(t)

    def reserved_slots(self, t: TenantState) -> int:
        return int(math.floor(t.spec.min_share * self.max_running))

    def on_arrival(self, t: TenantState, req: Request) -> Reason | None:
        if t.num_waiting >= t.spec.max_queued:
            return Reason(ReasonCode.QUEUE_FULL,
                          f"tenant {t.name!r} has {t.num_waiting} queued (max_queued {t.spec.max_queued})")
        return None

    def refill(self, t: TenantState, now: float) -> None:
        rl = t.spec.rate_limit
        if rl is None:
            return
        t.bucket = bucket_level(t, now)
        t.bucket_t = now

    def can_admit(self, t: TenantState, req: Request, num_running: int, cost: float, now: float) -> bool:
        return (self.within_limits(t, req.prompt_tokens + req.predicted_output, now)
                and self._reservation_allows(t, num_running))

    def within_limits(self, t: TenantState, num_tokens: int, now: float) -> bool:
        """The contract's hard limits on ``t`` for one more request that will hold
        ``num_tokens`` tokens of KV: max_concurrency, the token bucket, the KV quota (not
        the slot reservations)."""
        spec = t.spec
        if spec.max_concurrency is not None and len(t.running) >= spec.max_concurrency:
            return False
        if spec.rate_limit is not None:
            self.refill(t, now)
            if t.bucket < 0:
                return False
        quota = spec.kv_quota_blocks or (self.pool.blocks_for(spec.kv_quota_tokens) if spec.kv_quota_tokens else None)
        return quota is None or not t.running or t.kv_blocks() + self.pool.blocks_for(num_tokens) <= quota

    def _reservation_allows(self, t: TenantState, num_running: int) -> bool:
        if not self.owners:
            return True
        lend = self.contract.borrowing.enabled
        unmet = 0
        for o in self.owners:
            if o is t:
                continue
            if lend and o.num_waiting == 0:
                continue               # idle reservation: lent out
            unmet += max(0, self.reserved_slots(o) - len(o.running))
        return self.max_running - num_running - 1 >= unmet

    def on_admit(self, t: TenantState, cost: float) -> None:
        if t.spec.rate_limit is not None:
            t.bucket -= cost

    def wakeup(self, tenants: list[TenantState], now: float) -> float:
        """Earliest time a rate-limited tenant with waiting work has a non-negative bucket."""
        best = math.inf
        for t in tenants:
            rl = t.spec.rate_limit
            if rl is None or t.num_waiting == 0:
                continue
            self.refill(t, now)
            if t.bucket < 0:
                best = min(best, now + (-t.bucket) / rl.tokens_per_s + 1e-9)
        return best


def bucket_level(t: TenantState, now: float) -> float:
    """``t``'s token bucket refilled to ``now`` (not written back); ``t`` has a rate limit."""
    rl = t.spec.rate_limit
    assert rl is not None
    return min(rl.burst_tokens, t.bucket + (now - t.bucket_t) * rl.tokens_per_s)
