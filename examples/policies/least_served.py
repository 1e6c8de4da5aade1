"""A least-served-tenant-first policy: the next admission goes to the waiting tenant that has
been served the fewest tokens so far (prefill + decode), in arrival order inside a tenant
(docs/POLICIES.md walks through it)."""

from __future__ import annotations

from collections import deque

from tokenfair.core.request import Request
from tokenfair.sched.policy import Policy
from tokenfair.sched.registry import register


class LeastServedPolicy(Policy):
    name = "least-served"
    supports_fast_forward = True        # a decode-only step only calls on_served

    def __init__(self) -> None:
        self.queues: dict[str, deque[Request]] = {}   # per tenant, arrival order
        self.served: dict[str, int] = {}              # tokens served per tenant
        self.first_seen: dict[str, int] = {}          # the tie-break: first seen first
        self.size = 0

    def enqueue(self, req: Request, now: float) -> None:
        self.first_seen.setdefault(req.tenant, len(self.first_seen))
        self.served.setdefault(req.tenant, 0)
        queue = self.queues.setdefault(req.tenant, deque())
        (queue.appendleft if req.num_preemptions else queue.append)(req)   # evicted: front
        self.size += 1

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        waiting = [t for t, q in self.queues.items() if q and t not in blocked]
        if not waiting:
            return None
        tenant = min(waiting, key=lambda t: (self.served[t], self.first_seen[t]))
        return self.queues[tenant][0]

    def take(self, req: Request) -> None:
        self.queues[req.tenant].popleft()               # pick returns a tenant's head
        self.size -= 1

    def discard(self, req: Request) -> None:            # expired or aborted while waiting
        self.queues[req.tenant].remove(req)
        self.size -= 1

    def num_waiting(self) -> int:
        return self.size

    def on_served(self, req: Request, prefill_tokens: int, decoded: int, now: float) -> None:
        self.served[req.tenant] += prefill_tokens + decoded


register("least-served", LeastServedPolicy)
