"""Deadlines and preemption of the fair policy: who fails fast, who is evicted, how.

* ``expire``: a waiting request whose deadline is nearer than its estimated service (the
  prompt's prefill from the cost model plus its predicted decode steps at the recent step
  time) expires now with a reason instead of consuming capacity (deadline heap, O(log n));
* ``victim_for_kv`` / ``preempt_mode``: the victim and the swap-or-recompute choice belong to
  ``preemption.PreemptionPolicy`` (lowest urgency, most over its share, least recovery cost);
* ``urgent_victim``: an overdue or below-min-share waiting request may evict one running
  request, only after the cool-down and when the wait it saves exceeds the recovery cost.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ...core.request import Request
from .state import FairState


@mypyc_attr(allow_interpreted_subclasses=True)
class UrgencyMixin(FairState):
    """Part of :class:`FairPolicy`; uses its tenants, WFQ, deadlines heap and preemption."""

    def estimate_service_s(self, req: Request) -> float:
        prefill = self.profile.step_s([(req.num_uncomputed, 0)], 0, 0) if req.num_uncomputed > 1 else 0.0
        return prefill + req.predicted_remaining * self.step_ewma_s

    def expire(self, now: float) -> list[tuple[Request, str]]:
        out: list[tuple[Request, str]] = []
        while True:
            e = self.deadlines.top()
            if e is None or e[0] >= now:
                return out
            self.deadlines.pop()
            req: Request = e[-1]
            deadline_s = req.deadline_s
            assert deadline_s is not None            # only requests with a deadline are pushed
            left = deadline_s - now
            out.append((req, f"deadline_infeasible: needs ~{self.estimate_service_s(req):.2f}s, "
                             f"{max(0.0, left):.2f}s left before the deadline"))
            self.take(req)

    def victim_for_kv(self, candidates: list[Request], needing: Request, now: float) -> Request | None:
        victim = self.preemption.choose(candidates, now, self.overshare)
        if victim is None:
            return None
        p = self.preemption
        if p.key(victim, now, self.overshare(victim)) > p.key(needing, now, self.overshare(needing)):
            return needing
        return victim

    def preempt_mode(self, req: Request) -> str:
        return self.preemption.mode(req)

    def urgent_victim(self, cand: Request, running: list[Request], now: float) -> Request | None:
        p = self.preemption
        if not running or not p.cooled_down(now):
            return None
        overdue = cand.max_wait_s is not None and now - cand.enqueued_s >= cand.max_wait_s
        t = self.tenants[cand.tenant]
        # a guaranteed tenant below its share takes capacity back by eviction only when the
        # contract says so (borrowing.reclaim: preempt); otherwise by no longer admitting others
        evict_for_owner = self.contract.borrowing.reclaim == "preempt"
        below = (evict_for_owner and t.spec.min_share > 0 and self.recent_total > 0
                 and t.decayed_recent(now, self.share_tau_s) / self.recent_total < t.spec.min_share)
        reclaim = evict_for_owner and len(t.running) < self.admission.reserved_slots(t)
        if not (overdue or below or reclaim):
            return None
        cand_prio = cand.priority + cand.aging_rate * (now - cand.enqueued_s)
        if reclaim and not (overdue or below):
            # an owner takes back its lent reservation: only borrowers (tenants running more
            # than their own reservation) can be evicted for it
            pool = [r for r in running if r.tenant != cand.tenant
                    and len(self.tenants[r.tenant].running) > self.admission.reserved_slots(self.tenants[r.tenant])]
        else:
            pool = [r for r in running if r.tenant != cand.tenant
                    and (r.priority + r.aging_rate * (now - r.enqueued_s) < cand_prio
                         or self.overshare(r) > self.overshare(cand))]
        victim = p.choose(pool, now, self.overshare)
        if victim is None:
            return None
        natural_wait = self.step_ewma_s * min(r.predicted_remaining for r in running)
        if not p.worth_it(victim, natural_wait):
            return None
        p.last_urgent_s = now
        return victim
