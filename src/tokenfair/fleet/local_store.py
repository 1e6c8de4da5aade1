"""The fleet store in this process: the same rules as the Lua scripts (``scripts.py``), used
while Redis is unreachable, with ``share`` (1 / live replicas) of every fleet limit: the
token rate and burst, max_concurrency and each backend's window (each at least 1).

With ``share = 1`` and one gateway it answers exactly as the Redis store does for the same
operations and clock (``tests/fleet/test_store_equivalence.py``)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .model import (REASON_AHEAD, REASON_CONCURRENCY, REASON_RATE, REASON_WINDOW, Completion, DispatchAnswer,
                    DispatchAsk, FleetView, Heartbeat)


@dataclass
class Lease:
    tenant: str
    backend: str
    expires_s: float     # store clock
    op_id: str = ""      # the dispatch that granted it


@dataclass
class LocalState:
    tags: dict[str, float] = field(default_factory=dict)
    vtime: float = 0.0
    weights: dict[str, float] = field(default_factory=dict)
    bucket: dict[str, tuple[float, float]] = field(default_factory=dict)   # tenant -> (level, when)
    blocked: dict[str, float] = field(default_factory=dict)                # tenant -> until
    leases: dict[str, Lease] = field(default_factory=dict)
    served: dict[str, float] = field(default_factory=dict)
    charged: dict[str, float] = field(default_factory=dict)
    applied: set[str] = field(default_factory=set)   # dispatch op ids whose lease is not completed yet


def _scaled(limit: int, share: float) -> int:
    return max(1, int(math.floor(limit * share)))


class LocalStore:
    """:class:`~tokenfair.fleet.redis_store.FleetStore` in memory (see the module docstring)."""

    def __init__(self, share: float = 1.0) -> None:
        self.share = share
        self.state = LocalState()

    def clock(self, now: float) -> float:
        return now if now > 0 else time.monotonic()

    def seed(self, tags: dict[str, float], vtime: float) -> None:
        """Start from the fleet's last known tags (entering degraded mode)."""
        for t, s in tags.items():
            self.state.tags[t] = max(self.state.tags.get(t, 0.0), s)
        self.state.vtime = max(self.state.vtime, vtime)

    def adopt(self, ask: DispatchAsk) -> None:
        """Count a lease Redis granted for ``ask`` (never expiring here: this gateway releases
        its own leases), so this store's windows see it while degraded."""
        self.state.leases[ask.lease_id] = Lease(ask.tenant, ask.backend, math.inf, ask.op_id)
        self.state.applied.add(ask.op_id)

    def release(self, lease_id: str) -> None:
        lease = self.state.leases.pop(lease_id, None)
        if lease is not None:
            self.state.applied.discard(lease.op_id)

    def _level(self, tenant: str, rate: float, burst: float, now: float) -> float:
        b = self.state.bucket.get(tenant)
        if b is None:
            return burst
        return min(burst, b[0] + max(0.0, now - b[1]) * rate)

    def _count(self, now: float, backend: str | None = None, tenant: str | None = None) -> int:
        st = self.state
        for k in [k for k, v in st.leases.items() if v.expires_s <= now]:
            del st.leases[k]
        return sum(1 for v in st.leases.values()
                   if (backend is None or v.backend == backend) and (tenant is None or v.tenant == tenant))

    def _answer(self, ok: bool, reason: str, backend: str, now: float, retry: float = 0.0) -> DispatchAnswer:
        return DispatchAnswer(ok=ok, reason=reason, tags=dict(self.state.tags), vtime=self.state.vtime,
                              backend_inflight=self._count(now, backend=backend), retry_s=retry)

    def _check(self, ask: DispatchAsk, s: float, level: float, now: float) -> tuple[str, float]:
        """The first refusal of ``ask`` (reason, retry_s), or ("", V_b) when it may go."""
        st, share = self.state, self.share
        if self._count(now, backend=ask.backend) >= _scaled(ask.window, share):
            return REASON_WINDOW, 0.0
        if ask.max_concurrency > 0 and self._count(now, tenant=ask.tenant) >= _scaled(ask.max_concurrency, share):
            st.blocked[ask.tenant] = now + ask.lease_ttl_s
            return REASON_CONCURRENCY, 0.0
        if ask.rate > 0 and level < 0:
            wait = -level / (ask.rate * share)
            st.blocked[ask.tenant] = now + wait
            return REASON_RATE, wait
        if not ask.check_ahead:
            return "", -math.inf
        vb = s
        for j in set(ask.backlog) - {ask.tenant}:
            if st.blocked.get(j, -math.inf) > now:
                continue
            sj = max(st.tags.get(j, 0.0), st.vtime - ask.credit / st.weights.get(j, 1.0))
            vb = min(vb, sj)
        if s > vb + ask.cost_pred / ask.weight:
            return REASON_AHEAD, 0.0
        return "", vb

    async def dispatch(self, ask: DispatchAsk) -> DispatchAnswer:
        st, share = self.state, self.share
        now = self.clock(ask.now)
        if ask.op_id in st.applied:
            return self._answer(True, "", ask.backend, now)
        s = max(st.tags.get(ask.tenant, 0.0), st.vtime - ask.credit / ask.weight)
        level = self._level(ask.tenant, ask.rate * share, ask.burst * share, now) if ask.rate > 0 else 0.0
        if not ask.force:
            reason, x = self._check(ask, s, level, now)
            if reason:
                return self._answer(False, reason, ask.backend, now, x)
            st.vtime = max(st.vtime, x)
        st.tags[ask.tenant] = s + ask.cost_pred / ask.weight
        st.weights[ask.tenant] = ask.weight
        if ask.rate > 0:
            st.bucket[ask.tenant] = (level - ask.cost_max, now)
        st.leases[ask.lease_id] = Lease(ask.tenant, ask.backend, now + ask.lease_ttl_s, ask.op_id)
        st.charged[ask.tenant] = st.charged.get(ask.tenant, 0.0) + ask.cost_pred
        st.blocked.pop(ask.tenant, None)
        st.applied.add(ask.op_id)
        return self._answer(True, "", ask.backend, now)

    async def complete(self, done: Completion) -> DispatchAnswer:
        st, share = self.state, self.share
        now = self.clock(done.now)
        if done.dispatch_op not in st.applied:      # never dispatched here, or completed already
            return self._answer(True, "", done.backend, now)
        st.applied.discard(done.dispatch_op)
        s = st.tags.get(done.tenant, 0.0)
        delta = (done.cost_actual - done.cost_pred) / done.weight
        s = s + delta if delta >= 0 else max(s + delta, min(s, st.vtime - done.credit / done.weight))
        st.tags[done.tenant] = s
        if done.rate > 0:
            burst = done.burst * share
            level = self._level(done.tenant, done.rate * share, burst, now) + done.cost_max - done.cost_actual
            st.bucket[done.tenant] = (min(burst, level), now)
        st.leases.pop(done.lease_id, None)
        st.served[done.tenant] = st.served.get(done.tenant, 0.0) + done.cost_actual
        st.blocked.pop(done.tenant, None)
        return self._answer(True, "", done.backend, now)

    def inflight_by_backend(self) -> dict[str, int]:
        per: dict[str, int] = {}
        for v in self.state.leases.values():
            per[v.backend] = per.get(v.backend, 0) + 1
        return per

    async def heartbeat(self, hb: Heartbeat) -> FleetView:
        now = self.clock(hb.now)
        for lease_id, backend, tenant in hb.leases:
            lease = self.state.leases.get(lease_id)
            if lease is not None:
                lease.expires_s = max(lease.expires_s, now + hb.lease_ttl_s)
        self._count(now)
        return FleetView(live_gateways=1, tags=dict(self.state.tags), vtime=self.state.vtime,
                         backend_inflight=self.inflight_by_backend(), contract=hb.contract)
