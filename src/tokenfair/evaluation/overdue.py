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
O(overdue requests x tenants), the range sums read from the sparse series
(``bucket_series.py``).
"""

from __future__ import annotations

from typing import Callable, Final

import numpy as np

from .bucket_series import BacklogIntervals, ServiceSeries

SHARE_TOLERANCE: Final = 0.05
BACKLOG_MAJORITY: Final = 0.5


def overdue_split(recs: list[dict], service: dict[str, ServiceSeries], backlog: dict[str, BacklogIntervals],
                  n_buckets: int, bucket_s: float, entitled: Callable[[list[str]], dict[str, float]]) -> dict:
    """``service``/``backlog``: per tenant, its service and backlogged buckets, of
    ``n_buckets``; ``entitled(members)``: the members' entitled shares.  Returns the counts in
    total and per tenant."""
    n = n_buckets
    late = []
    for r in recs:
        limit = r["max_wait_s"]
        end = r["scheduled_s"] if r["scheduled_s"] is not None else r["finish_s"]
        if limit is None or end is None or end - r["arrival_s"] <= limit:
            continue
        a = min(n, int(r["arrival_s"] // bucket_s))
        late.append((r["tenant"], a, min(n, max(a + 1, int(-(-end // bucket_s))))))
    lo = np.array([a for _, a, _ in late], dtype=np.int64)
    hi = np.array([b for _, _, b in late], dtype=np.int64)
    # per tenant and late request: backlogged for most of its wait; its service over the wait
    majority = {t: (bl.covered(lo, hi) >= BACKLOG_MAJORITY * (hi - lo)).tolist() for t, bl in backlog.items()}
    served = {t: (sv.below(hi) - sv.below(lo)).tolist() for t, sv in service.items()}
    per_tenant: dict[str, dict[str, int]] = {}
    within = over = 0
    for i, (me, _, _) in enumerate(late):
        members = [t for t, flags in majority.items() if t == me or flags[i]]
        if me not in members:
            members.append(me)
        got = {t: served[t][i] if t in served else 0.0 for t in members}
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
