"""Who is light, who is owed service: the fair policy's share meter (recent service).

* *recent service*: per tenant (and in total, and per min-share class) the cost-weighted
  tokens served, decayed exponentially with time constant ``share_tau_s``;
  ``recent_total / tau`` is the engine's service rate;
* *under share* (``under_share``): recently served, per weight, clearly less than the most
  served active tenant -- it is owed service and exempt from the limits on heavy tenants;
  *persistently owed* (``persistently_owed``): under share while backlogged for at least
  ``share_tau_s``;
* *light* (``is_light``): a tenant whose recent service plus what it still asks for
  (queued predicted cost, the remaining cost of the request at hand), per weight, is clearly
  less than the most served active tenant's -- below the max-min water level, so what it
  asks for is within its fair share and it gets latency priority (no warm-up needed: a
  tenant that was not served yet but has a 20K-token prompt or a standing queue is not
  light).
"""

from __future__ import annotations

import math
from typing import Final

from ...contracts.contract import Contract
from ...core.exactfloat import add_repeated
from ...core.request import Request, Status
from .roster import TenantRoster
from .tenant import TenantState

# *light* means served, per weight, less than this fraction of the water level
LIGHT_FRACTION: Final = 0.9
LEVEL_REFRESH_S: Final = 0.25
# the shortest time constant the meter takes (``fair:share_tau_s``): a few engine steps; below
# it the recent service is one step's, and the service rate (recent / tau) loses its meaning
MIN_SHARE_TAU_S: Final = 0.1


