"""Advancing runs of decode-only iterations in one event (simulation only).

A *decode run* starts when every running request is decoding, nothing waits and no arrival
is due: until the next arrival, each step decodes one token for every running request and
nothing else happens but requests finishing and KV blocks growing.  ``fast_forward`` applies
such a run segment by segment, a *segment* being the steps up to and including the next
step in which a request finishes (true length or ``max_tokens``):

  * step j's duration is the cost model's ``step_s([], ctx_j, n)`` (``StepCost.decode_run``:
    the same float operations, ``decode_s``'s), added to the clock in the same order, so times
    are identical;
  * requests advance k tokens (``sched/decode.advance_decodes``, stepping's own decode
    advance), KV blocks grow to ``max(blocks, ceil(context / block_size))``
    (``BlockPool.grow_decodes``);
    a segment stops before a step whose block growth the pool could not hold (eviction goes
    through the normal path) and before the step at which the next arrival is due;
  * the policy gets ``on_fast_forward`` (exactly what ``on_decoded`` + ``on_step_end`` per
    step would leave), the engine its busy time, the recorder ``record_run``; where neither
    the policy nor the recorder reads the steps' times (``Policy.reads_run_steps``,
    ``Recorder.reads_steps``: fifo's runs of the isolated baselines), the run is summed
    instead (``StepCost.decode_run_end``: the same float operations, no lists) and the
    recorder counts its steps (``record_steps``);
  * the finishing step retires its requests through ``IterationScheduler.retire`` (the code
    ``update_from_output`` runs) between the policy's ``on_decoded`` and ``on_step_end``, as
    stepping does; the run then goes on with the others.
The first step's ``schedule()`` asks ``policy.prefill_budget`` about the previous step's
prefills (the fair policy reads its light/level statistics there), so the run makes that
call too; in the later steps that call only sees decodes, and nothing else a decode-only
step calls on a policy reads or changes its state (``Policy.can_fast_forward``).
``tests/test_fastforward.py`` checks that every record, the whole timeline and the
scheduler's counters equal those of stepping one iteration at a time, for every policy.
Cost: O(n) per segment (n running; O(n log k) when the pool is nearly full) plus O(k) float
work for its k steps, instead of O(n) Python work per step.
"""

from __future__ import annotations

from typing import Callable, Final

from ..core.kv import BlockPool
from ..runtime.recorder import Recorder
from ..core.request import Request, Status
from ..sched.decode import advance_decodes
from ..sched.scheduler import IterationScheduler
from .engine import RowFedEngine

Counts = tuple[dict[str, int], dict[str, int]]     # running requests per tenant, per class
# more steps than any request runs (the min over a segment's requests starts here)
NO_STOP: Final = 1 << 62

