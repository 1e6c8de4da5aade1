r"""Layer 2: weighted fair queueing across tenants, in token cost, by virtual time.

Symbols (fields):
  w_i   tenant weight                          (TenantState.weight)
  S_i   normalised service of tenant i          (TenantState.vtime)
  B(t)  tenants with waiting requests           (num_waiting > 0)
  V     system virtual time = min_{i in B} S_i, kept monotone (self.vnow)
  C     carry-over credit in cost units         (self.credit = prefill_token_budget * w_prefill)
  c(r)  cost of request r = w_p * prompt + w_d * output (+ w_kv * KV block-seconds)

Rules:
  admit:    pick i = argmin_{i in B} F_i, the virtual finish of its head request h_i,
            F_i = S_i + c_pred(h_i) / w_i (WFQ finish tags, as EEVDF's virtual deadline: a
            small request of a tenant that is owed service goes before a large one); ties by
            the tenant's sequence number (first seen first), so heap maintenance never changes
            an order; on admission S_i += c_pred(r) / w_i with c_pred from
            the predicted output length;
  correct:  as r runs, when its actual cost exceeds what was charged, S_i += excess / w_i;
            when r ends, the unused prediction is refunded: S_i -= (charged - used) / w_i;
  return:   a tenant entering B gets S_i = max(S_i, V - C / w_i): it keeps a lead of at most
            C over the others (no banking of unlimited credit while idle) and keeps any
            debt it had (it does not lose its place, nor escape its over-service);
  floor:    refunds never take S_i below V - C / w_i.

Invariant and bound.  For any two tenants i, j continuously in B over an interval,
        | S_i - S_j |  <=  D := max_r c_max(r) / w_min + C / w_min,
where c_max(r) = w_p * prompt + w_d * max_tokens bounds any single charge or correction.
Hence the service W_i received over the interval satisfies
        | W_i / w_i - W_j / w_j |  <=  2 D,
so each backlogged tenant's long-run share tends to w_i / sum_{j in B} w_j (subject to
min shares, which the policy serves first while a guaranteed tenant is below its share).
``check_bound`` asserts it in tests.

V is tracked as the largest S_i of a tenant picked so far (monotone; equal to the textbook
min over B whenever the picked tenant has the least S).

Complexity: pick is O(log T) amortised (lazy heap, stale entries dropped on pop, the heap is
rebuilt when it holds more than 4x the backlogged tenants); charge/refund/lift O(log T).
"""

from __future__ import annotations

import heapq
from typing import Callable

from .tenant import TenantState


