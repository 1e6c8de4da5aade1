"""The fair policy's layers, each pinned on a small hand-made workload."""

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.core.reasons import ReasonCode
from tokenfair.runtime.intake import make_request
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.core.request import Status
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import SimEngine
from tokenfair.workloads.workload import TraceRow

PROFILE = Profile(name="t", kind="linear", prefill_token_s=2e-4, prefill_batch_s=0.01, decode_base_s=0.015,
                  decode_seq_s=2e-4, kv_capacity_tokens=40_000, block_size=16)


def _sim(rows, contract, profile=PROFILE, policy="fair", on_step=None):
    sched = IterationScheduler(make_policy(policy), contract, profile)
    sim = SimEngine(profile)

    class E:
        def add(self, req, row):
            sim.add(req, row.output_tokens)

        def execute(self, out):
            if on_step:
                on_step(sched)
            return sim.execute(out)

        def forget(self, req):
            sim.forget(req)

    return run(rows, contract, sched, E(), VirtualClock()), sched


def _backlogged(tenants, n, prompt=400, out=100, weights=None, max_tokens=None):
    return [TraceRow(f"{t}-{i}", 0.0, t, prompt, out, max_tokens=max_tokens) for i in range(n) for t in tenants]


def test_weighted_shares_and_counter_bound():
    c = parse_contract({"tenants": {"a": {"weight": 2}, "b": {"weight": 1}},
                        "classes": {"interactive": {"priority": 0}},
                        "engine": {"prefill_token_budget": 512, "decode_token_budget": 64, "chunk_size": 256,
                                   "max_running": 16},
                        "admission": {"shed_over_max_wait": False}})
    rows = _backlogged(["a", "b"], 150, max_tokens=100)
    # wfq.py's bound, as its docstring states it: D = max_r c_max(r) / w_min + C / w_min with
    # c_max = w_p * prompt + w_d * max_tokens (default cost weights 1 and 2) and C the credit
    w_min, credit = 1.0, c.engine.prefill_token_budget * c.costs.prefill_token
    bound = (c.costs.prefill_token * 400 + c.costs.decode_token * 100) / w_min + credit / w_min
    gaps = []

    def check(sched):
        p = sched.policy
        if len(p.tenants) == 2 and all(t.num_waiting for t in p.tenants.values()):
            p.wfq.check_bound(list(p.tenants.values()), bound)
            gaps.append(abs(p.tenants["a"].vtime - p.tenants["b"].vtime))

    res, sched = _sim(rows, c, on_step=check)
    assert len(gaps) > 100 and max(gaps) > 0      # checked while both were backlogged
    # while both are backlogged, service splits 2:1 (in cost units)
    tl = res.recorder.to_json()
    a, b = tl["tenant_service"]["a"], tl["tenant_service"]["b"]
    both_until = min(max(r.scheduled_s for r in res.requests if r.tenant == t) for t in "ab")
    sa = sum(v for k, v in a.items() if k < both_until - 1)
    sb = sum(v for k, v in b.items() if k < both_until - 1)
    assert sa / (sa + sb) == pytest.approx(2 / 3, abs=0.05)


def test_returning_tenant_neither_loses_place_nor_banks_credit():
    c = parse_contract({"classes": {"interactive": {"priority": 0}},
                        "engine": {"prefill_token_budget": 512, "decode_token_budget": 32, "chunk_size": 256,
                                   "max_running": 4},
                        "admission": {"shed_over_max_wait": False}})
    rows = _backlogged(["a"], 200) + [TraceRow(f"b-{i}", 30.0, "b", 400, 100) for i in range(40)]
    rows.sort(key=lambda r: r.arrival_s)
    seen = {}

    def watch(sched):
        p = sched.policy
        if "b" in p.tenants and "b_lift" not in seen:
            seen["b_lift"] = (p.tenants["b"].vtime, p.wfq.vnow, p.wfq.credit)

    res, sched = _sim(rows, c, on_step=watch)
    vt, vnow, credit = seen["b_lift"]
    assert vt >= vnow - credit - 1e-6            # no unlimited banked credit after 30 s idle
    b_first = min(r.scheduled_s for r in res.requests if r.tenant == "b")
    first_free_slot = min(r.finish_s for r in res.requests if r.finish_s >= 30.0)
    assert b_first == pytest.approx(first_free_slot)   # it takes the first slot that frees up
    order = [t for _, t in sorted((r.scheduled_s, r.tenant) for r in res.requests if r.scheduled_s >= b_first)[:20]]
    assert order[0] == "b"                       # and is ahead of the backlog: it lost no place
    # b's 40 queued requests make it no lighter than a (its demand counts), so equal weights
    # and equal costs then alternate: a lead of at most C, no burst on banked credit
    assert order.count("b") == 10, order
    a_after = [r for r in res.requests if r.tenant == "a" and r.scheduled_s and 30 < r.scheduled_s < 60]
    assert a_after, "the backlogged tenant keeps being served too"


