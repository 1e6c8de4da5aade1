r"""Layer 3 inside one (tenant, class) queue: a burst's requests that can still get their
first token in time go before those that no longer can.

Symbols: ``M`` the class's max wait, ``L`` the forecast's look-ahead (``lookahead.py``),
``s`` the start of the tenant's backlog spell (``TenantState.backlogged_since``), ``e_r`` a
request's enqueue time and ``f(r)`` the policy's estimate of its time to first token once
it is picked (``FairPolicy.time_to_first_token_s``: its prefill chunks and one step more, at
the recent step time).

  * ``r`` is *late* at ``now`` when ``now + f(r) > e_r + M``: its first token can no longer
    come within its max wait.  A request that already has its first token is never late.
  * ``r`` is a *burst* request when ``e_r - s < M - L``: it arrived before its tenant's spell
    was long enough for the forecast to shed it.

Serving late requests first under overload makes each later one late in turn.  So a burst
request found late at the front of ``ready`` moves to ``late`` (it stays there), and the
head is ``ready``'s front if that is a burst request, else the smaller key of the two
fronts.  With ``A`` the burst requests and ``B`` the later ones of the spell (keys:
``ordering.order_key``), the order is::

    A in time  <  A late  <  B        (A late and B by key; A's keys precede B's in a class)

``B`` keeps its place behind every request that arrived before it, so a new arrival's wait
forecast (all queued cost ahead of it, ``forecast.py``) and the counterfactual behind
shedding precision (``evaluation/shedding.py``) are what they would be without the split.
The guarantee still serves an overdue request (past ``e_r + M``) of a tenant within its
share next (``guarantee.py``), so the split orders the excess of a tenant over its share,
and others' requests only in the seconds before their max wait.

Bound: every ``A`` request arrived by ``s + M - L`` and is late by ``e_r + M``, so from
``s + 2M - L`` on no request is in time in ``A`` and the queue is in key order: a late
request yields to later ones of its tenant and class at most until then.
Cost: O(log n) for each request moved (once), O(1) per head otherwise; entries go stale
lazily as in ``ordering.LazyHeap``.
"""

from __future__ import annotations

from typing import Callable

from ...core.request import Request
from .lookahead import spell_allows_shedding
from .ordering import Entry, Key, LazyHeap


def is_late(req: Request, now: float, time_to_first_token_s: float) -> bool:
    """``req``'s first token can no longer come within its max wait."""
    max_wait_s = req.max_wait_s
    return (max_wait_s is not None and req.first_token_s is None
            and now + time_to_first_token_s > req.enqueued_s + max_wait_s)


def is_burst(req: Request, backlogged_since: float) -> bool:
    """``req`` arrived before its tenant's backlog spell allowed shedding it."""
    max_wait_s = req.max_wait_s
    return max_wait_s is not None and not spell_allows_shedding(req.enqueued_s - backlogged_since, max_wait_s)


class ClassQueue:
    """Invariants: every waiting request of the tenant and class has exactly one live entry,
    in ``ready`` or in ``late``; an entry in ``late`` is a burst request that was late when
    it moved (module docstring); both heaps hold ``(*key, qtoken, req)`` entries."""

    __slots__ = ("ready", "late", "splits", "time_to_first_token_s")

    def __init__(self, splits: bool, time_to_first_token_s: Callable[[Request], float]) -> None:
        self.ready = LazyHeap()
        self.late = LazyHeap()
        self.splits = splits                # False: one heap in key order (the "fifo" order)
        self.time_to_first_token_s = time_to_first_token_s

    def push(self, key: Key, req: Request) -> None:
        self.ready.push(key, req)

    def head(self, now: float, backlogged_since: float) -> Entry | None:
        """The front entry (None: no live one): amortised O(log n)."""
        ready = self.ready
        e = ready.top()
        if not self.splits:
            return e
        burst = False                       # is e a burst request (read once per entry)
        while e is not None:
            req: Request = e[-1]
            burst = is_burst(req, backlogged_since)
            if not (burst and is_late(req, now, self.time_to_first_token_s(req))):
                break
            self.late.push_entry(ready.pop())
            e = ready.top()
        if e is not None and burst:
            return e
        lt = self.late.top()
        if lt is None or (e is not None and e[:-2] < lt[:-2]):
            return e
        return lt

    def entries(self) -> list[Entry]:
        """Every entry, live or stale, in no particular order."""
        return self.ready.h + self.late.h

    def front(self, limit: int) -> list[Entry]:
        """Up to ``limit`` entries from the front of each heap (``LazyHeap.front``)."""
        return self.ready.front(limit) + self.late.front(limit)


def best_head(queues: dict[str, ClassQueue], now: float, backlogged_since: float) -> Request | None:
    """The tenant's next request: highest effective priority among its class heads."""
    best: Request | None = None
    best_key: tuple[float, float, int] | None = None
    for q in queues.values():
        e = q.head(now, backlogged_since)
        if e is None:
            continue
        r: Request = e[-1]
        vd: float = e[0]
        key = (-(r.priority + r.aging_rate * (now - r.enqueued_s)), vd, r.seq)
        if best_key is None or key < best_key:
            best, best_key = r, key
    return best
