"""The fair policy's fields, declared once for the classes that share them.

The fair policy's parts form one inheritance chain on this class, in the method resolution
order the policy has always had::

    Policy <- FairState <- UrgencyMixin <- AccountingMixin <- BatchingMixin <- SharesMixin
           <- PickMixin <- FairPolicy

so each part names the fields it uses with their types (a type checker and mypyc see them);
``FairPolicy.__init__`` and ``FairPolicy.bind`` assign them.  A part that calls a method
defined further down the chain (in a subclass) finds it declared here; every one of these
is overridden, so the stubs never run.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from typing import Final

from ...core.request import Request
from ...core.stepcost import StepCost
from ..policy import DecodeHold, Policy
from .admission import AdmissionControl
from .ordering import LazyHeap
from .preemption import PreemptionPolicy
from .guarantee import ServiceGuarantee
from .tenant import TenantState
from .tpot import DecodeSLOs
from .wfq import VirtualTimeWFQ

# *light* means served, per weight, less than this fraction of the water level (shares.py);
# here because batching.py, a base of SharesMixin, compares with it too
LIGHT_FRACTION: Final = 0.9


@mypyc_attr(allow_interpreted_subclasses=True)
class FairState(Policy):
    order: str                              # in-queue order: "edf" or "fifo"
    share_tau_s: float                      # time constant of the decayed service statistics
    _fast_forward: bool                     # can_fast_forward(): no KV occupancy charge
    wp: float                               # cost per prefill token
    wd: float                               # cost per decode token
    _integral_costs: bool                   # integer cost weights: exact fast-forward sums
    admission: AdmissionControl
    wfq: VirtualTimeWFQ
    preemption: PreemptionPolicy
    tenants: dict[str, TenantState]         # first-seen order
    backlogged: dict[str, TenantState]      # tenants with waiting requests (num_waiting > 0)
    prefill_rate: float                     # cost/s of full-budget prefill steps (forecast.py)
    guarantee: ServiceGuarantee             # starving tenants (guarantee.py)
    min_grace_s: float                      # the shortest starving grace of any class
    _reserve: Request | None                # a forced head that did not fit: room is kept for it
    backlog_since_s: float                  # since when a request has waited throughout (inf: none waits)
    guaranteed: list[TenantState]           # tenants with a min share
    rate_limited: list[TenantState]
    overdue: LazyHeap                       # (enqueued + max_wait, seq)
    deadlines: LazyHeap                     # (latest feasible start, seq)
    class_min: dict[str, float]             # class -> min share (> 0)
    class_heaps: dict[str, LazyHeap]
    class_recent: dict[str, float]          # decayed service per min-share class
    class_waiting: dict[str, int]
    recent_total: float                     # decayed service, all tenants
    num_queued: int
    step_ewma_s: float                      # recent step time
    _cost: StepCost                         # the step-time arithmetic (profile.cost)
    _last_shaped: int                       # the last shaped prefill budget (batching.py)
    first_service_s: float | None
    total_weight: float
    _now: float                             # the time of the step being built
    active_weight: float                    # weights of tenants with waiting or running work
    num_running: int
    _light_prefilling: bool                 # a light tenant's prefill runs (this step)
    _admitted_prefills: list[Request]       # admitted since the last prefill_budget
    _hold: DecodeHold | None                # this step's decode hold
    decode_slos: DecodeSLOs                 # TPOT SLOs of the running decodes (tpot.py)
    _level_t: float                         # when the water level was last read
    _level_v: float                         # the water level (shares.py)
    headroom_blocks: int
    headroom_slots: int
    _reserved_cache: tuple[dict[str, tuple[float, float]], float, float] | None

    # -- defined further down the chain (FairPolicy, PickMixin, SharesMixin) ---------------
    def overshare(self, r: Request) -> float:
        raise NotImplementedError

    def _touch(self, t: TenantState, now: float) -> None:
        raise NotImplementedError

    def within_share(self, t: TenantState) -> bool:
        raise NotImplementedError

    def predicted_cost(self, req: Request) -> float:
        raise NotImplementedError

    def under_share(self, t: TenantState, now: float, level: float | None = None) -> bool:
        raise NotImplementedError

    def is_light(self, t: TenantState, now: float, req: Request | None = None) -> bool:
        raise NotImplementedError

    def _level(self, now: float) -> float:
        raise NotImplementedError