def test_queue_bound_rejects_with_reason():
    c = parse_contract({"tenants": {"a": {"max_queued": 5}}, "engine": {"max_running": 1}})
    res, _ = _sim(_backlogged(["a"], 20), c)
    rejected = [r for r in res.requests if r.status is Status.REJECTED]
    assert len(rejected) >= 10 and all(r.reason.startswith("queue_full") for r in rejected)


def test_concurrency_cap_and_kv_quota():
    c = parse_contract({"tenants": {"a": {"max_concurrency": 2}, "b": {"kv_quota_tokens": 1200}}})
    peak = {"a": 0, "b_kv": 0}

    def check(sched):
        run_a = sum(1 for r in sched.running if r.tenant == "a")
        peak["a"] = max(peak["a"], run_a)
        kv_b = sum(r.blocks for r in sched.running if r.tenant == "b")
        peak["b_kv"] = max(peak["b_kv"], kv_b)

    res, _ = _sim(_backlogged(["a", "b"], 10, prompt=500, out=20), c, on_step=check)
    assert peak["a"] == 2
    # admission keeps b within its quota: a new request is admitted only if prompt + predicted
    # output fit, so b runs at most two 500-token requests at once
    assert peak["b_kv"] * 16 <= 1200 + 2 * 16 * 2 + 20 * 2
    assert all(r.status is Status.FINISHED for r in res.requests)


def test_rate_limit_spaces_admissions():
    c = parse_contract({"tenants": {"a": {"rate_limit": {"tokens_per_s": 1000, "burst_tokens": 1000}}}})
    res, _ = _sim(_backlogged(["a"], 6, prompt=400, out=50), c)
    starts = sorted(r.scheduled_s for r in res.requests)
    # each request costs ~400 + 2 * 50 predicted units: ~2 per second after the burst
    assert starts[-1] - starts[0] > 1.5
    assert all(r.status is Status.FINISHED for r in res.requests)


def test_infeasible_deadline_expires_fast_with_reason():
    c = parse_contract({"classes": {"interactive": {"priority": 0}},
                        "engine": {"max_running": 1, "prefill_token_budget": 512, "chunk_size": 512}})
    rows = [TraceRow("long", 0.0, "a", 500, 400)] + [TraceRow(f"d{i}", 0.01, "b", 300, 50, deadline_s=1.0)
                                                      for i in range(3)]
    res, _ = _sim(rows, c)
    st = {r.request_id: r for r in res.requests}
    expired = [r for r in st.values() if r.status is Status.EXPIRED]
    assert expired and all("deadline_infeasible" in r.reason for r in expired)
    assert all(r.finish_s <= r.deadline_s + 1e-9 for r in expired)   # failed before the deadline passed
    assert st["long"].status is Status.FINISHED


def test_client_can_only_lower_priority_and_delay_deadline():
    c = parse_contract({"classes": {"interactive": {"priority": 20, "deadline_s": 10},
                                    "batch": {"priority": 0}},
                        "tenants": {"a": {"classes": ["batch"], "default_class": "batch"}}})
    req, reject = make_request(TraceRow("x", 1.0, "b", 10, 5, klass="interactive", priority=99, deadline_s=2), 0, c)
    assert reject is None and req.priority == 20 and req.deadline_s == 11.0
    req, _ = make_request(TraceRow("y", 1.0, "b", 10, 5, klass="interactive", priority=5, deadline_s=30), 1, c)
    assert req.priority == 5 and req.deadline_s == 31.0
    _, reject = make_request(TraceRow("z", 1.0, "a", 10, 5, klass="interactive"), 2, c)
    assert reject is not None and reject.code is ReasonCode.CLASS_NOT_ALLOWED