def _kv_bound(running: list[Request], pool: BlockPool, k_max: int) -> int:
    """Largest k <= k_max whose growth fits in the pool's free blocks (growth is monotone in
    k, so every earlier step fits too): O(n log k_max)."""
    free = pool.num_free
    if pool.blocks_to_decode(running, k_max) <= free:
        return k_max
    lo, hi = 0, k_max
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pool.blocks_to_decode(running, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def _eligible(sched: IterationScheduler, now: float, next_arrival: float) -> bool:
    """All running decoding, nothing waiting, no arrival due, the decode budget holds them:
    O(prefills of the last step)."""
    policy = sched.policy
    running = sched.running
    hint = sched.runs.maybe_prefilling
    return bool(running and next_arrival > now and policy.can_fast_forward()
                and hint is not None and not policy.num_waiting()
                and len(running) <= sched.decode_token_budget
                and not any(r.status is Status.RUNNING and r.in_prefill for r in hint))


def fast_forward(sched: IterationScheduler, engine: RowFedEngine, recorder: Recorder, now: float,
                 next_arrival: float) -> float:
    """Apply decode-only steps until the next arrival, the pool runs short or nothing runs;
    return the new time (``now`` if no step could be applied)."""
    if not _eligible(sched, now, next_arrival):
        return now
    t = now
    first = True
    counts: Counts | None = None          # running requests per tenant / class, kept across segments
    listed = sched.policy.reads_run_steps() or recorder.reads_steps     # else summed (module docstring)
    while sched.running and next_arrival > t:
        t, steps, finished, counts = _segment(sched, engine, recorder, t, next_arrival, first, listed, counts)
        first = first and not steps
        if not finished:
            break                         # stopped by the arrival or the KV pool
    return t


def _without(counts: Counts, gone: list[Request]) -> Counts:
    """``counts`` less the requests ``gone`` (new dicts; names down to 0 dropped): O(gone)."""
    tenants, classes = dict(counts[0]), dict(counts[1])
    for r in gone:
        for d, name in ((tenants, r.tenant), (classes, r.klass)):
            if d[name] == 1:
                del d[name]
            else:
                d[name] -= 1
    return tenants, classes


def _segment(sched: IterationScheduler, engine: RowFedEngine, recorder: Recorder, now: float,
             next_arrival: float, first: bool, listed: bool,
             counts: Counts | None = None) -> tuple[float, int, bool, Counts | None]:
    """One segment: the steps up to the next finishing one (or fewer); (end time, steps
    applied, did it end with the finishing step?, the running requests per tenant / class
    after it).  ``listed``: the policy or the recorder reads the steps' times (else the
    run is summed); ``counts``: those of ``sched.running`` now (None: count them; the
    policy and the recorder read them per name, in no particular order).
    O(n) in a few passes, plus O(n log k) when the pool is nearly full."""
    running = sched.running
    pool = sched.pool
    stop_at = engine.stop_at
    n = len(running)
    gaps: list[int] = []                  # steps until each one stops
    ctx = 0
    k_fin = NO_STOP                       # min(gaps) (performance: native compares, not min())
    for r in running:
        g = stop_at[r] - r.num_output
        gaps.append(g)
        if g < k_fin:
            k_fin = g
        ctx += r.num_computed
    if k_fin < 1:
        return now, 0, False, counts
    k_max = k_fin if n * (k_fin // pool.block_size + 1) <= pool.num_free else _kv_bound(running, pool, k_fin)
    policy = sched.policy
    if listed:
        ends, durations = engine.cost.decode_run(ctx, n, now, next_arrival, k_max)   # none at/after the arrival
        k = len(ends)
    else:                                 # performance: nobody reads the steps' times
        ends = durations = []
        k, t, busy_s, last_s = engine.cost.decode_run_end(ctx, n, now, next_arrival, k_max, engine.busy_s)
    if k == 0:
        return now, 0, False, counts
    if first:                             # as the first step's schedule() does (see above)
        policy.prefill_budget(sched.step_stats, now)
    tenants, classes = counts = counts or sched.count_by_tenant_and_class(running)
    if listed:
        usage_after = _usage_after(running, pool, ends, recorder.bucket_s)
    pool.grow_decodes(running, k)         # the decode path, k steps at once (sched/decode.py)
    at_max = advance_decodes(running, k, now)
    finishing = k == k_fin
    if listed:
        t, last_s = ends[-1], durations[-1]
        policy.on_fast_forward(running, now, ends, durations, end_last=not finishing, tenant_counts=tenants)
        engine.advance(durations)
    else:
        engine.set_busy_s(busy_s)
    if finishing:
        counts = _retire(sched, engine, running, gaps, k, at_max, t, last_s, counts)
    if listed:
        recorder.record_run(tenants, classes, ends, durations, usage_after, len(sched.running))
    else:
        recorder.record_steps(k)
    sched.record_decode_run(k, n, ctx + (k - 1) * n)
    return t, k, finishing, counts


def _retire(sched: IterationScheduler, engine: RowFedEngine, running: list[Request], gaps: list[int],
            k: int, at_max: list[Request], t: float, duration_s: float, counts: Counts) -> Counts:
    """The segment's finishing step: its done and ``max_tokens`` requests end as stepping
    ends them (``retire`` between the policy's ``on_decoded`` and ``on_step_end``); the
    counts less them."""
    # only the requests stopping at this step can be done or at max_tokens (each other
    # one is short of both), so this keeps running order as filtering all of them would;
    # retire() replaces sched.running, not ``running``
    ending = [r for r, g in zip(running, gaps) if g == k]
    true_len = engine.true_lengths
    done = [r for r in ending if r.num_output >= true_len[r]]
    sched.retire([], done, at_max, t)
    sched.policy.on_step_end(t, duration_s)
    for r in done + at_max:               # as SimEngine.execute forgets what ends
        engine.forget(r)
    sched.take_ended()
    return _without(counts, [r for r in ending if r.status is not Status.RUNNING])


def _usage_after(running: list[Request], pool: BlockPool, ends: list[float],
                 bucket_s: float) -> Callable[[int], float]:
    """``usage_after(j)``: KV usage after step j of the segment about to be applied (the
    recorder asks for the last step of each bucket).  The last step reads the pool; earlier
    ones, needed only when the segment spans buckets, come from the blocks before it (O(n))."""
    if int(ends[0] // bucket_s) == int(ends[-1] // bucket_s):
        return lambda j: pool.usage
    bs, free0, num_blocks, last = pool.block_size, pool.num_free, pool.num_blocks, len(ends) - 1
    before = [(r.num_computed, r.blocks) for r in running]

    def usage_after(j: int) -> float:
        if j == last:
            return pool.usage
        free = free0
        for c, b in before:
            g = -(-(c + j + 1) // bs) - b
            if g > 0:
                free -= g
        return 1.0 - free / num_blocks
    return usage_after
