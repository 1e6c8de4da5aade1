r"""The fair policy's wait forecast for load shedding: work-conserving, so it sheds only
what really would wait past its max wait.

A request of tenant ``i`` has ``A`` predicted cost queued ahead of it: at its arrival, all
that its tenant has queued in its classes of at least the request's priority; at its review
in the queue (``review.py``), the same less what of its own class is behind it.  The
engine serves ``C`` cost units per second (the larger of the measured rate and what a full
step serves, per the cost model, with the last step's decodes).  Tenants that are not
backlogged keep using what they use now, ``u`` in total (their decayed recent service
rate), less what their ``n`` running decodes with a TPOT SLO give up while the backlog is
served: each decodes once a step, and the backlog's steps run at the TPOT target ``s_b``
(``TPOT_MARGIN`` x the tightest TPOT SLO) instead of the recent step time ``s``, so ``u' = u - n w_d (1/s - 1/s_b)`` (``w_d`` the cost of a decode
token; no change when ``s >= s_b``).  The rest ``C - u'`` is shared, as the WFQ
shares it, by weight among the backlogged tenants, each of which stops competing when its
queue ``Q_j`` is drained (generalised processor sharing); a tenant backlogged for longer
than the statistics' time constant is taken to stay backlogged (``Q_j = inf``: its arrivals
go on).  With the backlogged tenants
sorted by ``x_j = Q_j / w_j`` (those below ``A / w_i``), ``W_k`` the weight still
competing after the first ``k`` drained and ``x_0 = 0``::

    T_gps = sum_k (x_k - x_{k-1}) * W_{k-1} / (C - u')  +  (A / w_i - x_last) * W_last / (C - u')

The forecast is ``T_gps`` for a tenant that became backlogged less than a time constant
ago (a burst: what it will get is what the others leave), and ``A / d_i`` for one backlogged
for longer, with ``d_i`` its measured drain rate (the decayed predicted cost of its
admissions per second: under a sustained overload what it has been getting is the best
guide, light tenants' priority and later arrivals included) less the part of it admitted in
its classes of a higher base priority than the request's: its later arrivals there go
first, so they take that part of the drain before the request's turn (a front end's
realtime traffic beside its interactive flood: without it the interactive requests'
forecasts were 6-8% short on ``flood``, and 19-35% of those admitted started late).  Both
are in predicted cost, so a bias of the length predictor cancels.  O(B log B) for B backlogged
tenants, once per arrival of a request with a max wait (after the warm-up).

Horizon.  Either forecast takes what the tenant has been getting to go on for as long as
the request may wait.  So a request is shed at arrival only when its class's max wait ``M``
is at most ``SHED_LOOKAHEAD_S`` (``L``, a minute); a request of a class with a longer max
wait is queued, and first reviewed (``review.py``) when the rest of its wait is at most
``L`` away.  The competition may end within a long wait -- the streams
beside a batch flood stop, a burst drains -- and the backlog then drains at the engine's
full rate: a forecast over ``M`` from the first seconds of a burst would shed work that the
engine does in time.

Doubt.  A forecast just over the limit is within the forecast's error: nearly every request
shed at arrival that would have started within its max wait was forecast less than 25% over
it (``scripts/shed_misses.py``, docs/BENCHMARKS.md).  So a request of a class with ``M <= L``
is shed at arrival only when its forecast exceeds ``SHED_DOUBT_FACTOR`` x the limit; every
request with a max wait is judged again in the queue as its max wait nears, each time with
half as long left (``review.py``).
"""

from __future__ import annotations

import math
from typing import Final

from ...contracts.contract import Contract
from ...core.reasons import Reason, ReasonCode
from ...core.request import Request
from .batching import TPOT_MARGIN
from .queue import WaitingQueue
from .shares import ShareMeter
from .steptime import StepTimer
from .tenant import TenantState
from .tpot import DecodeSLOs

MIN_RATE: Final = 1e-9
# a shedding decision extrapolates the present load at most this far ahead (Horizon)
SHED_LOOKAHEAD_S: Final = 60.0
# a forecast over the limit by at most this factor is doubtful: the request is not shed at
# arrival, and is judged again in the queue (Doubt; ``review.py``)
SHED_DOUBT_FACTOR: Final = 1.25


def gps_drain_s(ahead: float, weight: float, others: list[tuple[float, float]], capacity: float) -> float:
    """Seconds until ``ahead`` cost of a tenant of weight ``weight`` is served, sharing
    ``capacity`` cost/s by weight with ``others`` = [(queued cost, weight)] that each leave
    when drained."""
    if capacity <= MIN_RATE:
        return float("inf")
    target = ahead / weight
    items = sorted((q / w, w) for q, w in others if q > 0.0 and w > 0.0)
    total_w = weight
    for _, w in items:
        total_w += w
    v = 0.0
    t = 0.0
    for x, w in items:
        if x >= target:
            break
        t += (x - v) * total_w / capacity
        v = x
        total_w -= w
    return t + (target - v) * total_w / capacity


def forecast_wait_s(ahead: float, weight: float, others: list[tuple[float, float]], capacity: float,
                    idle_use: float, drain: float, persistent: bool) -> float:
    """``ahead / drain`` for a tenant backlogged for a time constant (``persistent``), else
    ``T_gps`` (module docstring)."""
    if not uses_gps(persistent, drain):
        return ahead / drain
    return gps_drain_s(ahead, weight, others, capacity - idle_use)


def uses_gps(persistent: bool, drain: float) -> bool:
    """The forecast is ``T_gps`` (it reads ``others`` and ``idle_use``), not ``A / d_i``."""
    return not (persistent and drain > MIN_RATE)



