"""Prometheus metrics of the service (``GET /metrics``), one registry per app.

Series (``tenant`` labels are capped, see :class:`TenantLabels`):

  counters   tokenfair_requests_total{tenant,class,status}      terminal requests
             tokenfair_rejections_total{tenant,reason}          429/403/413/503 at the door
             tokenfair_tokens_total{tenant,class,kind}          prompt / output tokens served
             tokenfair_preemptions_total{tenant}
             tokenfair_unauthorized_requests_total{endpoint}    401s (no tenant: the key named none)
             tokenfair_engine_steps_total                        serve: engine steps executed
  histograms tokenfair_queue_wait_seconds{tenant,class}         arrival -> admission
             tokenfair_ttft_seconds{tenant,class}               arrival -> first token
             tokenfair_tpot_seconds{tenant,class}               per output token after the first
             tokenfair_e2e_seconds{tenant,class}
  gauges     tokenfair_queue_length{tenant,class}               waiting requests (scrape time)
             tokenfair_running_requests{tenant}
             tokenfair_service_share{tenant}                    decayed recent service share
             tokenfair_entitled_share{tenant}                   weight share among active tenants
                                                                (water-filled to min_share)
             plus backend gauges (serve: KV usage; gateway: per-backend window, in-flight,
             TTFT baseline, up).

Tenant label cardinality: the contract's named tenants (heaviest weight first) and then the
first tenants seen, up to ``max_tenants`` labels; every other tenant is ``"other"``.
A gauge series reported once reads 0 when its value is gone (queue empty, nothing
running) instead of vanishing.  ``/metrics`` shows tenant names: ``--metrics-key-sha256``
makes it require that key (401 otherwise).
The ``reason`` label is the request's :class:`~tokenfair.core.reasons.ReasonCode` value
(``queue_full``, ``overloaded``, ...): a closed set, so that label is bounded too.
"""

from __future__ import annotations

import threading
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..contracts.contract import Contract
from ..core.reasons import ReasonCode
from ..core.request import Request

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
OTHER = "other"


class TenantLabels:
    """Bounded tenant label values: ``max_tenants`` names, then ``"other"``."""

    def __init__(self, contract: Contract, max_tenants: int = 20) -> None:
        self.max_tenants = max(1, max_tenants)
        self._lock = threading.Lock()
        named = sorted(contract.tenants, key=lambda t: (-contract.tenants[t].weight, t))
        self.known: set[str] = set(named[: self.max_tenants])

    def __call__(self, tenant: str) -> str:
        if tenant in self.known:
            return tenant
        with self._lock:
            if tenant in self.known:
                return tenant
            if len(self.known) < self.max_tenants:
                self.known.add(tenant)
                return tenant
        return OTHER


