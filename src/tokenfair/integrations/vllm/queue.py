"""vLLM's waiting queue, answered by the tokenfair policy.

vLLM's scheduler admits from ``self.waiting`` in a loop: while ``bool(queue)``, it
``peek_request()``s, tries to allocate KV for it, and ``pop_request()``s it into the running
list (or pops it to skip it this step and ``prepend_requests`` it back).  Admission has no
hook, so this queue *is* the hook: ``bool`` and ``peek_request`` show only the policy's next
request that may start now (``PolicyBridge.eligible``); a tenant whose candidate may not is
skipped for the rest of the step (held back, still queued, still counted by ``len``, so vLLM
keeps stepping and reports it in ``vllm:num_requests_waiting``).  Nothing is dropped: a
request leaves the queue only by ``pop_request`` (it runs) or ``remove_request(s)`` (vLLM
finished it: aborted, or failed with a reason).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from vllm.v1.core.sched.request_queue import RequestQueue

from ...core.reasons import Reason
from ...core.request import Request
from .bridge import PolicyBridge


class PolicyQueue(RequestQueue):
    def __init__(self, bridge: PolicyBridge, num_running: Callable[[], int]) -> None:
        self.bridge = bridge
        self.num_running = num_running
        self.waiting: dict[str, object] = {}        # request id -> vLLM request, policy-queued
        self.failing: dict[str, object] = {}        # rejected or expired: ended with an error by vLLM
        self.handed: set[str] = set()               # failing ids already handed to vLLM to end
        self.blocked: set[str] = set()              # tenants held back for the rest of this step
        self.now = bridge.clock()
        self._next: Request | None = None           # the eligible head, until the queue changes

    def begin_step(self) -> None:
        self.blocked.clear()
        self.now = self.bridge.clock()
        self._next = None

    def _head(self) -> Request | None:
        if self._next is None:
            policy, bridge, now = self.bridge.policy, self.bridge, self.now
            while True:
                req = policy.pick(now, self.blocked)
                if req is None:
                    break
                if bridge.eligible(req, self.num_running(), now):
                    self._next = req
                    return req
                self.blocked.add(req.tenant)
            if self.blocked:
                self._next = self._work_conserving()
        return self._next

    def _work_conserving(self) -> Request | None:
        """Every waiting tenant is held back: the policy's first candidate within its hard
        limits (concurrency, KV quota, token rate, free KV) that the policy gives a chunk
        this step starts anyway.  The headroom a
        held-back tenant leaves free protects tenants *with requests waiting*; when none is
        waiting, a free slot would only idle (vLLM admits nothing else this step)."""
        policy, bridge, now = self.bridge.policy, self.bridge, self.now
        tried: set[str] = set()
        while True:
            req = policy.pick(now, tried)
            if req is None:
                return None
            if bridge.within_hard_limits(req, now) and policy.chunk_for(req, now) > 0:
                bridge.counts["work_conserving"] += 1
                return req
            tried.add(req.tenant)

    def expire(self, req: Request, reason: Reason) -> None:
        """The policy expired ``req`` (deadline infeasible): it ends with an error next."""
        vreq = self.waiting.pop(req.request_id, None)
        self.bridge.expired(req, reason)
        if vreq is not None:
            self.failing[req.request_id] = vreq
        self._next = None

    def take_failing(self) -> list[str]:
        """Ids of failing requests not yet handed to vLLM (they stay counted until removed)."""
        ids = [rid for rid in self.failing if rid not in self.handed]
        self.handed.update(ids)
        return ids

    # -- RequestQueue -------------------------------------------------------------------
    def add_request(self, request) -> None:
        req = self.bridge.arrive(request)
        if req is None:
            self.failing[request.request_id] = request
        else:
            self.waiting[request.request_id] = request
        self._next = None

    def peek_request(self):
        req = self._head()
        if req is None:
            raise IndexError("no waiting request may start now")
        return req.payload

    def pop_request(self):
        req = self._head()
        if req is None:
            raise IndexError("no waiting request may start now")
        self._next = None
        self.bridge.policy.take(req)
        self.bridge.admitted(req, self.now)
        return self.waiting.pop(req.request_id)

    def prepend_request(self, request) -> None:
        req = self.bridge.by_id.get(request.request_id)
        if req is None:                              # not ours (cannot happen): keep it anyway
            self.failing[request.request_id] = request
            return
        self.bridge.requeued(req, request, self.bridge.clock())
        self.waiting[request.request_id] = request
        self._next = None

    def prepend_requests(self, requests: Iterable) -> None:
        for r in requests:
            self.prepend_request(r)

    def remove_request(self, request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable) -> None:
        for r in requests:
            self.waiting.pop(r.request_id, None)
            self.failing.pop(r.request_id, None)
            self.handed.discard(r.request_id)
        self._next = None

    def __bool__(self) -> bool:
        return self._head() is not None

    def __len__(self) -> int:
        return len(self.waiting) + len(self.failing)

    def __iter__(self) -> Iterator:
        return iter(list(self.waiting.values()) + list(self.failing.values()))
