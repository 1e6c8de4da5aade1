"""``fail_waiting`` (the run loop's end when nothing can ever admit what waits), of an engine's
scheduler and of the fleet's gateway: every waiting request ends FAILED with the reason, and
the queue is empty after."""

import pytest

from tokenfair.contracts.contract import Contract
from tokenfair.core.costmodel import load_profile
from tokenfair.core.reasons import Reason, ReasonCode
from tokenfair.core.request import Request, Status
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.fleet_gate import FleetGate


def _scheduler(policy: str):
    sched = IterationScheduler(make_policy(policy), Contract(), load_profile(None))
    return sched, sched.add_request


def _gateway(policy: str):
    gate = FleetGate(policy, Contract(), load_profile(None), num_replicas=2, window=1, cached_discount=0.1)
    return gate, gate.arrive


@pytest.mark.parametrize("make, policy", [(_scheduler, "fifo"), (_scheduler, "vtc"), (_scheduler, "fair"),
                                          (_gateway, "fair")])
def test_fail_waiting_ends_every_waiting_request(make, policy: str) -> None:
    owner, add = make(policy)
    reqs = [Request(f"r{i}", i, f"t{i % 3}", "default", 0.01 * i, 100 + i, 10) for i in range(7)]
    for r in reqs:
        add(r, r.arrival_s)
    assert owner.policy.num_waiting() == 7
    reason = Reason(ReasonCode.UNSCHEDULABLE, "test")
    owner.fail_waiting(reason, 1.0)
    assert owner.policy.num_waiting() == 0
    assert ([(r.status, r.end_reason, r.reason, r.finish_s) for r in reqs]
            == [(Status.FAILED, reason, "unschedulable: test", 1.0)] * 7)
