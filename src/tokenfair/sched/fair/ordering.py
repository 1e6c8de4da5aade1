"""Layer 3: order inside a tenant's queue, and the global urgency views.

Per (tenant, class) a heap ordered by *virtual deadline* (EDF with aging folded in)::

    vd(r) = min(order_deadline(r), enqueued(r) + max_wait(class)) + lowered_priority_penalty(r)
    key   = (vd, predicted remaining cost, KV blocks needed, seq)

so requests with a contract deadline sooner than the class's wait bound go first (EDF),
others in arrival order, and predicted remaining tokens and KV cost break ties.  A request
keeps its place whether or not it can still get its first token within the max wait: one
that cannot is shed from the queue by a review as its max wait nears (``review.py``), not
passed.  Across a tenant's classes the head with the highest effective priority wins
(:func:`best_head`)::

    effective_priority = base_priority + aging_rate * waiting_s

Global views (lazy heaps, O(log n) per push/pop):
  * overdue:  (enqueued + max_wait) -- a request past its class's max wait is served next;
  * deadline: latest feasible start = deadline - estimated service time; past it the request
    is expired (fail fast, reason given) instead of consuming capacity;
  * reserved classes: per class with a min share, for the class guarantee.
Entries carry ``req.qtoken``; taking or re-queueing a request bumps it, so stale entries
are dropped when they surface.
"""

from __future__ import annotations

import heapq
from typing import Any, Final

from ...core.request import Request, Status

_WAITING: Final = (Status.WAITING, Status.SWAPPED)
NO_WAIT_BOUND_S: Final = 1e7


# An ordering key: (float, int) or (float, int, int, int) -- its first element a time, the
# rest integers (an int is a float to the type checker).  An entry is ``(*key, qtoken, req)``:
# its element types differ by position and its length by key, which a tuple type cannot
# say, so readers take its elements into annotated locals (``req: Request = e[-1]``).
Key = tuple[float, ...]
Entry = tuple[Any, ...]


def live(entry: Entry) -> bool:
    req: Request = entry[-1]
    qtoken: int = entry[-2]
    return qtoken == req.qtoken and req.status in _WAITING


class LazyHeap:
    """A min-heap of ``(*key, qtoken, req)`` entries with lazy deletion."""

    __slots__ = ("h",)

    def __init__(self) -> None:
        self.h: list[Entry] = []

    def push(self, key: Key, req: Request) -> None:
        heapq.heappush(self.h, (*key, req.qtoken, req))

    def top(self) -> Entry | None:
        h = self.h
        while h and not live(h[0]):
            heapq.heappop(h)
        return h[0] if h else None

    def pop(self) -> Entry:
        return heapq.heappop(self.h)

    def front(self, limit: int) -> list[Entry]:
        """Up to ``limit`` entries from the front of the heap's array, live or stale (the
        top first; the rest in heap order, not sorted).  O(limit)."""
        return self.h[:limit]

    def __len__(self) -> int:
        return len(self.h)


def virtual_deadline(req: Request, class_priority: float) -> float:
    vd = req.enqueued_s + (req.max_wait_s if req.max_wait_s is not None else NO_WAIT_BOUND_S)
    if req.order_deadline_s is not None:
        vd = min(vd, req.order_deadline_s)
    if req.priority < class_priority:
        gap = class_priority - req.priority
        vd += gap / req.aging_rate if req.aging_rate > 0 else NO_WAIT_BOUND_S
    return vd


def order_key(req: Request, class_priority: float, block_size: int) -> tuple[float, int, int, int]:
    remaining = req.num_uncomputed + req.predicted_remaining
    return (virtual_deadline(req, class_priority), remaining, -(-req.num_tokens // block_size), req.seq)


def best_head(queues: dict[str, LazyHeap], now: float) -> Request | None:
    """A tenant's next request: the highest effective priority among its class heads (ties:
    the sooner virtual deadline, then ``seq``).  O(classes) after each head's lazy pops."""
    best: Request | None = None
    best_key: tuple[float, float, int] | None = None
    for q in queues.values():
        e = q.top()
        if e is None:
            continue
        r: Request = e[-1]
        vd: float = e[0]
        key = (-(r.priority + r.aging_rate * (now - r.enqueued_s)), vd, r.seq)
        if best_key is None or key < best_key:
            best, best_key = r, key
    return best
