"""The fair policy's read-only snapshot (``sched/snapshot.py``), built from its parts.

Nothing here writes to a part: the token bucket and the decayed recent service are
computed as of ``now`` with the same formulas the parts apply when they update lazily
(``admission.bucket_level``, ``TenantState.recent_at``).
"""

from __future__ import annotations

from ..snapshot import PolicySnapshot, TenantView, freeze_views
from .admission import bucket_level
from .roster import TenantRoster
from .tenant import TenantState
from .wfq import VirtualTimeWFQ


def tenant_view(t: TenantState, now: float, share_tau_s: float) -> TenantView:
    return TenantView(name=t.name, weight=t.weight, min_share=t.spec.min_share, num_waiting=t.num_waiting,
                      queued_cost=sum(t.queued_cost.values()), num_running=len(t.running),
                      bucket=bucket_level(t, now) if t.spec.rate_limit is not None else None,
                      recent_service=t.recent_at(now, share_tau_s))


def view_of(roster: TenantRoster, name: str, now: float, share_tau_s: float) -> TenantView | None:
    t = roster.tenants.get(name)
    return tenant_view(t, now, share_tau_s) if t is not None else None


def policy_snapshot(roster: TenantRoster, wfq: VirtualTimeWFQ, share_tau_s: float, now: float) -> PolicySnapshot:
    views = [tenant_view(t, now, share_tau_s) for t in roster.tenants.values()]
    return PolicySnapshot(now=now, share_tau_s=share_tau_s, wfq_credit=wfq.credit, tenants=freeze_views(views))
