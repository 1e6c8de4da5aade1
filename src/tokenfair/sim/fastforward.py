"""Advancing a run of identical decode iterations in one event.

When every running request is decoding, nothing waits, no arrival falls inside the run, no
request finishes or reaches ``max_tokens`` before its last step and the KV pool can hold
the growth, the next ``k`` steps are all the same shape: each running request decodes one
token.  ``fast_forward`` applies them at once:

  * step j's duration is the cost model's ``step_s([], ctx_0 + j * n, n)`` -- the same call
    the per-step path makes, added to the clock in the same order, so times are identical;
  * requests advance ``k`` tokens, KV blocks grow to ``ceil(context / block_size)``;
  * the policy gets ``on_fast_forward`` (its per-step statistics in aggregate), the engine
    its busy time, the recorder one ``record_run``.
Policies opt in (``Policy.supports_fast_forward``); ``fair`` does not yet, because its
light/level statistics are refreshed lazily and would be read at different moments.
The run stops one step *before* the first finish, so the finishing step always goes
through the normal path.  ``tests/test_fastforward.py`` checks that every request's record
equals the one from stepping one iteration at a time.
Cost: O(n) per run plus O(k) float work, instead of O(n * k) Python work.
"""

from __future__ import annotations

MIN_RUN = 2


def _kv_bound(running, free: int, bs: int, k_max: int) -> int:
    """Largest k <= k_max such that growing every request by k tokens fits in ``free`` blocks."""
    def need(k: int) -> int:
        total = 0
        for r in running:
            total += -(-(r.num_computed + k) // bs) - r.blocks
        return total
    if need(k_max) <= free:
        return k_max
    lo, hi = 0, k_max
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if need(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def fast_forward(sched, engine, recorder, now: float, next_arrival: float) -> float:
    """Apply as many identical decode steps as allowed; return the new time (``now`` if none)."""
    running = sched.running
    n = len(running)
    policy = sched.policy
    if (n == 0 or not policy.supports_fast_forward or policy.num_waiting()
            or n > sched.contract.engine.decode_token_budget
            or next_arrival <= now):
        return now
    true_len = engine.true_lengths
    k_max = 1 << 60
    ctx = 0
    for r in running:                     # one pass: all decoding? first finish? context sum
        out = r.num_output
        if out == 0 or r.prompt_tokens + out - r.num_computed != 1:
            return now
        left = min(true_len[id(r)], r.max_tokens) - out
        if left < k_max:
            k_max = left
            if k_max <= MIN_RUN:
                return now
        ctx += r.num_computed
    k_max -= 1
    k_max = _kv_bound(running, sched.pool.num_free, sched.pool.block_size, k_max)
    if k_max < MIN_RUN:
        return now
    step_s = engine.profile.step_s
    ends: list[float] = []
    durations: list[float] = []
    t = now
    for j in range(k_max):
        if next_arrival <= t:
            break
        dt = step_s([], ctx + j * n, n)
        t += dt
        ends.append(t)
        durations.append(dt)
    k = len(ends)
    if k < MIN_RUN:
        return now
    pool = sched.pool
    bs = pool.block_size
    for r in running:
        r.num_computed += k
        r.num_output += k
        grown = -(-r.num_computed // bs) - r.blocks
        pool.num_free -= grown
        r.blocks += grown
    policy.on_fast_forward(running, ends, durations)
    engine.advance(durations)
    recorder.record_run(running, ends, durations, pool.usage)
    sched.step_stats = (n, ctx + (k - 1) * n, [])
    return t
