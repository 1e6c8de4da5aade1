"""A fleet run's records, timeline and per-replica summary.

Records: ``metrics.request_record`` plus ``replica`` (the replica index it landed on; None
for a request that ended at the gateway or at intake).  Timeline: one replica's own; for
several, the replicas' series summed per bucket (service, tokens, queue length, running),
KV use averaged over the replicas that recorded the bucket, steps and busy time summed.
Summary (``summary["fleet"]``): per replica the requests routed to it, utilisation (busy
time / the run's makespan), steps, preemptions and prefix-cache hit rate; for the fleet the
cache hit rate (blocks hit / blocks asked), *routing imbalance* (the most requests one
replica got / the mean) and *busy imbalance* (the most busy time / the mean).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..evaluation.metrics import request_record
from .fleet import FleetConfig, FleetRun


def fleet_records(run: FleetRun) -> list[dict[str, Any]]:
    out = []
    for req, k in zip(run.requests, run.replica_of):
        rec = request_record(req)
        rec["replica"] = k
        out.append(rec)
    return out


def fleet_timeline(run: FleetRun) -> dict[str, Any]:
    parts = [r.recorder.to_json() for r in run.replicas]
    swap_s = sum(r.engine.swap_s for r in run.replicas)
    if len(parts) == 1:
        return {**parts[0], "swap_s": swap_s}
    merged: dict[str, Any] = {"bucket_s": parts[0]["bucket_s"]}
    for key in ("tenant_service", "class_service"):
        acc: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for p in parts:
            for name, series in p[key].items():
                for b, v in series.items():
                    acc[name][b] += v
        merged[key] = {name: dict(sorted(s.items())) for name, s in acc.items()}
    for key in ("tokens", "queue_len", "running"):
        tot: dict[int, float] = defaultdict(int)
        for p in parts:
            for b, v in p[key].items():
                tot[b] += v
        merged[key] = dict(sorted(tot.items()))
    kv: dict[int, list[float]] = defaultdict(list)
    for p in parts:
        for b, v in p["kv_usage"].items():
            kv[b].append(v)
    merged["kv_usage"] = {b: sum(v) / len(v) for b, v in sorted(kv.items())}
    merged["preemptions"] = sorted(x for p in parts for x in p["preemptions"])
    merged["num_steps"] = sum(p["num_steps"] for p in parts)
    merged["busy_s"] = sum(p["busy_s"] for p in parts)
    merged["swap_s"] = swap_s
    return merged


def _ratio_to_mean(values: list[float]) -> float | None:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


def fleet_summary(run: FleetRun, config: FleetConfig, makespan_s: float) -> dict[str, Any]:
    span = max(1e-9, makespan_s)
    per = []
    asked = hit = 0
    for r in run.replicas:
        cache = r.cache.report() if r.cache is not None else None
        if r.cache is not None:
            asked += r.cache.num_blocks_asked
            hit += r.cache.num_blocks_hit
        per.append({"replica": r.index, "requests": r.num_routed, "busy_s": r.engine.busy_s,
                    "utilisation": r.engine.busy_s / span, "steps": r.recorder.num_steps,
                    "preemptions": r.sched.num_preemptions, "prefix_cache": cache})
    out: dict[str, Any] = {
        "replicas": len(run.replicas), "router": config.router, "fleet_policy": config.fleet_policy,
        "prefix_cache": config.prefix_cache,
        "cache_hit_rate": (hit / asked) if asked else None,
        "routing_imbalance": _ratio_to_mean([float(p["requests"]) for p in per]),
        "busy_imbalance": _ratio_to_mean([p["busy_s"] for p in per]),
        "mean_utilisation": sum(p["utilisation"] for p in per) / len(per),
        "per_replica": per,
    }
    if run.gate is not None:
        out["gateway"] = {"policy": config.gateway_policy, "window_per_replica": run.gate.window,
                          "cached_token_discount": config.cached_discount,
                          "ended_at_gateway": sum(1 for k in run.replica_of if k is None)}
    return out
