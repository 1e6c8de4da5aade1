"""Layer 4, the fair policy's half: how big this step's prefill is and in what order.

* the prefill budget is shaped so the predicted step (last step's decode batch plus the
  prefill) stays within ``TPOT_MARGIN`` x the tightest TPOT SLO (bisection, O(log budget));
* a light tenant's prefill that can finish within one step's budget may take all of it;
  everything else is capped at ``chunk_size`` (a 20K prompt never holds a step);
* a running prefill of a tenant that is not light waits behind light tenants' prefill work
  and behind the admissions of tenants served clearly less (``defer_prefill``).
"""

from __future__ import annotations

from ...request import Request
from .shares import LIGHT_FRACTION

MIN_PREFILL_BUDGET = 128
TPOT_MARGIN = 0.8


class BatchingMixin:
    """Mixed into :class:`FairPolicy`; uses its tenants, WFQ and share meter."""

    def prefill_budget(self, last_step: tuple[int, int, list[Request]], now: float) -> int:
        """The contract's prefill budget, shaped so the predicted step (with last step's decode
        batch) stays within ``TPOT_MARGIN`` x the tightest TPOT SLO of a running request:
        bisection over multiples of 64, O(log budget) cost-model calls."""
        budget = self.contract.engine.prefill_token_budget
        self._now = now
        n, ctx, prefilling = last_step
        self._light_prefilling = any(self.under_share(self.tenants[r.tenant], now) for r in prefilling)
        slo = self._min_tpot_slo
        if slo is None or n == 0:
            return budget
        target = TPOT_MARGIN * slo
        step = self._chunk_step                  # == profile.step_s([(c, 0)], ctx, n)
        if step(budget, ctx, n) <= target:
            return budget
        lo, hi = MIN_PREFILL_BUDGET, budget      # the largest multiple of 64 that fits (bisection)
        while hi - lo > 64:
            mid = (lo + hi) // 128 * 64
            if step(mid, ctx, n) <= target:
                lo = mid
            else:
                hi = mid
        return lo

    def chunk_for(self, req: Request, now: float) -> int:
        """A light tenant's prefill that can finish within one step's budget may take it all
        (it cannot monopolise what it is entitled to); everything else is capped at
        ``chunk_size``, so a 20K prompt never holds a step."""
        eng = self.contract.engine
        if self.under_share(self.tenants[req.tenant], now):
            return eng.prefill_token_budget
        return eng.chunk_size

    def defer_prefill(self, req: Request, now: float) -> bool:
        """A running prefill of a tenant that is not light waits behind the new admissions
        and running prefills of light tenants (``under_share``), and behind the admissions
        of a waiting tenant recently served clearly less than its own tenant: a heavy
        tenant's long prefill cannot hold a light tenant's request back.  The deferred
        chunk gets the budget left after admissions."""
        mine = self.tenants[req.tenant]
        if self.under_share(mine, now):
            return False
        if self._light_prefilling:
            return True
        if not self.num_queued:
            return False
        other = self.wfq.pick({mine.name}, prefer=lambda x: self.under_share(x, now))
        if other is None:
            return False
        tau = self.share_tau_s
        return (other.decayed_recent(now, tau) / other.weight
                < LIGHT_FRACTION * mine.decayed_recent(now, tau) / mine.weight)
