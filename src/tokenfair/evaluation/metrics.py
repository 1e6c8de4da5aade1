"""Operator metrics from a run: per tenant / class / prompt-length bucket, and global.

Definitions (times in seconds from the trace origin):
  TTFT = first_token_s - arrival_s;  TPOT = (finish_s - first_token_s) / (output_tokens - 1);
  e2e = finish_s - arrival_s;  wait = (scheduled_s or finish_s) - arrival_s;
  slowdown = shared e2e / isolated e2e (the request alone on an empty engine, prefilled in
  the reference scheduler's chunks: ``sim/simulate.py``, the same for every policy);
  overdue request = a request whose wait exceeds its class's max_wait_s, split into those of
  a tenant within its entitled share at the time and those of one over it (``overdue.py``);
  starvation = a tenant or class backlogged and receiving no service: per tenant and class
  the longest such service gap, and a starvation event = a tenant's gap in one class longer
  than the class's max_wait_s (``servicegaps.py``);
  in-time / SLO goodput, finished tokens, outcomes by reason (``goodput.py``);
  deadline miss = finished after deadline_s, or expired.
Shares: the recorder's cost-weighted service per 1 s bucket.  A tenant is *backlogged* in a
bucket when one of its requests has waited for admission longer than ``BACKLOG_GRACE_S``
(1 s, about twenty engine steps) in it: every request waits for the next step, so a tenant
whose requests start within the grace is being served all it asks for, not backlogged.  In a window where a set ``B`` of
>= 2 tenants is backlogged for >= 95% of the window, tenant i's entitled share ``e_i`` is its
weight share of ``B`` water-filled up to its min_share, its received share ``s_i`` is its
service over the service of ``B``, and the weighted Jain index is
``(sum x)^2 / (|B| sum x^2)`` with ``x_i = s_i / e_i``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np

from ..contracts.contract import Contract
from .bucket_series import BacklogIntervals, ServiceSeries
from .overdue import overdue_split
from ..core.request import Request
from .record_table import RecordTable, as_table
from .table_gaps import starvation_of
from .table_metrics import Derived, derive, group_metrics_of, overdue_mask

PROMPT_BUCKETS = ((0, 512, "<512"), (512, 2048, "512-2K"), (2048, 8192, "2K-8K"), (8192, 1 << 62, ">=8K"))
BACKLOG_FRACTION = 0.95
BACKLOG_GRACE_S = 1.0


def request_record(r: Request) -> dict:
    return {
        "request_id": r.request_id, "tenant": r.tenant, "class": r.klass, "arrival_s": r.arrival_s,
        "scheduled_s": r.scheduled_s, "first_token_s": r.first_token_s, "finish_s": r.finish_s,
        "prompt_tokens": r.prompt_tokens, "output_tokens": r.num_output, "status": r.status.value,
        "reason": r.reason, "preemptions": r.num_preemptions, "deadline_s": r.deadline_s,
        "recomputed_tokens": r.recomputed_tokens, "swapped_bytes": r.swapped_bytes,
        "predicted_output_tokens": r.predicted_output, "max_wait_s": r.max_wait_s,
        "ttft_slo_s": r.ttft_slo_s, "tpot_slo_s": r.tpot_slo_s,
    }


Records = RecordTable | Iterable[dict]


def group_metrics(recs: Records, isolated_e2e: dict[str, float] | None) -> dict:
    """Latency percentiles, wait, slowdown, overdue, deadline misses, SLOs and goodput of a
    group of records (``table_metrics.group_metrics_of``)."""
    t = as_table(recs)
    return group_metrics_of(t, derive(t, isolated_e2e))


def backlog_intervals(recs: Records, key: str, n_buckets: int, bucket_s: float) -> dict[str, BacklogIntervals]:
    """Per ``key`` value (tenant / class), in the order the records first show it backlogged:
    the buckets in which one of its requests waited longer than ``BACKLOG_GRACE_S``."""
    t = as_table(recs)
    v, p = t.values, t.present
    start = v["arrival_s"] + BACKLOG_GRACE_S
    end = np.where(p["scheduled_s"], v["scheduled_s"], v["finish_s"])
    ok = (p["scheduled_s"] | p["finish_s"]) & (end > start)
    rows = np.flatnonzero(ok)
    a = np.minimum(n_buckets, np.floor_divide(start[rows], bucket_s)).astype(np.int64)
    b = np.minimum(n_buckets, -np.floor_divide(-end[rows], bucket_s)).astype(np.int64)
    codes = t.codes[key][rows]
    names = t.names[key]
    seen, first = np.unique(codes, return_index=True)
    order = np.argsort(codes, kind="stable")
    a, b = a[order], b[order]
    ends = np.cumsum(np.bincount(codes, minlength=len(names)))
    out: dict[str, BacklogIntervals] = {}
    for c in seen[np.argsort(first)].tolist():
        lo = int(ends[c - 1]) if c else 0
        out[names[c]] = BacklogIntervals.merged(a[lo:ends[c]], b[lo:ends[c]])
    return out


def entitled_shares(weights: dict[str, float], mins: dict[str, float]) -> dict[str, float]:
    """Weight shares water-filled so every member gets at least its min share."""
    fixed: dict[str, float] = {}
    while True:
        rest = {k: w for k, w in weights.items() if k not in fixed}
        room = 1.0 - sum(fixed.values())
        total = sum(rest.values())
        share = {k: room * w / total for k, w in rest.items()} if total else {}
        low = [k for k, s in share.items() if s < mins.get(k, 0.0)]
        if not low:
            return fixed | share
        for k in low:
            fixed[k] = mins[k]


def fairness(recs: Records, timeline: dict, contract: Contract, window_s: float = 60.0) -> dict:
    """Jain and share deviation over windows, min-share classes' shares while backlogged, and
    overdue requests split by share.  O(records + buckets with service + windows x backlogged
    tenants) time and memory (``bucket_series.py``), not O(run length x tenants)."""
    bucket_s = timeline["bucket_s"]
    n_buckets = 1 + max([int(b) for b in timeline["tokens"]] or [0])
    per_window = max(1, int(round(window_s / bucket_s)))
    recs = as_table(recs)
    backlog = backlog_intervals(recs, "tenant", n_buckets, bucket_s)
    service = {t: ServiceSeries.of(s, n_buckets) for t, s in timeline["tenant_service"].items()}
    members_of: dict[int, list[str]] = defaultdict(list)    # window -> tenants backlogged in it
    for t, bl in backlog.items():
        windows, counts = bl.window_counts(per_window, n_buckets // per_window)
        for w, k in zip(windows.tolist(), counts.tolist()):
            if k / per_window >= BACKLOG_FRACTION:
                members_of[w].append(t)
    jains, devs = [], defaultdict(list)
    for w in sorted(members_of):
        members = members_of[w]
        if len(members) < 2:
            continue
        served = {t: service[t].window_sum(w * per_window, per_window) if t in service else 0.0 for t in members}
        total = sum(served.values())
        if total <= 0:
            continue
        ent = entitled_shares({t: contract.tenant(t).weight for t in members},
                              {t: contract.tenant(t).min_share for t in members})
        x = np.array([served[t] / total / ent[t] for t in members])
        jains.append(float(x.sum() ** 2 / (len(x) * (x ** 2).sum())))
        for t in members:
            devs[t].append(served[t] / total - ent[t])
    classes = {}
    cbacklog = backlog_intervals(recs, "class", n_buckets, bucket_s)
    cservice = {c: ServiceSeries.of(s, n_buckets) for c, s in timeline["class_service"].items()}
    all_service = ServiceSeries.total(service.values())
    for c, spec in contract.classes.items():
        if spec.min_share <= 0 or c not in cbacklog:
            continue
        where = cbacklog[c].positions()
        tot = all_service.sum_at(where)
        got = cservice[c].sum_at(where) if c in cservice else 0.0
        share = got / tot if tot else None
        classes[c] = {"min_share": spec.min_share, "share_while_backlogged": share,
                      "ratio_to_min_share": None if share is None else share / spec.min_share,
                      "backlogged_s": float(len(where) * bucket_s)}
    split = overdue_split(recs.rows(np.flatnonzero(overdue_mask(recs))), service, backlog,
                          n_buckets if service else 0, bucket_s, lambda members: entitled_shares(
        {t: contract.tenant(t).weight for t in members}, {t: contract.tenant(t).min_share for t in members}))
    return {
        "overdue_requests": split,
        "window_s": window_s, "jain_windows": len(jains),
        "jain_min": min(jains) if jains else None, "jain_mean": float(np.mean(jains)) if jains else None,
        "share_deviation": {t: {"mean": float(np.mean(v)), "max_abs": float(np.max(np.abs(v)))}
                            for t, v in sorted(devs.items())},
        "max_abs_share_deviation": max((float(np.max(np.abs(v))) for v in devs.values()), default=None),
        "class_min_share": classes,
    }


def add_isolated(tenants: dict[str, dict], isolated_tenant: dict[str, dict]) -> None:
    """Each tenant's figures next to its isolated run's: P99 TTFT and P50 end-to-end ratios."""
    for t, iso in isolated_tenant.items():
        if t in tenants:
            tenants[t]["isolated"] = iso
            p99, ip99 = tenants[t]["ttft_s"]["p99"], iso["ttft_s"]["p99"]
            tenants[t]["ttft_p99_vs_isolated"] = (p99 / ip99) if p99 is not None and ip99 else None
            e, ie = tenants[t]["e2e_s"]["p50"], iso["e2e_s"]["p50"]
            tenants[t]["slowdown_p50_e2e_vs_isolated"] = (e / ie) if e is not None and ie else None


def summarize(recs: Records, timeline: dict, contract: Contract,
              isolated_e2e: dict[str, float] | None = None,
              isolated_tenant: dict[str, dict] | None = None) -> dict:
    """summary.json's metrics of a run's records (a :class:`RecordTable` or the dicts) and
    timeline, computed over the records' columns."""
    t = as_table(recs)
    d = derive(t, isolated_e2e)
    v, p = t.values, t.present
    fin = d.finished
    has_finish = p["finish_s"]
    t0 = float(v["arrival_s"].min()) if t.n else 0.0
    t1 = float(v["finish_s"][has_finish].max()) if has_finish.any() else t0
    span = max(1e-9, t1 - t0)
    tok_in = int(v["prompt_tokens"][fin].sum())
    tok_out = int(v["output_tokens"][fin].sum())
    recomputed = int(v["recomputed_tokens"].sum())
    processed = sum(timeline["tokens"].values())
    tenants = dict(sorted((name, group_metrics_of(t, g)) for name, g in d.grouped(t.codes["tenant"], t.names["tenant"])))
    add_isolated(tenants, isolated_tenant or {})
    overall = group_metrics_of(t, d)
    busy = max(1e-9, timeline["busy_s"])
    classes = dict(sorted((name, group_metrics_of(t, g)) for name, g in d.grouped(t.codes["class"], t.names["class"])))
    starved = starvation_of(t)
    for kind, groups in (("tenants", tenants), ("classes", classes)):
        for g, m in starved[kind].items():
            groups[g].update(m)
    fair = fairness(t, timeline, contract)
    for name, split in fair["overdue_requests"]["tenants"].items():
        tenants[name]["overdue_split"] = split
    return {
        "requests": t.n, "status": overall["status"],
        "makespan_s": span, "throughput_tokens_per_s": (tok_in + tok_out) / span,
        "output_tokens_per_s": tok_out / span, "requests_per_s": int(fin.sum()) / span,
        "goodput_requests_per_s": overall["slo_met"] / span,
        "overall": overall,
        "preemptions": overall["preemptions"], "recomputed_tokens": recomputed,
        "swapped_bytes": int(v["swapped_bytes"].sum()),
        "recovery_cost_fraction": (recomputed / processed if processed else 0.0)
        + timeline.get("swap_s", 0.0) / busy,
        "finished_tokens": tok_in + tok_out,
        "last_finish_s": float(v["finish_s"][has_finish].max()) if has_finish.any() else 0.0,
        "goodput": overall["goodput"], "outcomes": overall["outcomes"],
        "starvation_events": starved["starvation_events"],
        "longest_service_gap_s": starved["longest_service_gap_s"], "starvation": starved["events"],
        "overdue_requests": fair["overdue_requests"]["within_share"] + fair["overdue_requests"]["over_share"],
        "overdue_within_share": fair["overdue_requests"]["within_share"],
        "overdue_over_share": fair["overdue_requests"]["over_share"],
        "deadline_misses": overall["deadline_misses"],
        "fairness": fair,
        "tenants": tenants,
        "classes": classes,
        "prompt_buckets": {name: group_metrics_of(t, g) for name, g in _prompt_buckets(t, d)},
        "engine_steps": timeline["num_steps"], "engine_busy_s": timeline["busy_s"],
    }


def _prompt_buckets(t: RecordTable, d: Derived) -> list[tuple[str, Derived]]:
    """(bucket name, its rows) in the order the records first show each bucket."""
    prompt = t.values["prompt_tokens"]
    found = []
    for lo, hi, name in PROMPT_BUCKETS:
        rows = np.flatnonzero((prompt >= lo) & (prompt < hi))
        if len(rows):
            found.append((int(rows[0]), name, d.take(rows)))
    return [(name, g) for _, name, g in sorted(found, key=lambda x: x[0])]
