"""The fleet simulator: N engine replicas, a router, optional prefix caching and the fair
gateway in front, on one deterministic event loop.

Events, in (time, priority, sequence) order: an arrival (priority 0, sequence = trace
position), a gateway wake-up (1), a replica's turn (2, sequence = replica index).  An
arrival goes to the gateway (``fleet_policy="fair"``: it releases requests as replicas have
room) or straight to the replica the router picks.  A replica's turn (``Replica.turn``) is
one step, one fast-forwarded decode run (it stops before the next time a request could
land there: the next arrival, or with the gateway holding a queue, the next event of any
kind), or going idle.  One replica without a gateway makes exactly ``loop.run``'s calls.
Cost per event: O(log N) for the event heap, O(N) per routing decision.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..contract import Contract
from ..costmodel import Profile
from ..intake import make_request
from ..recorder import Recorder
from ..request import Request, Status
from ..sched.scheduler import IterationScheduler
from ..workload import Workload
from .fleet_gate import FleetGate
from .prefix_cache import MOONCAKE_BLOCK_TOKENS, PrefixCache
from .replica import Replica
from .routers import DEFAULT_LOAD_BOUND, ROUTERS, make_router

FLEET_POLICIES = ("none", "fair")
DEFAULT_CACHED_DISCOUNT = 0.1


class FleetConfig(BaseModel):
    """How the fleet is built (validated, frozen)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    num_replicas: int = Field(default=1, ge=1)
    router: str = "round-robin"
    fleet_policy: str = "none"              # "fair": the gateway's layers 1-3 in front
    gateway_policy: str = "fair"            # the gateway's policy when fleet_policy == "fair"
    gateway_window: int | None = Field(default=None, ge=1)   # per replica; None: engine.max_running
    prefix_cache: bool = False
    cache_tokens: int | None = Field(default=None, ge=0)     # per replica; None: its KV capacity
    cache_block_tokens: int = Field(default=MOONCAKE_BLOCK_TOKENS, ge=1)
    cached_discount: float = Field(default=DEFAULT_CACHED_DISCOUNT, ge=0.0, le=1.0)
    load_bound: float = Field(default=DEFAULT_LOAD_BOUND, ge=1.0)

    @field_validator("router")
    @classmethod
    def _known_router(cls, v: str) -> str:
        if v not in ROUTERS:
            raise ValueError(f"unknown router {v!r}; choose one of {', '.join(ROUTERS)}")
        return v

    @field_validator("fleet_policy")
    @classmethod
    def _known_fleet_policy(cls, v: str) -> str:
        if v not in FLEET_POLICIES:
            raise ValueError(f"unknown fleet policy {v!r}; choose one of {', '.join(FLEET_POLICIES)}")
        return v


@dataclass
class FleetRun:
    requests: list[Request]             # one per trace row, in trace order (the one that ended it)
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
    gate = None
    if config.fleet_policy == "fair":
        window = config.gateway_window or contract.engine.max_running
        gate = FleetGate(config.gateway_policy, contract, profile, len(replicas), window, config.cached_discount)
    rows = workload.rows
    n = len(rows)
    final: list[Request | None] = [None] * n
    replica_of: list[int | None] = [None] * n
    heap: list[tuple[float, int, int]] = []          # (wake_s, replica index, version)
    version = [0] * len(replicas)

    def wake(r: Replica) -> None:
        if r.wake_s < math.inf:
            version[r.index] += 1
            heapq.heappush(heap, (r.wake_s, r.index, version[r.index]))

    def land(req: Request, r: Replica, t: float) -> None:
        r.accept(req, rows[req.seq], t)
        replica_of[req.seq] = r.index
        final[req.seq] = req
        wake(r)

    def release(gw: Request, r: Replica, t: float) -> Request:
        rr, _ = make_request(rows[gw.seq], gw.seq, contract)
        land(rr, r, t)
        return rr

    def hashes_of(req: Request):
        return rows[req.seq].prefix_hashes

    i = 0
    next_report = max(1, n // 20)
    while True:
        t_arr = rows[i].arrival_s if i < n else math.inf
        while heap and heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        t_rep = heap[0][0] if heap else math.inf
        t_gate = gate.wake_s if gate is not None else math.inf
        if t_arr == math.inf and t_rep == math.inf and t_gate == math.inf:
            break
        if t_arr <= t_rep and t_arr <= t_gate:
            row = rows[i]
            req, reject = make_request(row, i, contract)
            final[i] = req
            if reject is not None:
                replicas[0].sched._end(req, Status.REJECTED, reject, row.arrival_s)
            elif gate is not None:
                gate.arrive(req, row.arrival_s)
                gate.dispatch(row.arrival_s, replicas, router, hashes_of, release)
            else:
                land(req, replicas[router.choose(replicas, row.prefix_hashes)], row.arrival_s)
            i += 1
            if i == n:                        # nothing more arrives: a blocked replica may give up
                for r in replicas:
                    if r.wake_s == math.inf and r.sched.has_work():
                        r.wake_s = max(r.now_s, row.arrival_s)
                        wake(r)
            if progress and i % next_report == 0:
                progress(i, n)
            continue
        if gate is not None and t_gate < t_rep:
            gate.dispatch(t_gate, replicas, router, hashes_of, release)
            continue
        _, k, _ = heapq.heappop(heap)
        r = replicas[k]
        queued = gate is not None and gate.policy.num_waiting() > 0
        horizon = min(t_arr, t_gate, heap[0][0] if heap else math.inf) if queued else t_arr
        more = i < n or queued
        r.turn(horizon, more)
        if gate is not None and gate.collect(r, r.now_s):
            gate.dispatch(r.now_s, replicas, router, hashes_of, release)
        wake(r)
    if gate is not None and gate.policy.num_waiting():
        gate.fail_waiting("unschedulable: no replica can ever admit it", max(r.now_s for r in replicas))
    if progress:
        progress(n, n)
    requests = [req for req in final if req is not None]
    return FleetRun(requests, replica_of, replicas, gate, max(r.now_s for r in replicas),
                    time.perf_counter() - wall0)
