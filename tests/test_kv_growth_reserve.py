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
from tokenfair.workloads.random_mix import random_mix
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


def test_a_light_tenant_within_its_shares_is_exempt():
    """Exempt too: a light tenant with requests running that holds at most its weight share
    of KV (the prompt's blocks included) and of slots."""
    policy = FairPolicy()
    sched = IterationScheduler(policy, CONTRACT, PROFILE)
    for i, tenant in enumerate(("a", "b")):
        sched.add_request(Request(f"r{i}", i, tenant, "interactive", 0.0, 160, 1000), 0.0)
    sched.schedule(0.0)                                  # one request of each runs
    headroom, pool, meter, roster = policy.headroom, sched.pool, policy.meter, policy.roster
    a, b = roster.tenants["a"], roster.tenants["b"]
    a.recent, a.recent_t = 1e6, 1.0                      # a was served far more than b
    b.recent, b.recent_t = 1e3, 1.0
    assert meter.is_light(b, 1.0) and not meter.is_light(a, 1.0)
    growth = int(KV_GROWTH_RESERVE * headroom.running_growth_blocks())
    assert growth > 0
    headroom.note_kv_pressure(1.0)
    need = lambda r: headroom.blocks_to_admit(r, r.prompt_tokens, meter, None, 1.0)
    small_b = Request("n1", 3, "b", "interactive", 1.0, 320, 10)
    assert headroom.within_share(b, pool.blocks_for(320 + 1), 0)
    assert need(small_b) == pool.blocks_for(320 + 1)                   # light and within: exempt
    b.queued_cost["interactive"] = 1e7                   # owed service, but not light with its queue
    assert meter.under_share(b, 1.0) and not meter.is_light(b, 1.0)
    assert need(small_b) == pool.blocks_for(320 + 1) + growth
    del b.queued_cost["interactive"]
    small_a = Request("n0", 2, "a", "interactive", 1.0, 320, 10)
    assert need(small_a) == pool.blocks_for(320 + 1) + growth          # not light
    half = pool.num_blocks // 2                          # b's weight share of the blocks
    big_b = Request("n2", 4, "b", "interactive", 1.0, half * pool.block_size, 10)
    assert not headroom.within_share(b, pool.blocks_for(big_b.prompt_tokens + 1), 0)
    assert need(big_b) == pool.blocks_for(big_b.prompt_tokens + 1) + growth   # past its share


def test_a_light_tenant_is_not_held_for_the_others_growth():
    """Mix 355 (256 slots; two weight-3 batch tenants hold much of a full KV pool, and
    running requests are evicted as they grow): held for the running requests' growth,
    s6's 433-token prompt waited 4.7 s for blocks while s6 held 1-2 of some 120 running
    requests (its P99 TTFT 3.0 s, vtc's 0.93 s).  Light and within its share, it no longer
    waits for the others' growth."""
    wl, contract, light = random_mix(355)
    profile = load_profile(None)
    runs = {p: simulate(wl, p, contract, profile, isolated=False).summary for p in ("fair", "vtc")}
    p99 = {p: {t: s["tenants"][t]["ttft_s"]["p99"] for t in light} for p, s in runs.items()}
    assert p99["fair"]["s6"] <= p99["vtc"]["s6"]                                  # 0.48 s against 0.93 s
    assert all(p99["fair"][t] < 1.0 for t in ("s0", "s1", "s4", "s6"))            # 2.8-3.2 s held
    assert runs["fair"]["recovery_cost_fraction"] < 0.01                          # 0.20%
    assert runs["fair"]["fairness"]["jain_min"] >= 0.98


def test_a_kv_bound_engine_stops_admitting_into_evictions():
    """many-light on llama2-7b-a100 (4x the KV per token of llama3-8b): without the reserve
    fair evicted 1,211 times, recovering 14% of its service, and the longest service gap of
    a backlogged tenant was 3.4 s (vtc's 2.5 s)."""
    wl, contract = build_scenario("many-light", 0)
    s = simulate(wl, "fair", contract, load_profile("llama2-7b-a100"), isolated=False).summary
    assert s["preemptions"] < 300 and s["recovery_cost_fraction"] < 0.03   # 83, 1.27%
    assert s["longest_service_gap_s"] < 2.5                      # 1.3 s
