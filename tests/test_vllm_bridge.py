"""The vLLM plugin's policy side (``integrations/vllm/bridge.py``, no vLLM needed): vLLM-like
request objects driven through the bridge by a tiny stand-in for vLLM's admission loop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.reasons import ReasonCode
from tokenfair.integrations.vllm.bridge import PolicyBridge, identity
from tokenfair.integrations.vllm.compat import VllmInterfaceError, check_vllm_version
from tokenfair.integrations.vllm.settings import (VLLM_CPU_SMOLLM2, Settings, SettingsError, engine_budgets,
                                                  load_settings)

CONTRACT = {
    "version": "bridge-test",
    "tenants": {"a": {"weight": 2.0}, "b": {"weight": 1.0}, "capped": {"max_concurrency": 1}},
    "classes": {"batch": {"priority": 0}, "interactive": {"priority": 20}},
    "default_class": "batch",
    "admission": {"shed_over_max_wait": False},
}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def vreq(rid: str, tenant: str | None, prompt: int = 32, max_tokens: int = 8, klass: str | None = None):
    extra = {k: v for k, v in (("tenant", tenant), ("class", klass)) if v is not None}
    r = SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_computed_tokens=0, num_output_tokens=0,
                        max_tokens=max_tokens, sampling_params=SimpleNamespace(extra_args=extra), priority=0,
                        num_preemptions=0, status="WAITING", done=False)
    r.is_finished = lambda: r.done
    return r


def bridge(contract=CONTRACT, clock=None) -> PolicyBridge:
    c = engine_budgets(parse_contract(contract), max_running=6, token_budget=256, chunk_cap=0)
    prof = VLLM_CPU_SMOLLM2.model_copy(update={"kv_capacity_tokens": 4096})
    return PolicyBridge(Settings(c, prof, "fair", "<test>"), clock=clock or Clock())


def admit_next(b: PolicyBridge, running: list, blocked: set) -> object | None:
    """What vLLM's admission loop does with PolicyQueue: the eligible head, popped."""
    now = b.clock()
    while True:
        req = b.policy.pick(now, blocked)
        if req is None:
            return None
        if b.eligible(req, len(running), now):
            b.policy.take(req)
            b.admitted(req, now)
            running.append(req.payload)
            return req.payload
        blocked.add(req.tenant)


