"""A live contract change in a running fair policy: its tenants and min-share classes.

:meth:`FairPolicy.on_contract_change` has each part re-derive what it derived from the
contract at ``bind`` (cost weights, WFQ credit, prefill rate, grace, headroom, preemption
spec) and calls these two, which move the state several parts share:

  :func:`retenant`  every known tenant takes its spec in the new contract (its own entry or
                    the default template, ``TenantRoster.rebind``): weight (the total,
                    active and backlogged weights follow; its queued head is re-keyed in
                    the WFQ), min share, limits, rate limit (the bucket is refilled to now
                    under the old rate, then capped at the new burst), queue bound; its
                    queued cost is re-priced at the new cost weights.  The guaranteed,
                    rate-limited and reservation-owner lists are rebuilt.
  :func:`reclass`   the classes with a min share (``WaitingQueue.reclass``): a class that
                    gains one gets a reservation heap holding every request of that class
                    already queued (same ordering keys as the tenant queues); a class that
                    loses it drops its heap; kept classes keep their heap and decayed
                    service (``ShareMeter.rebind``).

Nothing queued or running moves or ends: requests keep the class parameters (priority,
max wait, SLOs, deadline) they were admitted with.  O(tenants + queued requests).
"""

from __future__ import annotations

from ...contracts.contract import Contract
from .admission import AdmissionControl
from .queue import WaitingQueue
from .roster import TenantRoster
from .shares import ShareMeter
from .wfq import VirtualTimeWFQ


def retenant(roster: TenantRoster, queue: WaitingQueue, wfq: VirtualTimeWFQ, admission: AdmissionControl,
             new: Contract, now: float) -> None:
    """Every known tenant takes its spec in ``new`` (``queue.costs`` already holds the new
    cost weights)."""
    weight_changes = roster.rebind(new, now)
    for name, t in roster.tenants.items():
        queue.reprice(t, now)
        wfq.reweigh(t, weight_changes[name])
    admission.rebind(new, list(roster.tenants.values()))


def reclass(queue: WaitingQueue, meter: ShareMeter, roster: TenantRoster, new: Contract) -> None:
    """The min-share classes of ``new``: their reservation heaps and recent service."""
    queue.reclass(new, list(roster.tenants.values()))
    meter.rebind(new, list(queue.class_min))
