"""The fleet simulator: N engine replicas, a router, optional prefix caching and the fair
gateway in front, on one deterministic event loop.

A replica's turn (``Replica.turn``) is one step, one fast-forwarded decode run (it stops
before the next time a request could land there) or going idle.  Without a gateway
(``fleet_loop.run_routed``) an arrival goes straight to the replica the router picks and replicas
advance lazily, each in its own time order; with the fair gateway (``_run_gated``) every
event is in global (time, priority, sequence) order: an arrival (priority 0, sequence =
trace position), a gateway wake-up (1), a replica's turn (2, sequence = replica index).
One replica without a gateway makes exactly ``loop.run``'s calls (fingerprints).
Cost: O(log N) per event for the event heap, O(N) per routing decision.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..runtime.intake import Intake
from ..runtime.recorder import Recorder
from ..core.reasons import Reason, ReasonCode
from ..core.request import Request
from ..sched.scheduler import IterationScheduler
from ..workloads.gc_pause import gc_paused
from ..workloads.workload import Workload
from .fleet_gate import FleetGate
from .fleet_loop import ReplicaEvents, kick_blocked, run_routed
from .prefix_cache import MOONCAKE_BLOCK_TOKENS, PrefixCache
from .replica import Replica
from .routers import DEFAULT_LOAD_BOUND, ROUTERS, make_router

FLEET_POLICIES = ("none", "fair")
# each replica is a simulated engine (about 12 KB before its requests); past this, memory is the limit
MAX_REPLICAS: Final = 10_000
DEFAULT_CACHED_DISCOUNT = 0.1
# the fields of FleetConfig that name one of a set: field -> (what it names, the names)
_NAMED_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {"router": ("router", ROUTERS),
                                                         "fleet_policy": ("fleet policy", FLEET_POLICIES)}


class FleetConfig(BaseModel):
    """How the fleet is built (validated, frozen)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    num_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    router: str = "round-robin"
    fleet_policy: str = "none"              # "fair": the gateway's layers 1-3 in front
    gateway_policy: str = "fair"            # the gateway's policy when fleet_policy == "fair"
    # per replica: a fixed window; None: the gateway's default (saturation-driven, sim/fleet_gate.py)
    gateway_window: int | None = Field(default=None, ge=1)
    prefix_cache: bool = False
    cache_tokens: int | None = Field(default=None, ge=0)     # per replica; None: its KV capacity
    cache_block_tokens: int = Field(default=MOONCAKE_BLOCK_TOKENS, ge=1)
    cached_discount: float = Field(default=DEFAULT_CACHED_DISCOUNT, ge=0.0, le=1.0)
    load_bound: float = Field(default=DEFAULT_LOAD_BOUND, ge=1.0)
    # the fair gateway: how long a request may wait for the replica holding its prefix (0: off)
    locality_hold_s: float = Field(default=0.0, ge=0.0)

    @field_validator(*_NAMED_CHOICES)
    @classmethod
    def _known_choice(cls, v: str, info: ValidationInfo) -> str:
        what, choices = _NAMED_CHOICES[info.field_name]
        if v not in choices:
            raise ValueError(f"unknown {what} {v!r}; choose one of {', '.join(choices)}")
        return v


@dataclass
class FleetRun:
    requests: list[Request]             # one per trace row, in trace order (the one that ended it);
                                        # emptied by fleet_simulate.simulate_fleet once recorded
    replica_of: list[int | None]        # the replica each row landed on (None: ended at the gateway)
    replicas: list[Replica]
    gate: FleetGate | None
    end_s: float
    wall_s: float
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def scheduler(self) -> IterationScheduler:
        """The first replica's scheduler (the only one with one replica)."""
        return self.replicas[0].sched

    @property
    def recorder(self) -> Recorder:
        """The first replica's recorder (the fleet's timeline: ``fleet_metrics.fleet_timeline``)."""
        return self.replicas[0].recorder


