"""Scheduling the steady decodes of a step at once (the mechanics' fast path).

Most running requests are decoding, and the oldest usually come first in running order.
After a step, the only running requests that may not be decoding are those the step
prefilled, swapped in or found prefilling (``RunningSet.maybe_prefilling``); so the
leading run of surely-decoding requests is found with a few C-level index scans, and when
the token budget and the free KV blocks cover all of them no eviction can happen and their
order does not matter: they are scheduled with comprehensions instead of one by one.  The
per-request loop in ``running_pass.RunningPass.run`` takes over after them, and
takes everything when a condition fails -- the result is the same either way.  A decode
hold (``Policy.decode_hold``) is applied to them as the loop would, request by request.
"""

from __future__ import annotations

from ..core.kv import BlockPool
from ..core.request import Request, Status
from .interface import SchedulerOutput
from .policy import Budget, DecodeHold

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
                 m: int, hold: DecodeHold | None = None, step_no: int = 0) -> tuple[int, int, int, int]:
    """Schedule the ``m`` leading running requests (all decoding) at once when the budget and
    the free blocks cover them all: (how many were passed, the scheduled ones' context sum,
    how many were held, the held ones' context sum); all 0 leaves them to the per-request
    loop, untouched.  With a ``hold``, the first ones in running order that the loop would
    hold (a held tenant's, not held in step ``step_no - 1``, up to ``hold.num_to_hold``) are
    held exactly as it would.  O(m) in one pass; a request whose context fills its last
    block gets one more (``BlockPool.add_blocks``)."""
    decs = running[:m]
    held_now: list[Request] = []
    if hold is not None and hold.num_to_hold > 0:
        tenants, prev, cap = hold.tenants, step_no - 1, hold.num_to_hold
        for r in decs:
            if r.tenant in tenants and r.last_held_step != prev:
                held_now.append(r)
                if len(held_now) == cap:
                    break
        if held_now:
            skip = set(held_now)
            decs = [r for r in decs if r not in skip]
    n = len(decs)
    if n > (budget.prefill_left if budget.shared else budget.decode_left):
        return 0, 0, 0, 0
    crossing: list[Request] = []        # contexts that fill their last block
    ctx = 0
    for r in decs:
        ctx += r.num_computed
        if pool.needs_block(r):
            crossing.append(r)
    if not pool.can_add_blocks(len(crossing)):
        return 0, 0, 0, 0
    for r in held_now:
        r.last_held_step = step_no
    if held_now and hold is not None:
        hold.num_to_hold -= len(held_now)
    pool.add_blocks(crossing)
    if budget.shared:
        budget.prefill_left -= n
    else:
        budget.decode_left -= n
    out.decode.extend(decs)
    return m, ctx, len(held_now), sum([r.num_computed for r in held_now])
