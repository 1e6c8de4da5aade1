"""Charging and service accounting of the fair policy (what happens after a step ran).

* the tenant was charged its request's predicted cost at admission (``wfq.py``); as tokens
  are produced, cost beyond the charge is charged (``S_i += excess / w_i``), and at the end
  the unused prediction is refunded; recomputed tokens are never charged;
* with ``costs.kv_block_s > 0`` each step also charges every tenant its KV occupancy
  (blocks held x step seconds x weight), O(running) per step;
* recent service per tenant / class / in total (decayed, ``share_tau_s``) feeds the light
  and min-share decisions (``shares.py``);
* ``on_decoded`` is the hot path: O(1) per decoding request, tenant updates aggregated.  A
  fast-forwarded run (sim/fastforward.py) replays it step by step (the base
  ``Policy.on_fast_forward``): a closed form would round differently and, through the
  floating-point state the policy's decisions read, change later decisions.
"""

from __future__ import annotations

import math

from ...request import Request


class AccountingMixin:
    """Mixed into :class:`FairPolicy`; uses its tenants, WFQ and counters."""

    def _used(self, req: Request) -> float:
        prompt_done = req.prompt_tokens if req.num_output else req.num_computed
        return max(req.used_cost, self.wp * prompt_done + self.wd * req.num_output)

    def on_served(self, req: Request, prefill_tokens: int, decoded: int, now: float) -> None:
        t = self.tenants[req.tenant]
        used = self._used(req)
        delta = used - req.used_cost
        if delta > 0:
            req.used_cost = used
            if used > req.charged:
                self.wfq.charge(t, used - req.charged)
                req.charged = used
        served = self.wp * prefill_tokens + self.wd * decoded
        self.recent_total += served
        if self.first_service_s is None:
            self.first_service_s = now
        t.decayed_recent(now, self.share_tau_s)
        t.recent += served
        if req.klass in self.class_recent:
            self.class_recent[req.klass] += served

    def on_decoded(self, reqs: list[Request], now: float) -> None:
        """One decode token each: O(1) per request, tenant updates aggregated per tenant."""
        wd = self.wd
        per_tenant: dict[str, int] = {}
        charge = self.wfq.charge
        tenants = self.tenants
        for req in reqs:
            used = req.used_cost + wd
            req.used_cost = used
            if used > req.charged:
                charge(tenants[req.tenant], used - req.charged)
                req.charged = used
            per_tenant[req.tenant] = per_tenant.get(req.tenant, 0) + 1
        served_total = 0.0
        tau = self.share_tau_s
        class_recent = self.class_recent
        for name, k in per_tenant.items():
            t = tenants[name]
            t.decayed_recent(now, tau)
            t.recent += wd * k
            served_total += wd * k
        if class_recent:
            for req in reqs:
                if req.klass in class_recent:
                    class_recent[req.klass] += wd
        self.recent_total += served_total
        if self.first_service_s is None and reqs:
            self.first_service_s = now

    def on_step_end(self, now: float, duration_s: float) -> None:
        self._reserved_cache = None
        w_kv = self.contract.costs.kv_block_s
        if w_kv > 0:                       # optional KV occupancy charge: blocks x seconds
            for t in self.tenants.values():
                if t.running:
                    self.wfq.charge(t, w_kv * duration_s * t.kv_blocks())
        self.step_ewma_s += 0.05 * (duration_s - self.step_ewma_s)
        decay = math.exp(-duration_s / self.share_tau_s)
        self.recent_total *= decay
        for k in self.class_recent:
            self.class_recent[k] *= decay

    def on_finish(self, req: Request, now: float) -> None:
        t = self.tenants.get(req.tenant)
        if t is None:
            return
        if req in t.running:
            t.running.discard(req)
            self.num_running -= 1
        self._touch(t)
        unused = req.charged - req.used_cost
        if unused > 0:
            self.wfq.refund(t, unused)
            req.charged -= unused