def test_aging_lets_low_class_through_and_overdue_served():
    c = parse_contract({"classes": {"hi": {"priority": 20, "aging_rate": 1.0, "max_wait_s": 30},
                                    "lo": {"priority": 0, "aging_rate": 1.0, "max_wait_s": 4}},
                        "default_class": "hi", "engine": {"max_running": 2},
                        "admission": {"shed_over_max_wait": False}})
    rows = [TraceRow(f"h{i}", i * 0.2, "a", 300, 60, klass="hi") for i in range(150)]
    rows += [TraceRow("low", 0.5, "a", 300, 60, klass="lo")]
    rows.sort(key=lambda r: r.arrival_s)
    res, _ = _sim(rows, c)
    low = next(r for r in res.requests if r.request_id == "low")
    assert low.status is Status.FINISHED and low.scheduled_s - low.arrival_s <= 4.5


def test_preemption_respects_limits_and_chooses_cheaper_mode():
    c = parse_contract({"engine": {"max_running": 8, "prefill_token_budget": 512, "chunk_size": 256},
                        "preemption": {"mode": "auto", "max_per_request": 1, "cooldown_s": 0.5}})
    small_kv = Profile(name="s", kind="linear", prefill_token_s=2e-4, prefill_batch_s=0.01, decode_base_s=0.015,
                       decode_seq_s=2e-4, kv_capacity_tokens=3000, block_size=16, swap_capacity_tokens=4000,
                       kv_bytes_per_token=1e3, swap_bandwidth=1e9)
    rows = [TraceRow(f"r{i}", i * 0.05, "a" if i % 2 else "b", 300, 400) for i in range(12)]
    res, sched = _sim(rows, c, profile=small_kv)
    assert sched.num_preemptions > 0
    assert all(r.status is Status.FINISHED for r in res.requests)
    # swap of 1 kB/token at 1 GB/s is far cheaper than recomputing: auto picks swap
    assert sum(r.swapped_bytes for r in res.requests) > 0
    assert sum(r.recomputed_tokens for r in res.requests) == 0


def test_in_queue_order_is_swappable():
    c = parse_contract({})
    assert make_policy("fair:order=fifo").order == "fifo"
    with pytest.raises(ValueError, match="order must be"):
        make_policy("fair:order=random").bind(c, PROFILE, None, None)


def test_policy_spec_options_arrive_as_strings():
    # "fair:share_tau_s=5" passes "5": the compiled policy took only a float once
    p = make_policy("fair:share_tau_s=5")
    assert p.share_tau_s == 5.0 and isinstance(p.share_tau_s, float)
    with pytest.raises(ValueError, match="bad option"):
        make_policy("fair:share_tau_s=soon")


@pytest.mark.parametrize("value", ["0", "-3", "0.01", "nan", "inf", "soon", ""])
def test_a_share_time_constant_out_of_range_is_refused_before_the_run(value):
    """``share_tau_s`` divides every statistic of the share meter (0 crashed the run with a
    ZeroDivisionError; a negative, NaN or infinite one ran to garbage): it is refused at the
    spec, naming the option and what it takes."""
    with pytest.raises(ValueError, match=r"fair: share_tau_s must be a finite number >= 0.1, got") as err:
        make_policy(f"fair:share_tau_s={value}")
    assert "fair:share_tau_s=" in str(err.value)
    assert make_policy("fair:share_tau_s=0.1").share_tau_s == 0.1


@pytest.mark.parametrize("spec, takes", [("fair:foo=1", "fair takes: order, share_tau_s"),
                                         ("vtc:x=1", "vtc takes: input_weight, output_weight"),
                                         ("fifo:x=1", "fifo takes: no options")])
def test_an_unknown_policy_option_names_the_options_the_policy_takes(spec, takes):
    with pytest.raises(ValueError, match=f"unknown option 'x'|unknown option 'foo'") as err:
        make_policy(spec)
    assert takes in str(err.value) and spec in str(err.value), str(err.value)


