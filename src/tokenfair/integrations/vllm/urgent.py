"""Urgent preemption inside vLLM: a waiting request the policy finds urgent evicts a running one.

vLLM preempts only when a running request's KV cannot grow.  tokenfair's scheduler also
evicts for a *waiting* request that cannot start and that the policy calls urgent
(``Policy.urgent_victim``: overdue past its class's ``max_wait_s``, a guaranteed tenant
below its ``min_share``, or an owner reclaiming its lent reservation, with
``borrowing.reclaim: preempt``), when the eviction is worth its recovery cost and the
preemption cool-down has passed.  Before each step, :func:`preempt_for_urgent` asks the
policy the same question about the head of its queue and, on a victim, evicts it with vLLM's
own ``Scheduler._preempt_request`` (recompute: its blocks freed, its request back in the
waiting queue, where ``PolicyQueue.prepend_request`` hands it to the policy again), so the
urgent request can start in this step.  At most one eviction per step, as in
``sched.admit.Admitter``; the cool-down bounds the rate.
"""

from __future__ import annotations

import time

from ...core.request import Request
from .bridge import PolicyBridge


def blocked_head(bridge: PolicyBridge, num_running: int, max_running: int, now: float) -> Request | None:
    """The policy's next request when it cannot start now (no free slot, its tenant's
    limits, or KV for its first chunk); None when the queue is empty or it can start."""
    cand = bridge.policy.pick(now, set())
    if cand is None:
        return None
    fits = num_running < max_running and bridge.can_start(cand, num_running, now)
    return None if fits else cand


def preempt_for_urgent(sched, now: float) -> bool:
    """Evict the policy's urgent victim for a blocked head, if any; True when one was evicted.
    ``sched``: the vLLM scheduler (``running``, ``max_num_running_reqs``, ``_preempt_request``)
    with the bridge as ``sched.tokenfair``."""
    bridge: PolicyBridge = sched.tokenfair
    running = sched.running
    cand = blocked_head(bridge, len(running), int(sched.max_num_running_reqs), now)
    if cand is None:
        return False
    victim = bridge.policy.urgent_victim(cand, bridge.policy_running(running), now)
    vreq = victim.payload if victim is not None else None
    if vreq is None or vreq not in running:
        return False
    running.remove(vreq)
    sched._preempt_request(vreq, time.monotonic())      # vLLM's own path (compat checks it exists)
    bridge.counts["urgent_preempted"] += 1
    return True
