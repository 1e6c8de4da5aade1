"""The mechanics' waiting side: admitting waiting requests and evicting running ones.

:class:`Admitter` is the part of :class:`~tokenfair.sched.scheduler.IterationScheduler` that
moves requests between the policy's waiting queue and the running set; it counts evictions.

* ``admit``: waiting requests in the policy's order while slots, prefill budget and KV allow
  (swapped ones are swapped back in); a candidate that does not fit blocks the queue
  (``hol_blocking``) or only its tenant for this step; one the policy gives no chunk
  (``chunk_for`` 0) blocks its tenant for this step; the policy may name an urgent victim;
* ``top_up_prefills``: prefill budget nobody else could use extends this step's chunks (the
  ones the policy puts first, ``Policy.prefill_first``, before the others);
* ``make_room`` / ``preempt``: evict the policy's victim (swap or recompute, by its choice
  and the host space) and put it back in the waiting queue.
"""

from __future__ import annotations

from ..core.request import Request, Status
from .interface import SchedulerOutput
from .policy import Budget, Policy
from .state import RunningSet


class Admitter:
    """Admission into and eviction from ``runs``, in the policy's order and by its choices.

    Invariants: a request admitted is RUNNING, in ``runs`` once and holds the KV its first
    chunk (or swap-in) needs; a request evicted leaves ``runs`` and ``out``'s work lists, is
    SWAPPED (host blocks taken) or WAITING (its KV and computed tokens dropped), and is back
    in the policy's queue; each eviction adds 1 to ``num_preemptions`` and its blocks or
    tokens to ``num_swapped_blocks`` / ``num_recomputed_tokens``.
    """

    def __init__(self, policy: Policy, runs: RunningSet, kv_bytes_per_token: float) -> None:
        self.policy = policy
        self.runs = runs
        self.kv_bytes_per_token = kv_bytes_per_token
        self.num_preemptions = 0
        self.num_recomputed_tokens = 0
        self.num_swapped_blocks = 0

    def top_up_prefills(self, out: SchedulerOutput, budget: Budget, first: list[bool] | None = None) -> None:
        """Work-conserving: prefill budget nobody else could use extends this step's chunks
        (in schedule order; the ones marked in ``first`` before the others) up to each
        request's remaining prompt."""
        pool = self.runs.pool
        if first is not None and len(first) != len(out.prefill):
            raise ValueError(f"{type(self.policy).__name__}.prefill_first returned {len(first)} flags for "
                             f"{len(out.prefill)} chunks: return one per chunk, in schedule order (or None)")
        order = range(len(out.prefill)) if first is None else \
            [i for i, f in enumerate(first) if f] + [i for i, f in enumerate(first) if not f]
        for idx in order:
            req, n = out.prefill[idx]
            if budget.prefill_left <= 0:
                return
            extra = min(req.num_uncomputed - n, budget.prefill_left)
            if extra > 0 and pool.can_grow(req, n + extra):
                pool.grow(req, n + extra)
                budget.take_prefill(extra)
                out.prefill[idx] = (req, n + extra)

    def make_room(self, req: Request, running: list[Request], i: int, out: SchedulerOutput,
                  now: float) -> bool:
        """Evict the policy's victim among the not-yet-scheduled running requests
        (``running[i:]``, or ``req`` itself) so ``req`` can grow; False when ``req`` was the
        one evicted."""
        victim = self.policy.victim_for_kv(running[i:], req, now)
        if victim is None:
            victim = req
        self.preempt(victim, out, now)
        if victim is req:
            return False
        running.remove(victim)
        return True

    def admit(self, out: SchedulerOutput, budget: Budget, max_running: int, now: float) -> None:
        """Admit waiting requests into ``runs`` (at most ``max_running`` running) while the
        budget and KV allow."""
        policy, pool, running = self.policy, self.runs.pool, self.runs.requests
        blocked: set[str] = set()
        while budget.prefill_left > 0:
            cand = policy.pick(now, blocked)
            if cand is None:
                return
            if cand.last_preempt_s == now:
                # evicted in this very step: it may not come back before the step runs
                if policy.hol_blocking:
                    return
                blocked.add(cand.tenant)
                continue
            fits_slot = len(running) < max_running
            swapped = cand.status is Status.SWAPPED
            n = 0 if swapped else min(cand.num_uncomputed, budget.prefill_left, policy.chunk_for(cand, now))
            if not swapped and n <= 0:
                blocked.add(cand.tenant)        # the policy gives it no chunk this step: it waits
                continue
            if swapped:
                fits_kv = pool.can_swap_in(cand)
            else:
                fits_kv = pool.can_add_blocks(policy.kv_blocks_to_admit(cand, n))
            if not (fits_slot and fits_kv and policy.can_admit(cand, now, len(running))):
                # an eviction makes room, so it is tried only for a candidate the policy would
                # admit with one request fewer running (not one held back for another reason)
                victim = (policy.urgent_victim(cand, running, now)
                          if not out.preempted and policy.can_admit(cand, now, len(running) - 1) else None)
                if victim is not None:
                    running.remove(victim)
                    self.preempt(victim, out, now)
                    continue
                if policy.hol_blocking or not fits_slot:
                    return
                blocked.add(cand.tenant)
                continue
            policy.take(cand)
            cand.status = Status.RUNNING
            running.append(cand)
            if cand.scheduled_s is None:
                cand.scheduled_s = now
            policy.on_admit(cand, now)
            if swapped:
                self._resume_swapped(cand, out, budget, now)
                continue
            pool.grow(cand, n)
            budget.take_prefill(n)
            cand.consecutive_prefill = 1
            out.prefill.append((cand, n))

    def _resume_swapped(self, cand: Request, out: SchedulerOutput, budget: Budget, now: float) -> None:
        """Swap an admitted ``cand`` back in and give it this step's work if it fits."""
        pool = self.runs.pool
        pool.swap_in(cand)
        out.swapped_in.append(cand)
        if cand.in_prefill:           # swapped out mid-prefill: resume its prompt
            n = min(cand.num_uncomputed, budget.prefill_left, self.policy.chunk_for(cand, now))
            if n > 0 and pool.can_grow(cand, n):
                pool.grow(cand, n)
                budget.take_prefill(n)
                out.prefill.append((cand, n))
            return
        if not budget.can_decode() or not pool.can_grow(cand, 1):
            return
        pool.grow(cand, 1)
        budget.take_decode()
        out.decode.append(cand)

    def preempt(self, req: Request, out: SchedulerOutput, now: float) -> None:
        """Evict ``req`` (already out of the running list) and queue it again."""
        pool = self.runs.pool
        mode = self.policy.preempt_mode(req)
        if mode == "swap" and not pool.can_swap_out(req):
            mode = "recompute"
        self.num_preemptions += 1
        req.num_preemptions += 1
        req.last_preempt_s = now
        req.consecutive_prefill = 0
        if mode == "swap":
            self.num_swapped_blocks += pool.swap_out(req)
            req.swapped_bytes += int(req.num_computed * self.kv_bytes_per_token)
            req.status = Status.SWAPPED
        else:
            pool.release(req)
            req.recomputed_tokens += req.num_computed
            self.num_recomputed_tokens += req.num_computed
            req.num_computed = 0
            req.status = Status.WAITING
        out.preempted.append((req, mode))
        if any(r is req for r, _ in out.prefill):
            out.prefill = [(r, n) for r, n in out.prefill if r is not req]
        if req in out.decode:
            out.decode.remove(req)
        self.policy.enqueue(req, now)
