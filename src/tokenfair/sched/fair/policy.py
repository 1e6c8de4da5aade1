"""``fair``: the four layers composed (admission -> WFQ -> in-queue order -> batching).

``FairPolicy`` is a facade: the mechanics (``sched/scheduler.py``) ask it their questions
and it routes each to the parts that answer it (``__init__.py`` lists them), in the order
the parts must see the changes.  A request whose predicted wait exceeds its class's max
wait is shed: at arrival when that max wait is a minute or less and the forecast is clearly
over it (``forecast.py``), and from the queue as its max wait nears (``review.py``).
``pick`` order (``picking.py``):
  1. a forced head (``guarantee.py``): a request past its class's max wait, or the head of
     a tenant backlogged with nothing running for its grace, whose tenant is not over its
     fair share (S_i <= V + C / w_i) -- a starving one also while its finish tag is within
     8 credits (F_i <= V + 8 C / w_i); one that does not fit keeps KV blocks and a slot free;
  2. a tenant, then a class, below its guaranteed min share while backlogged (``shares.py``);
  3. otherwise the tenant with the least finish tag (``wfq.py``) -- preferring, among the
     first few, light tenants by earliest first-token deadline -- and its best request
     (``ordering.py``, ``queue.py``).
Per step, the prefill budget is shaped for the running decodes' TPOT SLOs (``batching.py``);
charges are corrected as tokens are produced (``accounting.py``).  Options: ``order``
("edf" or "fifo", ``--policy fair:order=fifo``), ``share_tau_s``.
"""

from __future__ import annotations

import math

from mypy_extensions import mypyc_attr

from ...contracts.contract import Contract
from ...core.costmodel import Profile
from ...core.kv import BlockPool
from ...core.reasons import Reason
from ...core.request import Request
from ..policy import DecodeHold, Policy
from ..predictor import Predictor
from ..registry import number_option
from ..snapshot import PolicySnapshot, TenantView
from .accounting import Accounting
from .admission import AdmissionControl
from .background import BackgroundPrefill
from .batching import PrefillShaper
from .costs import MIN_COST_WEIGHT, RequestCost, prefill_rate
from .forecast import WaitForecaster
from .guarantee import ServiceGuarantee, min_grace_s
from .headroom import Headroom
from .picking import Picker
from .preemption import PreemptionPolicy
from .queue import WaitingQueue
from .review import QueueReview
from .rebind import reclass, retenant
from .roster import TenantRoster
from .shaping import BudgetShaper
from .shares import MIN_SHARE_TAU_S, ShareMeter
from .steptime import StepTimer, initial_step_s
from .tenant import PEAK_TAU_S, TenantState
from .tpot import DecodeSLOs
from .urgency import Urgency
from .view import policy_snapshot, view_of
from .wfq import VirtualTimeWFQ

