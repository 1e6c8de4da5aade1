"""Slot and KV reservations are capped at each tenant's weight share (fair/headroom.py).

Forty light tenants, each backlogged now and then, and two equal-weight whales: one with
long prompts and short outputs, one with shorter prompts and long outputs, whose requests
run longer and so hold more slots for the same cost.  The light tenants' peaks do not
coincide; summed uncapped, they reserved more slots than the engine has, so the second whale
-- above its weight share of slots but not of service -- was admitted only when the engine
had all but emptied, and received less than its share while the other took its turns."""

from poisson_tenants import fair_fairness, poisson_workload

from tokenfair.contracts.contract import parse_contract
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.core.costmodel import load_profile

CONTRACT = parse_contract({
    "tenants": {"whale": {"weight": 1, "max_queued": 20000}, "whale2": {"weight": 1, "max_queued": 20000}},
    "default_tenant": {"weight": 1, "max_queued": 5000},
    "classes": {"interactive": {"priority": 20, "aging_rate": 1.0, "max_wait_s": 45, "ttft_slo_s": 5.0}},
    "default_class": "interactive",
    "costs": {"prefill_token": 1.0, "decode_token": 2.0},
    "engine": {"prefill_token_budget": 1024, "decode_token_budget": 256, "chunk_size": 512, "max_running": 256}})


def _workload():
    streams = [("whale", 1.2, 0, 240, (2500, 0.5, 128, 8000), (300, 0.5, 16, 1500)),
               ("whale2", 0.8, 0, 240, (1500, 0.5, 128, 8000), (500, 0.5, 16, 1500))]
    streams += [(f"l{k:02d}", 0.25, 0, 240, (1500, 0.4, 64, 6000), (250, 0.4, 8, 1000)) for k in range(40)]
    return poisson_workload("many-tenants", 0, streams)


def test_reservations_never_exceed_the_others_unused_weight_shares():
    policy = FairPolicy()
    IterationScheduler(policy, CONTRACT, load_profile(None))
    roster, headroom = policy.roster, policy.headroom
    for k in range(10):
        t = roster.tenant(f"l{k}", 0.0)
        t.active, t.slots_peak, t.kv_peak = True, 100.0, 10_000.0     # peaks far above any share
        roster.active_weight += t.weight
    me = roster.tenant("whale2", 0.0)
    me.active = True
    roster.active_weight += me.weight
    blocks, slots = headroom.reserved(me, 1)
    share = 1 / 11                                                      # 11 active, equal weights
    assert slots <= 10 * share * CONTRACT.engine.max_running + 1e-9     # 2,500 uncapped
    assert blocks <= 10 * share * policy.pool.num_blocks + 1e-9


def test_a_tenant_holding_more_slots_for_the_same_cost_gets_its_share():
    fairness = fair_fairness(_workload(), CONTRACT)
    assert fairness["jain_windows"] >= 2
    assert fairness["jain_min"] >= 0.997                                # 0.994 uncapped
    for whale in ("whale", "whale2"):
        dev = fairness["share_deviation"][whale]
        assert dev["max_abs"] < 0.005, (whale, dev)                    # 0.0044; whale2: 0.007 uncapped
