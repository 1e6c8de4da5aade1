"""From a trace row to a scheduled :class:`Request`, applying the contract.

Priorities and deadlines come from the contract's class, never from the request alone: a row
may ask for a *lower* priority (``min(class priority, row priority)``) and a *later*
deadline.  A row deadline where the class has none is honoured for expiry (the client does
not want an answer after it) but gives no ordering advantage.
"""

from __future__ import annotations

from ..contracts.contract import Contract
from ..core.reasons import Reason, ReasonCode
from ..core.request import Request, Status
from ..workloads.workload import TraceRow

DEFAULT_MAX_TOKENS = 32_768


def generated_tokens(row: TraceRow) -> int:
    """The output tokens an engine generates for ``row``: its true length, stopped at its
    ``max_tokens`` (``DEFAULT_MAX_TOKENS`` when it names none)."""
    return min(row.output_tokens, row.max_tokens or DEFAULT_MAX_TOKENS)


class ClassTerms:
    """What a request of one (tenant, requested class) pair takes from the contract: its
    class, whether the tenant may use it (``allowed``; if not, the request is rejected, and
    ``klass`` is the one it asked for or the default), the class's spec fields.
    Invariant: equal to reading them from the contract it was made from (frozen)."""

    __slots__ = ("klass", "allowed", "priority", "deadline_s", "aging_rate", "max_wait_s",
                 "preemptible", "ttft_slo_s", "tpot_slo_s")

    def __init__(self, contract: Contract, tenant: str, requested: str | None) -> None:
        klass = contract.class_for(tenant, requested)
        self.allowed = klass is not None
        if klass is None:
            klass = requested or contract.default_class
        self.klass = klass
        spec = contract.classes.get(klass) or contract.classes[contract.default_class]
        self.priority: float = spec.priority
        self.deadline_s: float | None = spec.deadline_s
        self.aging_rate: float = spec.aging_rate
        self.max_wait_s: float | None = spec.max_wait_s
        self.preemptible: bool = spec.preemptible
        self.ttft_slo_s: float | None = spec.ttft_slo_s
        self.tpot_slo_s: float | None = spec.tpot_slo_s


class Intake:
    """:func:`make_request` for one contract, its class terms read once per (tenant,
    requested class) pair (performance: a contract field read costs a pydantic attribute
    lookup, about ten per request otherwise)."""

    def __init__(self, contract: Contract) -> None:
        self.contract = contract
        self.terms: dict[tuple[str, str | None], ClassTerms] = {}

    def make(self, row: TraceRow, seq: int) -> tuple[Request, Reason | None]:
        """The request for ``row`` and a rejection reason (None when the contract admits it)."""
        key = (row.tenant, row.klass)
        terms = self.terms.get(key)
        if terms is None:
            terms = self.terms[key] = ClassTerms(self.contract, row.tenant, row.klass)
        reject = None
        if not terms.allowed:
            reject = Reason(ReasonCode.CLASS_NOT_ALLOWED, f"tenant {row.tenant!r} may not use class {row.klass!r}")
        priority = terms.priority if row.priority is None else min(terms.priority, row.priority)
        deadline = order_deadline = None
        if terms.deadline_s is not None:
            rel = terms.deadline_s if row.deadline_s is None else max(terms.deadline_s, row.deadline_s)
            deadline = order_deadline = row.arrival_s + rel
        elif row.deadline_s is not None:
            deadline = row.arrival_s + row.deadline_s
        req = Request(row.request_id, seq, row.tenant, terms.klass, row.arrival_s, row.prompt_tokens,
                      row.max_tokens or DEFAULT_MAX_TOKENS, deadline_s=deadline,
                      order_deadline_s=order_deadline, priority=priority, aging_rate=terms.aging_rate,
                      max_wait_s=terms.max_wait_s, preemptible=terms.preemptible,
                      ttft_slo_s=terms.ttft_slo_s, tpot_slo_s=terms.tpot_slo_s)
        if reject is not None:
            req.status = Status.WAITING
        return req, reject


def make_request(row: TraceRow, seq: int, contract: Contract) -> tuple[Request, Reason | None]:
    """The request for ``row`` and a rejection reason (None when the contract admits it)."""
    return Intake(contract).make(row, seq)
