"""``fair``: the four layers composed (admission -> WFQ -> in-queue order -> batching).

The mechanics (``sched/scheduler.py``) build each step; this policy answers their
questions.  At arrival, a request whose predicted wait exceeds its class's max wait is shed
(``admission.shed_over_max_wait``): under overload the tenant that floods gets 429s, not
everyone a starving queue.  ``pick`` order:
  1. a request past its class's max wait (overdue heap) whose tenant is not over its fair
     share (S_i <= V + C / w_i), so no legal queue starves and no flood jumps the line;
  2. a tenant, then a class, below its guaranteed min share while backlogged (shares are
     exponentially decayed service, time constant ``share_tau_s``);
  3. otherwise the tenant with the least normalised service (``wfq.py``), and its best
     request (``ordering.py``).
Per step, the prefill budget is shaped so the predicted step time stays within 0.8x the
tightest TPOT SLO among running decodes (never below ``MIN_PREFILL_BUDGET``): long prefills
cannot stutter streams.
Charging: predicted cost at first admission, corrected by actual consumption as tokens are
produced, refunded at the end (``wfq.py``).  Recomputed tokens are never charged to the
victim's tenant.  Configurable layers: ``order`` ("edf" or "fifo") via
``--policy fair:order=fifo``.
"""

from __future__ import annotations

import math

from ...request import Request, Status
from ..policy import Policy
from .admission import AdmissionControl
from .ordering import LazyHeap, best_head, order_key
from .preemption import PreemptionPolicy
from .tenant import TenantState
from .wfq import VirtualTimeWFQ


MIN_PREFILL_BUDGET = 128
PEAK_MARGIN = 1.25
LIGHT_FRACTION = 0.9
LEVEL_REFRESH_S = 0.25
PEAK_TAU_S = 60.0
TPOT_MARGIN = 0.8


