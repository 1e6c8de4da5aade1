"""The TPOT SLOs of the running decodes: what the prefill budget is shaped for (batching.py).

A multiset of the ``tpot_slo_s`` of the requests that are running and past their prefill:
a request enters when its prefill completes (or when it is admitted with its prompt already
computed, a swapped-in decode), and leaves when it ends or is preempted.  ``tightest`` is the
least SLO among them, None when no running decode has one (then the budget is not shaped:
batch-only traffic keeps the contract's prefill budget).  O(1) per change, O(distinct SLOs)
per ``tightest``.
"""

from __future__ import annotations

from ...core.request import Request


class DecodeSLOs:
    __slots__ = ("counts", "members")

    def __init__(self) -> None:
        self.counts: dict[float, int] = {}       # SLO -> running decodes with it (> 0)
        self.members: set[Request] = set()       # the running decodes counted, each with an SLO

    def start(self, req: Request) -> None:
        """``req`` runs and decodes (its prefill is done); counted once."""
        slo = req.tpot_slo_s
        if slo is None or req in self.members:
            return
        self.members.add(req)
        self.counts[slo] = self.counts.get(slo, 0) + 1

    def stop(self, req: Request) -> None:
        """``req`` stopped running (ended, preempted); no-op when it was not counted."""
        if req not in self.members:
            return
        self.members.discard(req)
        slo = req.tpot_slo_s
        assert slo is not None                   # only requests with an SLO are members
        left = self.counts[slo] - 1
        if left:
            self.counts[slo] = left
        else:
            del self.counts[slo]

    def tightest(self) -> float | None:
        if not self.counts:
            return None
        return min(self.counts)
