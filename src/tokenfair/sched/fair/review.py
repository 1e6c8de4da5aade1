r"""Load shedding from the queue: a request of a class with a long max wait is judged a
minute before that max wait, not at its arrival.

Symbols: ``M`` the request's class's max wait, ``L`` = ``SHED_LOOKAHEAD_S`` (a minute,
``forecast.py``), ``e_r`` the request's enqueue time, ``m`` the contract's ``shed_margin``,
``A_r(t)`` the predicted cost queued ahead of ``r`` in its tenant at ``t`` (in its class, the
requests queued before it that still wait, ``arrivals.py``; in the tenant's other classes
of at least its base priority, all of them), ``W(A)`` the forecast of how long the tenant
takes to drain ``A`` (``WaitForecaster.wait_behind_s``: its measured drain rate, or its
weighted share of what the other tenants leave).

* ``M <= L``: shed at arrival when ``W(A_r(e_r)) > m M`` (``forecast.py``).
* ``M > L``: never shed at arrival.  At ``t_r = e_r + M - L``, a request still waiting that
  has not started is shed -- it ends ``expired``, reason ``overloaded`` -- when
  ``W(A_r(t_r)) > m (e_r + M - t_r) = m L``.

So no shedding decision extrapolates the load more than ``L`` ahead.  A batch class's
backlog is not judged from the first seconds of a burst; a request is judged after the
requests ahead of it that could not make it have left; and work the engine cannot do in time
leaves the queue a minute before its max wait instead of being served late, ahead of work
that can still make it.

The in-queue order is key order (arrival order within a class, unless a request carries its
own deadline or priority), one request never passing another for being able to make it: so
shedding a request never delays another of its tenant and class, and a request shed here
would wait at least as long with shedding off, where every request ahead of it is still
queued -- a review is as precise as its forecast.

Cost: O(log R) per request of a class with ``M > L`` for the review heap (``R`` pending
reviews); per review O(1) amortised for the cost ahead in its class (``arrivals.py``: the
reviews of a class come in arrival order) and O(B log B) for the forecast over ``B``
backlogged tenants.
"""

from __future__ import annotations

import heapq

from ...contracts.contract import Contract
from ...core.reasons import Reason, ReasonCode
from ...core.request import Request, Status
from .forecast import SHED_LOOKAHEAD_S, WaitForecaster
from .tenant import TenantState


class QueueReview:
    """Invariant: ``pending`` is a min-heap of ``(t_r, seq, req)`` -- one entry for each
    request of a class with a max wait over ``SHED_LOOKAHEAD_S`` pushed into the queue for
    the first time and not reviewed yet, ``t_r`` its review time (module docstring).  An
    entry whose request started, ended or was taken before ``t_r`` is dropped when it
    surfaces."""

    def __init__(self, contract: Contract, tenants: dict[str, TenantState], forecaster: WaitForecaster) -> None:
        self.contract = contract
        self.tenants = tenants
        self.forecaster = forecaster
        self.pending: list[tuple[float, int, Request]] = []

    def note_queued(self, req: Request) -> None:
        """``req`` was pushed into the queue; the first push of a request of a class with a
        max wait over ``SHED_LOOKAHEAD_S`` schedules its review."""
        max_wait_s = req.max_wait_s
        if max_wait_s is None or max_wait_s <= SHED_LOOKAHEAD_S or req.qtoken != 1:
            return
        heapq.heappush(self.pending, (req.enqueued_s + max_wait_s - SHED_LOOKAHEAD_S, req.seq, req))

    def next_shed(self, now: float) -> tuple[Request, Reason] | None:
        """The next request due for review by ``now`` that is shed (None: none left); the
        caller takes it out of the queue before asking again, so the next review sees the
        queue without it.  Reviews under a contract that does not shed end without one."""
        pending = self.pending
        while pending and pending[0][0] <= now:
            req: Request = heapq.heappop(pending)[2]
            if (not self.contract.admission.shed_over_max_wait or req.status is not Status.WAITING
                    or req.num_computed > 0 or req.first_token_s is not None):
                continue
            reason = self.judge(req, now)
            if reason is not None:
                return req, reason
        return None

    def judge(self, req: Request, now: float) -> Reason | None:
        """Why ``req`` (waiting, at its review) is shed: ``W(A_r) > m x`` the rest of its
        max wait (None: it stays)."""
        t = self.tenants[req.tenant]
        forecaster = self.forecaster
        priority = forecaster.base_priority(req)
        ahead = (t.queued_ahead(priority, self.contract.classes) - t.queued_cost.get(req.klass, 0.0)
                 + t.arrivals[req.klass].cost_before(req))
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
