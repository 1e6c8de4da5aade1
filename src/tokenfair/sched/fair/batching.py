"""Layer 4, the fair policy's half: how big this step's prefill is and in what order.

* the prefill budget is shaped so the predicted step (last step's decode batch plus the
  prefill) stays within ``TPOT_MARGIN`` x the tightest TPOT SLO among the running decodes
  (``tpot.py``; none has one: the contract's budget; bisection, O(log budget));
* a light tenant's prefill that can finish within one step's budget may take all of it;
  everything else is capped at ``chunk_size`` (a 20K prompt never holds a step);
* a running prefill of a tenant that is not light waits behind light tenants' prefill work
  and behind the admissions of tenants served clearly less (``defer_prefill``);
* while a light tenant's prefill runs and the shaping binds, that prefill keeps the whole
  budget and the decodes of tenants that are not light give way instead
  (``decode_hold``): as many as the TPOT target requires, never one twice in a row.
"""

from __future__ import annotations

from mypy_extensions import mypyc_attr

from typing import Final

from ...core.request import Request, Status
from ..policy import DecodeHold
from .accounting import AccountingMixin
from .state import LIGHT_FRACTION

MIN_PREFILL_BUDGET: Final = 128
TPOT_MARGIN: Final = 0.8


@mypyc_attr(allow_interpreted_subclasses=True)
class BatchingMixin(AccountingMixin):
    """Part of :class:`FairPolicy`; uses its tenants, WFQ and share meter."""

    def prefill_budget(self, last_step: tuple[int, int, list[Request]], now: float) -> int:
        """The contract's prefill budget, shaped so the predicted step (with last step's decode
        batch) stays within ``TPOT_MARGIN`` x the tightest TPOT SLO of a running decode:
        bisection over multiples of 64, O(log budget) cost-model calls.  While a light
        tenant's prefill runs, the prefill keeps the whole budget and the heavy tenants'
        decodes give way instead (:meth:`decode_hold`)."""
        budget = self.contract.engine.prefill_token_budget
        self._now = now
        self._hold = None
        n, ctx, prefilling = last_step
        admitted, self._admitted_prefills = self._admitted_prefills, []
        self._light_prefilling = any(self.is_light(self.tenants[r.tenant], now, r)
                                     for group in (prefilling, admitted) for r in group
                                     if r.status is Status.RUNNING and r.in_prefill)
        slo = self.decode_slos.tightest()
        if slo is None or n == 0:
            return budget
        target = TPOT_MARGIN * slo
        cost = self._cost                        # cost.chunk_s(c, ctx, n) == profile.step_s([(c, 0)], ctx, n)
        if cost.chunk_s(budget, ctx, n) <= target:
            return budget
        if self._light_prefilling:
            self._hold = self._hold_heavy_decodes(budget, n, ctx, target, now)
            return budget
        return self._shaped_budget(budget, ctx, n, target)

    def _shaped_budget(self, budget: int, ctx: int, n: int, target: float) -> int:
        """The largest multiple of 64 in [MIN_PREFILL_BUDGET, budget) whose predicted step
        fits ``target`` (MIN_PREFILL_BUDGET if none; ``budget`` itself if it is at most
        MIN_PREFILL_BUDGET), given ``cost.chunk_s(budget) > target``.  The
        step time is monotone in the chunk (every float operation of the cost model is), so
        bisection finds exactly that; the previous step's answer is tried first -- it is the
        answer iff it fits (or is the minimum) and 64 more does not (or reaches the budget):
        two evaluations where consecutive steps agree, else O(log budget) by bisection."""
        if budget <= MIN_PREFILL_BUDGET:
            return budget                        # the floor is the whole budget: never more
        cost = self._cost                        # cost.chunk_s(c, ctx, n) == profile.step_s([(c, 0)], ctx, n)
        g = self._last_shaped
        if (MIN_PREFILL_BUDGET <= g < budget
                and (g + 64 >= budget or cost.chunk_s(g + 64, ctx, n) > target)
                and (g == MIN_PREFILL_BUDGET or cost.chunk_s(g, ctx, n) <= target)):
            return g
        lo, hi = MIN_PREFILL_BUDGET, budget      # the largest multiple of 64 that fits (bisection)
        while hi - lo > 64:
            mid = (lo + hi) // 128 * 64
            if mid <= lo:                        # a budget that is not a multiple of 64
                mid = lo + 64                    # (else mid == lo and the loop never ends)
            if cost.chunk_s(mid, ctx, n) <= target:
                lo = mid
            else:
                hi = mid
        self._last_shaped = lo
        return lo

    def _hold_heavy_decodes(self, budget: int, n: int, ctx: int, target: float, now: float) -> DecodeHold:
        """A light tenant's prefill (its TTFT) is what the TPOT shaping would otherwise cut.
        Instead, the decodes of tenants that are not light give way: all but ``m`` of the
        planned ``n`` decodes, the largest m with cost.chunk_s(budget, m decodes of the mean
        context) <= target (bisection, O(log n)), are held -- never one twice in a row,
        so a held stream still decodes every other step.  O(active tenants) for the held set."""
        cost = self._cost                        # cost.chunk_s(c, ctx, n) == profile.step_s([(c, 0)], ctx, n)
        lo, hi = 0, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if cost.chunk_s(budget, ctx * mid // n, mid) <= target:
                lo = mid
            else:
                hi = mid
        level = self._level(now)                 # read already (is_light found the light prefill)
        heavy = frozenset(t.name for t in self.tenants.values()
                          if t.running and not self.under_share(t, now, level))
        return DecodeHold(heavy, n - lo)

    def decode_hold(self) -> DecodeHold | None:
        return self._hold

    def chunk_for(self, req: Request, now: float) -> int:
        """A light tenant's prefill that can finish within one step's budget may take it all
        (it cannot monopolise what it is entitled to); everything else is capped at
        ``chunk_size``, so a 20K prompt never holds a step."""
        eng = self.contract.engine
        if self.is_light(self.tenants[req.tenant], now, req):
            return eng.prefill_token_budget
        return eng.chunk_size

    def defer_prefill(self, req: Request, now: float) -> bool:
        """A running prefill of a tenant that is not light waits behind the new admissions
        and running prefills of light tenants (``is_light``), and behind the admissions
        of a waiting tenant recently served clearly less than its own tenant: a heavy
        tenant's long prefill cannot hold a light tenant's request back.  The deferred
        chunk gets the budget left after admissions."""
        mine = self.tenants[req.tenant]
        if self.is_light(mine, now, req):
            return False
        if self._light_prefilling:
            return True
        if not self.num_queued:
            return False
        other = self.wfq.pick({mine.name}, prefer=lambda x: self.is_light(x, now))
        if other is None:
            return False
        tau = self.share_tau_s
        return (other.decayed_recent(now, tau) / other.weight
                < LIGHT_FRACTION * mine.decayed_recent(now, tau) / mine.weight)
