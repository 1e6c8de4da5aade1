"""The KV growth reserve (sched/fair/headroom.py): under KV pressure a new request is admitted
only if part of the running requests' predicted growth stays free, so a KV-bound engine
stops admitting into evictions."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile, load_profile
from tokenfair.core.request import Request
from tokenfair.sched.fair.headroom import KV_GROWTH_RESERVE, KV_PRESSURE_WINDOW_S
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.scenarios import build_scenario

PROFILE = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                  decode_base_s=0.01, decode_seq_s=1e-4, kv_capacity_tokens=100_000, block_size=16)
CONTRACT = parse_contract({"engine": {"prefill_token_budget": 4096, "decode_token_budget": 64,
                                      "chunk_size": 4096, "max_running": 8}})


def test_the_reserve_applies_under_kv_pressure_to_a_tenant_with_running_requests():
    policy = FairPolicy()
    sched = IterationScheduler(policy, CONTRACT, PROFILE)
    running = Request("r0", 0, "a", "interactive", 0.0, 160, 1000)
    sched.add_request(running, 0.0)
    sched.schedule(0.0)                                  # r0 runs: 160 tokens, 10 blocks
    headroom, pool = policy.headroom, sched.pool
    growth = headroom.running_growth_blocks()
    assert growth == pool.blocks_for(160 + running.predicted_remaining) - running.blocks > 0
    new = Request("n0", 1, "a", "interactive", 1.0, 320, 10)
    other = Request("m0", 2, "b", "interactive", 1.0, 320, 10)
    for r in (new, other):
        sched.add_request(r, 1.0)
    base = pool.blocks_for(320 + 1)
    need = lambda r, now: headroom.blocks_to_admit(r, 320, policy.meter, None, now)
    assert need(new, 1.0) == base                        # no eviction yet: no reserve
    headroom.note_kv_pressure(1.0)
    assert need(new, 2.0) == base + int(KV_GROWTH_RESERVE * growth)
    assert need(other, 2.0) == base                      # b runs nothing: exempt
    assert need(new, 1.0 + KV_PRESSURE_WINDOW_S) == base # the pressure has passed


def test_a_kv_bound_engine_stops_admitting_into_evictions():
    """many-light on llama2-7b-a100 (4x the KV per token of llama3-8b): without the reserve
    fair evicted 1,211 times, recovering 14% of its service, and the longest service gap of
    a backlogged tenant was 3.4 s (vtc's 2.5 s)."""
    wl, contract = build_scenario("many-light", 0)
    s = simulate(wl, "fair", contract, load_profile("llama2-7b-a100"), isolated=False).summary
    assert s["preemptions"] < 300 and s["recovery_cost_fraction"] < 0.03
    assert s["longest_service_gap_s"] < 2.5                      # 2.1 s, the whale's
