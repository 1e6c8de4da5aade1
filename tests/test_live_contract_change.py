"""A contract changed under a running scheduler (what serve/gateway do on a live reload):
every field holds for what is decided from then on, nothing queued or running is lost or
ended, and the policy's derived state equals what a fresh bind to the new contract derives."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.runtime.intake import make_request
from tokenfair.core.kv import BlockPool
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.ordering import live
from tokenfair.sched.predictor import OnlinePredictor
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import SimEngine
from tokenfair.workloads.workload import TraceRow

LIVE_REQUEST_FIELDS = ("klass", "priority", "aging_rate", "max_wait_s", "preemptible", "ttft_slo_s", "tpot_slo_s",
                       "deadline_s", "order_deadline_s")
PROFILE = Profile(name="tiny", kind="linear", prefill_token_s=1e-4, prefill_batch_s=0.005, decode_base_s=0.01,
                  decode_seq_s=1e-4, kv_capacity_tokens=6000, block_size=16, swap_capacity_tokens=2000)
BASE = {
    "version": "v1",
    "tenants": {"a": {"weight": 2, "min_share": 0.3, "max_queued": 50},
                "b": {"weight": 1, "max_concurrency": 3, "rate_limit": {"tokens_per_s": 2000, "burst_tokens": 3000}}},
    "classes": {"interactive": {"priority": 20, "aging_rate": 1, "max_wait_s": 5, "tpot_slo_s": 0.05},
                "batch": {"priority": 0, "aging_rate": 0.5, "min_share": 0.1},
                "realtime": {"priority": 30, "preemptible": False}},
    "engine": {"prefill_token_budget": 256, "decode_token_budget": 16, "chunk_size": 128, "max_running": 6},
}


def changed(**over) -> dict:
    """BASE with every section changed (or as ``over`` says)."""
    d = {
        "version": "v2",
        "tenants": {"a": {"weight": 1, "max_queued": 50},                               # loses its min share
                    "b": {"weight": 3, "min_share": 0.4, "rate_limit": {"tokens_per_s": 500, "burst_tokens": 800}},
                    "c": {"weight": 0.5}},                                              # a new tenant
        "default_tenant": {"weight": 0.25},
        "classes": {"interactive": {"priority": 20, "aging_rate": 1, "max_wait_s": 9, "tpot_slo_s": 0.02,
                                    "min_share": 0.2},                                  # gains a min share
                    "batch": {"priority": 5, "aging_rate": 0.5},                        # loses it
                    "realtime": {"priority": 30, "preemptible": False}},
        "costs": {"prefill_token": 0.5, "decode_token": 3.0},
        "engine": {"prefill_token_budget": 512, "decode_token_budget": 32, "chunk_size": 64, "max_running": 3,
                   "max_long_prefills_per_tenant": 2},
        "preemption": {"mode": "recompute", "max_per_request": 1, "cooldown_s": 0.5},
        "borrowing": {"enabled": False},
        "admission": {"shed_over_max_wait": False, "headroom_kv_fraction": 0.2, "headroom_slot_fraction": 0.3},
    }
    d.update(over)
    return d


def rows(n: int = 60) -> list[TraceRow]:
    out = []
    for i in range(n):
        tenant = "abd"[i % 3]                      # d: not in the contract, the default template
        klass = ["interactive", "batch", None][i % 3 if i % 2 else 0]
        out.append(TraceRow(f"r{i}", i * 0.01, tenant, 40 + (i * 37) % 400, 5 + (i * 13) % 40, klass=klass))
    return out


class SwitchingEngine:
    """The simulated engine; before step ``at`` the contract changes, as LiveContract.apply does."""

    def __init__(self, sched, new, at: int):
        self.sched, self.new, self.at = sched, new, at
        self.sim = SimEngine(PROFILE)
        self.steps, self.now = 0, 0.0
        self.snapshot = None
        self.after: list[tuple[int, int]] = []      # after the change: (running, preempted) per step
        self.tightest: set[float] = set()            # after the change: the TPOT SLOs shaped for

    def add(self, req, row):
        """Called just before the scheduler gets ``req``: after the change, its class parameters
        are the live contract's, as service.submit takes them (the loop's intake holds v1)."""
        self.sim.add(req, row.output_tokens)
        self.now = max(self.now, req.arrival_s)
        if self.snapshot is not None:
            fresh, _ = make_request(row, req.seq, self.sched.contract)
            for f in LIVE_REQUEST_FIELDS:
                setattr(req, f, getattr(fresh, f))

    def forget(self, req):
        self.sim.forget(req)

    def execute(self, out):
        s = self.sched
        if len(s.running) <= s.contract.engine.max_running:   # a lowered max_running: no eviction for it
            s.check_invariants()
        self.steps += 1
        if self.steps == self.at:
            waiting = [r for r in self.all_requests() if r.status in (Status.WAITING, Status.SWAPPED)]
            self.snapshot = (len(waiting), len(s.running))
            s.set_contract(self.new)
            s.policy.on_contract_change(self.new, self.now)
            check_derived(s.policy, self.new)
        if self.snapshot is not None:
            self.after.append((len(s.running), len(out.preempted)))
            slos = getattr(s.policy, "decode_slos", None)
            if slos is not None and slos.tightest() is not None:
                self.tightest.add(slos.tightest())
        res = self.sim.execute(out)
        self.now += res.duration_s
        return res

    def all_requests(self):
        p = self.sched.policy
        if hasattr(p, "tenants") and isinstance(p.tenants, dict):
            return [e[-1] for t in p.tenants.values() for q in t.queues.values() for e in q.h if live(e)]
        return []


def check_derived(p, new) -> None:
    """What the policy's parts derived of the contract equals a fresh bind's; tenant
    aggregates agree."""
    if not (hasattr(p, "tenants") and isinstance(p.tenants, dict)):
        return
    fresh = make_policy("fair")
    fresh.bind(new, PROFILE, BlockPool(PROFILE.num_blocks, PROFILE.block_size), OnlinePredictor())
    for part, name in (("costs", "wp"), ("costs", "wd"), ("costs", "integral"), ("forecaster", "prefill_rate"),
                       ("picker", "min_grace_s"), ("headroom", "headroom_blocks"), ("headroom", "headroom_slots"),
                       ("queue", "class_min"), ("wfq", "credit"), ("admission", "max_running")):
        assert getattr(getattr(p, part), name) == getattr(getattr(fresh, part), name), (part, name)
    assert p.can_fast_forward() == fresh.can_fast_forward()
    assert p.preemption.spec == new.preemption and p.contract == new
    for part in ("admission", "roster", "queue", "meter", "headroom", "forecaster", "accounting", "shaper",
                 "urgency"):
        assert getattr(p, part).contract == new, part
    roster, queue, meter = p.roster, p.queue, p.meter
    ts = list(p.tenants.values())
    for t in ts:
        assert t.spec == new.tenant(t.name) and t.weight == new.tenant(t.name).weight
    assert roster.total_weight == pytest.approx(sum(t.weight for t in ts))
    assert roster.active_weight == pytest.approx(sum(t.weight for t in ts if t.active))
    assert p.wfq.backlogged_weight == pytest.approx(sum(t.weight for t in ts if t.num_waiting))
    assert {t.name for t in roster.guaranteed} == {t.name for t in ts if t.spec.min_share > 0}
    assert {t.name for t in roster.rate_limited} == {t.name for t in ts if t.spec.rate_limit is not None}
    assert {t.name for t in p.admission.owners} == {t.name for t in ts if p.admission.reserved_slots(t) > 0}
    assert set(queue.class_heaps) == set(queue.class_min) == set(queue.class_waiting) == set(meter.class_recent)
    for k, h in queue.class_heaps.items():
        queued = {id(e[-1]) for t in ts if k in t.queues for e in t.queues[k].h if live(e)}
        assert {id(e[-1]) for e in h.h if live(e)} == queued and queue.class_waiting[k] == len(queued)
    for t in ts:
        for k, q in t.queues.items():
            assert t.queued_cost.get(k, 0.0) == pytest.approx(sum(p.costs.predicted(e[-1]) for e in q.h if live(e)))


def run_switch(policy: str, new: dict, at: int, trace=None):
    trace = trace or rows()
    c1, c2 = parse_contract(BASE), parse_contract(new)
    sched = IterationScheduler(make_policy(policy), c1, PROFILE)
    engine = SwitchingEngine(sched, c2, at)
    res = run(trace, c1, sched, engine, VirtualClock())
    assert engine.snapshot is not None, "the contract never changed (the run ended first)"
    assert len(res.requests) == len(trace) and len({r.request_id for r in res.requests}) == len(trace)
    assert not sched.running and sched.policy.num_waiting() == 0 and sched.pool.num_free == sched.pool.num_blocks
    return res, sched, engine


def test_fair_takes_every_field_live_and_loses_nothing():
    res, sched, engine = run_switch("fair", changed(), at=8)
    waiting, running = engine.snapshot
    assert waiting >= 5 and running >= 3                  # the change met a queue and running work
    assert all(r.status is Status.FINISHED for r in res.requests), {r.reason for r in res.requests}
    p = sched.policy
    check_derived(p, parse_contract(changed()))
    assert p.tenants["b"].weight == 3 and p.tenants["d"].weight == 0.25     # named, and the default template
    # requests keep the class parameters they were admitted with; later ones have the new ones
    assert {r.max_wait_s for r in res.requests if r.klass == "interactive"} == {5.0, 9.0}
    # the TPOT shaping follows: once v2's decodes run, the prefill budget is shaped to 0.02 s
    assert 0.02 in engine.tightest


def test_new_min_share_class_is_served_from_its_reservation_queue():
    """A class that gains a min share while its requests queue is guaranteed from then on."""
    new = changed(tenants=BASE["tenants"], costs={}, engine=BASE["engine"])
    res, sched, _ = run_switch("fair", new, at=4)
    assert "interactive" in sched.policy.queue.class_min and "batch" not in sched.policy.queue.class_min
    assert all(r.status is Status.FINISHED for r in res.requests)


def test_lower_max_running_stops_admissions_and_evicts_nothing():
    new = dict(BASE, version="v2", engine={**BASE["engine"], "max_running": 1})
    res, sched, engine = run_switch("fair", new, at=6)
    assert engine.snapshot[1] > 1
    assert all(r.status is Status.FINISHED for r in res.requests)
    # until the running requests drain below the new bound: no admission, no eviction
    drain = [x for x in engine.after[:next(i for i, (n, _) in enumerate(engine.after) if n <= 1) + 1]]
    assert len(drain) > 1 and all(a[0] >= b[0] for a, b in zip(drain, drain[1:])) and not any(p for _, p in drain)
    assert max(n for n, _ in engine.after[len(drain):]) == 1          # then one at a time


def test_vtc_takes_the_new_weights():
    new = dict(BASE, version="v2", tenants={"a": {"weight": 8}, "b": {"weight": 1}})
    res, sched, _ = run_switch("vtc", new, at=5)
    p = sched.policy
    before = dict(p.counters)
    p.on_admit(Request("x", 10_000, "a", "interactive", 0.0, 100, 10), 0.0)     # a fresh request of tenant a
    assert p.counters["a"] - before["a"] == pytest.approx(100 * p.w_p / 8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["fifo", "sjf", "priority", "vtc", "fair"]), at=st.integers(1, 40),
       max_running=st.integers(1, 8), wp=st.sampled_from([0.0, 0.5, 1.0, 2.0]), class_min=st.booleans(),
       weight=st.floats(0.1, 5))
def test_any_change_at_any_step_ends_every_request_once(policy, at, max_running, wp, class_min, weight):
    new = changed(engine={**BASE["engine"], "max_running": max_running},
                  costs={"prefill_token": wp, "decode_token": 2.0},
                  tenants={"a": {"weight": weight}, "b": {"weight": 1, "min_share": 0.2}})
    if not class_min:
        new["classes"] = BASE["classes"]
    try:
        res, _, _ = run_switch(policy, new, at=at)
    except AssertionError as err:
        if "never changed" in str(err):
            return
        raise
    for r in res.requests:
        assert r.status.is_terminal and r.reason


def test_token_buckets_follow_the_new_rate_limits():
    """A bucket is refilled to now under the old rate, then capped at the new burst; a tenant
    that gains a limit starts with a full bucket; one that loses it stops counting."""
    p = make_policy("fair")
    c1 = parse_contract(BASE)
    p.bind(c1, PROFILE, BlockPool(PROFILE.num_blocks, PROFILE.block_size), OnlinePredictor())
    a, b = p.tenant("a", 0.0), p.tenant("b", 0.0)
    b.bucket = 1000.0                                  # 2000 tokens/s: full (3000) again by t = 1 s
    new = parse_contract(changed(tenants={"a": {"rate_limit": {"tokens_per_s": 10, "burst_tokens": 50}},
                                          "b": {"rate_limit": {"tokens_per_s": 500, "burst_tokens": 800}}}))
    p.on_contract_change(new, 1.0)
    assert b.bucket == 800.0 and b.bucket_t == 1.0
    assert a.bucket == 50.0 and [t.name for t in p.roster.rate_limited] == ["a", "b"]
    p.on_contract_change(parse_contract(changed(tenants={"a": {}, "b": {}})), 2.0)
    assert a.bucket == b.bucket == 0.0 and p.roster.rate_limited == []
