"""What a request costs the fair policy: the contract's cost weights applied to its tokens."""

from __future__ import annotations

from typing import Final

from ...contracts.contract import CostWeights as ContractCosts
from ...core.costmodel import Profile
from ...core.request import Request

MIN_COST_WEIGHT: Final = 1e-9


class RequestCost:
    """The contract's cost weights (a live contract change sets new ones, :meth:`rebind`:
    they price what is served from then on; charges already made stay).  Invariant:
    ``integral`` iff both weights are integer-valued and the decode weight is positive (then
    every used cost and charge is an integer-valued float and sums of them are exact,
    ``accounting.py``)."""

    __slots__ = ("wp", "wd", "integral")

    def __init__(self, costs: ContractCosts) -> None:
        self.wp: float = 0.0                         # cost per prefill token
        self.wd: float = 0.0                         # cost per decode token
        self.integral: bool = False
        self.rebind(costs)

    def rebind(self, costs: ContractCosts) -> None:
        self.wp = costs.prefill_token
        self.wd = costs.decode_token
        self.integral = float(self.wp).is_integer() and float(self.wd).is_integer() and self.wd > 0

    def predicted(self, req: Request) -> float:
        """Its prompt plus its predicted output: what it is charged at admission."""
        return self.wp * req.prompt_tokens + self.wd * req.predicted_output

    def used(self, req: Request) -> float:
        """What it has consumed so far (never less than what was recorded before)."""
        prompt_done = req.prompt_tokens if req.num_output else req.num_computed
        return max(req.used_cost, self.wp * prompt_done + self.wd * req.num_output)


def prefill_rate(costs: RequestCost, profile: Profile, full: int) -> float:
    """The cost per second of a step that fills the prefill budget ``full`` (the cost model)."""
    return costs.wp * full / max(profile.step_s([(full, 0)], 0, 0), MIN_COST_WEIGHT)