class VirtualTimeWFQ:
    def __init__(self, credit: float) -> None:
        self.credit = credit
        self.vnow = 0.0
        self._heap: list[tuple[float, int, int, TenantState]] = []
        self.num_backlogged = 0
        self.backlogged_weight = 0.0

    def _entry(self, t: TenantState) -> tuple[float, int, int, TenantState]:
        t.stamp += 1
        return (t.vtime + t.head_cost / t.weight, t.seq, t.stamp, t)

    def _push(self, t: TenantState) -> None:
        heapq.heappush(self._heap, self._entry(t))
        if len(self._heap) > 4 * self.num_backlogged + 64:
            live = {id(e[3]): e[3] for e in self._heap if e[3].num_waiting > 0}
            self._heap = [self._entry(t) for t in live.values()]
            heapq.heapify(self._heap)

    def update(self, t: TenantState) -> None:
        """Its head or S_i changed: re-key it (stale entries are skipped on pop)."""
        if t.num_waiting:
            self._push(t)

    def reweigh(self, t: TenantState, weight_change: float) -> None:
        """``t.weight`` changed by ``weight_change`` (a live contract change): the backlogged
        weight follows and a backlogged ``t`` is re-keyed."""
        if t.num_waiting:
            self.backlogged_weight += weight_change
            self._push(t)

    def on_backlogged(self, t: TenantState) -> None:
        """Tenant ``t`` just got its first waiting request."""
        self.num_backlogged += 1
        self.backlogged_weight += t.weight
        t.vtime = max(t.vtime, self.vnow - self.credit / t.weight)
        self._push(t)

    def on_idle(self, t: TenantState) -> None:
        self.num_backlogged -= 1
        self.backlogged_weight = max(0.0, self.backlogged_weight - t.weight)

    def within_share(self, t: TenantState) -> bool:
        """``S_i <= V + C / w_i``: ``t`` is not ahead of the others by more than the
        carry-over credit (forced service and urgent eviction are for such a tenant)."""
        return t.vtime <= self.vnow + self.credit / t.weight

    def within_lead(self, t: TenantState, credits: float) -> bool:
        """``F_i <= V + credits * C / w_i``: ``t``'s finish tag (its head included) is within
        ``credits`` carry-over credits of V (forced service of a starving tenant,
        ``guarantee.py``)."""
        return self.tag(t) <= self.vnow + credits * self.credit / t.weight

    def charge(self, t: TenantState, cost: float) -> None:
        t.vtime += cost / t.weight
        if t.num_waiting:
            self._push(t)

    def refund(self, t: TenantState, cost: float) -> None:
        t.vtime = max(t.vtime - cost / t.weight, min(t.vtime, self.vnow - self.credit / t.weight))
        if t.num_waiting:
            self._push(t)

    def pick(self, blocked: set[str], prefer: Callable[[TenantState], bool] | None = None, look: int = 4,
             among: Callable[[TenantState], tuple[float, int]] | None = None) -> TenantState | None:
        """Least finish tag among backlogged tenants not in ``blocked``; with ``prefer``, the
        first of the ``look`` least that satisfies it, if any -- or, with ``among`` (a key),
        the one of those preferred tenants with the least ``among(t)`` (O(look log T)).  A
        preferred tenant j counts only while its start tag S_j <= F_min + C / w_j: it may
        run at most one request (and the credit) ahead of the least finish tag
        (``guarantee.py``)."""
        if prefer is None:
            return self._pick(blocked)
        if among is not None:
            return self._pick_among(blocked, prefer, look, among)
        found = self._least(blocked, look)
        if not found:
            return None
        least = self.tag(found[0])
        for t in found:
            if prefer(t) and t.vtime <= least + self.credit / t.weight:
                return t
        return found[0]

    def tag(self, t: TenantState) -> float:
        """Its finish tag F_i = S_i + c_pred(h_i) / w_i."""
        return t.vtime + t.head_cost / t.weight

    def _pick_among(self, blocked: set[str], prefer: Callable[[TenantState], bool], look: int,
                    among: Callable[[TenantState], tuple[float, int]]) -> TenantState | None:
        """``pick`` with ``among``: of the ``look`` least backlogged tenants not in
        ``blocked``, the preferred one with the least ``among``, else the least.
        O(look log T) heap operations."""
        found = self._least(blocked, look)
        if not found:
            return None
        bound = self.tag(found[0])
        liked = [t for t in found if prefer(t) and t.vtime <= bound + self.credit / t.weight]
        return min(liked, key=among) if liked else found[0]

    def _pick(self, blocked: set[str]) -> TenantState | None:
        found = self._least(blocked, 1)
        return found[0] if found else None

    def _least(self, blocked: set[str], count: int) -> list[TenantState]:
        """The ``count`` backlogged tenants with the least finish tags not in ``blocked``, in
        tag order.  Stale heap entries met on the way are dropped; the live ones popped to
        look past them are pushed back (the last one found is never popped).  V moves to
        the first live entry's tag (monotone).  O((stale + blocked + count) log T)."""
        heap = self._heap
        popped: list[tuple[float, int, int, TenantState]] = []
        found: list[TenantState] = []
        while heap:
            _, _, stamp, t = heap[0]
            if t.num_waiting == 0 or stamp != t.stamp:
                heapq.heappop(heap)        # stale entry
                continue
            if not popped and t.vtime > self.vnow:
                self.vnow = t.vtime        # V, monotone
            if t.name not in blocked:
                found.append(t)
                if len(found) == count:
                    break
            popped.append(heapq.heappop(heap))
        for e in popped:
            heapq.heappush(heap, e)
        return found

    def check_bound(self, tenants: list[TenantState], bound: float) -> None:
        live = [t.vtime for t in tenants if t.num_waiting > 0]
        if len(live) >= 2:
            assert max(live) - min(live) <= bound + 1e-6, (max(live) - min(live), bound)
