"""Which waiting request goes next: the fair policy's ``pick`` (module docstring of
:mod:`.policy` for the order; :mod:`.guarantee` for forced heads and their reservation)."""

from __future__ import annotations

from typing import Final

from ...core.request import Request
from .admission import AdmissionControl
from .costs import RequestCost
from .guarantee import STARVING_LEAD_CREDITS, ServiceGuarantee
from .ordering import best_head, live
from .queue import WaitingQueue
from .roster import TenantRoster
from .shares import ShareMeter
from .tenant import TenantState
from .wfq import VirtualTimeWFQ


# waiting requests of a starving tenant looked at for a stand-in (per class queue)
STAND_IN_LOOK: Final = 64


def _ttft_deadline(r: Request | None) -> tuple[float, int]:
    """Among light tenants (all within their share) the next admission is the head whose
    first-token deadline comes first: a burst of light requests is served in arrival order
    (for equal SLOs) rather than by finish tag, which minimises the worst TTFT among them.
    ``r``: a backlogged tenant's head, which exists (``None`` only as ``best_head`` types it)."""
    assert r is not None
    return (r.enqueued_s + (r.ttft_slo_s or 0.0), r.seq)


class Picker:
    """Invariant: ``reserve`` is the forced head found by the last :meth:`pick` that could
    not be admitted for room (KV blocks or a slot), until it is admitted or the next pick
    (None: no reservation); ``forced_head`` the forced head the last :meth:`pick` returned
    (None: it returned none); ``min_grace_s`` the shortest starving grace of any class."""

    def __init__(self, queue: WaitingQueue, roster: TenantRoster, meter: ShareMeter, admission: AdmissionControl,
                 wfq: VirtualTimeWFQ, costs: RequestCost, guarantee: ServiceGuarantee, min_grace_s: float) -> None:
        self.queue = queue
        self.roster = roster
        self.meter = meter
        self.admission = admission
        self.wfq = wfq
        self.costs = costs
        self.guarantee = guarantee
        self.min_grace_s = min_grace_s
        self.reserve: Request | None = None
        self.forced_head: Request | None = None

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        self.reserve = self.forced_head = None
        forced = self.forced(now)
        if forced is not None:
            if forced.tenant not in blocked:
                self.forced_head = forced
                return forced
            t = self.roster.tenants[forced.tenant]
            if self.admission.can_admit(t, forced, self.roster.num_running, self.costs.predicted(forced), now):
                self.reserve = forced           # it did not fit: keep room for it (guarantee.py)
        if self.roster.guaranteed or self.queue.class_min:
            r = self.below_guarantee(now, blocked)
            if r is not None:
                return r
        meter = self.meter
        picked = self.wfq.pick(blocked, prefer=lambda x: meter.is_light(x, now),
                               among=lambda x: _ttft_deadline(best_head(x.queues, now)))
        return best_head(picked.queues, now) if picked is not None else None

    def forced(self, now: float) -> Request | None:
        """A head that must be served next (guarantee.py): an overdue request of a tenant
        within its share, else the longest-starving tenant's past its grace."""
        e = self.queue.overdue.top()
        if e is not None:
            due: float = e[0]
            overdue: Request = e[-1]
            if due <= now and self.wfq.within_share(self.roster.tenants[overdue.tenant]):
                return overdue
        return self.guarantee.due(now, self.min_grace_s, lambda t: self.starving_head(t, now),
                                   self.may_force_starving)

    def may_force_starving(self, t: TenantState) -> bool:
        """A starving tenant's head may be forced: it is within its share, or its finish tag
        is within ``STARVING_LEAD_CREDITS`` credits of V (guarantee.py)."""
        wfq = self.wfq
        return wfq.within_share(t) or wfq.within_lead(t, STARVING_LEAD_CREDITS)

    def starving_head(self, t: TenantState, now: float) -> Request | None:
        """What a starving tenant is served first: its head, or -- when the head's prompt does
        not fit the free KV blocks now -- its waiting request with the fewest tokens among the
        front ``STAND_IN_LOOK`` entries of each class queue (the head if none has fewer).
        Any of its requests ends its service gap, and the smaller one's room comes sooner
        (the room a forced request waits for is its reservation).  O(1) when the head fits,
        else O(classes x STAND_IN_LOOK)."""
        head = best_head(t.queues, now)
        pool = self.admission.pool
        if head is None or pool.blocks_for(head.num_tokens + 1) <= pool.num_free:
            return head
        best = head
        for q in t.queues.values():
            for e in q.front(STAND_IN_LOOK):
                r: Request = e[-1]
                if live(e) and r.num_tokens < best.num_tokens:
                    best = r
        return best

    def below_guarantee(self, now: float, blocked: set[str]) -> Request | None:
        """The head of the guaranteed tenant or min-share class furthest below its min share
        of recent service (None: none is below, or all such are blocked)."""
        meter = self.meter
        total = meter.recent_total
        if total <= 0:
            return None
        best: Request | None = None
        best_gap = 0.0
        for t in self.roster.guaranteed:
            if t.num_waiting and t.name not in blocked:
                gap = t.spec.min_share - t.decayed_recent(now, meter.share_tau_s) / total
                if gap > best_gap:
                    best, best_gap = best_head(t.queues, now), gap
        queue = self.queue
        for k, share in queue.class_min.items():
            if queue.class_waiting[k]:
                gap = share - meter.class_recent[k] / total
                e = queue.class_heaps[k].top()
                if gap > best_gap and e is not None:
                    head: Request = e[-1]
                    if head.tenant not in blocked:
                        best, best_gap = head, gap
        return best
