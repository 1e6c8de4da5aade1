"""Baseline policies from today's serving systems: ``sjf``, ``priority`` and ``vtc``
(:mod:`tokenfair.sched.baselines.vtc`).

Each reproduces a published scheduler on tokenfair's shared mechanics
(:mod:`tokenfair.sched.scheduler`); the facts they follow are in
docs/SOURCES.md.  All three use the same vLLM-style mechanics as ``fifo`` so that
a comparison isolates the *ordering* decision:

* one shared token budget per step (``shared_budget = True``: the contract's
  ``prefill_token_budget + decode_token_budget`` acts as ``max_num_batched_tokens``), prefill
  chunks capped only by that budget;
* head-of-line blocking (``hol_blocking = True``): admission stops at the first candidate that
  does not fit (slot, KV blocks);
* nothing new is admitted in a step that preempted;
* KV shortage preempts by recompute; nothing else ever preempts (``urgent_victim`` is None).

Waiting queues are lazy: a heap entry carries the request's ``qtoken`` at push time and is
dropped when it no longer matches (the request was taken, discarded or re-queued).  Because
the scheduler only ever calls :meth:`take` on the request :meth:`pick` just returned, and
``hol_blocking`` means ``blocked`` is always empty for these policies, a pick is a peek at
the top after popping stale entries.
"""

from __future__ import annotations

import heapq
from typing import Any

from ...core.request import Request, Status
from ..policy import Policy
from ..registry import register


class VllmMechanics(Policy):
    """vLLM V1 mechanics shared by the baselines (see module docstring)."""

    shared_budget = True
    hol_blocking = True
    admit_after_preemption = False
    supports_fast_forward = True       # exact for sjf, priority and vtc (tests/test_fastforward.py)

    def max_chunk(self) -> int:
        e = self.contract.engine
        return e.prefill_token_budget + e.decode_token_budget


class _LazyHeapPolicy(VllmMechanics):
    """A waiting queue that is one heap of ``(key..., seq, qtoken, request)``.

    Complexity (n = entries in the heap, stale ones included; stale entries are at most one
    per enqueue, so every bound below is amortised over the enqueues):
    enqueue O(log n); pick amortised O(log n) (pops stale tops); take O(1) (invalidates,
    the entry is popped by the next pick); discard O(1) (lazy); num_waiting O(1).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[Any, ...]] = []   # (*key, seq, qtoken, request)
        self._n = 0

    def _key(self, req: Request) -> tuple[float, ...]:
        raise NotImplementedError

    def enqueue(self, req: Request, now: float) -> None:
        req.qtoken += 1
        heapq.heappush(self._heap, (*self._key(req), req.seq, req.qtoken, req))
        self._n += 1

    def _top(self) -> Request | None:
        heap = self._heap
        while heap:
            entry = heap[0]
            req: Request = entry[-1]
            if entry[-2] == req.qtoken and req.status in (Status.WAITING, Status.SWAPPED):
                return req
            heapq.heappop(heap)
        return None

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        # ``blocked`` stays empty with hol_blocking; these baselines never skip a tenant.
        return self._top()

    def take(self, req: Request) -> None:
        req.qtoken += 1          # O(1): the heap entry turns stale
        self._n -= 1

    def discard(self, req: Request) -> None:
        req.qtoken += 1          # O(1), lazy
        self._n -= 1

    def num_waiting(self) -> int:
        return self._n


class SjfPolicy(_LazyHeapPolicy):
    """``sjf``: shortest predicted job first, no aging (the classic SJF baseline; SGLang's and
    LMDeploy's "short first" turns without their aging credit).

    Key: the request's predicted cost in the contract's cost-weighted tokens,
    ``costs.prefill_token * prompt_tokens + costs.decode_token * predicted_output``, where
    ``predicted_output`` is the scheduler's predictor guess (capped by ``max_tokens``) set
    before the request is queued -- never its true length.  Ties go by arrival (``seq``).
    The key is fixed at arrival: a request preempted by KV shortage re-enters the heap with
    its original key (it is the same job).  Long jobs may starve while short ones keep
    arriving: that is SJF's defining weakness, kept on purpose.
    """

    name = "sjf"

    def _key(self, req: Request) -> tuple[float, ...]:
        c = self.contract.costs
        return (c.prefill_token * req.prompt_tokens + c.decode_token * req.predicted_output,)


class PriorityPolicy(_LazyHeapPolicy):
    """``priority``: vLLM V1's ``--scheduling-policy priority``.

    vLLM orders its waiting heap by ``(priority, arrival_time, request_id)`` where a *lower*
    value is more urgent; in tokenfair a *higher* ``req.priority`` (the contract class's
    priority, possibly lowered by the row) is more urgent, so the key is ``(-priority, seq)``:
    strict class priority, FIFO (arrival order) inside a priority level, no aging.  A waiting
    urgent request never preempts a running one (vLLM does not; vllm#40004).

    KV shortage: vLLM preempts ``max(running, key=(priority, arrival))`` -- the least urgent,
    newest running request, which may be the request that needs the block itself.  Here:
    the candidate (or ``needing``) with the lowest ``priority``, newest ``seq`` on ties.
    Recompute only.
    """

    name = "priority"

    def _key(self, req: Request) -> tuple[float, ...]:
        return (-req.priority,)

    def victim_for_kv(self, candidates: list[Request], needing: Request, now: float) -> Request | None:
        # O(len(candidates)): vLLM's max over the running list.
        return min([*candidates, needing], key=lambda r: (r.priority, -r.seq))


register("sjf", SjfPolicy)
register("priority", PriorityPolicy)
