"""Fast-forwarding runs of decode-only steps gives exactly the results of stepping one
iteration at a time: every request's record, the whole recorded timeline (service per
tenant and class per bucket, queue, running, KV usage, step count, busy time), the end time
and the scheduler's counters -- for every policy, ``fair`` included."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile, load_profile
from tokenfair.evaluation.metrics import request_record
from tokenfair.workloads.scenarios import build_scenario
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.simulate import simulate_once
from tokenfair.workloads.traces import limit, load_workload, spread_tenants
from tokenfair.workloads.workload import TraceRow, Workload

POLICIES = ["fifo", "vtc", "fair", "sjf", "priority"]


def _outcome(wl, policy, contract, profile, fast):
    res = simulate_once(wl, policy, contract, profile, fast=fast)
    s = res.scheduler
    return ([request_record(r) for r in res.requests], res.recorder.to_json(), res.end_s,
            (s.num_preemptions, s.num_recomputed_tokens, s.num_swapped_blocks, s.num_steps),
            res.extra), s.num_fast_forwarded_steps


def _assert_exact(wl, policy, contract, profile=None, expect_fast_forward: bool | None = True):
    """Fast-forwarded == stepped; ``expect_fast_forward``: whether the fast run must have
    applied steps through sim/fastforward.py (None: either)."""
    profile = profile or load_profile(None)
    fast, num_ff = _outcome(wl, policy, contract, profile, True)
    slow, num_ff_slow = _outcome(wl, policy, contract, profile, False)
    assert num_ff_slow == 0
    if expect_fast_forward is not None:
        assert (num_ff > 0) == expect_fast_forward, f"{num_ff} steps fast-forwarded"
    assert fast[0] == slow[0], "per-request records differ"
    assert fast[1] == slow[1], [k for k in fast[1] if fast[1][k] != slow[1][k]]
    assert fast[2:] == slow[2:]


def test_every_policy_fast_forwards():
    assert all(make_policy(p).can_fast_forward() for p in POLICIES)


def test_a_new_policy_is_not_fast_forwarded_unless_it_opts_in():
    from tokenfair.sched.baselines.fifo import FifoPolicy
    from tokenfair.sched.policy import Policy

    class Mine(FifoPolicy):               # inherits fifo's opt-in
        name = "mine"

    class Bare(Policy):
        name = "bare"
    assert Policy.supports_fast_forward is False and not Bare().can_fast_forward()
    assert Mine().can_fast_forward()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("scenario", ["burst", "hol"])
def test_exact_on_scenario_slices(policy, scenario):
    wl, c = build_scenario(scenario)
    _assert_exact(Workload(wl.name, wl.rows[:400]), policy, c)


@pytest.mark.parametrize("scenario", ["whale", "flood"])
def test_fair_exact_on_multi_tenant_scenarios(scenario):
    """whale: equal weights, shedding, light tenants; flood: weight 3 vs 1 (non-integer
    charges per weight) and a class with a min share (class statistics replayed)."""
    wl, c = build_scenario(scenario)
    _assert_exact(wl, "fair", c)


@pytest.mark.usefixtures("public_traces")
@pytest.mark.parametrize("policy", ["fifo", "vtc", "fair"])
def test_exact_on_a_public_trace_over_20_tenants(policy):
    wl = spread_tenants(limit(load_workload("azure:conv"), 4000), 20, seed=0)
    _assert_exact(wl, policy, parse_contract({}))


def _light_rows(n=300, seed=3):
    import random
    rng = random.Random(seed)
    t, rows = 0.0, []
    for i in range(n):
        t += rng.expovariate(4.0)
        rows.append(TraceRow(f"r{i}", t, rng.choice(["a", "b", "c"]), rng.randint(16, 900),
                             rng.randint(1, 400), klass=rng.choice([None, "batch", "realtime"]),
                             max_tokens=rng.choice([None, 64, 300])))
    return Workload("light", tuple(rows))


# weights and cost weights whose sums are not integers: the closed forms must step aside
_ODD = {
    "tenants": {"a": {"weight": 3}, "b": {"weight": 0.7, "min_share": 0.2}},
    "classes": {"interactive": {"priority": 20, "aging_rate": 1, "max_wait_s": 30, "tpot_slo_s": 0.05},
                "batch": {"priority": 0, "aging_rate": 0.5, "max_wait_s": 600, "min_share": 0.15},
                "realtime": {"priority": 30, "max_wait_s": 10}},
}


@pytest.mark.parametrize("policy", ["vtc", "fair"])
@pytest.mark.parametrize("costs", [{"prefill_token": 1.0, "decode_token": 2.0},
                                   {"prefill_token": 0.7, "decode_token": 1.3}])
def test_exact_with_odd_weights_and_long_runs(policy, costs):
    _assert_exact(_light_rows(), policy, parse_contract({**_ODD, "costs": costs}))


def test_kv_occupancy_charge_turns_fair_fast_forward_off():
    c = parse_contract({**_ODD, "costs": {"kv_block_s": 0.5}})
    assert not IterationScheduler(make_policy("fair"), c, load_profile(None)).policy.can_fast_forward()
    _assert_exact(_light_rows(120), "fair", c, expect_fast_forward=False)


def test_exact_when_the_kv_pool_runs_short():
    """A small pool: runs stop before the step whose block growth does not fit, and the
    normal path evicts."""
    prof = Profile(name="small", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                   decode_base_s=0.01, decode_seq_s=1e-4, decode_ctx_s=1e-7, kv_capacity_tokens=6000,
                   block_size=16, swap_capacity_tokens=3000)
    for policy in ("fifo", "fair"):
        res = simulate_once(_light_rows(200), policy, parse_contract({}), prof)
        assert res.scheduler.num_preemptions > 0      # the case is exercised
        _assert_exact(_light_rows(200), policy, parse_contract({}), prof)


rows_strategy = st.lists(
    st.tuples(st.floats(0, 30), st.sampled_from(["a", "b", "c"]), st.integers(1, 600), st.integers(1, 300),
              st.sampled_from([None, "interactive", "batch", "realtime"]), st.sampled_from([None, 40, 200])),
    min_size=1, max_size=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, policy=st.sampled_from(POLICIES), kv_tokens=st.integers(1500, 20000),
       decode_weight=st.sampled_from([2.0, 1.3]))
def test_exact_on_random_workloads(rows, policy, kv_tokens, decode_weight):
    contract = parse_contract({**_ODD, "costs": {"decode_token": decode_weight},
                               "engine": {"prefill_token_budget": 256, "decode_token_budget": 16,
                                          "chunk_size": 128, "max_running": 8}})
    prof = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                   decode_base_s=0.01, decode_seq_s=1e-4, kv_capacity_tokens=kv_tokens, block_size=16,
                   swap_capacity_tokens=2000)
    trace = tuple(TraceRow(f"r{i}", t, ten, p, o, klass=k, max_tokens=m)
                  for i, (t, ten, p, o, k, m) in enumerate(sorted(rows, key=lambda x: x[0])))
    _assert_exact(Workload("random", trace), policy, contract, prof, expect_fast_forward=None)


def _counted_run(wl, policy, contract, profile, fast):
    """A run that records no timeline (as the isolated baselines' runs), and its engine."""
    from tokenfair.runtime.loop import VirtualClock, run
    from tokenfair.runtime.step_counter import StepCounter
    from tokenfair.sim.engine import RowFedEngine, SimEngine
    from tokenfair.sim.fastforward import fast_forward
    engine = SimEngine(profile)
    res = run(wl.rows, contract, IterationScheduler(make_policy(policy), contract, profile), RowFedEngine(engine),
              VirtualClock(), fast_forward=fast_forward if fast else None, recorder=StepCounter(contract.costs))
    return res, engine


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("profile_name", [None, "vtc-a10g-llama2-7b"])
def test_runs_nobody_reads_step_by_step_are_summed_exactly(policy, profile_name):
    """Where neither the policy nor the recorder reads a decode run's step times (fifo, sjf
    and priority without a timeline), the run is summed without lists: the requests, the end
    time, the step count and the engine's busy time are stepping's, bit for bit; vtc and
    fair read them and are given the lists."""
    profile = load_profile(profile_name)
    wl, contract = build_scenario("burst", 0)
    fast, fast_engine = _counted_run(wl, policy, contract, profile, True)
    slow, slow_engine = _counted_run(wl, policy, contract, profile, False)
    summed = not fast.scheduler.policy.reads_run_steps()
    assert summed == (policy in ("fifo", "sjf", "priority"))
    assert (fast.recorder.num_counted_runs > 0) == summed and slow.recorder.num_counted_runs == 0
    assert fast.scheduler.num_fast_forwarded_steps > 0
    assert [request_record(r) for r in fast.requests] == [request_record(r) for r in slow.requests]
    assert (fast.end_s, fast.recorder.num_steps, fast_engine.busy_s) == \
        (slow.end_s, slow.recorder.num_steps, slow_engine.busy_s)


@pytest.mark.parametrize("profile_name", [None, "vtc-a10g-llama2-7b"])
def test_a_summed_decode_run_is_the_listed_one(profile_name):
    cost = load_profile(profile_name).cost
    for ctx, n, now, stop_s, k_max in [(0, 1, 0.0, float("inf"), 1), (5000, 37, 12.5, 13.0, 10_000),
                                       (123_456, 250, 3.0, float("inf"), 700), (10, 3, 5.0, 5.0, 50)]:
        ends, durations = cost.decode_run(ctx, n, now, stop_s, k_max)
        busy = 0.25
        for dt in durations:
            busy += dt
        expected = (len(ends), ends[-1], busy, durations[-1]) if ends else (0, now, 0.25, 0.0)
        assert cost.decode_run_end(ctx, n, now, stop_s, k_max, 0.25) == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rows_strategy, policy=st.sampled_from(["fifo", "sjf", "priority"]), kv_tokens=st.integers(1500, 20000),
       roofline=st.booleans())
