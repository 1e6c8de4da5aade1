"""Scheduling the steady decodes of a step at once (the mechanics' fast path).

Most running requests are decoding, and the oldest usually come first in running order.
After a step, the only running requests that may not be decoding are those the step
prefilled, swapped in or found prefilling (``IterationScheduler.maybe_prefilling``); so the
leading run of surely-decoding requests is found with a few C-level index scans, and when
the token budget and the free KV blocks cover all of them no eviction can happen and their
order does not matter: they are scheduled with comprehensions instead of one by one.  The
per-request loop in ``IterationScheduler._schedule_running`` takes over after them, and
takes everything when a condition fails -- the result is the same either way.
"""

from __future__ import annotations

from operator import attrgetter

from ..kv import BlockPool
from ..request import Request, Status
from .interface import SchedulerOutput
from .policy import Budget

_num_computed = attrgetter("num_computed")


def leading_decodes(running: list[Request], hint: list[Request] | None) -> int:
    """How many running requests, from the oldest, are surely decoding, given the last
    step's ``hint`` (None: unknown, 0).  O(prefills x running) C-level index scans."""
    if hint is None:
        return 0
    m = len(running)
    for r in hint:
        if r.status is Status.RUNNING and r.in_prefill:
            try:
                m = min(m, running.index(r))
            except ValueError:                # not where the hint expects it: no fast path
                return 0
    return m


def bulk_decodes(running: list[Request], pool: BlockPool, out: SchedulerOutput, budget: Budget,
                 m: int) -> tuple[int, int]:
    """Schedule the ``m`` leading running requests (all decoding) at once when the budget and
    the free blocks cover them all: (how many were scheduled, their context sum); (0, 0)
    leaves them to the per-request loop.  O(m) in comprehensions; a request whose context
    fills its last block gets one more (``pool.held`` kept)."""
    if m > (budget.prefill_left if budget.shared else budget.decode_left):
        return 0, 0
    decs = running[:m]
    bs = pool.block_size
    crossing = [r for r in decs if r.num_computed >= r.blocks * bs]
    if len(crossing) > pool.num_free:
        return 0, 0
    held = pool.held
    for r in crossing:
        r.blocks += 1
        held[r.tenant] += 1
    pool.num_free -= len(crossing)
    if budget.shared:
        budget.prefill_left -= m
    else:
        budget.decode_left -= m
    out.decode.extend(decs)
    return m, sum(map(_num_computed, decs))
