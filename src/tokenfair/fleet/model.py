"""What crosses the fleet store's boundary: a dispatch ask and its answer, a completion, a
heartbeat and the fleet view it returns.

Units: *cost* is the contract's cost units (``prefill_token x prompt + decode_token x
output``); a tenant's *tag* S is its normalised service (cost / weight), the fair policy's
``vtime`` (``sched/fair/wfq.py``); V is the fleet's virtual time (monotone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# refusal reasons of a dispatch ask (DispatchAnswer.reason)
REASON_WINDOW = "window"            # the backend's fleet-wide window is full
REASON_CONCURRENCY = "concurrency"  # the tenant is at its fleet-wide max_concurrency
REASON_RATE = "rate"                # the tenant's fleet-wide token bucket is negative
REASON_AHEAD = "ahead"              # the tenant's tag is ahead of the fleet's backlogged tenants


@dataclass(frozen=True)
class DispatchAsk:
    op_id: str              # unique per ask; a replayed op with the same id is applied once
    lease_id: str           # unique per released request attempt
    gateway: str            # the asking gateway's id
    tenant: str
    weight: float           # > 0, the contract's weight
    cost_pred: float        # >= 0, predicted cost (prompt estimate + predicted output): the tag's charge
    cost_max: float         # >= cost_pred, prompt estimate + max_tokens: the bucket's charge
    rate: float             # tokens_per_s of the tenant's rate limit, 0 = none
    burst: float            # burst_tokens of the rate limit (ignored when rate == 0)
    max_concurrency: int    # the tenant's max_concurrency, 0 = none
    backend: str            # the backend's name
    window: int             # >= 1, the backend's window (requests in flight fleet-wide)
    lease_ttl_s: float      # > 0, a lease not renewed within this expires
    credit: float           # >= 0, C of the WFQ: a returning tenant's lead is at most C / weight
    backlog: tuple[str, ...] = ()   # tenants with waiting requests at the asking gateway
    klass: str = ""         # the request's class (per tenant and class service counters)
    check_ahead: bool = True  # False: skip the cross-replica fairness rule (a tenant with a min share)
    force: bool = False     # replay of a decision taken while Redis was unreachable: no checks
    now: float = 0.0        # > 0 only in tests: the store's clock (else Redis TIME / monotonic)


@dataclass
class DispatchAnswer:
    ok: bool
    reason: str = ""                                      # one of REASON_* when not ok
    tags: dict[str, float] = field(default_factory=dict)  # tenant -> S after this op (all tenants)
    vtime: float = 0.0                                    # V after this op
    backend_inflight: int = 0                             # leases on the asked backend after this op
    retry_s: float = 0.0                                  # for REASON_RATE: when the bucket is >= 0 again


@dataclass(frozen=True)
class Completion:
    op_id: str
    lease_id: str
    tenant: str
    weight: float
    backend: str
    cost_pred: float        # what the dispatch charged to the tag
    cost_max: float         # what the dispatch charged to the bucket
    cost_actual: float      # >= 0, the request's true cost (usage), 0 for an attempt that was re-queued
    rate: float
    burst: float
    credit: float
    dispatch_op: str = ""   # the dispatch's op id: skipped (a no-op) if that dispatch was never applied
    klass: str = ""
    now: float = 0.0


@dataclass(frozen=True)
class Heartbeat:
    gateway: str
    ttl_s: float                                    # the gateway counts as live this long
    lease_ttl_s: float
    contract: str                                   # "version@hash" of the gateway's contract
    queue: dict[str, int]                           # tenant -> waiting requests here
    running: int                                    # requests in flight through this gateway
    leases: tuple[tuple[str, str, str], ...] = ()   # (lease id, backend, tenant) held here
    reassert: bool = False                          # re-create missing leases (after a resync)
    now: float = 0.0


@dataclass
class FleetView:
    live_gateways: int = 1                           # >= 1 (this gateway counts)
    tags: dict[str, float] = field(default_factory=dict)
    vtime: float = 0.0
    backend_inflight: dict[str, int] = field(default_factory=dict)
    contract: str = ""                               # the fleet's contract tag (first published)
