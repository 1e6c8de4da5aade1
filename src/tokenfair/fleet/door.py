"""A fleet gateway's door from the fleet's state: the 429 ``rate_limited`` and the
``x-ratelimit-*-tokens`` headers, from the shared view (``sync.py``).

Healthy: the tenant's *fleet* token bucket (at most ``heartbeat_s`` old, refilled to now at
the tenant's rate) against the cost it has queued at every gateway.  Degraded (Redis
unreachable): this gateway's local store, which holds 1 / live replicas of the rate and
burst (``local_store.py``), against the cost queued here.
"""

from __future__ import annotations

from .sync import SharedView


def fleet_bucket(view: SharedView | None, local, healthy: bool, tenant: str, rate: float, burst: float,
                 now: float, mono_now: float) -> float | None:
    """The tenant's bucket level as the fleet's decisions see it (None: not known: the
    gateway's own policy bucket applies).  ``local``: the client's LocalStore; ``mono_now``:
    its clock."""
    if healthy:
        return view.bucket_level(tenant, rate, burst, now) if view is not None else None
    share = local.share
    b = local.state.bucket.get(tenant)
    if b is None:
        return burst * share
    return min(burst * share, b[0] + max(0.0, mono_now - b[1]) * rate * share)


def door_wait_s(level: float, queued_here: float, queued_elsewhere: float, rate: float) -> float:
    """How long the bucket takes to admit everything queued for the tenant, fleet-wide."""
    return max(0.0, queued_here + queued_elsewhere - level) / rate
