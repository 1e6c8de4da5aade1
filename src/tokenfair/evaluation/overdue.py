"""Overdue requests (waited past their class's max wait), split by whose fault it was.

A request that waited past its max wait over ``[arrival_s, start)`` is *within share* when
its tenant received, over those seconds, clearly less than its entitled share -- a
scheduling failure -- and *over share* otherwise (the tenant asked for more than its share
and its own excess waited).  The shares are the recorder's cost-weighted service per bucket
(timeline ``tenant_service``) among the tenants backlogged (``metrics.BACKLOG_GRACE_S``) for
at least half of those buckets, plus the request's own tenant: received share
``s_i / sum_B s_j``, entitled share its weight share of ``B`` water-filled up to the min
shares (``metrics.entitled_shares``).  "Clearly less": below ``1 - SHARE_TOLERANCE`` times
the entitled share, so two heavy tenants that split the engine evenly are both over share.
O(overdue requests x tenants) after O(buckets x tenants) prefix sums.
"""

from __future__ import annotations

from typing import Callable, Final

import numpy as np

SHARE_TOLERANCE: Final = 0.05
BACKLOG_MAJORITY: Final = 0.5


def overdue_split(recs: list[dict], service: dict[str, np.ndarray], backlog: dict[str, np.ndarray],
                  bucket_s: float, entitled: Callable[[list[str]], dict[str, float]]) -> dict:
    """``service``/``backlog``: per tenant, service and backlogged flag per bucket;
    ``entitled(members)``: the members' entitled shares.  Returns the counts in total and
    per tenant."""
    n = max((len(v) for v in service.values()), default=0)
    csum = {t: np.concatenate(([0.0], np.cumsum(v))) for t, v in service.items()}
    cback = {t: np.concatenate(([0], np.cumsum(v.astype(np.int64)))) for t, v in backlog.items()}
    per_tenant: dict[str, dict[str, int]] = {}
    within = over = 0
    for r in recs:
        limit = r["max_wait_s"]
        end = r["scheduled_s"] if r["scheduled_s"] is not None else r["finish_s"]
        if limit is None or end is None or end - r["arrival_s"] <= limit:
            continue
        a = min(n, int(r["arrival_s"] // bucket_s))
        b = min(n, max(a + 1, int(-(-end // bucket_s))))
        me = r["tenant"]
        members = [t for t, c in cback.items()
                   if t == me or (c[b] - c[a]) >= BACKLOG_MAJORITY * (b - a)]
        if me not in members:
            members.append(me)
        got = {t: float(csum[t][b] - csum[t][a]) if t in csum else 0.0 for t in members}
        total = sum(got.values())
        share = got[me] / total if total > 0 else 0.0
        ok = share < (1.0 - SHARE_TOLERANCE) * entitled(members)[me]
        row = per_tenant.setdefault(me, {"within_share": 0, "over_share": 0})
        if ok:
            within += 1
            row["within_share"] += 1
        else:
            over += 1
            row["over_share"] += 1
    return {"within_share": within, "over_share": over, "tenants": dict(sorted(per_tenant.items()))}
