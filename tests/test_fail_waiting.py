"""``fail_waiting`` (the run loop's end when nothing can ever admit what waits): every waiting
request ends FAILED with the reason, in the policy's order, and the queue is empty after."""

import pytest

from tokenfair.contracts.contract import Contract
from tokenfair.core.costmodel import load_profile
from tokenfair.core.request import Request, Status
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.fleet_gate import FleetGate


def _requests(n: int) -> list[Request]:
    return [Request(f"r{i}", i, f"t{i % 3}", "default", 0.01 * i, 100 + i, 10) for i in range(n)]


@pytest.mark.parametrize("policy", ["fifo", "vtc", "fair"])
def test_scheduler_fails_every_waiting_request(policy: str) -> None:
    sched = IterationScheduler(make_policy(policy), Contract(), load_profile(None))
    reqs = _requests(7)
    for r in reqs:
        sched.add_request(r, r.arrival_s)
    assert sched.policy.num_waiting() == 7
    sched.fail_waiting("unschedulable: test", 1.0)
    assert sched.policy.num_waiting() == 0
    assert [(r.status, r.reason, r.finish_s) for r in reqs] == [(Status.FAILED, "unschedulable: test", 1.0)] * 7
    sched.check_invariants()


def test_fleet_gate_fails_every_waiting_request() -> None:
    gate = FleetGate("fair", Contract(), load_profile(None), num_replicas=2, window=1, cached_discount=0.1)
    reqs = _requests(5)
    for r in reqs:
        gate.arrive(r, r.arrival_s)
    assert gate.policy.num_waiting() == 5
    gate.fail_waiting("unschedulable: no replica", 2.0)
    assert gate.policy.num_waiting() == 0
    assert [(r.status, r.reason, r.finish_s) for r in reqs] == [(Status.FAILED, "unschedulable: no replica", 2.0)] * 5
