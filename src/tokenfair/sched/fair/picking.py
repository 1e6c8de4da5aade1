"""Which waiting request goes next: the fair policy's ``pick`` (module docstring of
:mod:`.policy` for the order; :mod:`.guarantee` for forced heads and their reservation)."""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from ...core.request import Request
from .ordering import best_head
from .shares import SharesMixin
from .tenant import TenantState


def _ttft_deadline(r: Request | None) -> tuple[float, int]:
    """Among light tenants (all within their share) the next admission is the head whose
    first-token deadline comes first: a burst of light requests is served in arrival order
    (for equal SLOs) rather than by finish tag, which minimises the worst TTFT among them.
    ``r``: a backlogged tenant's head, which exists (``None`` only as ``best_head`` types it)."""
    assert r is not None
    return (r.enqueued_s + (r.ttft_slo_s or 0.0), r.seq)


@mypyc_attr(allow_interpreted_subclasses=True)
class PickMixin(SharesMixin):
    """Part of :class:`FairPolicy`; uses its tenants, WFQ, overdue heap and guarantee."""

    def pick(self, now: float, blocked: set[str]) -> Request | None:
        self._now = now
        self._reserve = None
        forced = self._forced(now)
        if forced is not None:
            if forced.tenant not in blocked:
                return forced
            t = self.tenants[forced.tenant]
            if self.admission.can_admit(t, forced, self.num_running, self.predicted_cost(forced), now):
                self._reserve = forced          # it did not fit: keep room for it (guarantee.py)
        if self.guaranteed or self.class_min:
            r = self._below_guarantee(now, blocked)
            if r is not None:
                return r
        picked = self.wfq.pick(blocked, prefer=lambda x: self.is_light(x, now),
                               among=lambda x: _ttft_deadline(best_head(x.queues, now)))
        return best_head(picked.queues, now) if picked is not None else None

    def within_share(self, t: TenantState) -> bool:
        """``S_i <= V + C / w_i``: not ahead of the others by more than the carry-over credit."""
        return t.vtime <= self.wfq.vnow + self.wfq.credit / t.weight

    def _forced(self, now: float) -> Request | None:
        """A head that must be served next (guarantee.py): an overdue request of a tenant
        within its share, else the longest-starving tenant's past its grace."""
        e = self.overdue.top()
        if e is not None:
            due: float = e[0]
            overdue: Request = e[-1]
            if due <= now and self.within_share(self.tenants[overdue.tenant]):
                return overdue
        return self.guarantee.due(now, self.min_grace_s, lambda t: best_head(t.queues, now), self.within_share)

    def _below_guarantee(self, now: float, blocked: set[str]) -> Request | None:
        total = self.recent_total
        if total <= 0:
            return None
        best: Request | None = None
        best_gap = 0.0
        for t in self.guaranteed:
            if t.num_waiting and t.name not in blocked:
                gap = t.spec.min_share - t.decayed_recent(now, self.share_tau_s) / total
                if gap > best_gap:
                    best, best_gap = best_head(t.queues, now), gap
        for k, share in self.class_min.items():
            if self.class_waiting[k]:
                gap = share - self.class_recent[k] / total
                e = self.class_heaps[k].top()
                if gap > best_gap and e is not None:
                    head: Request = e[-1]
                    if head.tenant not in blocked:
                        best, best_gap = head, gap
        return best
