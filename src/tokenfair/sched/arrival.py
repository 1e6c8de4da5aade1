"""A request's arrival at a policy: the one admission code path of every front door.

The simulator's scheduler (``Scheduler.add_request``, which ``serve``'s engine backend
calls too), ``tokenfair gateway`` (``serve/gateway.py``), the fleet simulator's gateway
(``sim/fleet_gate.py``) and the vLLM bridge all let a request in through :func:`arrive`,
after the contract's own intake (``runtime/intake.make_request``: ``class_not_allowed``)
and, in the HTTP service, the door (``Service.door_check``: ``rate_limited``).
"""

from __future__ import annotations

from ..core.reasons import Reason
from ..core.request import Request, Status
from .policy import Policy
from .predictor import Predictor


def arrive(policy: Policy, predictor: Predictor, req: Request, now: float) -> Reason | None:
    """Predict ``req``'s output, ask ``policy`` (``on_arrival``: the tenant's bounded queue,
    the predicted wait against its class's max wait) and, accepted, enqueue it (WAITING).
    Returns the rejection reason (the caller ends ``req`` REJECTED with it), or None."""
    req.predicted_output = predictor.predict(req)
    reason = policy.on_arrival(req, now)
    if reason is None:
        req.status = Status.WAITING
        policy.enqueue(req, now)
    return reason
