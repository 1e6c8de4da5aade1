"""Layer 4 (policy half): whom to evict, how, and whether it is worth it.

Victim order (first = evicted first), among preemptible requests that have been preempted
fewer than ``max_per_request`` times and not within ``cooldown_s``:
    (effective priority ascending, tenant over-service S_i - V descending,
     recovery cost ascending, newest first)
Mode: recompute costs one prefill of the computed tokens (cost model); swap costs moving
the KV out and back (2 x bytes / swap bandwidth); ``auto`` takes the cheaper.
An *urgent* eviction (for a waiting request, not for KV growth) happens only when the
waiting request is overdue (past its class's max wait) or its tenant is below its
guaranteed share, at most once per ``cooldown_s``, and only when the expected wait it saves
exceeds ``min_benefit_ratio`` x the victim's recovery cost.
"""

from __future__ import annotations

from typing import Callable

from ...contracts.contract import Contract
from ...core.costmodel import Profile
from ...core.request import Request


class PreemptionPolicy:
    def __init__(self, contract: Contract, profile: Profile) -> None:
        self.spec = contract.preemption
        self.profile = profile
        self.last_urgent_s = float("-inf")

    def eligible(self, r: Request, now: float) -> bool:
        return (r.preemptible and r.num_preemptions < self.spec.max_per_request
                and now - r.last_preempt_s >= self.spec.cooldown_s)

    def recompute_s(self, r: Request) -> float:
        return self.profile.step_s([(r.num_computed, 0)], 0, 0) if r.num_computed else 0.0

    def swap_s(self, r: Request) -> float:
        return 2 * self.profile.swap_s(r.num_computed)

    def recovery_s(self, r: Request) -> float:
        mode = self.mode(r)
        return self.swap_s(r) if mode == "swap" else self.recompute_s(r)

    def mode(self, r: Request) -> str:
        if self.spec.mode != "auto":
            return self.spec.mode
        return "swap" if self.swap_s(r) < self.recompute_s(r) else "recompute"

    def key(self, r: Request, now: float, over: float) -> tuple[float, float, int, int]:
        return (r.priority + r.aging_rate * (now - r.enqueued_s), -over, r.num_computed, -r.seq)

    def choose(self, cands: list[Request], now: float,
               overshare: Callable[[Request], float]) -> Request | None:
        best: Request | None = None
        best_key: tuple[float, float, int, int] | None = None
        for r in cands:
            if not self.eligible(r, now):
                continue
            k = self.key(r, now, overshare(r))
            if best_key is None or k < best_key:
                best, best_key = r, k
        return best

    def worth_it(self, victim: Request, expected_wait_s: float) -> bool:
        return expected_wait_s >= self.spec.min_benefit_ratio * max(1e-6, self.recovery_s(victim))

    def cooled_down(self, now: float) -> bool:
        return now - self.last_urgent_s >= self.spec.cooldown_s