def run_step(b: PolicyBridge, running: list, clock: Clock, served: dict | None = None) -> None:
    """Every running request computes its prompt in one step, then one token per step
    (``served``: cost per tenant added, prefill 1 and decode 2 per token)."""
    b.before_step(running, b.pool.num_blocks - sum(-(-v.num_computed_tokens // 16) for v in running))
    scheduled = {}
    for v in running:
        if v.num_computed_tokens < v.num_prompt_tokens:
            scheduled[v.request_id] = v.num_prompt_tokens - v.num_computed_tokens
            v.num_computed_tokens = v.num_prompt_tokens
        else:
            scheduled[v.request_id] = 1
            v.num_computed_tokens += 1
        v.num_output_tokens += 1
        v.done = v.num_output_tokens >= v.max_tokens
        if served is not None:
            t = v.sampling_params.extra_args["tenant"]
            served[t] = served.get(t, 0) + (scheduled[v.request_id] if scheduled[v.request_id] > 1 else 2)
    clock.t += 0.05
    b.after_step(scheduled)
    running[:] = [v for v in running if not v.done]


def test_identity_from_vllm_xargs():
    assert identity(vreq("1", "acme", klass="batch")) == ("acme", "batch")
    assert identity(vreq("2", None)) == ("default", None)
    assert identity(SimpleNamespace(sampling_params=SimpleNamespace(extra_args=None))) == ("default", None)


def test_weighted_service_while_both_backlogged_and_charges_settle():
    clock = Clock()
    b = bridge(clock=clock)
    reqs = []
    for i in range(24):
        reqs.append(b.arrive(vreq(f"a{i}", "a")))
        reqs.append(b.arrive(vreq(f"b{i}", "b")))
    running: list = []
    served: dict = {}
    tenants = b.policy.tenants
    while all(tenants[t].num_waiting for t in ("a", "b")):      # both backlogged
        blocked: set = set()
        while len(running) < 6 and admit_next(b, running, blocked) is not None:
            pass
        run_step(b, running, clock, served)
    # a (weight 2) got two thirds of the service while both were backlogged
    share = served["a"] / (served["a"] + served["b"])
    assert abs(share - 2 / 3) <= 0.05 * 2 / 3, served
    while running or b.policy.num_waiting():
        blocked = set()
        while len(running) < 6 and admit_next(b, running, blocked) is not None:
            pass
        run_step(b, running, clock)
    assert not b.by_id and b.counts["finished"] == 48
    # predicted cost charged at admission, corrected to the actual cost, the rest refunded
    assert all(r.status.value == "finished" and r.num_output == 8 for r in reqs)
    assert all(r.charged == pytest.approx(r.used_cost) == 32 + 2 * 8 for r in reqs)
    for name in ("a", "b"):
        t = b.policy.tenants[name]
        assert not t.running and t.num_waiting == 0


def test_concurrency_quota_holds_requests_back_without_losing_them():
    clock = Clock()
    b = bridge(clock=clock)
    for i in range(3):
        b.arrive(vreq(f"c{i}", "capped"))
    running: list = []
    assert admit_next(b, running, set()) is not None
    blocked: set = set()
    assert admit_next(b, running, blocked) is None and blocked == {"capped"}   # held back, still queued
    assert b.policy.num_waiting() == 2 and b.counts["held_back"] >= 1
    seen = 1
    while running or b.policy.num_waiting():
        while admit_next(b, running, set()) is not None:
            seen += 1
        assert len(running) <= 1
        run_step(b, running, clock)
    assert seen == 3 and b.counts["finished"] == 3
    b.arrive(vreq("c3", "capped"))
    b.arrive(vreq("c4", "capped"))
    assert admit_next(b, running, set()) is not None
    held = b.policy.pick(clock.t, set())
    assert held is not None and not b.within_hard_limits(held, clock.t)   # a hard limit: never overridden


def test_victim_ranks_follow_the_policy():
    clock = Clock()
    b = bridge(clock=clock)
    for i in range(2):
        b.arrive(vreq(f"a{i}", "a", klass="interactive"))
        b.arrive(vreq(f"b{i}", "b"))
    running: list = []
    while admit_next(b, running, set()) is not None:
        pass
    run_step(b, running, clock)
    clock.t += 5.0                                      # past the preemption cool-down
    b.before_step(running, 100)
    victim = max(running, key=lambda v: (v.priority, 0))       # vLLM's priority-mode rule
    reqs = [b.by_id[v.request_id] for v in running]
    expected = b.policy.preemption.choose(reqs, clock.t, b.policy.urgency.overshare)
    assert victim.request_id == expected.request_id and victim.request_id.startswith("b")
    assert len({v.priority for v in running}) == len(running)


def test_rejected_class_and_bad_settings(tmp_path, monkeypatch):
    b = bridge(contract={**CONTRACT, "tenants": {**CONTRACT["tenants"], "a": {"classes": ["batch"]}}})
    assert b.arrive(vreq("x", "a", klass="interactive")) is None
    assert b.rejected["x"].code is ReasonCode.CLASS_NOT_ALLOWED and not b.by_id
    monkeypatch.delenv("TOKENFAIR_CONTRACT", raising=False)
    kw = dict(max_running=8, token_budget=512, chunk_cap=0, num_blocks=64, block_size=16)
    with pytest.raises(SettingsError, match="tokenfair_contract"):
        load_settings({}, **kw)
    with pytest.raises(SettingsError, match="nope.yaml"):
        load_settings({"tokenfair_contract": str(tmp_path / "nope.yaml")}, **kw)
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\nengine: {chunk_size: 256}\n")
    monkeypatch.setenv("TOKENFAIR_CONTRACT", str(path))
    s = load_settings({}, **kw)
    assert (s.contract.engine.max_running, s.contract.engine.prefill_token_budget, s.contract.engine.chunk_size) == (8, 512, 256)
    assert s.profile.num_blocks == 64 and s.policy == "fair"


def test_version_check_names_the_versions(monkeypatch):
    import sys
    fake = SimpleNamespace(__version__="0.1.0")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    with pytest.raises(VllmInterfaceError, match=r"built for vLLM 0\.32\.0; found vLLM 0\.1\.0"):
        check_vllm_version()


def test_prefill_budget_shaped_only_while_a_running_request_has_a_tpot_slo():
    contract = {**CONTRACT, "classes": {"batch": {"priority": 0},
                                        "interactive": {"priority": 20, "tpot_slo_s": 0.05}}}
    for klass, shaped in (("interactive", True), ("batch", False)):
        clock = Clock()
        b = bridge(contract=contract, clock=clock)
        for i in range(4):
            b.arrive(vreq(f"{klass}{i}", "a", prompt=32, max_tokens=50, klass=klass))
        running: list = []
        while admit_next(b, running, set()) is not None:
            pass
        run_step(b, running, clock)                   # prefill
        run_step(b, running, clock)                   # 4 decodes: the next budget sees them
        budget = b.before_step(running, 200)
        full = b.contract.engine.prefill_token_budget
        assert (budget < full) == shaped, (klass, budget, full)


URGENT_CONTRACT = {**CONTRACT, "tenants": {**CONTRACT["tenants"], "vip": {"classes": ["urgent"]}},
                   "classes": {**CONTRACT["classes"], "urgent": {"priority": 30, "max_wait_s": 1.0}}}


class FakeVllmScheduler:
    """What ``urgent.preempt_for_urgent`` uses of vLLM's scheduler; ``_preempt_request`` does
    what vLLM's does to the request and hands it back to the waiting queue (here the bridge)."""

    def __init__(self, b: PolicyBridge, running: list) -> None:
        self.tokenfair, self.running, self.max_num_running_reqs = b, running, 6
        self.preempted: list[str] = []

    def _preempt_request(self, v, timestamp: float) -> None:
        v.status, v.num_computed_tokens, v.num_output_tokens = "PREEMPTED", 0, 0
        v.num_preemptions += 1
        self.preempted.append(v.request_id)
        self.tokenfair.requeued(self.tokenfair.by_id[v.request_id], v, self.tokenfair.clock())


def test_an_overdue_waiting_request_evicts_the_policys_victim():
    """Six long batch requests fill the slots; a vip request (max_wait_s 1) waits.  Once it is
    overdue the policy's victim is evicted through vLLM's preemption path, the vip request is
    the head and can start; the victim waits again, nothing is lost; one eviction per cool-down."""
    from tokenfair.integrations.vllm.urgent import blocked_head, preempt_for_urgent
    clock = Clock()
    b = bridge(URGENT_CONTRACT, clock=clock)
    for i in range(6):
        b.arrive(vreq(f"a{i}", "a" if i % 2 else "b", max_tokens=400))
    running: list = []
    while admit_next(b, running, set()) is not None:
        pass
    for _ in range(3):
        run_step(b, running, clock)
    sched = FakeVllmScheduler(b, running)
    vip = b.arrive(vreq("vip", "vip", klass="urgent"))
    b.before_step(running, 100)
    assert blocked_head(b, len(running), 6, clock.t) is vip          # no free slot
    assert not preempt_for_urgent(sched, clock.t)                    # not overdue yet: it waits
    clock.t += 1.5
    assert preempt_for_urgent(sched, clock.t)
    assert len(running) == 5 and len(sched.preempted) == 1 and b.counts["urgent_preempted"] == 1
    victim = b.by_id[sched.preempted[0]]
    assert victim.status.value == "waiting" and victim.num_preemptions == 1 and victim.num_computed == 0
    assert b.policy.pick(clock.t, set()) is vip and blocked_head(b, len(running), 6, clock.t) is None
    admit_next(b, running, set())
    assert running[-1].request_id == "vip"
    assert not preempt_for_urgent(sched, clock.t)                    # nothing blocked and urgent now
    while running or b.policy.num_waiting():
        while len(running) < 6 and admit_next(b, running, set()) is not None:
            pass
        run_step(b, running, clock)
    assert b.counts["finished"] == 7 and not b.by_id


def test_step_log_writes_one_line_per_step(tmp_path, monkeypatch):
    import json
    from tokenfair.integrations.vllm.steplog import StepLog
    monkeypatch.setenv("TOKENFAIR_STEPS", str(tmp_path / "steps.jsonl"))
    kw = dict(max_running=6, token_budget=256, chunk_cap=0, num_blocks=64, block_size=16)
    path = tmp_path / "c.yaml"
    path.write_text("version: v1\n")
    assert load_settings({"tokenfair_contract": str(path)}, **kw).steps_path == str(tmp_path / "steps.jsonl")
    b = bridge()
    running: list = []
    for i, t in enumerate(("a", "b")):
        b.arrive(vreq(f"{t}{i}", t, prompt=20))
    admit_next(b, running, set())
    admit_next(b, running, set())
    by_id = {v.request_id: v for v in running}
    by_id["a0"].num_computed_tokens = 20                     # a prefill of 20 tokens this step
    by_id["b1"].num_computed_tokens = 21                     # a decode (its prompt done before)
    sched = SimpleNamespace(requests=by_id, tokenfair=b, running=running, waiting=[],
                            max_num_scheduled_tokens=256, scheduler_config=SimpleNamespace(long_prefill_token_threshold=64))
    out = SimpleNamespace(num_scheduled_tokens={"a0": 20, "b1": 1}, total_num_scheduled_tokens=21,
                          scheduled_new_reqs=[1], preempted_req_ids=None)
    log = StepLog(str(tmp_path / "steps.jsonl"))
    log.begin()
    log.scheduled()
    log.end(sched, out)
    log.close()
    (row,) = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert (row["reqs"], row["tokens"], row["prefills"], row["prefill_tokens"], row["new"]) == (2, 21, 1, 20, 1)
    assert row["tenants"] == {"a": 1, "b": 1} and row["budget"] == 256 and row["chunk"] == 64
    assert row["step_ms"] >= row["schedule_ms"] >= 0


def test_a_request_the_policy_gives_no_chunk_waits_for_the_step():
    """A background prefill (no TPOT SLO) of a tenant served more than its share sits out a
    step that carries a streaming prompt (``chunk_for`` 0): it does not start in that step,
    as in the simulator's admitter, and starts in a later one."""
    contract = {**CONTRACT, "tenants": {"s": {"default_class": "interactive"}, "d": {"default_class": "batch"}},
                "classes": {"batch": {"priority": 0}, "interactive": {"priority": 20, "tpot_slo_s": 0.05}}}
    clock = Clock()
    b = bridge(contract=contract, clock=clock)
    running: list = []
    b.arrive(vreq("d0", "d", prompt=2000, max_tokens=40))
    b.arrive(vreq("s0", "s", prompt=16, max_tokens=40))
    while admit_next(b, running, set()) is not None:
        pass
    for _ in range(3):
        run_step(b, running, clock)                 # d0 prefilled: d is served far over s
    b.arrive(vreq("s1", "s", prompt=64, max_tokens=4))
    b.arrive(vreq("d1", "d", prompt=64, max_tokens=4))
    b.before_step(running, 200)
    started = []
    while (v := admit_next(b, running, set())) is not None:
        started.append(v.request_id)
    assert started == ["s1"]
    d1 = b.by_id["d1"]
    assert b.policy.chunk_for(d1, clock.t) == 0 and not b.can_start(d1, len(running), clock.t)
    run_step(b, running, clock)
    b.before_step(running, 200)                     # no streaming prompt in this step
    assert admit_next(b, running, set()).request_id == "d1"