class ServiceMetrics:
    def __init__(self, contract: Contract, max_tenants: int = 20,
                 snapshot: Callable[[], dict] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.contract = contract
        self.tenant = TenantLabels(contract, max_tenants)
        self.classes = set(contract.classes)
        r = self.registry
        self.requests = Counter("tokenfair_requests", "Requests that ended, by terminal status",
                                ["tenant", "class", "status"], registry=r)
        self.rejections = Counter("tokenfair_rejections", "Requests refused at the door, by reason code",
                                  ["tenant", "reason"], registry=r)
        self.tokens = Counter("tokenfair_tokens", "Tokens served (prompt tokens prefilled, output tokens generated)",
                              ["tenant", "class", "kind"], registry=r)
        self.unauthorized = Counter("tokenfair_unauthorized_requests", "Requests refused with 401 (no or bad key)",
                                    ["endpoint"], registry=r)
        self.preemptions = Counter("tokenfair_preemptions", "Preemptions (recompute or swap), or backend retries",
                                   ["tenant"], registry=r)
        self.wait = Histogram("tokenfair_queue_wait_seconds", "Arrival to admission",
                              ["tenant", "class"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("tokenfair_ttft_seconds", "Arrival to first token",
                              ["tenant", "class"], buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("tokenfair_tpot_seconds", "Time per output token after the first",
                              ["tenant", "class"], buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("tokenfair_e2e_seconds", "Arrival to last token",
                             ["tenant", "class"], buckets=LATENCY_BUCKETS, registry=r)
        if snapshot is not None:
            r.register(_SnapshotCollector(self, snapshot))

    def klass(self, k: str) -> str:
        return k if k in self.classes else OTHER

    def rejected(self, tenant: str, code: ReasonCode | None) -> None:
        """One request refused at the door, labelled by its reason code."""
        self.rejections.labels(self.tenant(tenant), (code or ReasonCode.UNSPECIFIED).value).inc()

    def preempted(self, tenant: str, n: int = 1) -> None:
        self.preemptions.labels(self.tenant(tenant)).inc(n)

    def ended(self, req: Request) -> None:
        """Record one terminal request (called exactly once per request)."""
        t, k = self.tenant(req.tenant), self.klass(req.klass)
        self.requests.labels(t, k, req.status.value).inc()
        a = req.arrival_s
        if req.scheduled_s is not None:
            self.wait.labels(t, k).observe(max(0.0, req.scheduled_s - a))
        if req.first_token_s is not None:
            self.ttft.labels(t, k).observe(max(0.0, req.first_token_s - a))
            self.tokens.labels(t, k, "prompt").inc(req.prompt_tokens)
        if req.num_output:
            self.tokens.labels(t, k, "output").inc(req.num_output)
        if req.finish_s is not None and req.first_token_s is not None and req.status.value == "finished":
            self.e2e.labels(t, k).observe(max(0.0, req.finish_s - a))
            if req.num_output > 1:
                self.tpot.labels(t, k).observe(max(0.0, (req.finish_s - req.first_token_s) / (req.num_output - 1)))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SnapshotCollector:
    """Gauges computed at scrape time from the backend's ``snapshot()``::

        {"queue": {(tenant, class): n}, "running": {tenant: n}, "share": {tenant: x},
         "entitled": {tenant: x}, "extra": [(name, help, labelnames, {labelvalues: value})],
         "counters": [(name, help, value)]}      # counters the backend keeps (engine steps)
    """

    def __init__(self, metrics: ServiceMetrics, snapshot: Callable[[], dict]) -> None:
        self.m = metrics
        self.snapshot = snapshot
        # label sets reported once are reported as 0 afterwards (a gauge that vanishes at zero
        # reads as "no data", not "empty"); bounded by the tenant label cap x classes
        self.seen_queue: set[tuple[str, str]] = set()
        self.seen_tenants: dict[str, set[str]] = {}

    def describe(self):
        return []

    def collect(self):
        snap = self.snapshot()
        lab, kl = self.m.tenant, self.m.klass
        q = GaugeMetricFamily("tokenfair_queue_length", "Waiting requests", labels=["tenant", "class"])
        agg: dict[tuple[str, str], float] = dict.fromkeys(self.seen_queue, 0)   # 0, not gone, once seen
        for (t, k), n in snap.get("queue", {}).items():
            key = (lab(t), kl(k))
            agg[key] = agg.get(key, 0) + n
        self.seen_queue.update(agg)
        for key, n in sorted(agg.items()):
            q.add_metric(list(key), n)
        yield q
        for name, help_, field in (("tokenfair_running_requests", "Running (admitted) requests", "running"),
                                   ("tokenfair_service_share", "Decayed recent share of served cost", "share"),
                                   ("tokenfair_entitled_share", "Weight share among active tenants", "entitled")):
            g = GaugeMetricFamily(name, help_, labels=["tenant"])
            seen = self.seen_tenants.setdefault(field, set())
            per: dict[str, float] = dict.fromkeys(seen, 0.0)
            for t, v in snap.get(field, {}).items():
                per[lab(t)] = per.get(lab(t), 0.0) + v
            seen.update(per)
            for t, v in sorted(per.items()):
                g.add_metric([t], v)
            yield g
        for name, help_, labelnames, values in snap.get("extra", []):
            g = GaugeMetricFamily(name, help_, labels=list(labelnames))
            for lv, v in values.items():
                g.add_metric(list(lv), v)
            yield g
        for name, help_, value in snap.get("counters", []):
            yield CounterMetricFamily(name, help_, value=value)
