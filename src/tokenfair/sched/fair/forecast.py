r"""The fair policy's wait forecast for load shedding: work-conserving, so it sheds only
what really would wait past its max wait.

At a request's arrival, its tenant ``i`` has ``A`` predicted cost queued ahead of it (its
classes of at least the request's priority).  The engine serves ``C`` cost units per second
(the larger of the measured rate and what a full step serves, per the cost model, with the
last step's decodes).  Tenants that are not backlogged keep using what they use now, ``u``
in total (their decayed recent service rate); the rest ``C - u`` is shared, as the WFQ
shares it, by weight among the backlogged tenants, each of which stops competing when its
queue ``Q_j`` is drained (generalised processor sharing); a tenant backlogged for longer
than the statistics' time constant is taken to stay backlogged (``Q_j = inf``: its arrivals
go on).  With the backlogged tenants
sorted by ``x_j = Q_j / w_j`` (those below ``A / w_i``), ``W_k`` the weight still
competing after the first ``k`` drained and ``x_0 = 0``::

    T_gps = sum_k (x_k - x_{k-1}) * W_{k-1} / (C - u)  +  (A / w_i - x_last) * W_last / (C - u)

The forecast is ``T_gps`` for a tenant that became backlogged less than a time constant
ago (a burst: what it will get is what the others leave), and ``A / d_i`` for one backlogged
for longer, with ``d_i`` its measured drain rate (the decayed predicted cost of its
admissions per second: under a sustained overload what it has been getting is the best
guide, light tenants' priority and later arrivals included).  Both are in predicted cost,
so a bias of the length predictor cancels.  O(B log B) for B backlogged
tenants, once per arrival of a request with a max wait (after the warm-up).
"""

from __future__ import annotations

from typing import Final

MIN_RATE: Final = 1e-9


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
    if persistent and drain > MIN_RATE:
        return ahead / drain
    return gps_drain_s(ahead, weight, others, capacity - idle_use)

