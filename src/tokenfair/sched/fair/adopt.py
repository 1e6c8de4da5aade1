"""What a fleet gateway (``fleet/``) writes into its fair policy: the fleet's normalised
service tags and its proportions of recent service.  The fleet changes the policy only
through these two functions (and reads it through ``FairPolicy.snapshot``)."""

from __future__ import annotations

from collections.abc import Mapping

from .policy import FairPolicy


def adopt_tags(policy: FairPolicy, vtime: float, tags: Mapping[str, float]) -> None:
    """The fleet's virtual time (when ahead of the policy's: V stays monotone) and its
    normalised service S per tenant (``wfq.py``), re-keying the tenants whose tag moved."""
    wfq = policy.wfq
    if vtime > wfq.vnow:
        wfq.vnow = vtime
    for name, t in policy.roster.tenants.items():
        s = tags.get(name)
        if s is not None and s != t.vtime:
            t.vtime = s
            wfq.update(t)


def adopt_recent(policy: FairPolicy, tenant_recent: Mapping[str, float], class_recent: Mapping[str, float],
                 now: float) -> bool:
    """The fleet's recent service per tenant and per min-share class (decayed to ``now``,
    the policy's clock), scaled to this policy's own recent total (``shares.py``): the
    shares the min-share guarantees and the light-tenant test compare are then the fleet's,
    while the total stays this policy's.  False: nothing applied (no fleet service, or none
    here)."""
    meter = policy.meter
    fleet_total = sum(tenant_recent.values())
    local_total = meter.recent_total
    if fleet_total <= 0 or local_total <= 0:
        return False
    scale = local_total / fleet_total
    for name, t in policy.roster.tenants.items():
        t.recent = tenant_recent.get(name, 0.0) * scale
        t.recent_t = now
    for k in meter.class_recent:
        meter.class_recent[k] = class_recent.get(k, 0.0) * scale
    return True
