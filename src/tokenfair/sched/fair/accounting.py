"""Charging and service accounting of the fair policy (what happens after a step ran).

* the tenant was charged its request's predicted cost at admission (``wfq.py``); as tokens
  are produced, cost beyond the charge is charged (``S_i += excess / w_i``), and at the end
  the unused prediction is refunded; recomputed tokens are never charged;
* with ``costs.kv_block_s > 0`` each step also charges every tenant its KV occupancy
  (blocks held x step seconds x weight), O(running) per step;
* recent service per tenant / class / in total (decayed, ``share_tau_s``) feeds the light
  and min-share decisions (``shares.py``);
* ``on_decoded`` is the hot path: O(1) per decoding request, tenant updates aggregated.
* ``on_fast_forward`` (a run of k decode-only steps, sim/fastforward.py) leaves every float
  exactly as ``on_decoded`` + ``on_step_end`` per step would: with integer cost weights every
  request's used cost and charge is an integer-valued float, so its k increments sum exactly
  in one addition; the charges to S_i and the decayed statistics are replayed per step in
  the same order (O(charging requests + tenants) per step, not O(running)).  Other weights
  replay ``on_decoded`` step by step; with a KV occupancy charge the policy does not
  fast-forward at all (that charge reads every step's blocks).
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

import math

from ...core.exactfloat import add_repeated
from ...core.request import Request
from .tenant import TenantState
from .urgency import UrgencyMixin


@mypyc_attr(allow_interpreted_subclasses=True)
class AccountingMixin(UrgencyMixin):
    """Part of :class:`FairPolicy`; uses its tenants, WFQ and counters."""

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
        if decoded and not req.in_prefill:
            self.decode_slos.start(req)        # its prefill just completed: a running decode
        served = self.wp * prefill_tokens + self.wd * decoded
        self.recent_total += served
        if self.first_service_s is None:
            self.first_service_s = now
        t.decayed_recent(now, self.share_tau_s)
        t.recent += served
        if req.klass in self.class_recent:
            self.class_recent[req.klass] += served

    def on_decoded(self, reqs: list[Request], now: float,
                   tenant_counts: dict[str, int] | None = None) -> None:
        """One decode token each: O(1) per request, tenant updates aggregated per tenant
        (``tenant_counts``: the caller counted them already)."""
        wd = self.wd
        wfq = self.wfq
        tenants = self.tenants
        for req in reqs:
            used = req.used_cost + wd
            req.used_cost = used
            if used > req.charged:
                wfq.charge(tenants[req.tenant], used - req.charged)
                req.charged = used
        per_tenant = tenant_counts
        if per_tenant is None:
            per_tenant = {}
            for req in reqs:
                per_tenant[req.tenant] = per_tenant.get(req.tenant, 0) + 1
        served_total = 0.0
        tau = self.share_tau_s
        class_recent = self.class_recent
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
        if class_recent:
            for req in reqs:
                if req.klass in class_recent:
                    class_recent[req.klass] += wd
        self.recent_total += served_total
        if self.first_service_s is None and reqs:
            self.first_service_s = now

    def on_fast_forward(self, reqs: list[Request], start: float, step_ends: list[float],
                        step_durations: list[float], end_last: bool = True,
                        tenant_counts: dict[str, int] | None = None) -> None:
        """k decode-only steps of ``reqs``, bit for bit as ``on_decoded`` + ``on_step_end`` per
        step (module docstring): O(len(reqs)) once, then O(charging requests + tenants +
        min-share classes) per step."""
        # what schedule() leaves behind in a decode-only step (pick/prefill_budget set it)
        self._now = step_ends[-2] if len(step_ends) > 1 else start
        if not self._integral_costs or self.contract.costs.kv_block_s > 0:
            super().on_fast_forward(reqs, start, step_ends, step_durations, end_last)
            return
        wd, k = self.wd, len(step_ends)
        tenants = self.tenants
        per_tenant = tenant_counts
        if per_tenant is None:
            per_tenant = {}
            for req in reqs:
                per_tenant[req.tenant] = per_tenant.get(req.tenant, 0) + 1
        charging: list[tuple[int, float, TenantState]] = []   # (first charging step, its charge, tenant)
        kwd = k * wd
        for req in reqs:
            used = req.used_cost + kwd               # integer-valued: exact (module docstring)
            if used > req.charged:
                first = int(req.charged - req.used_cost) // int(wd) + 1
                if first < 1:
                    first = 1
                charging.append((first, req.used_cost + first * wd - req.charged, tenants[req.tenant]))
                req.charged = used
            req.used_cost = used
        served = [(tenants[name], wd * cnt) for name, cnt in per_tenant.items()]
        served_total = 0.0
        for _, s in served:                    # integer-valued: the same sum in any order
            served_total += s
        class_recent = self.class_recent
        per_class: dict[str, int] = {}
        if class_recent:
            for req in reqs:
                if req.klass in class_recent:
                    per_class[req.klass] = per_class.get(req.klass, 0) + 1
        self._ff_recent(served, step_ends)
        if charging:
            for j in range(1, k + 1):                # step j's charges, in on_decoded's order
                for first, partial, t in charging:
                    if j >= first:
                        t.vtime += (partial if j == first else wd) / t.weight
        if self.first_service_s is None and reqs:
            self.first_service_s = step_ends[0]
        self._ff_totals(served_total, per_class, step_durations, k if end_last else k - 1)

    def _ff_totals(self, served_total: float, per_class: dict[str, int], step_durations: list[float],
                   ended: int) -> None:
        """The totals of the run's steps: per step, on_decoded's additions to the min-share
        classes' and the total recent service, then -- for the first ``ended`` steps --
        on_step_end's float operations, inlined (with a KV occupancy charge the caller replays
        step by step instead).  These touch no per-tenant state, so doing them apart
        from the per-tenant charges leaves every value as interleaving would.  O(k x classes)."""
        wd, tau = self.wd, self.share_tau_s
        class_recent = self.class_recent
        total, ewma = self.recent_total, self.step_ewma_s
        for j, dt in enumerate(step_durations):
            for klass, m in per_class.items():
                class_recent[klass] = add_repeated(class_recent[klass], wd, m)
            total += served_total
            if j < ended:
                ewma += 0.05 * (dt - ewma)
                decay = math.exp(-dt / tau)
                total *= decay
                for c in class_recent:
                    class_recent[c] *= decay
        self.recent_total, self.step_ewma_s = total, ewma
        if ended:
            self._reserved_cache = None

    def _ff_recent(self, served: list[tuple[TenantState, float]], step_ends: list[float]) -> None:
        """Each tenant's decayed service after these steps, the same float operations as
        ``on_decoded`` step by step (decay to the step's end, then add): from the second step
        on every tenant was updated at the previous step's end, so the decay factor is one per
        step, shared.  O(k + tenants x k) float work, no method calls."""
        tau = self.share_tau_s
        now, end = step_ends[0], step_ends[-1]
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
        self.decode_slos.stop(req)
        self._touch(t, now)
        unused = req.charged - req.used_cost
        if unused > 0:
            self.wfq.refund(t, unused)
            req.charged -= unused
