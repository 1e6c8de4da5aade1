"""The fair policy's waiting requests: per (tenant, class) heaps in the in-queue order
(``ordering.py``), the global urgency views, and who is backlogged (``wfq.py``)."""

from __future__ import annotations

from ...contracts.contract import Contract
from ...core.request import Request
from .arrivals import ArrivalCosts
from .costs import RequestCost
from .ordering import Key, LazyHeap, best_head, live, order_key
from .tenant import TenantState
from .wfq import VirtualTimeWFQ


class WaitingQueue:
    """Every waiting request, once per view.

    Invariants: each waiting request ``r`` has one live entry (its ``qtoken``) in its
    tenant's heap for its class (``t.queues``), one in ``overdue`` keyed
    ``(enqueued + max_wait, seq)`` if it has a max wait, one in ``deadlines`` keyed
    ``(latest feasible start, seq)`` if it has a deadline, and one in ``class_heaps[k]`` if
    its class ``k`` has a min share; ``num_queued`` is the sum of ``t.num_waiting``,
    ``class_waiting[k]`` the waiting requests of class ``k`` and ``num_waiting_tpot`` the
    waiting requests with a TPOT SLO; ``backlogged`` holds exactly the tenants with waiting
    requests (each also backlogged in the WFQ); ``backlog_since_s``: since when some request
    has waited throughout (inf while none waits); ``t.head_cost`` is the predicted cost of
    ``t``'s best head (0 when it has none) after every change of its queue;
    ``t.arrivals[k]`` holds the same requests as ``t.queues[k]`` (``arrivals.py``)."""

    def __init__(self, contract: Contract, order: str, block_size: int, costs: RequestCost,
                 wfq: VirtualTimeWFQ, class_min: dict[str, float]) -> None:
        self.contract = contract
        self.order = order                  # "edf" or "fifo" (the key: ordering.py or arrival)
        self.block_size = block_size
        self.costs = costs
        self.wfq = wfq
        self.class_min = class_min          # class -> min share (> 0)
        self.class_heaps: dict[str, LazyHeap] = {k: LazyHeap() for k in class_min}
        self.class_waiting: dict[str, int] = {k: 0 for k in class_min}
        self.overdue = LazyHeap()
        self.deadlines = LazyHeap()
        self.backlogged: dict[str, TenantState] = {}
        self.num_queued = 0
        self.num_waiting_tpot = 0
        self.backlog_since_s = float("inf")

    def push(self, req: Request, t: TenantState, now: float, service_s: float) -> None:
        """``req`` of ``t`` waits from now; ``service_s``: its estimated service (used only
        when it has a deadline)."""
        req.qtoken += 1
        q = t.queues.get(req.klass)
        if q is None:
            q = t.queues[req.klass] = LazyHeap()
            t.arrivals[req.klass] = ArrivalCosts()
        cls = self.contract.classes.get(req.klass)
        base = cls.priority if cls is not None else req.priority
        key: Key = (req.enqueued_s, req.seq) if self.order == "fifo" else order_key(req, base, self.block_size)
        q.push(key, req)
        if req.max_wait_s is not None:
            self.overdue.push((req.enqueued_s + req.max_wait_s, req.seq), req)
        if req.deadline_s is not None:
            self.deadlines.push((req.deadline_s - service_s, req.seq), req)
        if req.klass in self.class_heaps:
            self.class_heaps[req.klass].push(key, req)
            self.class_waiting[req.klass] += 1
        t.num_waiting += 1
        cost = self.costs.predicted(req)
        t.queued_cost[req.klass] = t.queued_cost.get(req.klass, 0.0) + cost
        t.arrivals[req.klass].push(req, cost)
        if not self.num_queued:
            self.backlog_since_s = now
        self.num_queued += 1
        if req.tpot_slo_s is not None:
            self.num_waiting_tpot += 1
        first = t.num_waiting == 1
        if first:
            t.backlogged_since = now
        self.rekey(t, now)
        if first:
            self.backlogged[t.name] = t
            self.wfq.on_backlogged(t)
        else:
            self.wfq.update(t)

    def remove(self, req: Request, t: TenantState, now: float) -> None:
        """``req`` (waiting, of ``t``) leaves the queue; its heap entries go stale."""
        req.qtoken += 1
        t.num_waiting -= 1
        t.arrivals[req.klass].remove(req)
        left = t.queued_cost.get(req.klass, 0.0) - self.costs.predicted(req)
        t.queued_cost[req.klass] = max(0.0, left) if t.num_waiting else 0.0
        self.num_queued -= 1
        if req.tpot_slo_s is not None:
            self.num_waiting_tpot -= 1
        if not self.num_queued:
            self.backlog_since_s = float("inf")
        if req.klass in self.class_waiting:
            self.class_waiting[req.klass] -= 1
        if t.num_waiting == 0:
            del self.backlogged[t.name]
            self.wfq.on_idle(t)
        else:
            self.rekey(t, now)
            self.wfq.update(t)

    def reprice(self, t: TenantState, now: float) -> None:
        """The cost weights changed (a live contract change): ``t``'s queued cost and head
        cost at the new ones."""
        for klass, q in t.queues.items():
            queued = 0.0
            arrivals = t.arrivals[klass]
            for e in q.h:
                if live(e):
                    cost = self.costs.predicted(e[-1])
                    queued += cost
                    arrivals.reprice(e[-1], cost)
            t.queued_cost[klass] = queued
        self.rekey(t, now)

    def reclass(self, new: Contract, tenants: list[TenantState]) -> None:
        """A live contract change: ``new``'s classes with a min share.  A class that gains one
        gets a reservation heap holding every request of that class already queued (the
        same ordering keys as the tenant queues); one that loses it drops its heap; kept
        classes keep theirs.  O(queued requests of the new classes)."""
        self.contract = new
        class_min = {k: s.min_share for k, s in new.classes.items() if s.min_share > 0}
        heaps: dict[str, LazyHeap] = {}
        waiting: dict[str, int] = {}
        for k in class_min:
            if k in self.class_heaps:
                heaps[k], waiting[k] = self.class_heaps[k], self.class_waiting[k]
                continue
            heap = LazyHeap()
            count = 0
            for t in tenants:
                q = t.queues.get(k)
                if q is not None:
                    for e in q.h:
                        if live(e):
                            heap.push(tuple(e[:-2]), e[-1])
                            count += 1
            heaps[k], waiting[k] = heap, count
        self.class_min, self.class_heaps, self.class_waiting = class_min, heaps, waiting

    def rekey(self, t: TenantState, now: float) -> None:
        head = best_head(t.queues, now)
        t.head_cost = self.costs.predicted(head) if head is not None else 0.0
