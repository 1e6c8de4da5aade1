"""Deadlines and victims of the fair policy: who fails fast, who is evicted, how.

* ``next_expired``: a waiting request whose deadline is nearer than its estimated service
  (the prompt's prefill from the cost model plus its predicted decode steps at the recent
  step time) expires now with a reason instead of consuming capacity (deadline heap,
  O(log n));
* ``victim_for_kv``: the victim and the swap-or-recompute choice belong to
  ``preemption.PreemptionPolicy`` (lowest urgency, most over its share, least recovery cost);
* ``urgent_victim``: an overdue request of a tenant within its share, or a below-min-share
  waiting request, may evict one running request, only after the cool-down and when the
  wait it saves exceeds the recovery cost.
"""

from __future__ import annotations

from ...contracts.contract import Contract
from ...core.costmodel import Profile
from ...core.reasons import Reason, ReasonCode
from ...core.request import Request
from .admission import AdmissionControl
from .ordering import LazyHeap
from .preemption import PreemptionPolicy
from .roster import TenantRoster
from .shares import ShareMeter
from .steptime import StepTimer
from .wfq import VirtualTimeWFQ


class Urgency:
    """Invariants: none of its own beyond its parts' (``deadlines`` is the waiting queue's
    heap of latest feasible starts, ``queue.py``; the preemption cool-down is in
    ``preemption``); it reads the step timer, the tenants' over-service and min shares."""

    def __init__(self, contract: Contract, profile: Profile, preemption: PreemptionPolicy,
                 admission: AdmissionControl, roster: TenantRoster, meter: ShareMeter, wfq: VirtualTimeWFQ,
                 step_time: StepTimer, deadlines: LazyHeap) -> None:
        self.contract = contract
        self.profile = profile
        self.preemption = preemption
        self.admission = admission
        self.roster = roster
        self.meter = meter
        self.wfq = wfq
        self.step_time = step_time
        self.deadlines = deadlines

    def estimate_service_s(self, req: Request) -> float:
        prefill = self.profile.step_s([(req.num_uncomputed, 0)], 0, 0) if req.num_uncomputed > 1 else 0.0
        return prefill + req.predicted_remaining * self.step_time.ewma_s

    def overshare(self, r: Request) -> float:
        """How far ``r``'s tenant is ahead of the system virtual time (``wfq.py``)."""
        return self.roster.tenants[r.tenant].vtime - self.wfq.vnow

    def next_expired(self, now: float) -> tuple[Request, Reason] | None:
        """The next waiting request past its latest feasible start, with the reason (its
        deadline entry popped; the caller takes it off the queue), or None."""
        e = self.deadlines.top()
        if e is None or e[0] >= now:
            return None
        self.deadlines.pop()
        req: Request = e[-1]
        deadline_s = req.deadline_s
        assert deadline_s is not None            # only requests with a deadline are pushed
        left = deadline_s - now
        return (req, Reason(ReasonCode.DEADLINE_INFEASIBLE, f"needs ~{self.estimate_service_s(req):.2f}s, "
                                                            f"{max(0.0, left):.2f}s left before the deadline"))

    def victim_for_kv(self, candidates: list[Request], needing: Request, now: float) -> Request | None:
        p = self.preemption
        victim = p.choose(candidates, now, self.overshare)
        if victim is None:
            return None
        if p.key(victim, now, self.overshare(victim)) > p.key(needing, now, self.overshare(needing)):
            return needing
        return victim

    def urgent_victim(self, cand: Request, running: list[Request], now: float) -> Request | None:
        p = self.preemption
        if not running or not p.cooled_down(now):
            return None
        tenants = self.roster.tenants
        t = tenants[cand.tenant]
        # overdue counts for a tenant within its share only (as for forced service,
        # guarantee.py): a flood's own overdue requests evict no one
        overdue = (cand.max_wait_s is not None and now - cand.enqueued_s >= cand.max_wait_s
                   and self.wfq.within_share(t))
        # a guaranteed tenant below its share takes capacity back by eviction only when the
        # contract says so (borrowing.reclaim: preempt); otherwise by no longer admitting others
        evict_for_owner = self.contract.borrowing.reclaim == "preempt"
        meter = self.meter
        below = (evict_for_owner and t.spec.min_share > 0 and meter.recent_total > 0
                 and t.decayed_recent(now, meter.share_tau_s) / meter.recent_total < t.spec.min_share)
        reclaim = evict_for_owner and len(t.running) < self.admission.reserved_slots(t)
        if not (overdue or below or reclaim):
            return None
        cand_prio = cand.priority + cand.aging_rate * (now - cand.enqueued_s)
        if reclaim and not (overdue or below):
            # an owner takes back its lent reservation: only borrowers (tenants running more
            # than their own reservation) can be evicted for it
            pool = [r for r in running if r.tenant != cand.tenant
                    and len(tenants[r.tenant].running) > self.admission.reserved_slots(tenants[r.tenant])]
        else:
            pool = [r for r in running if r.tenant != cand.tenant
                    and (r.priority + r.aging_rate * (now - r.enqueued_s) < cand_prio
                         or self.overshare(r) > self.overshare(cand))]
        victim = p.choose(pool, now, self.overshare)
        if victim is None:
            return None
        natural_wait = self.step_time.ewma_s * min(r.predicted_remaining for r in running)
        if not p.worth_it(victim, natural_wait):
            return None
        p.last_urgent_s = now
        return victim
