"""The TPOT-shaped prefill budget's arithmetic: the largest prefill, and the most decodes,
whose predicted step fits a target time (bisection over the cost model)."""

from __future__ import annotations

from typing import Final

from ...core.stepcost import StepCost

MIN_PREFILL_BUDGET: Final = 128
# shaped budgets are multiples of this many tokens
SHAPING_GRANULARITY: Final = 64


class BudgetShaper:
    """Invariant: ``last_shaped`` is the last budget :meth:`shaped` found by bisection with
    ``remember`` (0 before the first); ``cost.chunk_s(c, ctx, n, k) == profile.step_s([(c, k)], ctx, n)``.
    ``k`` is the cached context the step's prefill is predicted on (``batching.py``)."""

    __slots__ = ("cost", "last_shaped")

    def __init__(self, cost: StepCost) -> None:
        self.cost = cost
        self.last_shaped = 0

    def shaped(self, budget: int, ctx: int, n: int, target: float, k: int = 0, remember: bool = True) -> int:
        """The largest multiple of 64 in [MIN_PREFILL_BUDGET, budget) whose predicted step
        fits ``target`` (MIN_PREFILL_BUDGET if none; ``budget`` itself if it is at most
        MIN_PREFILL_BUDGET), given ``cost.chunk_s(budget) > target``.  The step time is
        monotone in the chunk (every float operation of the cost model is), so bisection
        finds exactly that; the previous answer is tried first -- it is the answer iff it
        fits (or is the minimum) and 64 more does not (or reaches the budget): two
        evaluations where consecutive steps agree, else O(log budget) by bisection.
        ``remember=False``: a side question (another prefix) that leaves the hint alone."""
        if budget <= MIN_PREFILL_BUDGET:
            return budget                        # the floor is the whole budget: never more
        cost = self.cost
        g = self.last_shaped
        step = SHAPING_GRANULARITY
        if (MIN_PREFILL_BUDGET <= g < budget
                and (g + step >= budget or cost.chunk_s(g + step, ctx, n, k) > target)
                and (g == MIN_PREFILL_BUDGET or cost.chunk_s(g, ctx, n, k) <= target)):
            return g
        lo, hi = MIN_PREFILL_BUDGET, budget      # the largest multiple of 64 that fits (bisection)
        while hi - lo > step:
            mid = (lo + hi) // (2 * step) * step
            if mid <= lo:                        # a budget that is not a multiple of 64
                mid = lo + step                  # (else mid == lo and the loop never ends)
            if cost.chunk_s(mid, ctx, n, k) <= target:
                lo = mid
            else:
                hi = mid
        if remember:
            self.last_shaped = lo
        return lo

    def decodes_that_fit(self, budget: int, n: int, ctx: int, target: float, k: int = 0) -> int:
        """The largest m < n with ``cost.chunk_s(budget, m decodes of the mean context, k) <=
        target`` (0 if none; bisection, O(log n))."""
        cost = self.cost
        lo, hi = 0, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if cost.chunk_s(budget, ctx * mid // n, mid, k) <= target:
                lo = mid
            else:
                hi = mid
        return lo
