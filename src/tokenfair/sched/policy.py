"""The policy interface: everything a scheduling policy decides, and nothing mechanical.

The mechanics (:mod:`tokenfair.sched.scheduler`) own the running list, the KV pool and the
token budgets; they ask the policy *which* waiting request is next, *whether* it may be
admitted, *whom* to evict and *how*, and tell it what was served so it can charge tenants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar

from mypy_extensions import mypyc_attr

from ..contracts.contract import Contract
from ..core.costmodel import Profile
from ..core.kv import BlockPool
from ..core.reasons import Reason
from ..core.request import Request
from .predictor import Predictor
from .snapshot import PolicySnapshot, TenantView


class Budget:
    """Per-step token budgets.  ``shared`` makes prefill and decode draw from one pool
    (vLLM's ``max_num_batched_tokens``); otherwise each has its own."""

    __slots__ = ("prefill_left", "decode_left", "shared")

    def __init__(self, prefill: int, decode: int, shared: bool) -> None:
        self.shared = shared
        self.prefill_left = prefill + decode if shared else prefill
        self.decode_left = 0 if shared else decode

    def can_decode(self) -> bool:
        return (self.prefill_left if self.shared else self.decode_left) > 0

    def take_decode(self) -> None:
        if self.shared:
            self.prefill_left -= 1
        else:
            self.decode_left -= 1

    def take_prefill(self, n: int) -> None:
        self.prefill_left -= n

    def add_prefill(self, n: int) -> None:
        self.prefill_left += n


@dataclass(slots=True)
class DecodeHold:
    """This step, ``num_to_hold`` decodes of ``tenants`` give way to prefill work: the first
    ones in running order that were not held in the previous step.  The scheduler enforces
    that no decode is held two steps in a row, so the held set rotates and a held stream
    still gets a token at least every other step."""
    tenants: frozenset[str]
    num_to_hold: int


@mypyc_attr(allow_interpreted_subclasses=True)     # policies written in plain Python plug in
class Policy:
    # what a policy is, per class (ClassVar: a subclass's value is read from its class, also
    # when the subclass is plain Python and this base is compiled)
    name: ClassVar[str] = "base"
    shared_budget: ClassVar[bool] = False   # one token budget for prefill and decode (vLLM style)
    hol_blocking: ClassVar[bool] = True     # stop admitting at the first candidate that does not fit
    admit_after_preemption: ClassVar[bool] = False  # vLLM admits nothing new in a step that preempted
    # the consecutive-prefill cap only yields a step to others: a step that carries no prefill
    # once admission is done serves the prefills the cap held (sched/scheduler.py, step 5)
    cap_yields_only_to_prefill: ClassVar[bool] = False
    # a run of decode-only steps may be applied at once (sim/fastforward.py): only for policies
    # whose decode-only steps change nothing but what on_decoded / on_step_end change, and
    # whose schedule-time calls in such a step read nothing but prefill_budget's arguments.
    # Off unless a policy opts in (and tests/test_fastforward.py shows it exact for it)
    supports_fast_forward: ClassVar[bool] = False

    def bind(self, contract: Contract, profile: Profile, pool: BlockPool, predictor: Predictor) -> None:
        self.contract = contract
        self.profile = profile
        self.pool = pool
        self.predictor = predictor

    def on_contract_change(self, contract: Contract, now: float) -> None:
        """A live contract change (serve/contract_live.py): new requests follow ``contract``;
        queued and running ones are neither moved nor ended.  A policy that derived state
        from the contract at :meth:`bind` derives it again here."""
        self.contract = contract

    def can_fast_forward(self) -> bool:
        """``supports_fast_forward``, unless this policy's configuration rules it out."""
        return self.supports_fast_forward

    def reads_run_steps(self) -> bool:
        """Whether :meth:`on_fast_forward` reads anything: False only for a policy that keeps
        this class's ``on_fast_forward`` and every hook it replays (``on_decoded``,
        ``on_served``, ``on_step_end``): then a decode run need not list its steps for it."""
        cls = type(self)
        return not (cls.on_fast_forward is Policy.on_fast_forward and cls.on_decoded is Policy.on_decoded
                    and cls.on_served is Policy.on_served and cls.on_step_end is Policy.on_step_end)

    # -- waiting queue ---------------------------------------------------------------
    def on_arrival(self, req: Request, now: float) -> Reason | None:
        """Reject reason for a new request, or None to accept it (then it is enqueued)."""
        return None

    def enqueue(self, req: Request, now: float) -> None:
        raise NotImplementedError

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        """The next waiting request to try (not removed), skipping tenants in ``blocked``."""
        raise NotImplementedError

    def take(self, req: Request) -> None:
        """Remove ``req`` (returned by :meth:`pick`) from the waiting queue."""
        raise NotImplementedError

    def discard(self, req: Request) -> None:
        """Remove a waiting request that ended without running (expired, aborted)."""
        raise NotImplementedError

    def num_waiting(self) -> int:
        raise NotImplementedError

    # -- admission -----------------------------------------------------------------------
    def can_admit(self, req: Request, now: float, num_running: int) -> bool:
        return True

    def prefill_budget(self, last_step: tuple[int, int, list[Request]], now: float) -> int:
        """This step's prefill token budget (the contract's, unless the policy shapes it).
        ``last_step``: the previous step's (decodes, their context sum, running prefills)."""
        return self.contract.engine.prefill_token_budget

    def decode_hold(self) -> DecodeHold | None:
        """Decodes that give way in the step being built (asked right after
        :meth:`prefill_budget`); default None: every running decode runs."""
        return None

    def extra_prefill_budget(self, prefills: list[tuple[Request, int]]) -> int:
        """Prefill tokens the step may carry beyond :meth:`prefill_budget`'s, now that its
        chunks (``prefills``, in schedule order) are chosen; the top-up extends those chunks
        with them.  Default 0."""
        return 0

    def defer_prefill(self, req: Request, now: float) -> bool:
        """Serve this running prefill's next chunk only after new admissions (default: no)."""
        return False

    def prefill_first(self, prefills: list[tuple[Request, int]], now: float) -> list[bool] | None:
        """Which of this step's chunks (``prefills``, in schedule order, two or more) the
        top-up extends first, asked only when budget is left for it.  Default None:
        schedule order."""
        return None

    def max_chunk(self) -> int:
        return self.contract.engine.chunk_size

    def chunk_for(self, req: Request, now: float) -> int:
        """The largest prefill chunk ``req`` may take this step (default: ``max_chunk``)."""
        return self.max_chunk()

    def kv_blocks_to_admit(self, req: Request, first_chunk: int) -> int:
        """Free blocks that must exist before ``req`` is admitted."""
        return self.pool.extra_blocks(req, first_chunk)

    # -- accounting ----------------------------------------------------------------------
    def on_admit(self, req: Request, now: float) -> None:
        pass

    def on_served(self, req: Request, prefill_tokens: int, decoded: int, now: float) -> None:
        pass

    def on_decoded(self, reqs: list[Request], now: float,
                   tenant_counts: dict[str, int] | None = None) -> None:
        """Each of ``reqs`` decoded one token this step (batched: the hot path).
        ``tenant_counts``, when given: ``reqs`` per tenant, in order of first appearance."""
        if type(self).on_served is Policy.on_served:
            return
        for req in reqs:
            self.on_served(req, 0, 1, now)

    def on_fast_forward(self, reqs: list[Request], start: float, step_ends: list[float],
                        step_durations: list[float], end_last: bool = True,
                        tenant_counts: dict[str, int] | None = None) -> None:
        """``reqs`` (all running, all decoding, in running order) decoded one token in each of
        these steps (the first began at ``start``) and nothing else happened (see
        ``sim/fastforward.py``): leave the policy exactly as ``on_decoded`` + ``on_step_end`` per
        step would.  ``end_last=False``: the last step's ``on_step_end`` is left to the caller
        (requests finish in between).  ``tenant_counts``, when given: ``reqs`` per tenant, in
        no particular order (the caller keeps them across a run's segments): use them name
        by name, or sum them only where the sum is exact in any order.  Default: replay
        step by step, O(len(reqs)) per step."""
        cls = type(self)
        if (cls.on_decoded is Policy.on_decoded and cls.on_served is Policy.on_served
                and cls.on_step_end is Policy.on_step_end):
            return                            # nothing to replay (fifo, sjf, priority)
        last = len(step_ends) - 1
        for i, (now, dt) in enumerate(zip(step_ends, step_durations)):
            self.on_decoded(reqs, now)
            if end_last or i < last:
                self.on_step_end(now, dt)

    def on_step_end(self, now: float, duration_s: float) -> None:
        pass

    def on_finish(self, req: Request, now: float) -> None:
        pass

    # -- preemption -------------------------------------------------------------------------
    def victim_for_kv(self, candidates: list[Request], needing: Request, now: float) -> Request | None:
        """A running request to evict so ``needing`` can grow; default: the newest (vLLM FCFS)."""
        return candidates[-1] if candidates else None

    def preempt_mode(self, req: Request) -> str:
        return "recompute"

    def urgent_victim(self, cand: Request, running: list[Request], now: float) -> Request | None:
        """A running request to evict so a waiting, more urgent ``cand`` can start; None: wait."""
        return None

    def next_wakeup(self, now: float) -> float:
        """Earliest time a blocked candidate may become admissible (rate limits); inf: never."""
        return float("inf")

    def expire(self, now: float) -> list[tuple[Request, Reason]]:
        """Waiting requests that can no longer meet their deadline (removed from the queue)."""
        return []

    # -- the service's seam (serve/, fleet/, integrations/: they read and change a policy
    #    only through these, never through its parts) ---------------------------------------
    def snapshot(self, now: float) -> PolicySnapshot:
        """Per-tenant state as of ``now``, read-only (``snapshot.py``); building it changes
        nothing.  Default: no tenants (a policy that keeps no per-tenant state)."""
        return PolicySnapshot(now=now)

    def tenant_view(self, name: str, now: float) -> TenantView | None:
        """One tenant of :meth:`snapshot` (O(1)); None: the policy holds no state for it."""
        return None

    def can_admit_within_limits(self, req: Request, now: float) -> bool:
        """Whether the contract's hard per-tenant limits (max_concurrency, token rate, KV
        quota; not the soft reservations) let ``req`` start now (default: no such limits)."""
        return True

    def victim_order(self, req: Request, now: float) -> tuple[int, float, float, int, int] | None:
        """Running ``req``'s place in this policy's eviction order: the smallest is evicted
        first; the first element is 1 for a request the contract protects from preemption.
        None (default): no order of its own (the newest is evicted first)."""
        return None

    def observe_step_time(self, step_s: float) -> None:
        """The time per decode step measured outside the policy (a gateway's backends' time
        per output token) replaces the policy's own estimate (default: it keeps none)."""


def end_each_waiting(policy: Policy, now: float, end: Callable[[Request], None]) -> None:
    """Take every waiting request out of ``policy`` in its pick order (no tenant blocked) and
    hand each to ``end`` before the next pick (ending one may change the order of the rest)."""
    while True:
        req = policy.pick(now, set())
        if req is None:
            return
        policy.take(req)
        end(req)
