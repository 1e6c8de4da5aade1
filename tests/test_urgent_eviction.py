"""Urgent eviction (sched/admit.py, sched/fair/urgency.py): an overdue waiting request may
evict one running request, but only when that lets it in, and only for a tenant within its
share -- a flooding tenant's own overdue requests evict no one."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import SimEngine

CONTRACT = parse_contract({
    "classes": {"interactive": {"priority": 10, "aging_rate": 1.0, "max_wait_s": 1.0},
                "low": {"priority": 0, "aging_rate": 0.0}},
    "engine": {"prefill_token_budget": 256, "decode_token_budget": 16, "chunk_size": 128, "max_running": 1}})
PROFILE = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                  decode_base_s=0.01, decode_seq_s=1e-4, kv_capacity_tokens=100_000, block_size=16)


class _HeldBack(FairPolicy):
    """The fair policy, except that tenant ``x`` is never admissible (as a tenant at its
    long-prefill limit or out of rate-limit tokens is not)."""

    def can_admit(self, req: Request, now: float, num_running: int) -> bool:
        return req.tenant != "x" and super().can_admit(req, now, num_running)


def _running_then_overdue(policy: FairPolicy, until_s: float):
    """``a0`` (low class, long output) runs in the only slot; ``x0`` (max wait 1 s) waits.
    Steps until ``until_s``; returns (scheduler, a0, x0, now, preempted requests)."""
    sched = IterationScheduler(policy, CONTRACT, PROFILE)
    eng = SimEngine(PROFILE)
    a = Request("a0", 0, "a", "low", 0.0, 100, 2000)
    x = Request("x0", 1, "x", "interactive", 0.0, 100, 5, priority=10.0, aging_rate=1.0, max_wait_s=1.0)
    eng.add(a, 2000)
    eng.add(x, 5)
    sched.add_request(a, 0.0)
    now, preempted = 0.0, []
    while now < until_s:
        out = sched.schedule(now)
        if now == 0.0:
            sched.add_request(x, now)
        preempted += [r for r, _ in out.preempted]
        res = eng.execute(out)
        now += res.duration_s
        sched.update_from_output(out, res, now)
    return sched, a, x, now, preempted


def test_an_overdue_request_evicts_a_running_one_to_get_in():
    _, a, x, _, preempted = _running_then_overdue(FairPolicy(), 1.5)
    assert preempted == [a] and x.scheduled_s is not None and 1.0 <= x.scheduled_s < 1.5


def test_no_eviction_for_a_request_the_policy_would_not_admit_anyway():
    _, a, x, _, preempted = _running_then_overdue(_HeldBack(), 1.5)
    assert preempted == [] and a.status is Status.RUNNING and x.status is Status.WAITING


def test_an_overdue_request_of_a_tenant_over_its_share_evicts_no_one():
    policy = FairPolicy()
    _, a, x, _, _ = _running_then_overdue(policy, 0.5)
    t, wfq = policy.roster.tenants["x"], policy.wfq
    victims = []
    for lead in (0.0, 10 * wfq.credit):              # within its share; far ahead of V
        t.vtime = wfq.vnow + lead / t.weight
        policy.urgency.preemption.last_urgent_s = float("-inf")     # cooled down
        victims.append(policy.urgent_victim(x, [a], 2.0))
    assert victims == [a, None]
