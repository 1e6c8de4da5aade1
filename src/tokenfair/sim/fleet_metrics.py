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

import numpy as np

from ..evaluation.record_table import RecordTable
from .fleet import FleetConfig, FleetRun


def fleet_records(run: FleetRun) -> RecordTable:
    return RecordTable.from_requests(run.requests, extra={"replica": run.replica_of})


def fleet_timeline(run: FleetRun) -> dict[str, Any]:
    """One replica's timeline as it is; several summed per bucket in replica order (each
    sum adds the replicas' values in that order, from zero, as a loop would), one replica's
    series at a time (``_Series``)."""
    swap_s = sum(r.engine.swap_s for r in run.replicas)
    if len(run.replicas) == 1:
        return {**run.replicas[0].recorder.to_json(), "swap_s": swap_s}
    named = {key: _Series() for key in ("tenant_service", "class_service")}
    totals = {key: _Series() for key in ("tokens", "queue_len", "running", "kv_usage")}
    preemptions: list[Any] = []
    bucket_s = num_steps = busy_s = None
    for r in run.replicas:
        p = r.recorder.to_json()
        for key, acc in named.items():
            for name, series in p[key].items():
                acc.add(name, series)
        for key, acc in totals.items():
            acc.add(None, p[key])
        preemptions.extend(p["preemptions"])
        if bucket_s is None:
            bucket_s, num_steps, busy_s = p["bucket_s"], p["num_steps"], p["busy_s"]
        else:
            num_steps += p["num_steps"]
            busy_s += p["busy_s"]
    merged: dict[str, Any] = {"bucket_s": bucket_s}
    for key, acc in named.items():
        merged[key] = {name: acc.summed(name, float) for name in acc.names}
    for key in ("tokens", "queue_len", "running"):
        merged[key] = totals[key].summed(None, int)
    merged["kv_usage"] = totals["kv_usage"].summed(None, float, mean=True)
    merged["preemptions"] = sorted(preemptions)
    merged["num_steps"] = num_steps
    merged["busy_s"] = busy_s
    merged["swap_s"] = swap_s
    return merged


class _Series:
    """Per name, the (bucket, value) pairs of every replica's series, in replica order."""

    def __init__(self) -> None:
        self.names: dict[Any, None] = {}        # first-seen order
        self.buckets: dict[Any, list[np.ndarray]] = defaultdict(list)
        self.values: dict[Any, list[np.ndarray]] = defaultdict(list)

    def add(self, name: Any, series: dict[int, float]) -> None:
        self.names.setdefault(name, None)
        self.buckets[name].append(np.fromiter(map(int, series.keys()), np.int64, len(series)))
        self.values[name].append(np.fromiter(series.values(), np.float64, len(series)))

    def summed(self, name: Any, kind: type, mean: bool = False) -> dict[int, Any]:
        """bucket -> the values' sum (or mean) in replica order, buckets ascending.  ``int``:
        integer values, summed exactly (float sums of integers below 2**53 are exact)."""
        b = np.concatenate(self.buckets[name])
        v = np.concatenate(self.values[name])
        if not len(b):
            return {}
        count = np.bincount(b)
        total = np.bincount(b, weights=v)
        seen = np.flatnonzero(count)
        out = total[seen] / count[seen] if mean else total[seen]
        vals = out.astype(np.int64).tolist() if kind is int else out.tolist()
        return dict(zip(seen.tolist(), vals))


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
                          "locality_hold_s": config.locality_hold_s,
                          "ended_at_gateway": sum(1 for k in run.replica_of if k is None)}
    return out
