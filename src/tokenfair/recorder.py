"""What a run records besides the per-request states: service over time, queue, KV, preemptions.

Service is bucketed per ``bucket_s`` (1 s) of simulated/wall time, per tenant and per class,
in cost-weighted tokens (the contract's prefill/decode weights), so shares and Jain's index
can be computed over any window made of whole buckets.  Memory: O(buckets x active tenants).
"""

from __future__ import annotations

from collections import defaultdict

from .contract import CostWeights
from .sched.interface import SchedulerOutput


class Recorder:
    def __init__(self, costs: CostWeights, bucket_s: float = 1.0) -> None:
        self.costs = costs
        self.bucket_s = bucket_s
        self.tenant_service: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.class_service: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.tokens: dict[int, int] = defaultdict(int)       # bucket -> tokens processed
        self.queue_len: dict[int, int] = {}
        self.running: dict[int, int] = {}
        self.kv_usage: dict[int, float] = {}
        self.preemptions: list[tuple[float, str, str, str]] = []   # (t, request_id, tenant, mode)
        self.num_steps = 0
        self.busy_s = 0.0

    def record_step(self, out: SchedulerOutput, t_end: float, duration_s: float,
                    num_waiting: int, num_running: int, kv_usage: float) -> None:
        b = int(t_end // self.bucket_s)
        wp, wd = self.costs.prefill_token, self.costs.decode_token
        ts, cs = self.tenant_service, self.class_service
        n_tokens = 0
        for req, n in out.prefill:
            c = wp * n
            ts[req.tenant][b] += c
            cs[req.klass][b] += c
            n_tokens += n
        for req in out.decode:
            ts[req.tenant][b] += wd
            cs[req.klass][b] += wd
        n_tokens += len(out.decode)
        self.tokens[b] += n_tokens
        for req, mode in out.preempted:
            self.preemptions.append((t_end - duration_s, req.request_id, req.tenant, mode))
        self.queue_len[b] = num_waiting
        self.running[b] = num_running
        self.kv_usage[b] = kv_usage
        self.num_steps += 1
        self.busy_s += duration_s

    def to_json(self) -> dict:
        return {
            "bucket_s": self.bucket_s,
            "tenant_service": {t: dict(sorted(v.items())) for t, v in self.tenant_service.items()},
            "class_service": {c: dict(sorted(v.items())) for c, v in self.class_service.items()},
            "tokens": dict(sorted(self.tokens.items())),
            "queue_len": self.queue_len,
            "running": self.running,
            "kv_usage": self.kv_usage,
            "preemptions": self.preemptions,
            "num_steps": self.num_steps,
            "busy_s": self.busy_s,
        }
