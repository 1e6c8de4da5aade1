"""What fidelity compares: pure functions over two runs' records, timelines and summaries
(no torch, no engine).  See :mod:`tokenfair.engine.fidelity` for the runs themselves.

Reported by :func:`compare`:
  * per-request absolute percentage error of TTFT and of end-to-end latency (median, p90;
    requests finished in both runs, matched by id);
  * P50 / P95 of TTFT and e2e over all requests, per class and per tenant, real vs simulated
    (:func:`latency_percentiles`): what operators judge a contract by;
  * per-tenant share of cost-weighted service, progress-aligned: each tenant's share of the
    first 25 / 50 / 75 / 100 % of all service delivered in each run (wall and virtual time
    differ, progress does not), and the largest absolute difference;
  * run-level numbers side by side (makespan, throughput, preemptions, status counts).
:func:`step_model_error` prices every real step's exact shape with the profile (cost-model
error apart from scheduling divergence); :func:`repeat_report` compares repeated real runs.
"""

from __future__ import annotations

import numpy as np

from ..core.costmodel import Profile


def _ape(real: float, sim: float) -> float:
    return abs(sim - real) / max(abs(real), 1e-9)


PROGRESS = (0.25, 0.5, 0.75, 1.0)


def progress_shares(timeline: dict, points=PROGRESS) -> dict[float, dict[str, float]]:
    """Each tenant's share of the first ``p`` of all service, for each ``p`` in ``points``
    (1 s buckets; the bucket that crosses ``p`` counts pro rata)."""
    series = {t: {int(b): float(x) for b, x in v.items()} for t, v in timeline["tenant_service"].items()}
    buckets = sorted({b for v in series.values() for b in v})
    total = sum(sum(v.values()) for v in series.values())
    out: dict[float, dict[str, float]] = {}
    for p in points:
        target, acc = p * total, 0.0
        got = {t: 0.0 for t in series}
        for b in buckets:
            step = {t: v.get(b, 0.0) for t, v in series.items()}
            n = sum(step.values())
            if n <= 0:
                continue
            frac = min(1.0, (target - acc) / n)
            for t, x in step.items():
                got[t] += frac * x
            acc += frac * n
            if acc >= target - 1e-12:
                break
        s = sum(got.values())
        out[p] = {t: (x / s if s else 0.0) for t, x in got.items()}
    return out


def step_model_error(step_log, profile: Profile) -> dict:
    """The profile's step time for each real step's shape vs the measured time (swaps excluded)."""
    ape, meas, pred = [], 0.0, 0.0
    for prefill, ctx, n_dec, seconds, swap_s in step_log:
        p = profile.step_s(prefill, ctx, n_dec)
        m = max(1e-9, seconds - swap_s)
        ape.append(abs(p - m) / m)
        meas += m
        pred += p
    if not ape:
        return {"steps": 0, "median_ape": None, "p90_ape": None, "bias": None}
    return {"steps": len(ape), "median_ape": float(np.median(ape)), "p90_ape": float(np.percentile(ape, 90)),
            "bias": meas / pred if pred else None}


def _latencies(records: list[dict]) -> dict[str, tuple[float, float]]:
    return {r["request_id"]: (r["first_token_s"] - r["arrival_s"], r["finish_s"] - r["arrival_s"])
            for r in records if r["status"] == "finished"}


def _median_ape(pairs: list[tuple[float, float]]) -> float | None:
    return float(np.median([_ape(a, b) for a, b in pairs])) if pairs else None


