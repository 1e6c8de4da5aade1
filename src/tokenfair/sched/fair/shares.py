"""Who is light, who holds more than its share: the fair policy's view of recent service.

* *recent service*: per tenant (and in total) the cost-weighted tokens served, decayed
  exponentially with time constant ``share_tau_s``; ``recent_total / tau`` is the engine's
  service rate;
* *light* (``under_share``): a tenant recently served, per weight, clearly less than the most
  served active tenant -- below the max-min water level, so what it asks for is within its
  fair share and it gets latency priority;
* *headroom*: KV blocks and slots kept free for tenants within their weight share (the
  static headroom, or what those tenants used at their recent peak, whichever is larger).
"""

from __future__ import annotations

from .tenant import TenantState

LIGHT_FRACTION = 0.9
LEVEL_REFRESH_S = 0.25
PEAK_MARGIN = 1.25


class SharesMixin:
    """Mixed into :class:`FairPolicy`; uses its tenants, pool, contract and counters."""

    def under_share(self, t: TenantState, now: float) -> bool:
        """A *light* tenant: recently served (decayed, normalised by weight) clearly less than
        the most served active tenant, i.e. below the max-min water level: its demand is met
        or it is owed, so it gets latency priority over the heaviest ones."""
        return t.decayed_recent(now, self.share_tau_s) / t.weight < LIGHT_FRACTION * self._level(now)

    def _level(self, now: float) -> float:
        """Max normalised recent service over active tenants; O(T), refreshed every 0.25 s."""
        if now - self._level_t >= LEVEL_REFRESH_S or self._level_t > now:
            self._level_t = now
            self._level_v = max((t.decayed_recent(now, self.share_tau_s) / t.weight
                                 for t in self.tenants.values() if t.active), default=0.0)
        return self._level_v

    def service_rate(self, now: float) -> float | None:
        """Engine service rate in cost units/s, or None before the warm-up."""
        if self.first_service_s is None or now - self.first_service_s < max(self.contract.admission.warmup_s,
                                                                            self.share_tau_s):
            return None
        return self.recent_total / self.share_tau_s

    def predicted_wait_s(self, t: TenantState, req, now: float) -> float:
        """Predicted cost queued ahead of ``req`` in its tenant (classes of at least its base
        priority) over the rate the tenant's queue drains (predicted cost of its admissions per
        second, decayed; both in predicted units, so prediction bias cancels), never over less
        than its weight share of the engine's rate (its guaranteed floor)."""
        rate = self.service_rate(now)
        if rate is None:
            return 0.0
        cls = self.contract.classes.get(req.klass)
        ahead = t.queued_ahead(cls.priority if cls is not None else req.priority, self.contract.classes)
        if ahead <= 0:
            return 0.0
        floor = rate * t.weight / max(self.total_weight, t.weight)
        drain = t.decayed_admitted(now, self.share_tau_s) / self.share_tau_s
        return ahead / max(floor, drain, 1e-9)

    def _within_share(self, t: TenantState, extra_blocks: int, extra_slots: int) -> bool:
        """True when ``t`` stays within its weight share of KV and of slots after admission."""
        share = t.weight / max(self.total_weight, t.weight)
        return (t.kv_blocks() + extra_blocks <= share * self.pool.num_blocks
                and len(t.running) + extra_slots <= share * self.contract.engine.max_running)

    def _reserved(self, now: float) -> tuple[int, int]:
        """(KV blocks, slots) kept free for tenants within their share: the static headroom,
        or what those tenants recently used at peak (x ``PEAK_MARGIN``) beyond what they
        hold now, whichever is larger.  Computed once per step, O(tenants)."""
        if self._reserved_cache is not None:
            return self._reserved_cache
        blocks = slots = 0.0
        share_blocks = self.pool.num_blocks / max(self.total_weight, 1e-9)
        share_slots = self.contract.engine.max_running / max(self.total_weight, 1e-9)
        for t in self.tenants.values():
            if t.kv_peak <= 0:
                continue
            held = t.kv_blocks()
            if held <= t.weight * share_blocks and len(t.running) <= t.weight * share_slots:
                blocks += max(0.0, PEAK_MARGIN * t.kv_peak - held)
                slots += max(0.0, PEAK_MARGIN * t.slots_peak - len(t.running))
        self._reserved_cache = (max(self.headroom_blocks, int(blocks)), max(self.headroom_slots, int(slots)))
        return self._reserved_cache