@mypyc_attr(allow_interpreted_subclasses=True)
class FairPolicy(Policy):
    name = "fair"
    shared_budget = False
    hol_blocking = False
    admit_after_preemption = True
    cap_yields_only_to_prefill = True
    # a decode-only step reads the light/level statistics only in prefill_budget (for the
    # previous step's prefills), which fast-forward calls too; on_fast_forward is exact
    supports_fast_forward = True

    # the parts (made by bind; each holds its own state)
    costs: RequestCost
    admission: AdmissionControl
    wfq: VirtualTimeWFQ
    preemption: PreemptionPolicy
    roster: TenantRoster
    tenants: dict[str, TenantState]         # roster.tenants (the service reads snapshot())
    queue: WaitingQueue
    meter: ShareMeter
    headroom: Headroom
    decode_slos: DecodeSLOs
    step_time: StepTimer
    forecaster: WaitForecaster
    review: QueueReview
    accounting: Accounting
    shaper: PrefillShaper
    urgency: Urgency
    picker: Picker

    def __init__(self, order: str = "edf", share_tau_s: float | str = 10.0) -> None:
        # options come from a policy spec as strings (``fair:share_tau_s=5``, registry.py)
        if order not in ("edf", "fifo"):
            raise ValueError(f"fair: order must be 'edf' or 'fifo', got {order!r}")
        self.order = order
        self.share_tau_s = number_option("fair", "share_tau_s", share_tau_s, MIN_SHARE_TAU_S)
        self._fast_forward = True
        self._now = 0.0                         # the time of the step being built

    def bind(self, contract: Contract, profile: Profile, pool: BlockPool, predictor: Predictor) -> None:
        super().bind(contract, profile, pool, predictor)
        self.read_limits(contract)
        # a KV occupancy charge reads every step's blocks, which a fast-forward run skips
        self._fast_forward = contract.costs.kv_block_s == 0
        self.costs = costs = RequestCost(contract.costs)
        self.admission = admission = AdmissionControl(contract, pool)
        full = contract.engine.prefill_token_budget
        self.wfq = wfq = VirtualTimeWFQ(credit=full * max(costs.wp, MIN_COST_WEIGHT))
        self.preemption = PreemptionPolicy(contract, profile)
        guarantee = ServiceGuarantee()
        self.roster = roster = TenantRoster(contract, pool.held, admission, guarantee)
        self.tenants = roster.tenants
        class_min = {k: s.min_share for k, s in contract.classes.items() if s.min_share > 0}
        self.step_time = step_time = StepTimer(initial_step_s(profile))
        self.queue = queue = WaitingQueue(contract, self.order, pool.block_size, costs, wfq, class_min)
        self.meter = meter = ShareMeter(contract, roster, self.share_tau_s, list(class_min))
        self.headroom = headroom = Headroom(contract, pool, roster, wfq)
        self.decode_slos = slos = DecodeSLOs()
        self.forecaster = forecaster = WaitForecaster(contract, meter, queue, prefill_rate(costs, profile, full),
                                                      step_time, slos, costs.wd)
        self.review = QueueReview(contract, roster.tenants, forecaster)
        self.accounting = Accounting(contract, costs, wfq, roster, meter, headroom, slos, step_time)
        self.background = background = BackgroundPrefill(queue)
        self.shaper = PrefillShaper(contract, BudgetShaper(profile.cost), roster, meter, wfq, queue, slos,
                                    background)
        self.urgency = Urgency(contract, profile, self.preemption, admission, roster, meter, wfq, step_time,
                               queue.deadlines)
        self.picker = Picker(queue, roster, meter, admission, wfq, costs, guarantee, min_grace_s(contract))
        self._now = 0.0

    def on_contract_change(self, contract: Contract, now: float) -> None:
        """A live contract change (``serve/contract_live.py``): each part re-derives what it
        derived from the contract at :meth:`bind` (cost weights, WFQ credit, prefill rate,
        grace, headroom, preemption), and the tenants and min-share classes follow
        (``rebind.py``); nothing queued or running moves or ends."""
        self.contract = contract
        self.read_limits(contract)
        self._fast_forward = contract.costs.kv_block_s == 0
        self.costs.rebind(contract.costs)
        full = contract.engine.prefill_token_budget
        self.wfq.credit = full * max(self.costs.wp, MIN_COST_WEIGHT)
        self.preemption.spec = contract.preemption
        retenant(self.roster, self.queue, self.wfq, self.admission, contract, now)
        reclass(self.queue, self.meter, self.roster, contract)
        self.headroom.rebind(contract)
        self.headroom.invalidate()              # the reservations of the old bounds
        self.forecaster.contract = contract
        self.review.contract = contract
        self.forecaster.prefill_rate = prefill_rate(self.costs, self.profile, full)
        self.accounting.rebind(contract)
        self.shaper.rebind(contract)
        self.shaper.shaper.last_shaped = 0      # the bisection's start, for the new budget
        self.urgency.contract = contract
        self.picker.min_grace_s = min_grace_s(contract)

    def can_fast_forward(self) -> bool:
        """Not with a KV occupancy charge (``costs.kv_block_s > 0``): it reads every step's blocks."""
        return self._fast_forward

    def tenant(self, name: str, now: float = 0.0) -> TenantState:
        return self.roster.tenant(name, now)

    # -- the service's seam (``Policy``'s docstrings) ------------------------------------------
    def snapshot(self, now: float) -> PolicySnapshot:
        return policy_snapshot(self.roster, self.wfq, self.share_tau_s, now)

    def tenant_view(self, name: str, now: float) -> TenantView | None:
        return view_of(self.roster, name, now, self.share_tau_s)

    def can_admit_within_limits(self, req: Request, now: float) -> bool:
        t = self.roster.tenant(req.tenant, now)
        return self.admission.within_limits(t, req.num_tokens + req.predicted_remaining, now)

    def victim_order(self, req: Request, now: float) -> tuple[int, float, float, int, int] | None:
        k = self.preemption.key(req, now, self.urgency.overshare(req))
        return (0 if self.preemption.eligible(req, now) else 1, k[0], k[1], k[2], k[3])

    def observe_step_time(self, step_s: float) -> None:
        self.step_time.ewma_s = step_s

    # -- waiting queue -------------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> Reason | None:
        t = self.roster.tenant(req.tenant, now)
        reason = self.admission.on_arrival(t, req)
        if reason is None and req.max_wait_s is not None:
            if self.contract.admission.shed_over_max_wait:
                reason = self.forecaster.shed_reason(t, req, now)
            else:
                req.predicted_wait_s = self.forecaster.predicted_wait_s(t, req, now)
            self.background.note_forecast(req.predicted_wait_s, req.max_wait_s, now)
        return reason

    def enqueue(self, req: Request, now: float) -> None:
        t = self.roster.tenant(req.tenant, now)
        if self.roster.stop(t, req):            # preempted: it waits again
            self.decode_slos.stop(req)
        service_s = self.urgency.estimate_service_s(req) if req.deadline_s is not None else 0.0
        self.queue.push(req, t, now, service_s)
        self.review.note_queued(req)
        self.roster.touch(t, now)

    def take(self, req: Request) -> None:
        t = self.roster.tenants[req.tenant]
        self.queue.remove(req, t, self._now)
        self.roster.touch(t, self._now)

    def discard(self, req: Request) -> None:     # expired or aborted while waiting
        self.take(req)

    def num_waiting(self) -> int:
        return self.queue.num_queued

    def read_limits(self, contract: Contract) -> None:
        """The engine limits :meth:`can_admit` reads, as plain fields (performance: a
        contract field read is a pydantic attribute lookup; ``max_running`` is the
        admission control's, kept by its own rebind)."""
        eng = contract.engine
        self.chunk_size = eng.chunk_size
        self.max_long_prefills = eng.max_long_prefills_per_tenant

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        self._now = now
        return self.picker.pick(now, blocked)

    def expire(self, now: float) -> list[tuple[Request, Reason]]:
        """The requests shed at their review (``review.py``), then those past their deadline
        (``urgency.py``), each taken out of the queue before the next is found."""
        out: list[tuple[Request, Reason]] = []
        while True:
            shed = self.review.next_shed(now)
            if shed is None:
                break
            out.append(shed)
            self.take(shed[0])
        while True:
            expired = self.urgency.next_expired(now)
            if expired is None:
                return out
            out.append(expired)
            self.take(expired[0])

    # -- admission -----------------------------------------------------------------------
    def can_admit(self, req: Request, now: float, num_running: int) -> bool:
        t = self.roster.tenants[req.tenant]
        chunk_size, max_running = self.chunk_size, self.admission.max_running
        if req.num_uncomputed > chunk_size and not self.meter.is_light(t, now):
            long_prefills = sum(1 for r in t.running if r.num_uncomputed > chunk_size)
            if long_prefills >= self.roster.long_prefill_limit(t, self.max_long_prefills):
                return False
        keep = self.picker.reserve
        if keep is not None and keep.tenant != req.tenant and num_running + 2 > max_running:
            return False                        # the forced head's slot stays free
        # the slots kept for the tenants within their share (headroom.py) do not hold a
        # forced head (its tenant is within its share, or starving within the lead that
        # guarantee.py allows)
        if self.headroom.holds_slot(t, num_running, self.meter, now, req is self.picker.forced_head):
            return False
        return self.admission.can_admit(t, req, num_running, self.costs.predicted(req), now)

    def kv_blocks_to_admit(self, req: Request, first_chunk: int) -> int:
        return self.headroom.blocks_to_admit(req, first_chunk, self.meter, self.picker.reserve, self._now)

    def on_admit(self, req: Request, now: float) -> None:
        t = self.roster.tenants[req.tenant]
        if req.in_prefill:
            self.shaper.note_admitted(req)
        else:
            self.decode_slos.start(req)
        self.roster.start(t, req)
        if req is self.picker.reserve:
            self.picker.reserve = None
        self.roster.touch(t, now)
        t.note_peak(now, t.kv_blocks() + self.pool.blocks_for(req.num_tokens + req.predicted_remaining),
                    len(t.running), PEAK_TAU_S)
        if req.charged == 0.0:
            self.admission.on_admit(t, self.accounting.charge_admission(req, t, now))

    def next_wakeup(self, now: float) -> float:
        """The rate limits' next wake-up, or the next queue review if sooner (``review.py``:
        a request due for review while only a rate limit holds the queue is judged then).
        Without a rate-limit wake-up, none: what waits while nothing runs can never start,
        and the loop fails it at once (``IterationScheduler.after_empty_step``)."""
        wake = self.admission.wakeup(self.roster.rate_limited, now)
        return min(wake, self.review.next_due_s()) if wake < math.inf else wake

    # -- the step's shape ------------------------------------------------------------------
    def prefill_budget(self, last_step: tuple[int, int, list[Request]], now: float) -> int:
        self._now = now
        return self.shaper.prefill_budget(last_step, now)

    def decode_hold(self) -> DecodeHold | None:
        return self.shaper.hold

    def chunk_for(self, req: Request, now: float) -> int:
        return self.shaper.chunk_for(req, now)

    def extra_prefill_budget(self, prefills: list[tuple[Request, int]]) -> int:
        return self.shaper.extra_budget(prefills)

    def defer_prefill(self, req: Request, now: float) -> bool:
        return self.shaper.defer_prefill(req, now)

    def prefill_first(self, prefills: list[tuple[Request, int]], now: float) -> list[bool] | None:
        return self.shaper.prefill_first(prefills, now)

    # -- accounting ----------------------------------------------------------------------
    def on_served(self, req: Request, prefill_tokens: int, decoded: int, now: float) -> None:
        self.accounting.on_served(req, prefill_tokens, decoded, now)

    def on_decoded(self, reqs: list[Request], now: float,
                   tenant_counts: dict[str, int] | None = None) -> None:
        self.accounting.on_decoded(reqs, now, tenant_counts)

    def on_fast_forward(self, reqs: list[Request], start: float, step_ends: list[float],
                        step_durations: list[float], end_last: bool = True,
                        tenant_counts: dict[str, int] | None = None) -> None:
        # what schedule() leaves behind in a decode-only step (pick/prefill_budget set it)
        self._now = step_ends[-2] if len(step_ends) > 1 else start
        if not self.accounting.can_sum_steps():
            super().on_fast_forward(reqs, start, step_ends, step_durations, end_last)
            return
        self.accounting.fast_forward(reqs, start, step_ends, step_durations, end_last, tenant_counts)

    def on_step_end(self, now: float, duration_s: float) -> None:
        self.accounting.on_step_end(now, duration_s)

    def on_finish(self, req: Request, now: float) -> None:
        t = self.roster.tenants.get(req.tenant)
        if t is None:
            return
        self.roster.stop(t, req)
        self.decode_slos.stop(req)
        self.roster.touch(t, now)
        self.accounting.refund(req, t)

    # -- preemption ------------------------------------------------------------------------
    def victim_for_kv(self, candidates: list[Request], needing: Request, now: float) -> Request | None:
        self.headroom.note_kv_pressure(now)
        return self.urgency.victim_for_kv(candidates, needing, now)

    def preempt_mode(self, req: Request) -> str:
        return self.preemption.mode(req)

    def urgent_victim(self, cand: Request, running: list[Request], now: float) -> Request | None:
        return self.urgency.urgent_victim(cand, running, now)
