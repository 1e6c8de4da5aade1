"""The consecutive-prefill cap yields a step to other prefills, not to nothing.

A long prefill that has had ``max_consecutive_prefill_steps`` chunks in a row sits the next
step out while others wait, so that a waiting request gets in.  When none can (no slot free,
say) and decodes run, that step carried no prefill at all: the cap had idled the prefill
budget.  The fair policy (``cap_yields_only_to_prefill``) then gives the held prefill the
step's budget; the baselines keep the plain cap (``sched/scheduler.py``, step 5)."""

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.core.request import Request
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import SimEngine

CAP = 3
CONTRACT = parse_contract({"engine": {"prefill_token_budget": 256, "decode_token_budget": 16,
                                      "chunk_size": 128, "max_running": 2,
                                      "max_consecutive_prefill_steps": CAP}})
PROFILE = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                  decode_base_s=0.01, decode_seq_s=1e-4, kv_capacity_tokens=100_000, block_size=16)


def _steps(policy: str, num_steps: int) -> list[tuple[int, int]]:
    """(prefill tokens, decodes) of each step: a short request decoding, a long prompt
    prefilling beside it, and a second request of the long prompt's tenant waiting for a
    slot the whole time (its own tenant's: the fair policy defers no prefill for it)."""
    sched = IterationScheduler(make_policy(policy), CONTRACT, PROFILE)
    engine = SimEngine(PROFILE)
    short = Request("short", 0, "a", "interactive", 0.0, 16, 500)
    long = Request("long", 1, "b", "interactive", 0.0, 5000, 5)
    late = Request("late", 2, "b", "interactive", 0.0, 64, 5)
    for req, true_len in ((short, 500), (long, 5), (late, 5)):
        engine.add(req, true_len)
    sched.add_request(short, 0.0)
    sched.add_request(long, 0.0)
    steps = []
    now = 0.0
    for i in range(num_steps):
        out = sched.schedule(now)
        if i == 0:
            sched.add_request(late, now)
        result = engine.execute(out)
        now += result.duration_s
        sched.update_from_output(out, result, now)
        steps.append((sum(n for _, n in out.prefill), len(out.decode)))
    assert sched.policy.num_waiting() == 1          # the late request never found a slot
    return steps


def test_a_step_nobody_else_takes_serves_the_capped_prefill():
    steps = _steps("fair", 12)
    assert all(prefill > 0 for prefill, _ in steps[1:]), steps
    assert all(decodes == 1 for _, decodes in steps[1:])


@pytest.mark.parametrize("policy", ["fifo", "vtc"])
def test_the_baselines_keep_the_plain_cap(policy):
    steps = _steps(policy, 12)
    idle = [i for i, (prefill, decodes) in enumerate(steps) if prefill == 0 and decodes == 1]
    assert idle, steps                              # the cap idled the prefill budget
    assert all(prefill > 0 for i, (prefill, _) in enumerate(steps[1:], 1) if i not in idle)
