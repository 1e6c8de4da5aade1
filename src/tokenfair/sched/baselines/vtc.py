"""``vtc``: the Virtual Token Counter baseline (see :class:`VtcPolicy`), on the same vLLM
mechanics as the other baselines (:mod:`tokenfair.sched.baselines.classic`)."""

from __future__ import annotations

import heapq
from collections import deque

from ...contracts.contract import Contract
from ...core.exactfloat import add_repeated
from ...core.request import Request
from .classic import VllmMechanics
from ..registry import number_option, register


class VtcPolicy(VllmMechanics):
    """``vtc``: the Virtual Token Counter (Sheng et al., "Fairness in Serving Large Language
    Models", OSDI 2024), as docs/SOURCES.md states the paper and its artifact.

    State per tenant ``u``: counter ``c[u]`` (0 on first sight), FIFO queue ``Q[u]``, weight
    ``w[u]`` (the contract tenant's ``weight``).  Cost weights ``w_p`` (input token, default
    1) and ``w_q`` (output token, default 2), set by the constructor.

    * Arrival into an empty ``Q[u]`` lifts ``c[u] = max(c[u], min c[k])`` over the *other*
      tenants with a non-empty queue (no lift when no other tenant is queued), so an idle
      tenant cannot bank credit.
    * Admission: the tenant with the smallest counter among those with queued requests
      offers the head of its queue; on admission ``c[u] += w_p * prompt_tokens / w[u]``.
      If that head does not fit, admission stops (``hol_blocking``: no skipping).
    * Every generated token (the one sampled by the last prefill chunk included) adds
      ``w_q / w[u]``.  Each token is charged exactly once: the artifact's quirk of charging
      counters twice on a step where a request finishes is *not* reproduced.
    * Only KV shortage preempts (newest running request, recompute); the preempted request
      goes back to the *front* of its tenant's queue without a lift and is not charged its
      input again on re-admission (the recomputation is the system's overhead, not new
      demand).

    Differences from the artifact, all from using the shared vLLM-style mechanics: new work
    may be admitted on every step (the artifact admits only when nothing runs or every 10
    decode steps), and KV is not reserved for the full output length up front (the artifact
    does; tokenfair requests only bound their output by ``max_tokens``), hence KV-shortage
    preemption exists here.  Ties between equal counters go to the tenant seen first.

    ``counters`` (tenant -> counter) is public for tests and reports.

    Complexity (T = tenants with an entry in the tenant heap, i.e. at most those that had
    queued requests since they were last found idle): enqueue O(1) plus, on an arrival into
    an empty queue, one lazy min O(k log T) and a push O(log T); pick O(k log T) where k is
    the number of tenants whose counters grew since their heap entry was pushed (counters
    only grow, so a stale entry is refreshed by re-pushing it); take O(1); on_admit and
    on_served O(1); discard O(len(Q[u])) (abort only); num_waiting O(1).
    """

    name = "vtc"

    def __init__(self, input_weight: float | str = 1.0, output_weight: float | str = 2.0) -> None:
        # strings come from the registry's ``vtc:input_weight=1,output_weight=2`` syntax
        self.w_p = number_option("vtc", "input_weight", input_weight, 0.0)
        self.w_q = number_option("vtc", "output_weight", output_weight, 0.0)
        self.counters: dict[str, float] = {}
        self._queues: dict[str, deque[Request]] = {}
        self._order: dict[str, int] = {}           # first-seen order: the tie-break
        self._weight: dict[str, float] = {}
        self._heap: list[tuple[float, int, str]] = []   # (counter when pushed, order, tenant)
        self._in_heap: set[str] = set()
        self._n = 0

    # -- tenants ------------------------------------------------------------------------
    def _tenant(self, t: str) -> deque[Request]:
        q = self._queues.get(t)
        if q is None:
            q = self._queues[t] = deque()
            self.counters[t] = 0.0
            self._order[t] = len(self._order)
            self._weight[t] = self.contract.tenant(t).weight
        return q

    def on_contract_change(self, contract: Contract, now: float) -> None:
        """Every known tenant's weight is the new contract's: its counter grows by the new
        ``1 / w[u]`` per unit of cost from now on (what it was charged stays)."""
        self.contract = contract
        for t in self._weight:
            self._weight[t] = contract.tenant(t).weight

    def _push(self, t: str) -> None:
        if t not in self._in_heap:
            self._in_heap.add(t)
            heapq.heappush(self._heap, (self.counters[t], self._order[t], t))

    def _min_backlogged(self, skip: set[str] | frozenset[str] = frozenset()) -> str | None:
        """The tenant with the smallest counter among those with queued requests (not in
        ``skip``).  Entries of idle tenants are dropped, stale ones re-pushed."""
        heap, aside, found = self._heap, [], None
        while heap:
            c, order, t = heap[0]
            if not self._queues[t]:
                heapq.heappop(heap)
                self._in_heap.discard(t)
                continue
            cur = self.counters[t]
            if c < cur:
                heapq.heapreplace(heap, (cur, order, t))
                continue
            if t in skip:
                aside.append(heapq.heappop(heap))
                continue
            found = t
            break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found

    # -- waiting queue ------------------------------------------------------------------
    def enqueue(self, req: Request, now: float) -> None:
        t = req.tenant
        q = self._tenant(t)
        if req.num_preemptions:
            q.appendleft(req)                       # back to the front, as vLLM does
        else:
            if not q:                               # lift: no banking of idle credit
                low = self._min_backlogged()
                if low is not None:
                    self.counters[t] = max(self.counters[t], self.counters[low])
            q.append(req)
        self._n += 1
        self._push(t)

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        t = self._min_backlogged(blocked)
        return None if t is None else self._queues[t][0]

    def take(self, req: Request) -> None:
        self._queues[req.tenant].popleft()          # pick returned this tenant's head
        self._n -= 1

    def discard(self, req: Request) -> None:
        self._queues[req.tenant].remove(req)
        self._n -= 1

    def num_waiting(self) -> int:
        return self._n

    # -- accounting ---------------------------------------------------------------------
    def on_admit(self, req: Request, now: float) -> None:
        if req.num_preemptions == 0:
            self.counters[req.tenant] += self.w_p * req.prompt_tokens / self._weight[req.tenant]

    def on_served(self, req: Request, prefill_tokens: int, decoded: int, now: float) -> None:
        if decoded:
            self.counters[req.tenant] += self.w_q * decoded / self._weight[req.tenant]

    def on_decoded(self, reqs: list[Request], now: float,
                   tenant_counts: dict[str, int] | None = None) -> None:
        """``on_served(req, 0, 1)`` for each, batched per tenant: O(len(reqs)), O(tenants)
        with ``tenant_counts``."""
        per_tenant = tenant_counts
        if per_tenant is None:
            per_tenant = {}
            for req in reqs:
                per_tenant[req.tenant] = per_tenant.get(req.tenant, 0) + 1
        counters = self.counters
        for t, m in per_tenant.items():
            x = self.w_q * 1 / self._weight[t]
            counters[t] = counters[t] + x if m == 1 else add_repeated(counters[t], x, m)

    def on_fast_forward(self, reqs: list[Request], start: float, step_ends: list[float],
                        step_durations: list[float], end_last: bool = True,
                        tenant_counts: dict[str, int] | None = None) -> None:
        """Each request's tenant counter gets ``w_q / w[u]`` per step, as ``on_served`` adds it:
        O(len(reqs)) (O(tenants) with ``tenant_counts``) plus ``add_repeated`` per tenant (O(1)
        for integer-valued counters)."""
        per_tenant = tenant_counts
        if per_tenant is None:
            per_tenant = {}
            for req in reqs:
                per_tenant[req.tenant] = per_tenant.get(req.tenant, 0) + 1
        k = len(step_ends)
        for t, m in per_tenant.items():
            self.counters[t] = add_repeated(self.counters[t], self.w_q * 1 / self._weight[t], m * k)


register("vtc", VtcPolicy)