def test_a_policy_factory_taking_any_keyword_gets_its_options_unchecked():
    from tokenfair.sched.registry import POLICIES, register
    seen = {}

    def factory(**opts):
        seen.update(opts)
        return make_policy("fifo")
    register("any-options", factory)
    try:
        make_policy("any-options:x=1,y=2")
    finally:
        del POLICIES["any-options"]
    assert seen == {"x": "1", "y": "2"}


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_vtc_cost_weights_must_be_finite_and_not_negative(value):
    with pytest.raises(ValueError, match=f"vtc: output_weight must be a finite number >= 0, got '{value}'"):
        make_policy(f"vtc:output_weight={value}")
    assert make_policy("vtc:input_weight=0,output_weight=3").w_q == 3.0


def test_kv_block_seconds_are_charged_when_weighted():
    base = {"classes": {"interactive": {"priority": 0}}, "admission": {"shed_over_max_wait": False}}
    rows = [TraceRow("long", 0.0, "a", 3000, 50), TraceRow("short", 0.0, "b", 100, 50)]
    vt = {}
    for w in (0.0, 1.0):
        res, sched = _sim(rows, parse_contract({**base, "costs": {"kv_block_s": w}}))
        vt[w] = {n: t.vtime for n, t in sched.policy.tenants.items()}
    assert vt[0.0]["a"] < vt[1.0]["a"]                       # a held ~190 blocks for seconds
    assert vt[1.0]["a"] - vt[0.0]["a"] > 10 * (vt[1.0]["b"] - vt[0.0]["b"])


def test_borrowing_reclaim_by_preemption():
    contract = {"tenants": {"owner": {"min_share": 0.5}, "borrower": {}},
                "classes": {"interactive": {"priority": 0}},
                "engine": {"max_running": 4, "prefill_token_budget": 512, "chunk_size": 256},
                "preemption": {"max_per_request": 3, "cooldown_s": 0.0, "min_benefit_ratio": 0.01},
                "admission": {"shed_over_max_wait": False}}
    rows = [TraceRow(f"b{i}", 0.0, "borrower", 200, 400) for i in range(4)]
    rows += [TraceRow(f"o{i}", 1.0, "owner", 200, 50) for i in range(2)]
    starts = {}
    for mode in ("stop_admitting", "preempt"):
        res, sched = _sim(rows, parse_contract({**contract, "borrowing": {"enabled": True, "reclaim": mode}}))
        starts[mode] = min(r.scheduled_s for r in res.requests if r.tenant == "owner")
        preempted = sum(r.num_preemptions for r in res.requests if r.tenant == "borrower")
        assert (preempted > 0) == (mode == "preempt")
        assert all(r.status is Status.FINISHED for r in res.requests)
    assert starts["preempt"] < starts["stop_admitting"] - 1.0


def test_prompt_larger_than_its_kv_share_is_not_starved_by_reservations():
    # four tenants share 40K tokens of KV (10K each); three keep a few 2K-token requests
    # decoding for two minutes, so reservations for their recent KV peaks always exist.  A
    # fourth tenant's single 16K prompt is beyond its share, but it is owed service: it must
    # start within seconds, not when the others go idle.
    fast = Profile(name="t", kind="linear", prefill_token_s=2e-5, prefill_batch_s=0.01, decode_base_s=0.015,
                   decode_seq_s=2e-4, kv_capacity_tokens=40_000, block_size=16)
    c = parse_contract({"classes": {"interactive": {"priority": 0}},
                        "engine": {"prefill_token_budget": 1024, "decode_token_budget": 64, "chunk_size": 512,
                                   "max_running": 16},
                        "admission": {"shed_over_max_wait": False}})
    rows = [TraceRow(f"{t}-{i}", i * 2.0, t, 2000, 300) for i in range(60) for t in ("a", "b", "c")]
    rows.append(TraceRow("big-0", 20.0, "big", 16_000, 10))
    rows.sort(key=lambda r: (r.arrival_s, r.request_id))
    res, _ = _sim(rows, c, profile=fast)
    big = next(r for r in res.requests if r.tenant == "big")
    last_other = max(r.finish_s for r in res.requests if r.tenant != "big")
    assert big.status is Status.FINISHED
    assert big.scheduled_s - big.arrival_s < 10.0, (big.scheduled_s, last_other)
