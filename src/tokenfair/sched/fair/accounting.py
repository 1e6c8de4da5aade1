"""Charging and service accounting of the fair policy (what happens after a step ran).

* the tenant was charged its request's predicted cost at admission (``wfq.py``); as tokens
  are produced, cost beyond the charge is charged (``S_i += excess / w_i``), and at the end
  the unused prediction is refunded; recomputed tokens are never charged;
* with ``costs.kv_block_s > 0`` each step also charges every tenant its KV occupancy
  (blocks held x step seconds x weight), O(running) per step;
* the service is recorded in the share meter (``shares.py``), the step time in the step
  timer (``steptime.py``);
* ``on_decoded`` is the hot path: O(1) per decoding request, tenant updates aggregated.
* ``fast_forward`` (a run of k decode-only steps, sim/fastforward.py) leaves every float
  exactly as ``on_decoded`` + ``on_step_end`` per step would: with integer cost weights every
  request's used cost and charge is an integer-valued float, so its k increments sum exactly
  in one addition; the charges to S_i and the decayed statistics are replayed per step in
  the same order (O(charging requests + tenants) per step, not O(running)).  Other weights
  replay ``on_decoded`` step by step (``can_sum_steps``); with a KV occupancy charge the
  policy does not fast-forward at all (that charge reads every step's blocks).
"""

from __future__ import annotations

from ...contracts.contract import Contract
from ...core.request import Request
from .costs import RequestCost
from .headroom import Headroom
from .roster import TenantRoster
from .shares import ShareMeter
from .steptime import StepTimer
from .tenant import TenantState
from .tpot import DecodeSLOs
from .wfq import VirtualTimeWFQ


def _per_tenant(reqs: list[Request]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for req in reqs:
        counts[req.tenant] = counts.get(req.tenant, 0) + 1
    return counts


class Accounting:
    """What was served, charged to the tenants.

    Invariants: a running request's ``charged`` is at least its ``used_cost`` and never
    less than its predicted cost at admission until it ends; every charge beyond the
    admission charge and every refund moves its tenant's ``S_i`` by cost / weight
    (``wfq.py``); what was served is in the share meter, in the order it was served."""

    def __init__(self, contract: Contract, costs: RequestCost, wfq: VirtualTimeWFQ, roster: TenantRoster,
                 meter: ShareMeter, headroom: Headroom, decode_slos: DecodeSLOs, step_time: StepTimer) -> None:
        self.rebind(contract)
        self.costs = costs
        self.wfq = wfq
        self.roster = roster
        self.meter = meter
        self.headroom = headroom
        self.decode_slos = decode_slos
        self.step_time = step_time

    def rebind(self, contract: Contract) -> None:
        """The contract and its KV occupancy charge (read every step), as a plain field
        (performance: a contract field read is a pydantic attribute lookup)."""
        self.contract = contract
        self.kv_block_s = contract.costs.kv_block_s

    def on_served(self, req: Request, prefill_tokens: int, decoded: int, now: float) -> None:
        t = self.roster.tenants[req.tenant]
        used = self.costs.used(req)
        delta = used - req.used_cost
        if delta > 0:
            req.used_cost = used
            if used > req.charged:
                self.wfq.charge(t, used - req.charged)
                req.charged = used
        if decoded and not req.in_prefill:
            self.decode_slos.start(req)        # its prefill just completed: a running decode
        served = self.costs.wp * prefill_tokens + self.costs.wd * decoded
        self.meter.add(t, req.klass, served, now)

    def on_decoded(self, reqs: list[Request], now: float, tenant_counts: dict[str, int] | None) -> None:
        """One decode token each: O(1) per request, tenant updates aggregated per tenant
        (``tenant_counts``: the caller counted them already)."""
        wd = self.costs.wd
        wfq = self.wfq
        tenants = self.roster.tenants
        for req in reqs:
            used = req.used_cost + wd
            req.used_cost = used
            if used > req.charged:
                wfq.charge(tenants[req.tenant], used - req.charged)
                req.charged = used
        self.meter.add_decoded(reqs, tenant_counts if tenant_counts is not None else _per_tenant(reqs), wd, now)

    def can_sum_steps(self) -> bool:
        """Integer cost weights and no KV occupancy charge: :meth:`fast_forward` is exact."""
        return self.costs.integral and not self.kv_block_s > 0

    def fast_forward(self, reqs: list[Request], start: float, step_ends: list[float],
                     step_durations: list[float], end_last: bool, tenant_counts: dict[str, int] | None) -> None:
        """k decode-only steps of ``reqs``, bit for bit as ``on_decoded`` + ``on_step_end`` per
        step (module docstring; only when :meth:`can_sum_steps`): O(len(reqs)) once, then
        O(charging requests + tenants + min-share classes) per step."""
        wd, k = self.costs.wd, len(step_ends)
        tenants = self.roster.tenants
        per_tenant = tenant_counts if tenant_counts is not None else _per_tenant(reqs)
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
        meter = self.meter
        per_class: dict[str, int] = {}
        if meter.class_recent:
            for req in reqs:
                if req.klass in meter.class_recent:
                    per_class[req.klass] = per_class.get(req.klass, 0) + 1
        meter.replay_recent(served, step_ends)
        if charging:
            for j in range(1, k + 1):                # step j's charges, in on_decoded's order
                for first, partial, t in charging:
                    if j >= first:
                        t.vtime += (partial if j == first else wd) / t.weight
        if meter.first_service_s is None and reqs:
            meter.first_service_s = step_ends[0]
        ended = k if end_last else k - 1
        meter.replay_totals(served_total, per_class, wd, step_durations, ended)
        self.step_time.observe_all(step_durations, ended)
        if ended:
            self.headroom.invalidate()

    def on_step_end(self, now: float, duration_s: float) -> None:
        self.headroom.invalidate()
        w_kv = self.kv_block_s
        if w_kv > 0:                       # optional KV occupancy charge: blocks x seconds
            for t in self.roster.tenants.values():
                if t.running:
                    self.wfq.charge(t, w_kv * duration_s * t.kv_blocks())
        self.step_time.observe(duration_s)
        self.meter.decay(duration_s)

    def charge_admission(self, req: Request, t: TenantState, now: float) -> float:
        """``req``, admitted for the first time, is charged its predicted cost (returned)."""
        cost = self.costs.predicted(req)
        req.charged = cost
        t.add_admitted(req.klass, cost, now, self.meter.share_tau_s)
        self.wfq.charge(t, cost)
        return cost

    def refund(self, req: Request, t: TenantState) -> None:
        """``req`` ended: the unused part of its charge goes back to ``t``."""
        unused = req.charged - req.used_cost
        if unused > 0:
            self.wfq.refund(t, unused)
            req.charged -= unused
