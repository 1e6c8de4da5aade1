"""Who is light, who holds more than its share: the fair policy's view of recent service.

* *recent service*: per tenant (and in total) the cost-weighted tokens served, decayed
  exponentially with time constant ``share_tau_s``; ``recent_total / tau`` is the engine's
  service rate;
* *under share* (``under_share``): recently served, per weight, clearly less than the most
  served active tenant -- it is owed service and exempt from the limits on heavy tenants;
* *light* (``is_light``): a tenant whose recent service plus what it still asks for
  (queued predicted cost, the remaining cost of the request at hand), per weight, is clearly
  less than the most served active tenant's -- below the max-min water level, so what it
  asks for is within its fair share and it gets latency priority (no warm-up needed: a
  tenant that was not served yet but has a 20K-token prompt or a standing queue is not
  light);
* *headroom*: KV blocks and slots kept free for tenants within their weight share (the
  static headroom, or what those tenants used at their recent peak, whichever is larger).
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

import math
from typing import Final

from ...core.request import Request, Status
from .batching import BatchingMixin
from .forecast import forecast_wait_s
from .state import LIGHT_FRACTION
from .tenant import TenantState

__all__ = ["LIGHT_FRACTION", "LEVEL_REFRESH_S", "PEAK_MARGIN", "SharesMixin"]

LEVEL_REFRESH_S: Final = 0.25
PEAK_MARGIN: Final = 1.25


@mypyc_attr(allow_interpreted_subclasses=True)
class SharesMixin(BatchingMixin):
    """Part of :class:`FairPolicy`; uses its tenants, pool, contract and counters."""

    def under_share(self, t: TenantState, now: float, level: float | None = None) -> bool:
        """``t`` was recently served, per weight, clearly less than the most served active
        tenant (below the max-min water level): it is owed service, so the limits meant for
        heavy tenants (one long prefill at a time, decodes giving way) do not apply.  O(1).
        ``level``: ``self._level(now)`` when the caller has already read it."""
        if level is None:
            level = self._level(now)
        return level > 0.0 and t.decayed_recent(now, self.share_tau_s) / t.weight < LIGHT_FRACTION * level

    def is_light(self, t: TenantState, now: float, req: Request | None = None) -> bool:
        """A *light* tenant: even counting what it has asked for and not yet received (its
        queued predicted cost, plus what ``req``, one of its running requests, still needs),
        it stays under its share (:meth:`under_share`): what it asks for is within its fair
        share, so it gets latency priority.  A tenant with a 20K-token prompt or a standing
        queue is not light merely because it has not been served yet.  O(classes)."""
        level = self._level(now)
        if not self.under_share(t, now, level):
            return False
        pending = 0.0
        for cost in t.queued_cost.values():
            pending += cost
        if req is not None and req.status is Status.RUNNING:
            pending += max(0.0, req.charged - req.used_cost)
        return (t.recent + pending) / t.weight < LIGHT_FRACTION * level

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

    def predicted_wait_s(self, t: TenantState, req: Request, now: float) -> float:
        """The work-conserving forecast of ``req``'s wait (``forecast.py``): the predicted
        cost queued ahead of it in its tenant (classes of at least its base priority), drained
        at what the tenant gets when the capacity the tenants that are not backlogged leave
        idle is shared by weight among the backlogged ones until each drains -- or at the
        tenant's measured drain rate, if faster.  O(backlogged tenants)."""
        rate = self.service_rate(now)
        if rate is None:
            return 0.0
        cls = self.contract.classes.get(req.klass)
        ahead = t.queued_ahead(cls.priority if cls is not None else req.priority, self.contract.classes)
        if ahead <= 0:
            return 0.0
        tau = self.share_tau_s
        others: list[tuple[float, float]] = []
        backlogged_recent = 0.0
        for o in self.backlogged.values():
            backlogged_recent += o.decayed_recent(now, tau)
            if o is not t:
                queued = math.inf               # backlogged for a time constant: it keeps
                if now - o.backlogged_since < tau:   # competing (its arrivals go on)
                    queued = 0.0
                    for c in o.queued_cost.values():
                        queued += c
                others.append((queued, o.weight))
        idle_use = self.recent_total - backlogged_recent
        if t.name not in self.backlogged:
            idle_use -= t.decayed_recent(now, tau)
        # backlogged for a whole time constant: the measured rate is what the engine serves
        # under this load; otherwise it may only be what the load asked for
        saturated = now - self.backlog_since_s >= tau
        capacity = rate if saturated else max(rate, self.prefill_rate)
        drain = t.decayed_admitted(now, tau) / tau
        persistent = t.name in self.backlogged and now - t.backlogged_since >= tau
        return forecast_wait_s(ahead, t.weight, others, capacity, max(0.0, idle_use) / tau, drain, persistent)

    def _share_of_active(self, t: TenantState) -> float:
        return t.weight / max(self.active_weight + (0.0 if t.active else t.weight), t.weight)

    def _within_share(self, t: TenantState, extra_blocks: int, extra_slots: int) -> bool:
        """True when ``t`` stays within its weight share (among the active tenants) of KV and of
        slots after admission."""
        share = self._share_of_active(t)
        return (t.kv_blocks() + extra_blocks <= share * self.pool.num_blocks
                and len(t.running) + extra_slots <= share * self.contract.engine.max_running)

    def _reserved(self, t: TenantState, num_running: int) -> tuple[int, int]:
        """(KV blocks, slots) ``t`` must leave free for the *other* active tenants that are
        within their share: what they used at their recent peak (x ``PEAK_MARGIN``) beyond
        what they hold now, at least the static headroom.  Nothing while the engine runs
        nothing (reservations never idle an empty engine).  O(tenants), once per step."""
        if num_running == 0:
            return (0, 0)
        if self._reserved_cache is None:
            self._reserved_cache = self._reservations()
        per, blocks, slots = self._reserved_cache
        mine = per.get(t.name)
        if mine is not None:
            blocks, slots = blocks - mine[0], slots - mine[1]
        other_active_weight = self.active_weight - (t.weight if t.active else 0.0)
        if other_active_weight <= 1e-12:
            return (0, 0)
        return (max(self.headroom_blocks, int(blocks)), max(self.headroom_slots, int(slots)))

    def _reservations(self) -> tuple[dict[str, tuple[float, float]], float, float]:
        """What :meth:`_reserved` sums, for every tenant at once: (tenant -> (blocks, slots)
        it would reserve, their sums) over the active tenants with a peak that are within
        their share (``_within_share(o, 0, 0)``, inlined: the same float operations, summed
        in tenant order as before).  O(tenants), at most once per step."""
        per: dict[str, tuple[float, float]] = {}
        blocks_sum = slots_sum = 0.0
        active_weight = self.active_weight + 0.0     # every tenant counted here is active
        num_blocks = self.pool.num_blocks
        max_running = self.contract.engine.max_running
        held = self.pool.held
        for o in self.tenants.values():
            if o.active and o.kv_peak > 0:
                w = o.weight
                share = w / (w if w > active_weight else active_weight)   # max(active_weight, w)
                kv = held.get(o.name, 0)
                slots = len(o.running)
                if kv <= share * num_blocks and slots <= share * max_running:
                    b = PEAK_MARGIN * o.kv_peak - kv
                    if not b > 0.0:
                        b = 0.0
                    sl = PEAK_MARGIN * o.slots_peak - slots
                    if not sl > 0.0:
                        sl = 0.0
                    per[o.name] = (b, sl)
                    blocks_sum += b
                    slots_sum += sl
        return per, blocks_sum, slots_sum