class FairPolicy(Policy):
    name = "fair"
    shared_budget = False
    hol_blocking = False
    admit_after_preemption = True

    def __init__(self, order: str = "edf", share_tau_s: float = 10.0) -> None:
        if order not in ("edf", "fifo"):
            raise ValueError(f"fair: order must be 'edf' or 'fifo', got {order!r}")
        self.order = order
        self.share_tau_s = float(share_tau_s)

    def bind(self, contract, profile, pool, predictor) -> None:
        super().bind(contract, profile, pool, predictor)
        c = contract.costs
        self.wp, self.wd = c.prefill_token, c.decode_token
        self.admission = AdmissionControl(contract, pool)
        self.wfq = VirtualTimeWFQ(credit=contract.engine.prefill_token_budget * max(self.wp, 1e-9))
        self.preemption = PreemptionPolicy(contract, profile)
        self.tenants: dict[str, TenantState] = {}
        self.guaranteed: list[TenantState] = []
        self.rate_limited: list[TenantState] = []
        self.overdue = LazyHeap()
        self.deadlines = LazyHeap()
        self.class_min = {k: s.min_share for k, s in contract.classes.items() if s.min_share > 0}
        self.class_heaps = {k: LazyHeap() for k in self.class_min}
        self.class_recent = {k: 0.0 for k in self.class_min}
        self.class_waiting = {k: 0 for k in self.class_min}
        self.recent_total = 0.0
        self.num_queued = 0
        self.step_ewma_s = profile.step_s([], 1024, 1)
        self.first_service_s: float | None = None
        self.total_weight = 0.0
        self._now = 0.0
        self.active_weight = 0.0
        self._light_prefilling = False
        slos = [k.tpot_slo_s for k in contract.classes.values() if k.tpot_slo_s is not None]
        self._min_tpot_slo = min(slos) if slos else None
        self._level_t = float("-inf")
        self._level_v = 0.0
        adm = contract.admission
        self.headroom_blocks = int(adm.headroom_kv_fraction * pool.num_blocks)
        self.headroom_slots = int(adm.headroom_slot_fraction * contract.engine.max_running)
        self._reserved_cache: tuple[int, int] | None = None

    # -- tenants ------------------------------------------------------------------------
    def tenant(self, name: str, now: float = 0.0) -> TenantState:
        t = self.tenants.get(name)
        if t is None:
            t = self.tenants[name] = TenantState(name, self.contract.tenant(name), now)
            self.admission.register(t)
            if t.spec.min_share > 0:
                self.guaranteed.append(t)
            if t.spec.rate_limit is not None:
                self.rate_limited.append(t)
            self.total_weight += t.weight
        return t

    def overshare(self, r: Request) -> float:
        return self.tenants[r.tenant].vtime - self.wfq.vnow

    def predicted_cost(self, req: Request) -> float:
        return self.wp * req.prompt_tokens + self.wd * req.predicted_output

    # -- waiting queue -------------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> str | None:
        t = self.tenant(req.tenant, now)
        reason = self.admission.on_arrival(t, req)
        if reason is None and req.max_wait_s is not None and self.contract.admission.shed_over_max_wait:
            wait = self.predicted_wait_s(t, now)
            req.predicted_wait_s = wait
            limit = self.contract.admission.shed_margin * req.max_wait_s
            if wait > limit:
                reason = (f"overloaded: predicted wait {wait:.1f}s exceeds {limit:.1f}s "
                          f"(class {req.klass!r} max_wait_s {req.max_wait_s}); retry after ~{wait - limit:.0f}s")
        return reason

    def service_rate(self, now: float) -> float | None:
        """Engine service rate in cost units/s, or None before the warm-up."""
        if self.first_service_s is None or now - self.first_service_s < max(self.contract.admission.warmup_s,
                                                                            self.share_tau_s):
            return None
        return self.recent_total / self.share_tau_s

    def predicted_wait_s(self, t: TenantState, now: float) -> float:
        """Queued predicted cost of ``t`` over the rate its queue drains (predicted cost of its
        admissions per second, decayed; both in predicted units, so prediction bias cancels),
        never over less than its weight share of the engine's rate (its guaranteed floor)."""
        rate = self.service_rate(now)
        if rate is None or t.queued_cost <= 0:
            return 0.0
        floor = rate * t.weight / max(self.total_weight, t.weight)
        drain = t.decayed_admitted(now, self.share_tau_s) / self.share_tau_s
        return t.queued_cost / max(floor, drain, 1e-9)

    def enqueue(self, req: Request, now: float) -> None:
        t = self.tenant(req.tenant, now)
        t.running.discard(req)
        req.qtoken += 1
        q = t.queues.get(req.klass)
        if q is None:
            q = t.queues[req.klass] = LazyHeap()
        cls = self.contract.classes.get(req.klass)
        base = cls.priority if cls is not None else req.priority
        key = (req.enqueued_s, req.seq) if self.order == "fifo" else order_key(req, base, self.pool.block_size)
        q.push(key, req)
        if req.max_wait_s is not None:
            self.overdue.push((req.enqueued_s + req.max_wait_s, req.seq), req)
        if req.deadline_s is not None:
            self.deadlines.push((req.deadline_s - self.estimate_service_s(req), req.seq), req)
        if req.klass in self.class_heaps:
            self.class_heaps[req.klass].push(key, req)
            self.class_waiting[req.klass] += 1
        t.num_waiting += 1
        t.queued_cost += self.predicted_cost(req)
        self.num_queued += 1
        self._rekey(t, now)
        self._touch(t)
        if t.num_waiting == 1:
            self.wfq.on_backlogged(t)
        else:
            self.wfq.update(t)

    def take(self, req: Request) -> None:
        t = self.tenants[req.tenant]
        req.qtoken += 1
        t.num_waiting -= 1
        t.queued_cost = max(0.0, t.queued_cost - self.predicted_cost(req)) if t.num_waiting else 0.0
        self.num_queued -= 1
        if req.klass in self.class_waiting:
            self.class_waiting[req.klass] -= 1
        self._touch(t)
        if t.num_waiting == 0:
            self.wfq.on_idle(t)
        else:
            self._rekey(t, self._now)
            self.wfq.update(t)

    discard = take

    def _rekey(self, t: TenantState, now: float) -> None:
        head = best_head(t.queues, now)
        t.head_cost = self.predicted_cost(head) if head is not None else 0.0

    def num_waiting(self) -> int:
        return self.num_queued

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        self._now = now
        e = self.overdue.top()
        if e is not None and e[0] <= now and e[-1].tenant not in blocked:
            t = self.tenants[e[-1].tenant]
            if t.vtime <= self.wfq.vnow + self.wfq.credit / t.weight:
                return e[-1]
        if self.guaranteed or self.class_min:
            r = self._below_guarantee(now, blocked)
            if r is not None:
                return r
        t = self.wfq.pick(blocked, prefer=lambda x: self.under_share(x, now))
        return best_head(t.queues, now) if t is not None else None

    def _below_guarantee(self, now: float, blocked: set[str]) -> Request | None:
        total = self.recent_total
        if total <= 0:
            return None
        best, best_gap = None, 0.0
        for t in self.guaranteed:
            if t.num_waiting and t.name not in blocked:
                gap = t.spec.min_share - t.decayed_recent(now, self.share_tau_s) / total
                if gap > best_gap:
                    best, best_gap = best_head(t.queues, now), gap
        for k, share in self.class_min.items():
            if self.class_waiting[k]:
                gap = share - self.class_recent[k] / total
                e = self.class_heaps[k].top()
                if gap > best_gap and e is not None and e[-1].tenant not in blocked:
                    best, best_gap = e[-1], gap
        return best

    # -- batching ------------------------------------------------------------------------
    def prefill_budget(self, last_step: tuple[int, int, list[Request]], now: float) -> int:
        """The contract's prefill budget, shaped so the predicted step (with last step's decode
        batch) stays within ``TPOT_MARGIN`` x the tightest TPOT SLO of a running request:
        bisection over multiples of 64, O(log budget) cost-model calls."""
        budget = self.contract.engine.prefill_token_budget
        self._now = now
        n, ctx, prefilling = last_step
        self._light_prefilling = any(self.under_share(self.tenants[r.tenant], now) for r in prefilling)
        slo = self._min_tpot_slo
        if slo is None or n == 0:
            return budget
        target = TPOT_MARGIN * slo
        step = self.profile.step_s
        if step([(budget, 0)], ctx, n) <= target:
            return budget
        lo, hi = MIN_PREFILL_BUDGET, budget      # the largest multiple of 64 that fits (bisection)
        while hi - lo > 64:
            mid = (lo + hi) // 128 * 64
            if step([(mid, 0)], ctx, n) <= target:
                lo = mid
            else:
                hi = mid
        return lo

    # -- admission -----------------------------------------------------------------------
    def can_admit(self, req: Request, now: float, num_running: int) -> bool:
        t = self.tenants[req.tenant]
        chunk = self.contract.engine.chunk_size
        if req.num_uncomputed > chunk and not self.under_share(t, now):
            long_prefills = sum(1 for r in t.running if r.num_uncomputed > chunk)
            if long_prefills >= self.contract.engine.max_long_prefills_per_tenant:
                return False
        reserved_slots = self._reserved(now)[1]
        if (num_running + 1 > self.contract.engine.max_running - reserved_slots
                and not self._within_share(t, 0, 1)):
            return False
        return self.admission.can_admit(t, req, num_running, self.predicted_cost(req), now)

    def chunk_for(self, req: Request, now: float) -> int:
        """A light tenant's prefill that can finish within one step's budget may take it all
        (it cannot monopolise what it is entitled to); everything else is capped at
        ``chunk_size``, so a 20K prompt never holds a step."""
        eng = self.contract.engine
        if req.num_uncomputed <= eng.prefill_token_budget and self.under_share(self.tenants[req.tenant], now):
            return eng.prefill_token_budget
        return eng.chunk_size

    def defer_prefill(self, req: Request, now: float) -> bool:
        """A running prefill of a tenant that is not light waits behind the new admissions
        and running prefills of light tenants (``under_share``), and behind the admissions
        of a waiting tenant recently served clearly less than its own tenant: a heavy
        tenant's long prefill cannot hold a light tenant's request back.  The deferred
        chunk gets the budget left after admissions."""
        mine = self.tenants[req.tenant]
        if self.under_share(mine, now):
            return False
        if self._light_prefilling:
            return True
        if not self.num_queued:
            return False
        other = self.wfq.pick({mine.name}, prefer=lambda x: self.under_share(x, now))
        if other is None:
            return False
        tau = self.share_tau_s
        return (other.decayed_recent(now, tau) / other.weight
                < LIGHT_FRACTION * mine.decayed_recent(now, tau) / mine.weight)

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

    def _touch(self, t: TenantState) -> None:
        active = t.num_waiting > 0 or bool(t.running)
        if active != t.active:
            t.active = active
            self.active_weight += t.weight if active else -t.weight

    def kv_blocks_to_admit(self, req: Request, first_chunk: int) -> int:
        if req.num_preemptions:
            need = self.pool.extra_blocks(req, first_chunk)
        else:
            # KV-aware: the whole prompt must fit now, so an admitted prefill is not evicted
            need = self.pool.blocks_for(req.prompt_tokens + 1)
        t = self.tenants[req.tenant]
        if not self._within_share(t, need, 0):
            need += self._reserved(now=req.last_preempt_s)[0]
        return need

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

    def on_admit(self, req: Request, now: float) -> None:
        t = self.tenants[req.tenant]
        t.running.add(req)
        self._touch(t)
        t.note_peak(now, t.kv_blocks() + self.pool.blocks_for(req.num_tokens + req.predicted_remaining),
                    len(t.running), PEAK_TAU_S)
        if req.charged == 0.0:
            cost = self.predicted_cost(req)
            req.charged = cost
            t.decayed_admitted(now, self.share_tau_s)
            t.admitted += cost
            self.wfq.charge(t, cost)
            self.admission.on_admit(t, cost)

    def next_wakeup(self, now: float) -> float:
        return self.admission.wakeup(self.rate_limited, now)

    # -- accounting ----------------------------------------------------------------------
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

    def on_fast_forward(self, reqs: list[Request], step_ends: list[float], step_durations: list[float]) -> None:
        """The effect of ``len(step_ends)`` decode steps at once: per-request charges in one
        sum, per-tenant decayed service in closed form, the per-step EWMAs replayed (O(k))."""
        k = len(step_ends)
        wd, tau = self.wd, self.share_tau_s
        tenants = self.tenants
        per_tenant: dict[str, int] = {}
        per_class: dict[str, int] = {}
        for req in reqs:
            used = req.used_cost + wd * k
            req.used_cost = used
            if used > req.charged:
                self.wfq.charge(tenants[req.tenant], used - req.charged)
                req.charged = used
            per_tenant[req.tenant] = per_tenant.get(req.tenant, 0) + 1
            if req.klass in self.class_recent:
                per_class[req.klass] = per_class.get(req.klass, 0) + 1
        end = step_ends[-1]
        weight_sum = sum(math.exp(-(end - t) / tau) for t in step_ends)   # sum_j e^{-(t_k - t_j)/tau}
        for name, cnt in per_tenant.items():
            t = tenants[name]
            t.decayed_recent(end, tau)
            t.recent += wd * cnt * weight_sum
        n = len(reqs)
        for now, dt in zip(step_ends, step_durations):   # replay what on_decoded + on_step_end do
            self.recent_total += wd * n
            for c, cnt in per_class.items():
                self.class_recent[c] += wd * cnt
            self.on_step_end(now, dt)
        if self.first_service_s is None:
            self.first_service_s = step_ends[0]

    def on_step_end(self, now: float, duration_s: float) -> None:
        self._reserved_cache = None
        self.step_ewma_s += 0.05 * (duration_s - self.step_ewma_s)
        decay = math.exp(-duration_s / self.share_tau_s)
        self.recent_total *= decay
        for k in self.class_recent:
            self.class_recent[k] *= decay

    def on_finish(self, req: Request, now: float) -> None:
        t = self.tenants.get(req.tenant)
        if t is None:
            return
        t.running.discard(req)
        self._touch(t)
        unused = req.charged - req.used_cost
        if unused > 0:
            self.wfq.refund(t, unused)
            req.charged -= unused

    # -- deadlines -------------------------------------------------------------------------
    def estimate_service_s(self, req: Request) -> float:
        prefill = self.profile.step_s([(req.num_uncomputed, 0)], 0, 0) if req.num_uncomputed > 1 else 0.0
        return prefill + req.predicted_remaining * self.step_ewma_s

    def expire(self, now: float) -> list[tuple[Request, str]]:
        out = []
        while True:
            e = self.deadlines.top()
            if e is None or e[0] >= now:
                return out
            self.deadlines.pop()
            req = e[-1]
            left = req.deadline_s - now
            out.append((req, f"deadline_infeasible: needs ~{self.estimate_service_s(req):.2f}s, "
                             f"{max(0.0, left):.2f}s left before the deadline"))
            self.take(req)

    # -- preemption ------------------------------------------------------------------------
    def victim_for_kv(self, candidates: list[Request], needing: Request, now: float) -> Request | None:
        victim = self.preemption.choose(candidates, now, self.overshare)
        if victim is None:
            return None
        p = self.preemption
        if p.key(victim, now, self.overshare(victim)) > p.key(needing, now, self.overshare(needing)):
            return needing
        return victim

    def preempt_mode(self, req: Request) -> str:
        return self.preemption.mode(req)

    def urgent_victim(self, cand: Request, running: list[Request], now: float) -> Request | None:
        p = self.preemption
        if not running or not p.cooled_down(now):
            return None
        overdue = cand.max_wait_s is not None and now - cand.enqueued_s >= cand.max_wait_s
        t = self.tenants[cand.tenant]
        below = (t.spec.min_share > 0 and self.recent_total > 0
                 and t.decayed_recent(now, self.share_tau_s) / self.recent_total < t.spec.min_share)
        if not (overdue or below):
            return None
        cand_prio = cand.priority + cand.aging_rate * (now - cand.enqueued_s)
        pool = [r for r in running if r.tenant != cand.tenant
                and (r.priority + r.aging_rate * (now - r.enqueued_s) < cand_prio
                     or self.overshare(r) > self.overshare(cand))]
        victim = p.choose(pool, now, self.overshare)
        if victim is None:
            return None
        natural_wait = self.step_ewma_s * min(r.predicted_remaining for r in running)
        if not p.worth_it(victim, natural_wait):
            return None
        p.last_urgent_s = now
        return victim
