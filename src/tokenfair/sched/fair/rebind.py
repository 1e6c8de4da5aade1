"""A live contract change in a running fair policy: its tenants and min-share classes.

:meth:`FairPolicy.on_contract_change` re-derives what ``bind`` derived from the contract
(cost weights, WFQ credit, prefill rate, grace, headroom, preemption spec) and calls these two:

  :func:`retenant`  every known tenant takes its spec in the new contract (its own entry or
                    the default template): weight (the total, active and backlogged weights
                    follow; its queued head is re-keyed in the WFQ), min share, limits, rate
                    limit (the bucket is refilled to now under the old rate, then capped at
                    the new burst), queue bound; its queued cost is re-priced at the new
                    cost weights.  The guaranteed, rate-limited and reservation-owner lists
                    are rebuilt.
  :func:`reclass`   the classes with a min share: a class that gains one gets a reservation
                    heap holding every request of that class already queued (same ordering
                    keys as the tenant queues); a class that loses it drops its heap; kept
                    classes keep their heap and decayed service.

Nothing queued or running moves or ends: requests keep the class parameters (priority,
max wait, SLOs, deadline) they were admitted with.  O(tenants + queued requests).
"""

from __future__ import annotations

from ...contracts.contract import Contract
from .ordering import LazyHeap, best_head, live
from .state import FairState


def retenant(p: FairState, new: Contract, now: float) -> None:
    for name, t in p.tenants.items():
        spec = new.tenant(name)
        if now > t.bucket_t:
            p.admission.refill(t, now)              # the bucket up to now, under the old rate
        rl = spec.rate_limit
        if rl is None:
            t.bucket = 0.0
        elif t.spec.rate_limit is None:
            t.bucket, t.bucket_t = rl.burst_tokens, now
        else:
            t.bucket = min(t.bucket, rl.burst_tokens)
        dw = spec.weight - t.weight
        t.spec, t.weight = spec, spec.weight
        p.total_weight += dw
        if t.active:
            p.active_weight += dw
        if t.num_waiting:
            p.wfq.backlogged_weight += dw
        for klass, q in t.queues.items():
            t.queued_cost[klass] = sum(p.predicted_cost(e[-1]) for e in q.h if live(e))
        head = best_head(t.queues, now)
        t.head_cost = p.predicted_cost(head) if head is not None else 0.0
        p.wfq.update(t)
    tenants = list(p.tenants.values())
    p.guaranteed = [t for t in tenants if t.spec.min_share > 0]
    p.rate_limited = [t for t in tenants if t.spec.rate_limit is not None]
    p.admission.owners = [t for t in tenants if p.admission.reserved_slots(t) > 0]


def reclass(p: FairState, new: Contract) -> None:
    class_min = {k: s.min_share for k, s in new.classes.items() if s.min_share > 0}
    heaps: dict[str, LazyHeap] = {}
    waiting: dict[str, int] = {}
    for k in class_min:
        if k in p.class_heaps:
            heaps[k], waiting[k] = p.class_heaps[k], p.class_waiting[k]
            continue
        heaps[k], waiting[k] = LazyHeap(), 0
        for t in p.tenants.values():
            q = t.queues.get(k)
            for e in (q.h if q is not None else ()):
                if live(e):
                    heaps[k].push(tuple(e[:-2]), e[-1])
                    waiting[k] += 1
    p.class_recent = {k: p.class_recent.get(k, 0.0) for k in class_min}
    p.class_min, p.class_heaps, p.class_waiting = class_min, heaps, waiting