def _replicas(policy: str, contract: Contract, profile: Profile, config: FleetConfig,
              fast: bool) -> list[Replica]:
    out = []
    for i in range(config.num_replicas):
        cache = None
        if config.prefix_cache:
            tokens = profile.kv_capacity_tokens if config.cache_tokens is None else config.cache_tokens
            cache = PrefixCache(tokens // config.cache_block_tokens, config.cache_block_tokens)
        out.append(Replica(i, policy, contract, profile, cache, fast))
    return out


def simulate_fleet_once(workload: Workload, policy: str, contract: Contract, profile: Profile,
                        config: FleetConfig, progress: Callable[[int, int], None] | None = None,
                        fast: bool = True) -> FleetRun:
    wall0 = time.perf_counter()
    replicas = _replicas(policy, contract, profile, config, fast)
    router = make_router(config.router, config.load_bound)
    rows = workload.rows
    n = len(rows)
    final: list[Request | None] = [None] * n
    replica_of: list[int | None] = [None] * n
    report = _progress(progress, n)
    gate = None
    # performance: the collector paused while the loop runs -- it makes about one Request and
    # a few containers per row that all live to the end and no reference cycles to speak of
    # (a handful per run), so the collector's passes would only trace them again and again
    with gc_paused():
        if config.fleet_policy == "fair":
            gate = FleetGate(config.gateway_policy, contract, profile, len(replicas), config.gateway_window,
                             config.cached_discount, config.locality_hold_s)
            _run_gated(rows, contract, replicas, router, gate, final, replica_of, report)
        else:
            run_routed(rows, contract, replicas, router, final, replica_of, report)
    if progress:
        progress(n, n)
    requests = [req for req in final if req is not None]
    return FleetRun(requests, replica_of, replicas, gate, max(r.now_s for r in replicas),
                    time.perf_counter() - wall0)


def _progress(progress: Callable[[int, int], None] | None, n: int) -> Callable[[int], None]:
    every = max(1, n // 20)
    if progress is None:
        return lambda i: None
    return lambda i: progress(i, n) if i % every == 0 else None


def _run_gated(rows, contract: Contract, replicas: list[Replica], router, gate: FleetGate, final,
               replica_of, report) -> None:
    """The fair gateway in front: every event in global (time, priority, sequence) order --
    an arrival (0), a gateway wake-up (1), a replica's turn (2, by index) -- since a replica
    ending a request lets the gateway release one to any replica."""
    events = ReplicaEvents(replicas)
    n = len(rows)
    intake = Intake(contract)

    def release(gw: Request, r: Replica, t: float) -> Request:
        rr, _ = intake.make(rows[gw.seq], gw.seq)
        r.accept(rr, rows[gw.seq], t)
        replica_of[gw.seq] = r.index
        final[gw.seq] = rr
        events.push(r)
        return rr

    def hashes_of(req: Request):
        return rows[req.seq].prefix_hashes

    i = 0
    while True:
        t_arr = rows[i].arrival_s if i < n else math.inf
        t_rep = events.peek_s()
        t_gate = gate.wake_s
        if t_arr == math.inf and t_rep == math.inf and t_gate == math.inf:
            break
        if t_arr <= t_rep and t_arr <= t_gate:
            row = rows[i]
            req, reject = intake.make(row, i)
            final[i] = req
            if reject is not None:
                replicas[0].sched.reject(req, reject, row.arrival_s)
            else:
                gate.arrive(req, row.arrival_s)
                gate.dispatch(row.arrival_s, replicas, router, hashes_of, release)
            i += 1
            if i == n:
                kick_blocked(replicas, row.arrival_s)
                for r in replicas:
                    events.push(r)
            report(i)
            continue
        if t_gate < t_rep:
            gate.dispatch(t_gate, replicas, router, hashes_of, release)
            continue
        r = events.pop()
        queued = gate.policy.num_waiting() > 0
        horizon = min(t_arr, t_gate, events.peek_s()) if queued else t_arr
        r.turn(horizon, i < n or queued)
        if gate.collect(r, r.now_s):
            gate.dispatch(r.now_s, replicas, router, hashes_of, release)
        events.push(r)
    if gate.policy.num_waiting():
        gate.fail_waiting(Reason(ReasonCode.UNSCHEDULABLE, "no replica can ever admit it"), max(r.now_s for r in replicas))