def test_summed_runs_exact_on_random_workloads(rows, policy, kv_tokens, roofline):
    """The summed decode runs (no timeline, a policy that reads no step times) against
    stepping, on random workloads with a small pool (evictions, swaps) and either cost form."""
    contract = parse_contract({**_ODD, "engine": {"prefill_token_budget": 256, "decode_token_budget": 16,
                                                  "chunk_size": 128, "max_running": 8}})
    if roofline:
        prof = Profile(**{**load_profile(None).model_dump(), "kv_capacity_tokens": kv_tokens * 4,
                          "swap_capacity_tokens": 2000})
    else:
        prof = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005,
                       decode_base_s=0.01, decode_seq_s=1e-4, kv_capacity_tokens=kv_tokens, block_size=16,
                       swap_capacity_tokens=2000)
    trace = tuple(TraceRow(f"r{i}", t, ten, p, o, klass=k, max_tokens=m)
                  for i, (t, ten, p, o, k, m) in enumerate(sorted(rows, key=lambda x: x[0])))
    wl = Workload("random", trace)
    fast, fast_engine = _counted_run(wl, policy, contract, prof, True)
    slow, slow_engine = _counted_run(wl, policy, contract, prof, False)
    assert [request_record(r) for r in fast.requests] == [request_record(r) for r in slow.requests]
    assert (fast.end_s, fast.recorder.num_steps, fast_engine.busy_s, fast.scheduler.num_preemptions) == \
        (slow.end_s, slow.recorder.num_steps, slow_engine.busy_s, slow.scheduler.num_preemptions)
    assert (fast.recorder.num_counted_runs > 0) == (fast.scheduler.num_fast_forwarded_steps > 0)
