"""``fair``: the four layers composed (admission -> WFQ -> in-queue order -> batching).

The mechanics (``sched/scheduler.py``) build each step; this policy answers their
questions.  At arrival, a request whose predicted wait exceeds its class's max wait is shed
(``admission.shed_over_max_wait``): under overload the tenant that floods gets 429s, not
everyone a starving queue.  ``pick`` order:
  1. a forced head (``guarantee.py``): a request past its class's max wait (overdue heap),
     or the head of a tenant that has been backlogged with nothing running for its grace,
     whose tenant is not over its fair share (S_i <= V + C / w_i), so no legal queue starves
     and no flood jumps the line; one that does not fit keeps KV blocks and a slot free;
  2. a tenant, then a class, below its guaranteed min share while backlogged (shares are
     exponentially decayed service, time constant ``share_tau_s``);
  3. otherwise the tenant with the least finish tag (``wfq.py``) -- preferring, among the
     first few, light tenants (``shares.py``) by earliest first-token deadline -- and its
     best request (``ordering.py``).
Per step, the prefill budget is shaped so the predicted step time stays within 0.8x the
tightest TPOT SLO among running decodes (``tpot.py``; none: no shaping) (never below ``MIN_PREFILL_BUDGET``): long prefills
cannot stutter streams; while a light tenant's prefill runs, heavy tenants' decodes give way
instead (``batching.py``).
Charging: predicted cost at first admission, corrected by actual consumption as tokens are
produced, refunded at the end (``wfq.py``).  Recomputed tokens are never charged to the
victim's tenant.  Configurable layers: ``order`` ("edf" or "fifo") via
``--policy fair:order=fifo``.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from typing import Final

from ...contracts.contract import Contract
from ...core.costmodel import Profile
from ...core.kv import BlockPool
from ...core.request import Request
from ..predictor import Predictor
from .admission import AdmissionControl
from .ordering import Key, LazyHeap, best_head, order_key
from .preemption import PreemptionPolicy
from .rebind import reclass, retenant
from .picking import PickMixin
from .tenant import TenantState
from .tpot import DecodeSLOs
from .guarantee import FORCE_AFTER_S, FORCE_FRACTION, ServiceGuarantee
from .wfq import VirtualTimeWFQ


PEAK_TAU_S: Final = 60.0


# the parts form one chain (state.py): FairPolicy -> PickMixin -> SharesMixin -> BatchingMixin ->
# AccountingMixin -> UrgencyMixin -> FairState -> Policy, the method order of the mixins
@mypyc_attr(allow_interpreted_subclasses=True)
class FairPolicy(PickMixin):
    name = "fair"
    shared_budget = False
    hol_blocking = False
    admit_after_preemption = True
    # a decode-only step reads the light/level statistics only in prefill_budget (for the
    # previous step's prefills), which fast-forward calls too; on_fast_forward is exact
    supports_fast_forward = True

    def __init__(self, order: str = "edf", share_tau_s: float | str = 10.0) -> None:
        # options come from a policy spec as strings (``fair:share_tau_s=5``, registry.py)
        if order not in ("edf", "fifo"):
            raise ValueError(f"fair: order must be 'edf' or 'fifo', got {order!r}")
        self.order = order
        self.share_tau_s = float(share_tau_s)
        self._fast_forward = True

    def bind(self, contract: Contract, profile: Profile, pool: BlockPool, predictor: Predictor) -> None:
        super().bind(contract, profile, pool, predictor)
        self.admission = AdmissionControl(contract, pool)
        self.wfq = VirtualTimeWFQ(credit=0.0)
        self.preemption = PreemptionPolicy(contract, profile)
        self.tenants = {}
        self.backlogged = {}
        self.guarantee = ServiceGuarantee()
        self._reserve = None
        self.backlog_since_s = float("inf")
        self.guaranteed = []
        self.rate_limited = []
        self.overdue = LazyHeap()
        self.deadlines = LazyHeap()
        self.class_min = {}
        self.class_heaps = {}
        self.class_recent = {}
        self.class_waiting = {}
        self.recent_total = 0.0
        self.num_queued = 0
        self.step_ewma_s = profile.step_s([], 1024, 1)
        self._cost = profile.cost               # the step-time arithmetic (chunk_s: batching.py)
        self._last_shaped = 0                   # the last shaped prefill budget (batching.py)
        self.first_service_s = None
        self.total_weight = 0.0
        self._now = 0.0
        self.active_weight = 0.0
        self.num_running = 0
        self._light_prefilling = False
        self._admitted_prefills = []
        self._hold = None
        self.decode_slos = DecodeSLOs()
        self._level_t = float("-inf")
        self._level_v = 0.0
        self.on_contract_change(contract, 0.0)

    def on_contract_change(self, contract: Contract, now: float) -> None:
        """Derive from ``contract`` what the policy reads of it (at bind, and on a live change:
        then tenants and min-share classes follow, rebind.py; nothing queued or running moves)."""
        self.contract = contract
        c = contract.costs
        # a KV occupancy charge reads every step's blocks, which a fast-forward run skips
        self._fast_forward = c.kv_block_s == 0
        self.wp, self.wd = c.prefill_token, c.decode_token
        # integer cost weights keep every used cost and charge integer-valued (exact sums)
        self._integral_costs = float(self.wp).is_integer() and float(self.wd).is_integer() and self.wd > 0
        full = contract.engine.prefill_token_budget
        self.wfq.credit = full * max(self.wp, 1e-9)
        self.prefill_rate = self.wp * full / max(self.profile.step_s([(full, 0)], 0, 0), 1e-9)
        self.admission.contract = contract
        self.admission.max_running = contract.engine.max_running
        self.preemption.spec = contract.preemption
        waits = [k.max_wait_s for k in contract.classes.values() if k.max_wait_s is not None]
        self.min_grace_s = min([FORCE_AFTER_S] + [FORCE_FRACTION * w for w in waits])
        adm = contract.admission
        self.headroom_blocks = int(adm.headroom_kv_fraction * self.pool.num_blocks)
        self.headroom_slots = int(adm.headroom_slot_fraction * contract.engine.max_running)
        self._reserved_cache = None
        self._last_shaped = 0
        retenant(self, contract, now)
        reclass(self, contract)

    def can_fast_forward(self) -> bool:
        """Not with a KV occupancy charge (``costs.kv_block_s > 0``): it reads every step's blocks."""
        return self._fast_forward

    # -- tenants ------------------------------------------------------------------------
    def tenant(self, name: str, now: float = 0.0) -> TenantState:
        t = self.tenants.get(name)
        if t is None:
            t = self.tenants[name] = TenantState(name, self.contract.tenant(name), now, len(self.tenants),
                                                   held=self.pool.held)
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
            wait = self.predicted_wait_s(t, req, now)
            req.predicted_wait_s = wait
            limit = self.contract.admission.shed_margin * req.max_wait_s
            if wait > limit:
                reason = (f"overloaded: predicted wait {wait:.1f}s exceeds {limit:.1f}s "
                          f"(class {req.klass!r} max_wait_s {req.max_wait_s}); retry after ~{wait - limit:.0f}s")
        return reason

    def enqueue(self, req: Request, now: float) -> None:
        t = self.tenant(req.tenant, now)
        if req in t.running:
            t.running.discard(req)
            self.num_running -= 1
            self.decode_slos.stop(req)
        req.qtoken += 1
        q = t.queues.get(req.klass)
        if q is None:
            q = t.queues[req.klass] = LazyHeap()
        cls = self.contract.classes.get(req.klass)
        base = cls.priority if cls is not None else req.priority
        key: Key = (req.enqueued_s, req.seq) if self.order == "fifo" else order_key(req, base, self.pool.block_size)
        q.push(key, req)
        if req.max_wait_s is not None:
            self.overdue.push((req.enqueued_s + req.max_wait_s, req.seq), req)
        if req.deadline_s is not None:
            self.deadlines.push((req.deadline_s - self.estimate_service_s(req), req.seq), req)
        if req.klass in self.class_heaps:
            self.class_heaps[req.klass].push(key, req)
            self.class_waiting[req.klass] += 1
        t.num_waiting += 1
        t.queued_cost[req.klass] = t.queued_cost.get(req.klass, 0.0) + self.predicted_cost(req)
        if not self.num_queued:
            self.backlog_since_s = now
        self.num_queued += 1
        self._rekey(t, now)
        self._touch(t, now)
        if t.num_waiting == 1:
            t.backlogged_since = now
            self.backlogged[t.name] = t
            self.wfq.on_backlogged(t)
        else:
            self.wfq.update(t)

    def take(self, req: Request) -> None:
        t = self.tenants[req.tenant]
        req.qtoken += 1
        t.num_waiting -= 1
        left = t.queued_cost.get(req.klass, 0.0) - self.predicted_cost(req)
        t.queued_cost[req.klass] = max(0.0, left) if t.num_waiting else 0.0
        self.num_queued -= 1
        if not self.num_queued:
            self.backlog_since_s = float("inf")
        if req.klass in self.class_waiting:
            self.class_waiting[req.klass] -= 1
        self._touch(t, self._now)
        if t.num_waiting == 0:
            del self.backlogged[t.name]
            self.wfq.on_idle(t)
        else:
            self._rekey(t, self._now)
            self.wfq.update(t)

    def discard(self, req: Request) -> None:
        self.take(req)

    def _rekey(self, t: TenantState, now: float) -> None:
        head = best_head(t.queues, now)
        t.head_cost = self.predicted_cost(head) if head is not None else 0.0

    def num_waiting(self) -> int:
        return self.num_queued

    # -- admission -----------------------------------------------------------------------
    def can_admit(self, req: Request, now: float, num_running: int) -> bool:
        t = self.tenants[req.tenant]
        chunk = self.contract.engine.chunk_size
        if req.num_uncomputed > chunk and not self.is_light(t, now):
            long_prefills = sum(1 for r in t.running if r.num_uncomputed > chunk)
            if long_prefills >= self.contract.engine.max_long_prefills_per_tenant:
                return False
        keep = self._reserve
        if (keep is not None and keep.tenant != req.tenant
                and num_running + 2 > self.contract.engine.max_running):
            return False                        # the forced head's slot stays free
        reserved_slots = self._reserved(t, num_running)[1]
        if (num_running + 1 > self.contract.engine.max_running - reserved_slots
                and not self._within_share(t, 0, 1)):
            return False
        return self.admission.can_admit(t, req, num_running, self.predicted_cost(req), now)

    def _touch(self, t: TenantState, now: float) -> None:
        self.guarantee.note(t, now)
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
        if not self._within_share(t, need, 0) and not self.under_share(t, self._now):
            # beyond its KV share, a tenant that is not owed service leaves the others'
            # headroom free; one that is owed service (a prompt larger than its share,
            # say) is not blocked by reservations, or it could wait for ever
            need += self._reserved(t, self.num_running)[0]
        keep = self._reserve
        if keep is not None and keep.tenant != req.tenant:
            need += self.pool.blocks_for(keep.num_tokens + 1)   # the forced head's blocks stay free
        return need

    def on_admit(self, req: Request, now: float) -> None:
        t = self.tenants[req.tenant]
        if req.in_prefill:
            self._admitted_prefills.append(req)
        else:
            self.decode_slos.start(req)
        t.running.add(req)
        self.num_running += 1
        if req is self._reserve:
            self._reserve = None
        self._touch(t, now)
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
