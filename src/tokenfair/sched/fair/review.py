r"""Load shedding from the queue: every waiting request with a max wait is judged again as
its max wait nears, each time with half as long left, so that no forecast looks further
ahead than the time left and work that cannot start in time leaves before it is served late.

Symbols: ``M`` the request's class's max wait, ``L`` = ``SHED_LOOKAHEAD_S`` (a minute,
``forecast.py``), ``d`` = ``SHED_DOUBT_FACTOR`` (``forecast.py``), ``l_min`` =
``MIN_REVIEW_LEFT_S``, ``e_r`` the request's enqueue time, ``m`` the contract's
``shed_margin``, ``A_r(t)`` the predicted cost queued ahead of ``r`` in its tenant at ``t``
(in its class, the requests queued before it that still wait, ``arrivals.py``; in the
tenant's other classes of at least its base priority, all of them), ``W(A)`` the forecast of
how long the tenant takes to drain ``A`` (``WaitForecaster.wait_behind_s``: its measured
drain rate, or its weighted share of what the other tenants leave).

* At arrival (``forecast.py``), only when ``M <= L``: shed when ``W(A_r(e_r)) > d m M``.  A
  forecast over ``m M`` by less than that is within the forecast's error (Doubt).
* Reviews: round ``j = 0, 1, ...`` falls when ``l_j`` is left of the max wait, ``l_0 =
  min(L, M / 2)`` and ``l_{j+1} = l_j' / 2`` (``l_j'`` what was left when round ``j``
  ran: reviews run at the first scheduler step after they are due), while ``l_{j+1} >=
  l_min``.  At each, a request still waiting that has not started is shed -- it ends
  ``expired``, reason ``overloaded`` -- when ``W(A_r(t)) > m (e_r + M - t)``.

So no shedding decision extrapolates the load more than ``L``, nor more than half the max
wait, ahead, and each later one only half as far as the one before.  A batch class's backlog
is not judged from the first seconds of a burst; a request is judged after the requests
ahead of it that could not make it have left; and work the engine cannot do in time leaves
the queue before its max wait instead of being served late, ahead of work that can still
make it.

The in-queue order is key order (arrival order within a class, unless a request carries its
own deadline or priority), one request never passing another for being able to make it: so
shedding a request never delays another of its tenant and class, and a request shed here
would wait at least as long with shedding off, where every request ahead of it is still
queued -- a review is as precise as its forecast.

Cost: O(log R) per review for the review heap (``R`` pending reviews), at most ``2 +
log2(l_0 / l_min)`` reviews per request (a request that starts leaves its next review to be
dropped when it surfaces); per review O(1) amortised for the cost ahead in its class
(``arrivals.py``: a round's reviews of a class come in arrival order) and O(B log B) for the
forecast over ``B`` backlogged tenants.
"""

from __future__ import annotations

import heapq
from typing import Final

from ...contracts.contract import Contract
from ...core.reasons import Reason, ReasonCode
from ...core.request import Request, Status
from .forecast import SHED_LOOKAHEAD_S, WaitForecaster
from .tenant import TenantState

# no review is scheduled with less than this left of a request's max wait
MIN_REVIEW_LEFT_S: Final = 1.0


class QueueReview:
    """Invariant: ``pending`` is a min-heap of ``(t_r, seq, round, req)`` -- the next review
    of each request with a max wait that was pushed into the queue for the first time and is
    still due one (module docstring), ``t_r`` its time.  An entry whose request started,
    ended or was taken before ``t_r`` is dropped when it surfaces."""

    def __init__(self, contract: Contract, tenants: dict[str, TenantState], forecaster: WaitForecaster) -> None:
        self.contract = contract
        self.tenants = tenants
        self.forecaster = forecaster
        self.pending: list[tuple[float, int, int, Request]] = []

    def note_queued(self, req: Request) -> None:
        """``req`` was pushed into the queue; its first push schedules its first review,
        when ``min(L, M / 2)`` of its max wait is left."""
        max_wait_s = req.max_wait_s
        if max_wait_s is None or req.qtoken != 1:
            return
        left = min(SHED_LOOKAHEAD_S, 0.5 * max_wait_s)
        heapq.heappush(self.pending, (req.enqueued_s + max_wait_s - left, req.seq, 0, req))

    def next_due_s(self) -> float:
        """When the next review is due (inf: none pending); an entry whose request has since
        started or ended counts too -- a wake-up for it finds nothing to do."""
        return self.pending[0][0] if self.pending else float("inf")

    def next_shed(self, now: float) -> tuple[Request, Reason] | None:
        """The next request due for review by ``now`` that is shed (None: none left); the
        caller takes it out of the queue before asking again, so the next review sees the
        queue without it.  A request that stays is due its next review halfway to its max
        wait.  Reviews under a contract that does not shed end without one."""
        pending = self.pending
        while pending and pending[0][0] <= now:
            _, seq, round_, req = heapq.heappop(pending)
            if (not self.contract.admission.shed_over_max_wait or req.status is not Status.WAITING
                    or req.num_computed > 0 or req.first_token_s is not None):
                continue
            reason = self.judge(req, round_, now)
            if reason is not None:
                return req, reason
            max_wait_s = req.max_wait_s
            assert max_wait_s is not None
            half_left = 0.5 * (req.enqueued_s + max_wait_s - now)
            if half_left >= MIN_REVIEW_LEFT_S:
                heapq.heappush(pending, (now + half_left, seq, round_ + 1, req))
        return None

    def judge(self, req: Request, round_: int, now: float) -> Reason | None:
        """Why ``req`` (waiting, at its review of round ``round_``) is shed: ``W(A_r) > m x``
        the rest of its max wait (None: it stays)."""
        t = self.tenants[req.tenant]
        forecaster = self.forecaster
        priority = forecaster.base_priority(req)
        ahead = (t.queued_ahead(priority, self.contract.classes) - t.queued_cost.get(req.klass, 0.0)
                 + t.arrivals[req.klass].cost_before(req, round_))
        wait = forecaster.wait_behind_s(t, priority, ahead, now)
        max_wait_s = req.max_wait_s
        assert max_wait_s is not None
        left = req.enqueued_s + max_wait_s - now
        limit = self.contract.admission.shed_margin * left
        if wait <= limit:
            return None
        return Reason(ReasonCode.OVERLOADED,
                      f"queued {now - req.enqueued_s:.0f}s: predicted wait {wait:.1f}s more exceeds {limit:.1f}s "
                      f"(class {req.klass!r} max_wait_s {max_wait_s}); retry after ~{wait - limit:.0f}s")
