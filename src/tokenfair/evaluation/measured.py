"""Figures measured from request records alone (a live service's, or a replay's).

:func:`measured_summary` has the shape of :func:`tokenfair.evaluation.metrics.summarize`'s summary in
the parts that need no timeline: ``requests``, ``status``, ``overall``,
``starvation_events`` and per-tenant / per-class :func:`~tokenfair.evaluation.metrics.group_metrics`.
The fairness windows (Jain, share deviation) need per-bucket service and are left out: a
check that reads them finds them "not measured".
"""

from __future__ import annotations

from collections import defaultdict

from .metrics import group_metrics


def measured_summary(records: list[dict], starving: dict[tuple[str, str], int] | None = None,
                     workload: str = "live") -> dict:
    """The records' figures; ``starving`` adds (tenant, class) -> requests still queued past
    their class's max wait as starvation events."""
    starving = starving or {}
    by_tenant: dict[str, list[dict]] = defaultdict(list)
    by_class: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_tenant[r["tenant"]].append(r)
        by_class[r["class"]].append(r)
    for tenant, klass in starving:
        by_tenant.setdefault(tenant, [])
        by_class.setdefault(klass, [])
    tenants = {t: group_metrics(v, None) for t, v in sorted(by_tenant.items())}
    classes = {c: group_metrics(v, None) for c, v in sorted(by_class.items())}
    overall = group_metrics(records, None)
    # starvation, seen live: requests still queued past their class's max wait with nothing
    # served to them (the ended records' waits past max wait are ``overdue_requests``)
    for group in [*tenants.values(), *classes.values(), overall]:
        group["starvation_events"] = 0
    for (tenant, klass), n in starving.items():
        tenants[tenant]["starvation_events"] += n
        classes[klass]["starvation_events"] += n
        overall["starvation_events"] += n
    return {"workload": workload, "requests": len(records), "status": overall["status"], "overall": overall,
            "starvation_events": overall["starvation_events"], "tenants": tenants, "classes": classes}
