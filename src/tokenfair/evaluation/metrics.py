"""Operator metrics from a run: per tenant / class / prompt-length bucket, and global.

Definitions (times in seconds from the trace origin):
  TTFT = first_token_s - arrival_s;  TPOT = (finish_s - first_token_s) / (output_tokens - 1);
  e2e = finish_s - arrival_s;  wait = (scheduled_s or finish_s) - arrival_s;
  slowdown = shared e2e / isolated e2e (the request alone on an empty engine);
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
from .goodput import goodput, last_finish_s, outcomes
from .overdue import overdue_split
from ..core.request import Request
from .servicegaps import starvation

PROMPT_BUCKETS = ((0, 512, "<512"), (512, 2048, "512-2K"), (2048, 8192, "2K-8K"), (8192, 1 << 62, ">=8K"))
BACKLOG_FRACTION = 0.95
BACKLOG_GRACE_S = 1.0


def _pct(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    a = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(a.max())}


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


def _derived(rec: dict) -> dict:
    a = rec["arrival_s"]
    d = {}
    if rec["first_token_s"] is not None:
        d["ttft"] = rec["first_token_s"] - a
    if rec["status"] == "finished":
        d["e2e"] = rec["finish_s"] - a
        if rec["output_tokens"] > 1:
            d["tpot"] = (rec["finish_s"] - rec["first_token_s"]) / (rec["output_tokens"] - 1)
    end = rec["scheduled_s"] if rec["scheduled_s"] is not None else rec["finish_s"]
    d["wait"] = (end - a) if end is not None else None
    return d


def meets_slo(rec: dict, d: dict) -> bool:
    if rec["status"] != "finished":
        return False
    if rec["ttft_slo_s"] is not None and d.get("ttft", 0) > rec["ttft_slo_s"]:
        return False
    if rec["tpot_slo_s"] is not None and d.get("tpot", 0) > rec["tpot_slo_s"]:
        return False
    if rec["deadline_s"] is not None and rec["finish_s"] > rec["deadline_s"]:
        return False
    return True


def group_metrics(recs: list[dict], isolated_e2e: dict[str, float] | None) -> dict:
    ttft, tpot, e2e, wait, slow = [], [], [], [], []
    status = defaultdict(int)
    starv = misses = preempt = good = 0
    met: list[bool] = []
    for rec in recs:
        d = _derived(rec)
        status[rec["status"]] += 1
        if "ttft" in d:
            ttft.append(d["ttft"])
        if "tpot" in d:
            tpot.append(d["tpot"])
        if "e2e" in d:
            e2e.append(d["e2e"])
            if isolated_e2e and rec["request_id"] in isolated_e2e:
                slow.append(d["e2e"] / max(1e-9, isolated_e2e[rec["request_id"]]))
        if d["wait"] is not None:
            wait.append(d["wait"])
            if rec["max_wait_s"] is not None and d["wait"] > rec["max_wait_s"]:
                starv += 1
        if rec["deadline_s"] is not None and (rec["status"] == "expired" or (
                rec["status"] == "finished" and rec["finish_s"] > rec["deadline_s"])):
            misses += 1
        preempt += rec["preemptions"]
        met.append(meets_slo(rec, d))
        good += met[-1]
    return {
        "requests": len(recs), "status": dict(status), "ttft_s": _pct(ttft), "tpot_s": _pct(tpot),
        "e2e_s": _pct(e2e), "max_wait_s": max(wait) if wait else None,
        "slowdown": _pct(slow) | ({"mean": float(np.mean(slow))} if slow else {}),
        "overdue_requests": starv, "deadline_misses": misses, "preemptions": preempt,
        "slo_met": good, "goodput": goodput(recs, met), "outcomes": outcomes(recs),
    }


def backlog_buckets(recs: Iterable[dict], key: str, n_buckets: int, bucket_s: float) -> dict[str, np.ndarray]:
    diffs: dict[str, np.ndarray] = {}
    for rec in recs:
        start = rec["arrival_s"] + BACKLOG_GRACE_S
        end = rec["scheduled_s"] if rec["scheduled_s"] is not None else rec["finish_s"]
        if end is None or end <= start:
            continue
        a = int(start // bucket_s)
        b = min(n_buckets, int(-(-end // bucket_s)))
        arr = diffs.get(rec[key])
        if arr is None:
            arr = diffs[rec[key]] = np.zeros(n_buckets + 1, dtype=np.int32)
        arr[a] += 1
        arr[b] -= 1
    return {k: np.cumsum(v)[:n_buckets] > 0 for k, v in diffs.items()}


def service_array(series: dict, n_buckets: int) -> np.ndarray:
    out = np.zeros(n_buckets)
    for b, v in series.items():
        b = int(b)
        if 0 <= b < n_buckets:
            out[b] += v
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


def fairness(recs: list[dict], timeline: dict, contract: Contract, window_s: float = 60.0) -> dict:
    bucket_s = timeline["bucket_s"]
    n_buckets = 1 + max([int(b) for b in timeline["tokens"]] or [0])
    per_window = max(1, int(round(window_s / bucket_s)))
    backlog = backlog_buckets(recs, "tenant", n_buckets, bucket_s)
    service = {t: service_array(s, n_buckets) for t, s in timeline["tenant_service"].items()}
    jains, devs = [], defaultdict(list)
    for w0 in range(0, n_buckets - per_window + 1, per_window):
        sl = slice(w0, w0 + per_window)
        members = [t for t, bl in backlog.items() if bl[sl].mean() >= BACKLOG_FRACTION]
        if len(members) < 2:
            continue
        served = {t: float(service.get(t, np.zeros(n_buckets))[sl].sum()) for t in members}
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
    cbacklog = backlog_buckets(recs, "class", n_buckets, bucket_s)
    cservice = {c: service_array(s, n_buckets) for c, s in timeline["class_service"].items()}
    all_service = sum(service.values()) if service else np.zeros(n_buckets)
    for c, spec in contract.classes.items():
        if spec.min_share <= 0 or c not in cbacklog:
            continue
        mask = cbacklog[c]
        tot = float(all_service[mask].sum())
        got = float(cservice.get(c, np.zeros(n_buckets))[mask].sum())
        share = got / tot if tot else None
        classes[c] = {"min_share": spec.min_share, "share_while_backlogged": share,
                      "ratio_to_min_share": None if share is None else share / spec.min_share,
                      "backlogged_s": float(mask.sum() * bucket_s)}
    split = overdue_split(recs, service, backlog, bucket_s, lambda members: entitled_shares(
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


def summarize(recs: list[dict], timeline: dict, contract: Contract,
              isolated_e2e: dict[str, float] | None = None,
              isolated_tenant: dict[str, dict] | None = None) -> dict:
    by_tenant, by_class, by_bucket = defaultdict(list), defaultdict(list), defaultdict(list)
    for rec in recs:
        by_tenant[rec["tenant"]].append(rec)
        by_class[rec["class"]].append(rec)
        for lo, hi, name in PROMPT_BUCKETS:
            if lo <= rec["prompt_tokens"] < hi:
                by_bucket[name].append(rec)
    finished = [r for r in recs if r["status"] == "finished"]
    t0 = min((r["arrival_s"] for r in recs), default=0.0)
    t1 = max((r["finish_s"] for r in recs if r["finish_s"] is not None), default=t0)
    span = max(1e-9, t1 - t0)
    tok_in = sum(r["prompt_tokens"] for r in finished)
    tok_out = sum(r["output_tokens"] for r in finished)
    recomputed = sum(r["recomputed_tokens"] for r in recs)
    processed = sum(timeline["tokens"].values())
    tenants = {t: group_metrics(v, isolated_e2e) for t, v in sorted(by_tenant.items())}
    add_isolated(tenants, isolated_tenant or {})
    overall = group_metrics(recs, isolated_e2e)
    busy = max(1e-9, timeline["busy_s"])
    classes = {c: group_metrics(v, isolated_e2e) for c, v in sorted(by_class.items())}
    starved = starvation(recs)
    for kind, groups in (("tenants", tenants), ("classes", classes)):
        for g, m in starved[kind].items():
            groups[g].update(m)
    fair = fairness(recs, timeline, contract)
    for t, split in fair["overdue_requests"]["tenants"].items():
        tenants[t]["overdue_split"] = split
    return {
        "requests": len(recs), "status": overall["status"],
        "makespan_s": span, "throughput_tokens_per_s": (tok_in + tok_out) / span,
        "output_tokens_per_s": tok_out / span, "requests_per_s": len(finished) / span,
        "goodput_requests_per_s": overall["slo_met"] / span,
        "overall": overall,
        "preemptions": overall["preemptions"], "recomputed_tokens": recomputed,
        "swapped_bytes": sum(r["swapped_bytes"] for r in recs),
        "recovery_cost_fraction": (recomputed / processed if processed else 0.0)
        + timeline.get("swap_s", 0.0) / busy,
        "finished_tokens": tok_in + tok_out, "last_finish_s": last_finish_s(recs),
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
        "prompt_buckets": {b: group_metrics(v, isolated_e2e) for b, v in by_bucket.items()},
        "engine_steps": timeline["num_steps"], "engine_busy_s": timeline["busy_s"],
    }
