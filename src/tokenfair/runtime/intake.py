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


def make_request(row: TraceRow, seq: int, contract: Contract) -> tuple[Request, Reason | None]:
    """The request for ``row`` and a rejection reason (None when the contract admits it)."""
    klass = contract.class_for(row.tenant, row.klass)
    reject = None
    if klass is None:
        reject = Reason(ReasonCode.CLASS_NOT_ALLOWED, f"tenant {row.tenant!r} may not use class {row.klass!r}")
        klass = row.klass or contract.default_class
    spec = contract.classes.get(klass) or contract.classes[contract.default_class]
    priority = spec.priority if row.priority is None else min(spec.priority, row.priority)
    deadline = order_deadline = None
    if spec.deadline_s is not None:
        rel = spec.deadline_s if row.deadline_s is None else max(spec.deadline_s, row.deadline_s)
        deadline = order_deadline = row.arrival_s + rel
    elif row.deadline_s is not None:
        deadline = row.arrival_s + row.deadline_s
    req = Request(row.request_id, seq, row.tenant, klass, row.arrival_s, row.prompt_tokens,
                  row.max_tokens or DEFAULT_MAX_TOKENS, deadline_s=deadline,
                  order_deadline_s=order_deadline, priority=priority, aging_rate=spec.aging_rate,
                  max_wait_s=spec.max_wait_s, preemptible=spec.preemptible,
                  ttft_slo_s=spec.ttft_slo_s, tpot_slo_s=spec.tpot_slo_s)
    if reject is not None:
        req.status = Status.WAITING
    return req, reject