class WaitForecaster:
    """The inputs of :func:`forecast_wait_s` at an arrival, read from the share meter, the
    waiting queue, the recent step time and the running decodes with a TPOT SLO.
    Invariant: ``prefill_rate`` is the cost per second of a step that fills the contract's
    prefill budget (the cost model), fixed at bind; without ``step_time`` and
    ``decode_slos``, ``u' = u``."""

    def __init__(self, contract: Contract, meter: ShareMeter, queue: WaitingQueue, prefill_rate: float,
                 step_time: StepTimer | None = None, decode_slos: DecodeSLOs | None = None,
                 decode_cost: float = 0.0) -> None:
        self.contract = contract
        self.meter = meter
        self.queue = queue
        self.prefill_rate = prefill_rate
        self.step_time = step_time
        self.decode_slos = decode_slos
        self.decode_cost = decode_cost          # w_d

    def shed_reason(self, t: TenantState, req: Request, now: float) -> Reason | None:
        """Why ``req`` (with a max wait) is shed at arrival: its class's max wait is at most
        ``SHED_LOOKAHEAD_S`` and its predicted wait exceeds ``SHED_DOUBT_FACTOR`` x
        ``shed_margin`` x that max wait (module docstring, Horizon and Doubt; None: it is not
        shed; the prediction is kept in ``req.predicted_wait_s`` either way)."""
        max_wait_s = req.max_wait_s
        assert max_wait_s is not None
        wait = self.predicted_wait_s(t, req, now)
        req.predicted_wait_s = wait
        limit = self.contract.admission.shed_margin * max_wait_s
        if wait > SHED_DOUBT_FACTOR * limit and max_wait_s <= SHED_LOOKAHEAD_S:
            return Reason(ReasonCode.OVERLOADED, f"predicted wait {wait:.1f}s exceeds {limit:.1f}s (class "
                          f"{req.klass!r} max_wait_s {req.max_wait_s}); retry after ~{wait - limit:.0f}s")
        return None

    def predicted_wait_s(self, t: TenantState, req: Request, now: float) -> float:
        """The work-conserving forecast of ``req``'s wait at its arrival: behind the predicted
        cost its tenant has queued in classes of at least its base priority
        (:meth:`wait_behind_s`)."""
        priority = self.base_priority(req)
        return self.wait_behind_s(t, priority, t.queued_ahead(priority, self.contract.classes), now)

    def base_priority(self, req: Request) -> float:
        cls = self.contract.classes.get(req.klass)
        return cls.priority if cls is not None else req.priority

    def wait_behind_s(self, t: TenantState, priority: float, ahead: float, now: float) -> float:
        """How long ``t`` takes to drain ``ahead`` predicted cost for a request of base
        ``priority``: at what the tenant gets when the capacity the tenants that are not
        backlogged leave idle is shared by weight among the backlogged ones until each
        drains -- or at the tenant's measured drain rate, if faster.  O(backlogged tenants)."""
        meter = self.meter
        rate = meter.service_rate(now)
        if rate is None:
            return 0.0
        if ahead <= 0:
            return 0.0
        tau = meter.share_tau_s
        backlogged = self.queue.backlogged
        others: list[tuple[float, float]] = []
        backlogged_recent = 0.0
        for o in backlogged.values():
            backlogged_recent += o.decayed_recent(now, tau)
            if o is not t:
                queued = math.inf               # backlogged for a time constant: it keeps
                if now - o.backlogged_since < tau:   # competing (its arrivals go on)
                    queued = 0.0
                    for c in o.queued_cost.values():
                        queued += c
                others.append((queued, o.weight))
        idle_use = meter.recent_total - backlogged_recent
        if t.name not in backlogged:
            idle_use -= t.decayed_recent(now, tau)
        # backlogged for a whole time constant: the measured rate is what the engine serves
        # under this load; otherwise it may only be what the load asked for
        saturated = now - self.queue.backlog_since_s >= tau
        capacity = rate if saturated else max(rate, self.prefill_rate)
        # what the tenant's later arrivals in classes above this one will take first
        drain = max(0.0, t.decayed_admitted(now, tau) - t.admitted_above(priority, self.contract.classes)) / tau
        persistent = t.name in backlogged and now - t.backlogged_since >= tau
        given_up = self.decode_rate_given_up(backlogged, t.name) if uses_gps(persistent, drain) else 0.0
        idle_rate = max(0.0, max(0.0, idle_use) / tau - given_up)
        return forecast_wait_s(ahead, t.weight, others, capacity, idle_rate, drain, persistent)

    def decode_rate_given_up(self, backlogged: dict[str, TenantState], own: str) -> float:
        """``n w_d (1/s - 1/s_b)`` (module docstring): the cost per second that the running
        decodes with a TPOT SLO of the tenants in ``u`` (neither in ``backlogged`` nor
        ``own``, the forecast's tenant) give up while a backlog runs steps at the TPOT
        target.  O(those decodes)."""
        slos, timer = self.decode_slos, self.step_time
        if slos is None or timer is None:
            return 0.0
        tightest = slos.tightest()
        if tightest is None:
            return 0.0
        recent_s, target_s = timer.ewma_s, TPOT_MARGIN * tightest
        if recent_s <= 0.0 or recent_s >= target_s:
            return 0.0
        n = 0
        for r in slos.members:
            if r.tenant not in backlogged and r.tenant != own:
                n += 1
        return n * self.decode_cost * (1.0 / recent_s - 1.0 / target_s)
