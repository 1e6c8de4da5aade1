"""The fleet simulator's event loop without a gateway (compiled with the core, ``_core.py``).

:class:`ReplicaEvents` holds the replicas' turns in (wake time, replica index) order;
:func:`run_routed` sends each arrival straight to the replica the router picks and advances
replicas lazily (``sim/fleet.py`` explains the rules; its gated loop uses the events too).
Performance: this module and ``sim/replica.py`` are compiled, so a replica's turn and the
loop around it run as C, calling the compiled scheduler and fast-forward directly.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable, Sequence

from ..contracts.contract import Contract
from ..core.request import Request
from ..runtime.intake import Intake
from ..workloads.workload import TraceRow
from .replica import Replica
from .routers import Router

# how old a replica's state a router may read (llm-d's router treats engine metrics older
# than 200 ms as stale)
ROUTER_STALENESS_S = 0.2


class ReplicaEvents:
    """The replicas' turns in (wake time, replica index) order: a heap with lazy deletion
    (an entry is live while its version is the replica's latest)."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.heap: list[tuple[float, int, int]] = []
        self.version = [0] * len(replicas)

    def push(self, r: Replica) -> None:
        self.version[r.index] += 1
        if r.wake_s < math.inf:
            heapq.heappush(self.heap, (r.wake_s, r.index, self.version[r.index]))

    def peek_s(self) -> float:
        heap, version = self.heap, self.version
        while heap and heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def pop(self) -> Replica:
        self.peek_s()
        _, k, _ = heapq.heappop(self.heap)
        self.version[k] += 1
        return self.replicas[k]


def advance(r: Replica, t: float, more_coming: bool) -> None:
    """Run ``r``'s turns due before ``t`` (a request may land at ``t``)."""
    while r.wake_s < t:
        r.turn(t, more_coming)


def kick_blocked(replicas: list[Replica], t: float) -> None:
    """Nothing more arrives: a replica waiting for a request with work left takes a turn."""
    for r in replicas:
        if r.wake_s == math.inf and r.sched.has_work():
            r.wake_s = max(r.now_s, t)


def run_routed(rows: Sequence[TraceRow], contract: Contract, replicas: list[Replica], router: Router,
               final: list[Request | None], replica_of: list[int | None],
               report: Callable[[int], None]) -> None:
    """Requests go to replicas at arrival; replicas advance lazily.  A replica runs its turns
    up to an arrival only when the request lands on it, or -- for a router that reads replica
    state -- when its state is more than ``ROUTER_STALENESS_S`` old: routers see each
    replica as of its last event, at most that stale.  Replicas do not interact otherwise,
    so each one's events stay in time order.  One replica: ``loop.run``'s calls exactly."""
    events = ReplicaEvents(replicas)
    stale_s = ROUTER_STALENESS_S if router.reads_state and len(replicas) > 1 else math.inf
    n = len(rows)
    intake = Intake(contract)
    for i in range(n):
        row = rows[i]
        t = row.arrival_s
        while events.peek_s() < t - stale_s:
            r = events.pop()
            advance(r, t, True)
            events.push(r)
        req, reject = intake.make(row, i)
        final[i] = req
        if reject is not None:
            replicas[0].sched.reject(req, reject, t)
        else:
            r = replicas[router.choose(replicas, row.prefix_hashes)]
            advance(r, t, True)
            r.accept(req, row, t)
            replica_of[i] = r.index
            events.push(r)
        report(i + 1)
    kick_blocked(replicas, rows[n - 1].arrival_s if n else 0.0)
    for r in replicas:
        advance(r, math.inf, False)
