"""One simulated engine replica of a fleet: its scheduler, engine, recorder and prefix cache,
advanced one *turn* at a time by the fleet's event loop (``sim/fleet.py``).

A turn is exactly one pass of ``loop.run``'s body after the arrivals are handed over: a
fast-forwarded decode run up to ``horizon_s``, or one scheduled step, or, when the step is
empty, going idle until the policy's wake-up (or until a request is routed here).  With one
replica and the next arrival as the horizon, a fleet run makes the same calls with the same
arguments in the same order as ``loop.run`` (fingerprints: ``scripts/fingerprints.py --fleet``).

State: ``now_s`` -- the replica's clock (end of its last step, or when it went idle);
``wake_s`` -- when its next turn is due (``now_s`` while it has work to step, the policy's
wake-up when blocked, ``inf`` when it waits for a request).
"""

from __future__ import annotations

import math
from typing import Sequence

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..runtime.recorder import Recorder
from ..core.reasons import NEVER_ADMITTED, Reason, ReasonCode
from ..core.request import Request
from ..sched.registry import make_policy
from ..sched.scheduler import IterationScheduler
from ..workloads.workload import TraceRow
from .engine import RowFedEngine, SimEngine
from .fastforward import fast_forward
from .prefix_cache import PrefixCache


class Replica:
    def __init__(self, index: int, policy: str, contract: Contract, profile: Profile,
                 cache: PrefixCache | None, fast: bool = True) -> None:
        self.index = index
        self.sched = IterationScheduler(make_policy(policy), contract, profile)
        self.engine = SimEngine(profile)
        self.fed = RowFedEngine(self.engine)
        self.recorder = Recorder(contract.costs)
        self.cache = cache
        self.fast = fast
        self.capacity_tokens = self.sched.pool.num_blocks * self.sched.pool.block_size
        self.now_s = 0.0
        self.wake_s = math.inf
        self.num_routed = 0             # requests that landed here
        self.num_pending = 0            # released to it by the gateway, not yet ended

    # -- what a router reads ----------------------------------------------------------------
    def load(self) -> int:
        return len(self.sched.running) + self.sched.policy.num_waiting()

    def kv_usage(self) -> float:
        return self.sched.pool.usage

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        return self.cache.peek(hashes) if self.cache is not None else 0

    # -- intake ------------------------------------------------------------------------------
    def accept(self, req: Request, row: TraceRow, t: float) -> None:
        """A request lands here at ``t`` (its arrival, or its release by the gateway): what
        ``loop.run`` does for an arrival, plus the prefix-cache lookup."""
        self.num_routed += 1
        if row.prompt_tokens + 1 > self.capacity_tokens:
            self.sched.reject(req, Reason(ReasonCode.PROMPT_EXCEEDS_KV_CAPACITY,
                                          f"{row.prompt_tokens} tokens > {self.capacity_tokens}"), t)
        else:
            self.fed.add(req, row)
            if self.cache is not None and row.prefix_hashes:
                cached = self.cache.lookup_and_insert(row.prefix_hashes, row.prompt_tokens)
                if cached:
                    self.engine.cached_tokens[req] = cached
            self.sched.add_request(req, t)
        self.wake_s = min(self.wake_s, max(self.now_s, t))

    # -- one turn ------------------------------------------------------------------------------
    def turn(self, horizon_s: float, more_coming: bool) -> None:
        """Advance from ``wake_s``: ``horizon_s`` is the earliest time a new request could land
        here (a decode run stops before it); ``more_coming``: can any request still land?"""
        sched = self.sched
        now = self.wake_s
        if not sched.has_work():
            self.now_s, self.wake_s = now, math.inf
            return
        if self.fast:
            later = fast_forward(sched, self.fed, self.recorder, now, horizon_s)
            if later != now:
                self.now_s = self.wake_s = later
                return
        out = sched.schedule(now)
        if out.is_empty and not out.preempted:
            if sched.running:
                raise RuntimeError(f"scheduler produced an empty step with {len(sched.running)} running requests")
            wake = sched.policy_wakeup(now)
            if wake == math.inf and not more_coming:
                sched.fail_waiting(NEVER_ADMITTED, now)
                self.now_s = self.wake_s = now
                return
            self.now_s, self.wake_s = now, max(now, wake)
            return
        result = self.fed.execute(out)
        now = now + result.duration_s
        sched.update_from_output(out, result, now)
        self.recorder.record_step(out, now, result.duration_s, sched.policy.num_waiting(),
                                  len(sched.running), sched.pool.usage)
        for req in out.aborted:
            self.fed.forget(req)
        self.now_s = self.wake_s = now
