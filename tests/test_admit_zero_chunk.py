"""A waiting request the policy gives no chunk this step is not admitted with zero tokens.

The fair policy's ``chunk_for`` is 0 for a background prefill that sits out a step carrying a
foreground prefill (sched/fair/background.py); admitting such a request put ``(request, 0)``
into the step (the scheduler invariant test found it).  Now its tenant waits for the step,
and the others are admitted as usual."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.scheduler import IterationScheduler

CONTRACT = parse_contract({"engine": {"prefill_token_budget": 256, "decode_token_budget": 16,
                                      "chunk_size": 128, "max_running": 8}})
PROFILE = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                  decode_base_s=0.01, decode_seq_s=1e-4, kv_capacity_tokens=100_000, block_size=16)


class _SitsOut(FairPolicy):
    """The fair policy, except that tenant ``b`` gets no chunk (as a background prefill
    sitting out a foreground step does)."""

    def chunk_for(self, req: Request, now: float) -> int:
        return 0 if req.tenant == "b" else super().chunk_for(req, now)


def test_a_request_without_a_chunk_waits_and_the_others_are_admitted():
    sched = IterationScheduler(_SitsOut(), CONTRACT, PROFILE)
    b = Request("b0", 0, "b", "interactive", 0.0, 300, 5)
    a = Request("a0", 1, "a", "interactive", 0.0, 100, 5)
    sched.add_request(b, 0.0)
    sched.add_request(a, 0.0)
    out = sched.schedule(0.0)
    assert [(r.request_id, n) for r, n in out.prefill] == [("a0", 100)]
    assert b.status is Status.WAITING and b.scheduled_s is None
    assert sched.running == [a] and sched.policy.num_waiting() == 1
