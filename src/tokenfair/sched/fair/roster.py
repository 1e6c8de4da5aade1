"""The fair policy's tenants: who has been seen, who is active, how much runs."""

from __future__ import annotations

from ...contracts.contract import Contract
from ...core.request import Request
from .admission import AdmissionControl
from .guarantee import ServiceGuarantee
from .tenant import TenantState


class TenantRoster:
    """Every tenant's :class:`TenantState`, made on first sight.

    Invariants: ``tenants`` holds each tenant seen, in first-seen order (``t.seq`` is its
    index); ``num_running`` is the sum of ``len(t.running)``; ``active_weight`` is the sum of
    the weights of the tenants with ``t.active`` (waiting or running work), kept by
    :meth:`touch`, which is called after every change of a tenant's waiting or running
    requests (and tells the starving guarantee, ``guarantee.py``); ``guaranteed`` and
    ``rate_limited`` are the tenants with a min share and with a token rate limit, in
    first-seen order; ``total_weight`` the sum of all tenants' weights, ``min_weight`` the
    least of them (inf: none seen)."""

    def __init__(self, contract: Contract, held: dict[str, int], admission: AdmissionControl,
                 guarantee: ServiceGuarantee) -> None:
        self.contract = contract
        self.held = held                        # the KV pool's tenant -> device blocks
        self.admission = admission
        self.guarantee = guarantee
        self.tenants: dict[str, TenantState] = {}
        self.guaranteed: list[TenantState] = []
        self.rate_limited: list[TenantState] = []
        self.total_weight = 0.0
        self.min_weight = float("inf")
        self.active_weight = 0.0
        self.num_running = 0

    def tenant(self, name: str, now: float = 0.0) -> TenantState:
        t = self.tenants.get(name)
        if t is None:
            t = self.tenants[name] = TenantState(name, self.contract.tenant(name), now, len(self.tenants),
                                                   held=self.held)
            self.admission.register(t)
            if t.spec.min_share > 0:
                self.guaranteed.append(t)
            if t.spec.rate_limit is not None:
                self.rate_limited.append(t)
            self.total_weight += t.weight
            self.min_weight = min(self.min_weight, t.weight)
        return t

    def touch(self, t: TenantState, now: float) -> None:
        """``t``'s waiting or running requests changed: its starving spell and activity."""
        self.guarantee.note(t, now)
        active = t.num_waiting > 0 or bool(t.running)
        if active != t.active:
            t.active = active
            self.active_weight += t.weight if active else -t.weight

    def long_prefill_limit(self, t: TenantState, per_tenant: int) -> int:
        """How many long prefills ``t`` (not light) may run: ``per_tenant`` x
        ``floor(w_t / w_min)``, at least ``per_tenant``.  The limit bounds a heavy tenant's
        prefill rate; held to the rate of a tenant of the least weight, a tenant of twice that
        weight would get less than its weight share while both are backlogged.  O(1)."""
        return per_tenant * max(1, int(t.weight / self.min_weight))

    def start(self, t: TenantState, req: Request) -> None:
        t.running.add(req)
        self.num_running += 1

    def stop(self, t: TenantState, req: Request) -> bool:
        """``req`` no longer runs; False when it was not running."""
        if req not in t.running:
            return False
        t.running.discard(req)
        self.num_running -= 1
        return True

    def rebind(self, new: Contract, now: float) -> dict[str, float]:
        """A live contract change (``rebind.py``): every tenant takes its spec in ``new`` (its
        own entry or the default template) and its weight; its token bucket is refilled to
        ``now`` under the old rate, then capped at the new burst (a tenant that gains a
        limit starts with a full bucket; one that loses it stops counting).  Returns each
        tenant's weight change (new - old)."""
        self.contract = new
        changes: dict[str, float] = {}
        for name, t in self.tenants.items():
            spec = new.tenant(name)
            if now > t.bucket_t:
                self.admission.refill(t, now)       # the bucket up to now, under the old rate
            rl = spec.rate_limit
            if rl is None:
                t.bucket = 0.0
            elif t.spec.rate_limit is None:
                t.bucket, t.bucket_t = rl.burst_tokens, now
            else:
                t.bucket = min(t.bucket, rl.burst_tokens)
            dw = spec.weight - t.weight
            t.spec, t.weight = spec, spec.weight
            self.total_weight += dw
            if t.active:
                self.active_weight += dw
            changes[name] = dw
        self.guaranteed = [t for t in self.tenants.values() if t.spec.min_share > 0]
        self.rate_limited = [t for t in self.tenants.values() if t.spec.rate_limit is not None]
        self.min_weight = min((t.weight for t in self.tenants.values()), default=float("inf"))
        return changes
