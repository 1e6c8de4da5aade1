r"""The predicted cost queued ahead of a request in its (tenant, class) queue, in arrival order:
what the queue review (``review.py``) drains before the request's turn.

Symbols: ``p(r)`` a request's position (the order of its push into this queue; a request
pushed again after it left, preempted, gets a new one), ``c(r)`` its predicted cost while
it waits (0 once it left); per review round ``j`` (``review.py``: a request's ``j``-th
review), a cursor ``k_j`` and ``before_j`` = ``sum_{p(q) < k_j} c(q)``.

``cost_before(r, j)`` moves cursor ``k_j`` to ``p(r)`` and returns ``before_j``: the cost of
the requests of the queue pushed before ``r`` that still wait -- the cost ahead of ``r`` in
the class's key order whenever that order is arrival order (no request of the class carries
its own deadline or priority, ``ordering.py``).  A push or removal at a position below a
cursor updates its ``before`` at once; one above it is summed when the cursor passes.

Cost: O(1) per push; O(rounds) per removal; a cursor's moves, O(1) amortised when its
round's reviews come in arrival order, as they do within a class: a class's requests share
its max wait, so round 0 falls at the enqueue time plus a fixed offset, and round ``j + 1``
halfway from round ``j`` to the max wait, in the same order.  Memory: one float per push (a
removed request's slot keeps 0.0).
"""

from __future__ import annotations

from ...core.request import Request


class ArrivalCosts:
    """Invariants: ``position`` holds exactly the requests of this queue that wait, each at
    its position; ``costs[i]`` is the predicted cost of the request waiting at ``i`` (0.0 when
    none does); for each round ``j``, ``befores[j] == sum(costs[:cursors[j]])`` up to float
    rounding (``>= 0``)."""

    __slots__ = ("costs", "position", "cursors", "befores")

    def __init__(self) -> None:
        self.costs: list[float] = []
        self.position: dict[Request, int] = {}
        self.cursors: list[int] = []
        self.befores: list[float] = []

    def push(self, req: Request, cost: float) -> None:
        """``req`` waits in this queue from now, at the next position."""
        i = len(self.costs)
        self.position[req] = i
        self.costs.append(cost)

    def remove(self, req: Request) -> None:
        """``req`` leaves the queue (taken, shed, expired): its slot is 0.0 from now."""
        i = self.position.pop(req)
        self._replace_ahead(i, self.costs[i], 0.0)
        self.costs[i] = 0.0

    def reprice(self, req: Request, cost: float) -> None:
        """``req``'s predicted cost is ``cost`` now (new cost weights)."""
        i = self.position[req]
        self._replace_ahead(i, self.costs[i], cost)
        self.costs[i] = cost

    def _replace_ahead(self, i: int, old: float, new: float) -> None:
        """Position ``i``'s cost goes from ``old`` to ``new``: every cursor past it updates
        its ``before`` at once (``b - old + new``; ``+ 0.0`` leaves a removal's ``b - old``
        as it is).  O(rounds)."""
        befores = self.befores
        for j, k in enumerate(self.cursors):
            if i < k:
                befores[j] = max(0.0, befores[j] - old + new)

    def cost_before(self, req: Request, round_: int = 0) -> float:
        """The predicted cost of the waiting requests pushed before ``req`` (waiting), read
        with round ``round_``'s cursor."""
        while len(self.cursors) <= round_:
            self.cursors.append(0)
            self.befores.append(0.0)
        i = self.position[req]
        costs = self.costs
        k = self.cursors[round_]
        before = self.befores[round_]
        while k < i:
            before += costs[k]
            k += 1
        while k > i:
            k -= 1
            before -= costs[k]
        self.cursors[round_] = k
        self.befores[round_] = before = max(0.0, before)
        return before
