"""The fair policy's layer parts that predate the facade, each built alone: admission
control (layer 1), the in-queue order (layer 3) and the preemption policy (layer 4)."""

import math

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import Profile
from tokenfair.core.kv import BlockPool
from tokenfair.core.reasons import ReasonCode
from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.admission import AdmissionControl
from tokenfair.sched.fair.ordering import LazyHeap, best_head, order_key
from tokenfair.sched.fair.preemption import PreemptionPolicy
from tokenfair.sched.fair.tenant import TenantState

PROFILE = Profile(name="t", kind="linear", prefill_token_s=2e-4, prefill_batch_s=0.01, decode_base_s=0.015,
                  decode_seq_s=2e-4, kv_capacity_tokens=160_000, block_size=16)
CONTRACT = parse_contract({
    "tenants": {"owner": {"min_share": 0.5}, "capped": {"max_concurrency": 1, "max_queued": 2},
                "metered": {"rate_limit": {"tokens_per_s": 100, "burst_tokens": 50}},
                "quota": {"kv_quota_blocks": 10}},
    "engine": {"max_running": 8},
    "preemption": {"mode": "auto", "max_per_request": 1, "cooldown_s": 2.0, "min_benefit_ratio": 2.0}})


def _tenant(control, name, seq=0, pool_held=None):
    t = TenantState(name, CONTRACT.tenant(name), 0.0, seq, held=pool_held if pool_held is not None else {})
    control.register(t)
    return t


def _req(rid, seq, tenant="a", prompt=100, out=10, **kw):
    r = Request(rid, seq, tenant, "standard", 0.0, prompt, out, **kw)
    r.predicted_output = out
    return r


def test_admission_bounds_queues_concurrency_rate_and_kv():
    pool = BlockPool(1000, 16)
    control = AdmissionControl(CONTRACT, pool)
    capped = _tenant(control, "capped")
    capped.num_waiting = 2
    assert control.on_arrival(capped, _req("q", 0, "capped")).code is ReasonCode.QUEUE_FULL
    capped.running.add(_req("r", 1, "capped"))
    assert not control.can_admit(capped, _req("s", 2, "capped"), 1, 10.0, 0.0)       # max_concurrency 1
    metered = _tenant(control, "metered")
    assert control.can_admit(metered, _req("m", 3, "metered"), 0, 80.0, 0.0)
    control.on_admit(metered, 80.0)                       # the bucket may go negative once ...
    assert metered.bucket == 50 - 80 and not control.can_admit(metered, _req("n", 4, "metered"), 1, 10.0, 0.0)
    assert control.wakeup([metered], 0.0) == math.inf          # nothing waits: no wake-up
    metered.num_waiting = 1
    assert abs(control.wakeup([metered], 0.0) - 0.3) < 1e-6     # ... and refills at 100/s
    assert control.can_admit(metered, _req("o", 5, "metered"), 1, 10.0, 0.31)
    quota = _tenant(control, "quota", pool_held={"quota": 8})
    quota.running.add(_req("held", 6, "quota"))
    assert not control.can_admit(quota, _req("big", 7, "quota", prompt=64), 1, 1.0, 0.0)   # 8 + 5 > 10 blocks
    assert control.can_admit(quota, _req("tiny", 8, "quota", prompt=16, out=1), 1, 1.0, 0.0)


def test_admission_keeps_an_owners_unmet_reservation_unless_it_is_idle():
    control = AdmissionControl(CONTRACT, BlockPool(1000, 16))
    owner, other = _tenant(control, "owner", 0), _tenant(control, "other", 1)
    assert control.owners == [owner] and control.reserved_slots(owner) == 4
    assert control.can_admit(other, _req("a", 0, "other"), 6, 1.0, 0.0)    # idle reservation: lent
    owner.num_waiting = 1
    assert control.can_admit(other, _req("b", 1, "other"), 3, 1.0, 0.0)     # 8 - 3 - 1 >= 4
    assert not control.can_admit(other, _req("c", 2, "other"), 4, 1.0, 0.0)


def test_order_puts_earlier_virtual_deadlines_first_and_skips_stale_entries():
    heap = LazyHeap()
    late, soon = _req("late", 0, max_wait_s=100.0), _req("soon", 1, max_wait_s=5.0)
    for r in (late, soon):
        heap.push(order_key(r, 0.0, 16), r)
    assert heap.top()[-1] is soon
    soon.qtoken += 1                                       # taken: its entry is stale
    assert heap.top()[-1] is late
    late.status = Status.RUNNING
    assert heap.top() is None and len(heap) == 0
    hi, lo = _req("hi", 2, priority=5.0), _req("lo", 3, priority=1.0, aging_rate=1.0)
    queues = {"x": LazyHeap(), "y": LazyHeap()}
    queues["x"].push(order_key(hi, 5.0, 16), hi)
    queues["y"].push(order_key(lo, 1.0, 16), lo)
    assert best_head(queues, 0.0) is hi and best_head(queues, 10.0) is lo   # aging lifts the low one


def test_preemption_orders_victims_and_weighs_recovery():
    p = PreemptionPolicy(CONTRACT, PROFILE)
    a, b = _req("a", 0, priority=1.0), _req("b", 1, priority=1.0)
    for r in (a, b):
        r.num_computed = 500
    over = {"a": 0.0, "b": 10.0}
    assert p.choose([a, b], 10.0, lambda r: over[r.request_id]) is b        # further over its share
    b.num_preemptions = 1                                                   # max_per_request 1
    assert p.choose([a, b], 10.0, lambda r: over[r.request_id]) is a
    a.last_preempt_s = 9.0                                                  # within the cool-down
    assert p.choose([a, b], 10.0, lambda r: 0.0) is None
    assert p.mode(a) == ("swap" if p.swap_s(a) < p.recompute_s(a) else "recompute")
    assert p.worth_it(a, 2.0 * p.recovery_s(a)) and not p.worth_it(a, 1.9 * p.recovery_s(a))
    p.last_urgent_s = 9.0
    assert not p.cooled_down(10.0) and p.cooled_down(11.0)
