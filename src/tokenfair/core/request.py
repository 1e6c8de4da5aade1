"""A request as the scheduler sees it, and its lifecycle.

The true output length is *not* a field here: only the engine knows it (the simulator's
engine holds it privately, the real engine discovers it by generating).  The scheduler
sees prompt length, ``max_tokens`` and the predictor's guess.

Lifecycle (each request ends in exactly one terminal state, with a reason)::

    WAITING -> RUNNING -> FINISHED
       |  ^       |
       |  +-- PREEMPTED (recompute: back to WAITING; swap: SWAPPED, KV on host)
       +-> REJECTED (admission) | EXPIRED (deadline infeasible / passed) | FAILED (engine)
"""

from __future__ import annotations

import enum
from collections import _count_elements     # type: ignore[attr-defined]  # C: counts into a dict

from .reasons import Reason, ReasonCode


class Status(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    EXPIRED = "expired"
    FAILED = "failed"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({Status.FINISHED, Status.REJECTED, Status.EXPIRED, Status.FAILED})


class Request:
    """Mutable scheduling state of one request.  ``seq`` is the global arrival order and the
    last element of every ordering key, so orders are total and deterministic."""

    __slots__ = (
        "request_id", "seq", "tenant", "klass", "arrival_s", "prompt_tokens", "max_tokens",
        "deadline_s", "order_deadline_s", "priority", "aging_rate", "max_wait_s", "preemptible",
        "predicted_output", "status", "end_reason", "num_computed", "num_output", "num_preemptions",
        "scheduled_s", "first_token_s", "finish_s", "last_preempt_s", "enqueued_s",
        "consecutive_prefill", "blocks", "charged", "recomputed_tokens", "swapped_bytes",
        "ttft_slo_s", "tpot_slo_s", "payload", "qtoken", "used_cost", "predicted_wait_s",
        "last_held_step", "counts_owner", "tenant_idx", "class_idx",
    )

    def __init__(self, request_id: str, seq: int, tenant: str, klass: str, arrival_s: float,
                 prompt_tokens: int, max_tokens: int, *, deadline_s: float | None = None,
                 order_deadline_s: float | None = None, priority: float = 0.0,
                 aging_rate: float = 0.0, max_wait_s: float | None = None,
                 preemptible: bool = True, ttft_slo_s: float | None = None,
                 tpot_slo_s: float | None = None, payload: object = None) -> None:
        self.request_id = request_id
        self.seq = seq
        self.tenant = tenant
        self.klass = klass
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.deadline_s = deadline_s
        self.order_deadline_s = order_deadline_s
        self.priority = priority
        self.aging_rate = aging_rate
        self.max_wait_s = max_wait_s
        self.preemptible = preemptible
        self.ttft_slo_s = ttft_slo_s
        self.tpot_slo_s = tpot_slo_s
        self.payload = payload  # engine-side data (token ids, sampling params); never read by policy
        self.predicted_output = 1
        self.status = Status.WAITING
        self.end_reason: Reason | None = None   # why it ended: set with its terminal status, never before
        self.num_computed = 0          # tokens whose KV exists (prompt + generated, minus lost)
        self.num_output = 0            # generated tokens so far
        self.num_preemptions = 0
        self.scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.last_preempt_s = float("-inf")
        self.enqueued_s = arrival_s
        self.consecutive_prefill = 0
        self.blocks = 0                # KV blocks held on the device
        self.charged = 0.0             # predicted cost charged to the tenant, corrected as it runs
        self.recomputed_tokens = 0
        self.swapped_bytes = 0
        self.predicted_wait_s: float | None = None
        self.used_cost = 0.0           # cost actually served (never counts recomputation)
        self.qtoken = 0                # bumped on every enqueue/dequeue; lazy heap entries carry it
        self.last_held_step = -2       # the scheduler step in which its decode last gave way
        # the NameCounts (core/name_counts.py) whose indices tenant_idx / class_idx are (None: none)
        self.counts_owner: object = None
        self.tenant_idx = 0
        self.class_idx = 0

    @property
    def reason(self) -> str:
        """Why it ended, as records and HTTP error bodies show it (``"code: detail"``; "" until
        it ends).  Code that decides on it reads ``reason_code``."""
        r = self.end_reason
        return "" if r is None else r.text

    @property
    def reason_code(self) -> ReasonCode | None:
        r = self.end_reason
        return None if r is None else r.code

    @property
    def num_tokens(self) -> int:
        """Tokens the KV cache must hold once every known token is computed."""
        return self.prompt_tokens + self.num_output

    @property
    def in_prefill(self) -> bool:
        # num_tokens spelled out: these two run on every scheduler step (Python 3.11 calls
        # a property through a frame)
        return self.num_output == 0 or self.prompt_tokens + self.num_output - self.num_computed > 1

    @property
    def num_uncomputed(self) -> int:
        """Tokens to feed before the next token can be sampled (1 while decoding)."""
        return self.prompt_tokens + self.num_output - self.num_computed

    @property
    def predicted_remaining(self) -> int:
        return max(1, self.predicted_output - self.num_output)

    def waited_s(self, now: float) -> float:
        return now - self.enqueued_s

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"Request({self.request_id!r}, tenant={self.tenant!r}, class={self.klass!r}, "
                f"status={self.status.value}, computed={self.num_computed}, out={self.num_output})")


def count_by_tenant_and_class(reqs: list[Request]) -> tuple[dict[str, int], dict[str, int]]:
    """Requests per tenant and per class, each dict in first-seen order: O(n), the counting in
    C (``collections._count_elements``, what ``Counter`` uses, into plain dicts)."""
    return count_names([r.tenant for r in reqs]), count_names([r.klass for r in reqs])


def count_names(names: list[str]) -> dict[str, int]:
    """How often each name occurs, in first-seen order: O(n) in C."""
    counts: dict[str, int] = {}
    # one name (one class, one tenant alone: the common cases); the last name differing
    # rules it out without a pass (performance: most multi-tenant steps)
    if names and names[-1] is names[0] and names.count(names[0]) == len(names):
        counts[names[0]] = len(names)
    else:
        _count_elements(counts, names)
    return counts
