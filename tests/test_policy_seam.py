"""The seam between the policy core and the service: the read-only snapshot, the public
mutations, the one arrival path, and that nothing outside ``sched/`` reaches into a policy."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.core.request import Status
from tokenfair.runtime.intake import make_request
from tokenfair.sched.registry import make_policy, policy_names
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sched.snapshot import PolicySnapshot
from tokenfair.workloads.workload import TraceRow

SRC = Path(__file__).resolve().parents[1] / "src" / "tokenfair"
PROFILE = Profile(name="t", kind="linear", prefill_token_s=2e-4, prefill_batch_s=0.01, decode_base_s=0.015,
                  decode_seq_s=2e-4, kv_capacity_tokens=40_000, block_size=16)
RATE, BURST = 100.0, 5000.0
CONTRACT = parse_contract({
    "tenants": {"a": {"weight": 2, "min_share": 0.25, "rate_limit": {"tokens_per_s": RATE, "burst_tokens": BURST}},
                "b": {"weight": 1, "max_queued": 3}},
    "classes": {"interactive": {"priority": 0}},
    "costs": {"prefill_token": 1, "decode_token": 2},
    "engine": {"prefill_token_budget": 512, "decode_token_budget": 64, "chunk_size": 256, "max_running": 2},
    "admission": {"shed_over_max_wait": False}})


def _scheduler(policy="fair"):
    return IterationScheduler(make_policy(policy), CONTRACT, PROFILE)


def _submit(sched, rows, now=0.0):
    reqs = []
    for i, row in enumerate(rows):
        req, reject = make_request(row, i, CONTRACT)
        assert reject is None
        sched.add_request(req, now)
        reqs.append(req)
    return reqs


def _rows(tenant, n, prompt):
    return [TraceRow(f"{tenant}-{i}", 0.0, tenant, prompt, 20) for i in range(n)]


def test_snapshot_shows_what_the_policy_holds_for_two_tenants():
    sched = _scheduler()
    reqs = _submit(sched, _rows("a", 3, 100) + _rows("b", 2, 300))
    pol = sched.policy
    snap = pol.snapshot(0.0)
    assert list(snap.tenants) == ["a", "b"]                  # first-seen order
    a, b = snap.tenants["a"], snap.tenants["b"]
    assert (a.num_waiting, b.num_waiting) == (3, 2) and pol.num_waiting() == 5
    assert (a.num_waiting, b.num_waiting) == (pol.tenants["a"].num_waiting, pol.tenants["b"].num_waiting)
    # the queued cost is each waiting request's prompt + predicted output, at the cost weights
    for view, tenant in ((a, "a"), (b, "b")):
        expect = sum(1 * r.prompt_tokens + 2 * r.predicted_output for r in reqs if r.tenant == tenant)
        assert view.queued_cost == pytest.approx(expect) and view.queued_cost > 0
    assert (a.weight, a.min_share, b.weight, b.min_share) == (2.0, 0.25, 1.0, 0.0)
    assert a.bucket == BURST and b.bucket is None           # a full bucket; b has no rate limit
    assert a.num_running == b.num_running == 0 and a.is_active and b.is_active
    assert snap.share_tau_s == pol.share_tau_s and snap.wfq_credit == 512 * 1.0
    assert snap.queued_costs() == {"a": a.queued_cost, "b": b.queued_cost}
    assert snap.backlogged() == ("a", "b")
    assert pol.tenant_view("b", 0.0) == b and pol.tenant_view("nobody", 0.0) is None


def test_snapshot_follows_admission_and_changes_nothing():
    sched = _scheduler()
    _submit(sched, _rows("a", 3, 100) + _rows("b", 2, 300))
    pol = sched.policy
    out = sched.schedule(0.0)                                 # admits up to max_running
    admitted = [r for r in sched.running]
    assert admitted and out is not None
    snap = pol.snapshot(0.0)
    for name in ("a", "b"):
        t = pol.tenants[name]
        view = snap.tenants[name]
        assert view.num_running == len(t.running) == sum(1 for r in admitted if r.tenant == name)
        assert view.num_waiting == t.num_waiting
        assert view.queued_cost == pytest.approx(sum(t.queued_cost.values()))
    charged = sum(r.charged for r in admitted if r.tenant == "a")
    assert snap.tenants["a"].bucket == pytest.approx(BURST - charged)
    # a later snapshot shows the bucket refilled and the service decayed, without writing them
    t = pol.tenants["a"]
    t.recent = 50.0                                           # some recent service to decay
    before = (t.bucket, t.bucket_t, t.recent, t.recent_t)
    later = pol.snapshot(4.0).tenants["a"]
    assert (t.bucket, t.bucket_t, t.recent, t.recent_t) == before
    assert later.bucket == pytest.approx(min(BURST, BURST - charged + 4.0 * RATE))
    assert later.recent_service == pytest.approx(50.0 * math.exp(-(4.0 - before[3]) / pol.share_tau_s))


def test_snapshot_is_immutable():
    sched = _scheduler()
    _submit(sched, _rows("a", 1, 100))
    snap = sched.policy.snapshot(0.0)
    view = snap.tenants["a"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.now = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.num_waiting = 0
    with pytest.raises(TypeError):
        snap.tenants["b"] = view                              # a read-only mapping
    assert sched.policy.tenants["a"].num_waiting == 1


@pytest.mark.parametrize("name", [n for n in policy_names() if n != "fair"])
def test_every_baseline_answers_the_seam(name):
    sched = _scheduler(name)
    _submit(sched, _rows("a", 2, 100))
    pol = sched.policy
    snap = pol.snapshot(1.0)
    assert isinstance(snap, PolicySnapshot) and snap.now == 1.0 and dict(snap.tenants) == {}
    assert snap.share_tau_s is None and snap.wfq_credit is None
    req = next(iter(sched.running), None) or pol.pick(1.0, set())
    assert req is not None
    assert pol.tenant_view("a", 1.0) is None and pol.victim_order(req, 1.0) is None
    assert pol.can_admit_within_limits(req, 1.0)
    pol.observe_step_time(0.5)                               # accepted, nothing kept


def test_fair_mutations_are_the_public_methods():
    sched = _scheduler()
    reqs = _submit(sched, _rows("a", 1, 100) + _rows("b", 4, 100))
    pol = sched.policy
    assert reqs[-1].status is Status.REJECTED and reqs[-1].reason.startswith("queue_full")   # b: max_queued 3
    pol.observe_step_time(0.123)
    assert pol.step_time.ewma_s == 0.123
    a = reqs[0]
    assert pol.can_admit_within_limits(a, 0.0)
    pol.tenants["a"].bucket = -1.0                            # spent: the hard rate limit holds a
    assert not pol.can_admit_within_limits(a, pol.tenants["a"].bucket_t)
    order = pol.victim_order(a, 0.0)
    assert order is not None and order[0] == 0 and order[1:] == pol.preemption.key(a, 0.0, pol.urgency.overshare(a))


def _calls(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _outside_sched():
    return [p for p in SRC.rglob("*.py") if "sched" not in p.relative_to(SRC).parts]


def test_nothing_outside_sched_reaches_into_a_policy():
    """No getattr/hasattr on a policy, and no part of the fair policy (``tenants``,
    ``admission``, ``preemption``, ``wfq``, ``meter``, ``roster``...) read through a policy
    object outside ``sched/``: the service uses ``snapshot``/``tenant_view`` and the public
    mutations (``sched/fair/adopt.py`` for the fleet)."""
    parts = {"tenants", "admission", "preemption", "wfq", "meter", "roster", "queue", "picker", "urgency",
             "accounting", "shaper", "step_time", "forecaster", "headroom", "decode_slos", "costs",
             "step_ewma_s", "share_tau_s", "overshare", "tenant"}
    found = []
    for path in _outside_sched():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and "pol" in ast.unparse(node.args[0]).lower()):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
            if (isinstance(node, ast.Attribute) and node.attr in parts
                    and ast.unparse(node.value).lower().endswith("policy")):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_one_arrival_path():
    """Every front door (scheduler, gateway, fleet simulator, vLLM bridge) lets a request in
    through ``sched/arrival.arrive``: it is the only caller of ``on_arrival`` outside the
    policies themselves."""
    callers = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("sched/fair/") or rel.startswith("sched/baselines/"):
            continue
        for call in _calls(path):
            if isinstance(call.func, ast.Attribute) and call.func.attr == "on_arrival":
                callers.add(rel)
    assert callers == {"sched/arrival.py"}