def compare(real_records: list[dict], real_timeline: dict, real_summary: dict,
            sim_records: list[dict], sim_timeline: dict, sim_summary: dict) -> dict:
    sim_status = {r["request_id"]: r["status"] for r in sim_records}
    real_lat, sim_lat = _latencies(real_records), _latencies(sim_records)
    ttft, e2e, rows = [], [], []
    status_mismatch = sum(1 for r in real_records
                          if r["request_id"] in sim_status and r["status"] != sim_status[r["request_id"]])
    for r in real_records:
        i = r["request_id"]
        if i not in real_lat or i not in sim_lat:
            continue
        (rt, re), (st, se) = real_lat[i], sim_lat[i]
        ttft.append(_ape(rt, st))
        e2e.append(_ape(re, se))
        rows.append({"request_id": i, "tenant": r["tenant"], "ttft_real": rt, "ttft_sim": st,
                     "e2e_real": re, "e2e_sim": se})
    both = len(rows)
    real_ps, sim_ps = progress_shares(real_timeline), progress_shares(sim_timeline)
    tenants = sorted(set(real_timeline["tenant_service"]) | set(sim_timeline["tenant_service"]))
    tenant_share = {}
    for t in tenants:
        row = {"real": {}, "sim": {}, "abs_error": {}}
        for p in PROGRESS:
            r, s_ = real_ps[p].get(t, 0.0), sim_ps[p].get(t, 0.0)
            row["real"][f"{p:.0%}"], row["sim"][f"{p:.0%}"] = r, s_
            row["abs_error"][f"{p:.0%}"] = abs(r - s_)
        row["max_abs_error"] = max(row["abs_error"].values())
        tenant_share[t] = row

    def q(a, p):
        return float(np.percentile(a, p)) if a else None

    side = {}
    for key in ("makespan_s", "throughput_tokens_per_s", "preemptions", "engine_steps", "engine_busy_s"):
        side[key] = {"real": real_summary.get(key), "sim": sim_summary.get(key)}
    side["status"] = {"real": real_summary.get("status"), "sim": sim_summary.get("status")}
    return {
        "matched_finished": both, "status_mismatches": status_mismatch,
        "percentiles": latency_percentiles(real_records, sim_records),
        "ttft_ape": {"median": q(ttft, 50), "p90": q(ttft, 90), "mean": float(np.mean(ttft)) if ttft else None},
        "e2e_ape": {"median": q(e2e, 50), "p90": q(e2e, 90), "mean": float(np.mean(e2e)) if e2e else None},
        "tenant_share": tenant_share,
        "max_share_error": max((v["max_abs_error"] for v in tenant_share.values()), default=None),
        "run": side,
        "requests": rows,
    }


def repeat_report(real_runs: list[list[dict]], sim_records: list[dict]) -> dict:
    """How far the real engine is from *itself*: the same workload replayed ``len(real_runs)``
    times (each run's request records).  Per-request median
    |err| of TTFT / e2e for every pair of real runs (the noise floor no simulator can beat
    against a single run), of the simulator against each real run, and of the simulator
    against each request's median over the real runs (requests finished in every run)."""
    runs = [_latencies(records) for records in real_runs]
    sim = _latencies(sim_records)
    ids = [i for i in runs[0] if i in sim and all(i in run for run in runs)]

    def errors(a: dict, b: dict) -> dict:
        return {"ttft": _median_ape([(a[i][0], b[i][0]) for i in ids]),
                "e2e": _median_ape([(a[i][1], b[i][1]) for i in ids])}

    median = {i: tuple(float(np.median([run[i][m] for run in runs])) for m in (0, 1)) for i in ids}
    pairs = [(j, k) for j in range(len(runs)) for k in range(j + 1, len(runs))]
    return {"runs": len(runs), "requests": len(ids),
            "real_vs_real": [{"runs": [j + 1, k + 1], **errors(runs[j], runs[k])} for j, k in pairs],
            "sim_vs_real": [errors(run, sim) for run in runs],
            "sim_vs_real_median": errors(median, sim)}


PERCENTILES = (50, 95)


def latency_percentiles(real_records: list[dict], sim_records: list[dict], points=PERCENTILES,
                        min_requests: int = 5) -> dict:
    """P50 / P95 (``points``) of TTFT and e2e, real vs simulated, over the requests finished
    in both runs: ``{"all": G, "class": {name: G}, "tenant": {name: G}}`` with ``G`` =
    ``{"requests": n, "ttft": {"p50": {"real", "sim", "ape"}, ...}, "e2e": {...}}``.  Groups
    with fewer than ``min_requests`` such requests are left out (a p95 of three requests is
    one request)."""
    real_lat, sim_lat = _latencies(real_records), _latencies(sim_records)
    groups: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    for r in real_records:
        i = r["request_id"]
        if i not in real_lat or i not in sim_lat:
            continue
        row = (*real_lat[i], *sim_lat[i])  # TTFT real, e2e real, TTFT sim, e2e sim
        for key in (("all", "all"), ("class", r.get("class")), ("tenant", r.get("tenant"))):
            if key[1] is not None:
                groups.setdefault(key, []).append(row)

    def summary(rows):
        cols = np.array(rows)
        out = {"requests": len(rows)}
        for metric, (i, j) in (("ttft", (0, 2)), ("e2e", (1, 3))):
            out[metric] = {}
            for p in points:
                real, sim = float(np.percentile(cols[:, i], p)), float(np.percentile(cols[:, j], p))
                out[metric][f"p{p}"] = {"real": real, "sim": sim, "ape": _ape(real, sim)}
        return out

    res: dict = {"all": None, "class": {}, "tenant": {}}
    for (kind, name), rows in sorted(groups.items()):
        if len(rows) < min_requests:
            continue
        if kind == "all":
            res["all"] = summary(rows)
        else:
            res[kind][name] = summary(rows)
    return res
