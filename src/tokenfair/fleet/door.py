"""A fleet gateway's fleet-wide decisions outside the dispatch script: the door's 429
``rate_limited``, the ``x-ratelimit-*-tokens`` headers and the fair policy's recent
service shares (min shares, light tenants), from the shared view (``sync.py``).

Healthy: the tenant's *fleet* token bucket (at most ``heartbeat_s`` old, refilled to now at
the tenant's rate) against the cost it has queued at every gateway; the policy's recent
service per tenant is in the fleet's proportions (``apply_recent``).  Degraded (Redis unreachable): this
gateway's local store, which holds 1 / live replicas of the rate and burst
(``local_store.py``), against the cost queued here.
"""

from __future__ import annotations

from .sync import RecentService, SharedView


def queued_cost(t) -> float:
    """A fair-policy tenant's queued predicted cost (a float, or per class)."""
    qc = t.queued_cost
    return sum(qc.values()) if isinstance(qc, dict) else float(qc)


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


def apply_recent(policy, tenants: RecentService, classes: RecentService, now: float) -> bool:
    """Give the fair policy the fleet's *proportions* of recent service: each tenant's and
    min-share class's share of the fleet's recent service (decayed to ``now``, the
    policy's clock), scaled to this gateway's own recent total.  The shares that the
    min-share guarantees and the light-tenant test compare are then the fleet's, while the
    total -- the service rate the wait forecast drains this gateway's queue at -- stays
    this gateway's.  False: nothing to apply (no fleet service yet, or none here)."""
    if not tenants.known():
        return False
    for r in (tenants, classes):
        r.update(r.cumulative, now)              # decay to now (no new increments)
    fleet_total = sum(tenants.recent.values())
    local_total = policy.recent_total
    if fleet_total <= 0 or local_total <= 0:
        return False
    scale = local_total / fleet_total
    for name, t in policy.tenants.items():
        t.recent = tenants.recent.get(name, 0.0) * scale
        t.recent_t = now
    for k in policy.class_recent:
        policy.class_recent[k] = classes.recent.get(k, 0.0) * scale
    return True