class ShareMeter:
    """Recent service and the water level.

    Invariants: ``recent_total`` is every service recorded, each decayed by
    ``exp(-age / share_tau_s)`` step by step (:meth:`decay` at each step's end);
    ``class_recent[k]`` the same for the service of min-share class ``k`` (those classes
    only); each tenant's share lives in ``TenantState.recent`` (decayed lazily to
    ``recent_t``); ``first_service_s`` is when the first service was recorded (None:
    none yet); ``level_v`` is the max normalised recent service over active tenants as of
    ``level_t``, re-read when ``LEVEL_REFRESH_S`` has passed (or time went back)."""

    def __init__(self, contract: Contract, roster: TenantRoster, share_tau_s: float,
                 min_share_classes: list[str]) -> None:
        self.contract = contract
        self.roster = roster
        self.share_tau_s = share_tau_s
        self.recent_total = 0.0
        self.class_recent: dict[str, float] = {k: 0.0 for k in min_share_classes}
        self.first_service_s: float | None = None
        self.level_t = float("-inf")
        self.level_v = 0.0

    def rebind(self, new: Contract, min_share_classes: list[str]) -> None:
        """A live contract change: kept min-share classes keep their decayed service, new
        ones start at 0, dropped ones are forgotten."""
        self.contract = new
        self.class_recent = {k: self.class_recent.get(k, 0.0) for k in min_share_classes}

    def under_share(self, t: TenantState, now: float, level: float | None = None) -> bool:
        """``t`` was recently served, per weight, clearly less than the most served active
        tenant (below the max-min water level): it is owed service, so the limits meant for
        heavy tenants (decodes giving way, background prefill sitting out steps) do not apply.
        O(1).
        ``level``: ``self.level(now)`` when the caller has already read it."""
        if level is None:
            level = self.level(now)
        return level > 0.0 and t.decayed_recent(now, self.share_tau_s) / t.weight < LIGHT_FRACTION * level

    def persistently_owed(self, t: TenantState, now: float) -> bool:
        """``t`` has had waiting requests for at least ``share_tau_s`` and is under its share
        (:meth:`under_share`): its recent service reflects its backlog, not a pause, so it is
        owed service and no deferral meant for latency may keep it there.  O(1)."""
        return (t.num_waiting > 0 and now - t.backlogged_since >= self.share_tau_s
                and self.under_share(t, now))

    def is_light(self, t: TenantState, now: float, req: Request | None = None) -> bool:
        """A *light* tenant: even counting what it has asked for and not yet received (its
        queued predicted cost, plus what ``req``, one of its running requests, still needs),
        it stays under its share (:meth:`under_share`).  O(classes)."""
        level = self.level(now)
        if not self.under_share(t, now, level):
            return False
        pending = 0.0
        for cost in t.queued_cost.values():
            pending += cost
        if req is not None and req.status is Status.RUNNING:
            pending += max(0.0, req.charged - req.used_cost)
        return (t.recent + pending) / t.weight < LIGHT_FRACTION * level

    def level(self, now: float) -> float:
        """Max normalised recent service over active tenants; O(T), refreshed every 0.25 s."""
        if now - self.level_t >= LEVEL_REFRESH_S or self.level_t > now:
            self.level_t = now
            self.level_v = max((t.decayed_recent(now, self.share_tau_s) / t.weight
                                for t in self.roster.tenants.values() if t.active), default=0.0)
        return self.level_v

    def service_rate(self, now: float) -> float | None:
        """Engine service rate in cost units/s, or None before the warm-up."""
        if self.first_service_s is None or now - self.first_service_s < max(self.contract.admission.warmup_s,
                                                                            self.share_tau_s):
            return None
        return self.recent_total / self.share_tau_s

    def add(self, t: TenantState, klass: str, served: float, now: float) -> None:
        """``served`` cost was served to ``t``'s request of class ``klass``."""
        self.recent_total += served
        if self.first_service_s is None:
            self.first_service_s = now
        t.decayed_recent(now, self.share_tau_s)
        t.recent += served
        if klass in self.class_recent:
            self.class_recent[klass] += served

    def add_decoded(self, reqs: list[Request], per_tenant: dict[str, int], wd: float, now: float) -> None:
        """Each of ``reqs`` (``per_tenant`` of them per tenant) decoded one token of cost
        ``wd``: O(1) per request, one exp per distinct last update of a tenant."""
        tenants = self.roster.tenants
        served_total = 0.0
        tau = self.share_tau_s
        last_t, f = math.nan, 1.0                  # nan: unequal to every time (a float, for mypyc)
        for name, k in per_tenant.items():
            t = tenants[name]
            rt = t.recent_t
            if now > rt:                           # t.decayed_recent(now, tau), one exp per
                if rt != last_t:                   # distinct last update (usually one)
                    last_t, f = rt, math.exp(-(now - rt) / tau)
                t.recent *= f
                t.recent_t = now
            t.recent += wd * k
            served_total += wd * k
        class_recent = self.class_recent
        if class_recent:
            for req in reqs:
                if req.klass in class_recent:
                    class_recent[req.klass] += wd
        self.recent_total += served_total
        if self.first_service_s is None and reqs:
            self.first_service_s = now

    def decay(self, duration_s: float) -> None:
        """A step of ``duration_s`` ended: the totals decay (tenants decay lazily)."""
        decay = math.exp(-duration_s / self.share_tau_s)
        self.recent_total *= decay
        for k in self.class_recent:
            self.class_recent[k] *= decay

    def replay_recent(self, served: list[tuple[TenantState, float]], step_ends: list[float]) -> None:
        """Each tenant's decayed service after decode-only steps ending at ``step_ends``
        (``served``: what it got per step), the same float operations as :meth:`add_decoded`
        step by step (decay to the step's end, then add): from the second step on every
        tenant was updated at the previous step's end, so the decay factor is one per step,
        shared.  O(k + tenants x k) float work, no method calls."""
        tau = self.share_tau_s
        now, end = step_ends[0], step_ends[-1]
        if len(served) == 1:                       # one tenant (its traffic alone): no factor list
            self._replay_one(served[0][0], served[0][1], step_ends)
            return
        factors = [math.exp(-(step_ends[j] - step_ends[j - 1]) / tau) for j in range(1, len(step_ends))]
        last_t, f = math.nan, 1.0                  # nan: unequal to every time (a float, for mypyc)
        for t, s in served:
            r, rt = t.recent, t.recent_t
            if now > rt:
                if rt != last_t:
                    last_t, f = rt, math.exp(-(now - rt) / tau)
                r *= f
            r += s
            for g in factors:
                r = r * g + s
            t.recent = r
            t.recent_t = end if end > rt else rt     # max(rt, end)

    def _replay_one(self, t: TenantState, s: float, step_ends: list[float]) -> None:
        """:meth:`replay_recent` for one tenant: the same float operations, each step's
        factor computed where it is used."""
        tau = self.share_tau_s
        now, end = step_ends[0], step_ends[-1]
        r, rt = t.recent, t.recent_t
        if now > rt:
            r *= math.exp(-(now - rt) / tau)
        r += s
        prev = now
        for j in range(1, len(step_ends)):
            e = step_ends[j]
            r = r * math.exp(-(e - prev) / tau) + s
            prev = e
        t.recent = r
        t.recent_t = end if end > rt else rt

    def replay_totals(self, served_total: float, per_class: dict[str, int], wd: float,
                      step_durations: list[float], ended: int) -> None:
        """The totals after decode-only steps of these durations: per step, what
        :meth:`add_decoded` adds to the min-share classes (``per_class``: decodes per class)
        and to the total, then -- for the first ``ended`` steps -- :meth:`decay`.  They
        touch no per-tenant state, so doing them apart from the per-tenant updates leaves
        every value as interleaving would.  O(k x classes)."""
        tau = self.share_tau_s
        class_recent = self.class_recent
        total = self.recent_total
        if not class_recent:                       # no min-share class: the total alone
            for j, dt in enumerate(step_durations):
                total += served_total
                if j < ended:
                    total *= math.exp(-dt / tau)
            self.recent_total = total
            return
        for j, dt in enumerate(step_durations):
            for klass, m in per_class.items():
                class_recent[klass] = add_repeated(class_recent[klass], wd, m)
            total += served_total
            if j < ended:
                decay = math.exp(-dt / tau)
                total *= decay
                for c in class_recent:
                    class_recent[c] *= decay
        self.recent_total = total
