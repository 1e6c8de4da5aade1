r"""The predicted cost queued ahead of a request in its (tenant, class) queue, in arrival order:
what the queue review (``review.py``) drains before the request's turn.

Symbols: ``p(r)`` a request's position (the order of its push into this queue; a request
pushed again after it left, preempted, gets a new one), ``c(r)`` its predicted cost while
it waits (0 once it left), ``k`` the cursor.  ``before`` = ``sum_{p(q) < k} c(q)``.

``cost_before(r)`` moves the cursor to ``p(r)`` and returns ``before``: the cost of the
requests of the queue pushed before ``r`` that still wait -- the cost ahead of ``r`` in the
class's key order whenever that order is arrival order (no request of the class carries its
own deadline or priority, ``ordering.py``).  A push or removal at a position below the
cursor updates ``before`` at once; one above it is summed when the cursor passes.

Cost: O(1) per push and removal; the cursor's moves, O(1) amortised when reviews come in
arrival order, as they do within a class (each at its enqueue time plus the class's max wait
less a minute).  Memory: one float per push (a removed request's slot keeps 0.0).
"""

from __future__ import annotations

from ...core.request import Request


class ArrivalCosts:
    """Invariants: ``position`` holds exactly the requests of this queue that wait, each at
    its position; ``costs[i]`` is the predicted cost of the request waiting at ``i`` (0.0 when
    none does); ``before == sum(costs[:cursor])`` up to float rounding (``>= 0``)."""

    __slots__ = ("costs", "position", "cursor", "before")

    def __init__(self) -> None:
        self.costs: list[float] = []
        self.position: dict[Request, int] = {}
        self.cursor = 0
        self.before = 0.0

    def push(self, req: Request, cost: float) -> None:
        """``req`` waits in this queue from now, at the next position."""
        i = len(self.costs)
        self.position[req] = i
        self.costs.append(cost)

    def remove(self, req: Request) -> None:
        """``req`` leaves the queue (taken, shed, expired): its slot is 0.0 from now."""
        i = self.position.pop(req)
        cost = self.costs[i]
        self.costs[i] = 0.0
        if i < self.cursor:
            self.before = max(0.0, self.before - cost)

    def reprice(self, req: Request, cost: float) -> None:
        """``req``'s predicted cost is ``cost`` now (new cost weights)."""
        i = self.position[req]
        if i < self.cursor:
            self.before = max(0.0, self.before - self.costs[i] + cost)
        self.costs[i] = cost

    def cost_before(self, req: Request) -> float:
        """The predicted cost of the waiting requests pushed before ``req`` (waiting)."""
        i = self.position[req]
        costs = self.costs
        k = self.cursor
        before = self.before
        while k < i:
            before += costs[k]
            k += 1
        while k > i:
            k -= 1
            before -= costs[k]
        self.cursor = k
        self.before = before = max(0.0, before)
        return before
