"""``fair``: tokenfair's four-layer policy (admission, weighted fair queue, in-queue order,
iteration batching/preemption): :class:`FairPolicy` (``policy.py``), a facade over parts
that each hold their own state, take the parts they use as constructor arguments, and are
built and tested alone (``tests/test_fair_parts.py``):

  ``roster.TenantRoster``       the tenants (``tenant.TenantState``), active weight, running count
  ``admission.AdmissionControl`` layer 1: queue bounds, concurrency, token rate, KV quota, reservations
  ``forecast.WaitForecaster``   the wait forecast that sheds at arrival (max waits up to a minute)
  ``review.QueueReview``        sheds from the queue as a max wait nears
  ``wfq.VirtualTimeWFQ``        layer 2: virtual-time fair queueing across tenants
  ``queue.WaitingQueue``        layer 3: the waiting requests in their order (``ordering.py``)
  ``picking.Picker``            ``pick``: forced heads (``guarantee.py``), min shares, WFQ
  ``shares.ShareMeter``         recent service: light / under-share tenants, the water level
  ``headroom.Headroom``         KV and slot shares, the reservations for tenants within theirs
  ``accounting.Accounting``     charges, corrections, refunds, what was served
  ``batching.PrefillShaper``    layer 4: prefill budget, chunks, deferral, decode hold
                                (``shaping.BudgetShaper``, ``tpot.DecodeSLOs``)
  ``urgency.Urgency``           deadlines that expire, victims (``preemption.PreemptionPolicy``)
  ``costs.RequestCost``, ``steptime.StepTimer``  cost weights, the recent step time

A live contract change (``FairPolicy.on_contract_change``): each part re-derives what it read
of the contract; ``rebind.py`` moves the tenants and the min-share classes.
"""

from ..registry import register
from .policy import FairPolicy

register("fair", FairPolicy)

__all__ = ["FairPolicy"]
