"""The fair policy's parts (sched/fair/), each built alone from its constructor arguments,
without a scheduler or the policy facade: what each one's invariant says."""

import math

import pytest

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import BUILTIN_PROFILES, Profile
from tokenfair.core.kv import BlockPool
from tokenfair.core.reasons import ReasonCode
from tokenfair.core.request import Request, Status
from tokenfair.sched.fair.accounting import Accounting
from tokenfair.sched.fair.admission import AdmissionControl
from tokenfair.sched.fair.background import BackgroundPrefill
from tokenfair.sched.fair.batching import TPOT_MARGIN, PrefillShaper
from tokenfair.sched.fair.costs import RequestCost
from tokenfair.sched.fair.forecast import WaitForecaster
from tokenfair.sched.fair.guarantee import FORCE_AFTER_S, ServiceGuarantee
from tokenfair.sched.fair.headroom import Headroom
from tokenfair.sched.fair.picking import Picker
from tokenfair.sched.fair.preemption import PreemptionPolicy
from tokenfair.sched.fair.queue import WaitingQueue
from tokenfair.sched.fair.rebind import reclass, retenant
from tokenfair.sched.fair.roster import TenantRoster
from tokenfair.sched.fair.shaping import MIN_PREFILL_BUDGET, BudgetShaper
from tokenfair.sched.fair.shares import ShareMeter
from tokenfair.sched.fair.steptime import STEP_EWMA_FACTOR, StepTimer
from tokenfair.sched.fair.tpot import DecodeSLOs
from tokenfair.sched.fair.urgency import Urgency
from tokenfair.sched.fair.wfq import VirtualTimeWFQ

PROFILE = Profile(name="t", kind="linear", prefill_token_s=2e-4, prefill_batch_s=0.01, decode_base_s=0.015,
                  decode_seq_s=2e-4, kv_capacity_tokens=160_000, block_size=16)
CONTRACT = parse_contract({
    "tenants": {"gold": {"weight": 2, "min_share": 0.25}, "capped": {"rate_limit": {"tokens_per_s": 100, "burst_tokens": 500}}},
    "classes": {"interactive": {"priority": 10, "max_wait_s": 30.0, "tpot_slo_s": 0.05},
                "reserved": {"priority": 5, "min_share": 0.2}, "batch": {"priority": 0}},
    "costs": {"prefill_token": 1, "decode_token": 2},
    "engine": {"prefill_token_budget": 2048, "decode_token_budget": 512, "chunk_size": 512, "max_running": 16},
    "admission": {"shed_over_max_wait": True, "headroom_kv_fraction": 0.1, "headroom_slot_fraction": 0.25}})
TAU_S = 10.0


class Parts:
    """The parts wired as the policy wires them, by hand."""

    def __init__(self, contract=CONTRACT):
        self.pool = BlockPool(10_000, 16)
        self.costs = RequestCost(contract.costs)
        self.admission = AdmissionControl(contract, self.pool)
        self.wfq = VirtualTimeWFQ(credit=100.0)
        self.guarantee = ServiceGuarantee()
        self.roster = TenantRoster(contract, self.pool.held, self.admission, self.guarantee)
        class_min = {"reserved": 0.2}
        self.step_time = StepTimer(0.02)
        self.queue = WaitingQueue(contract, "edf", 16, self.costs, self.wfq, class_min)
        self.meter = ShareMeter(contract, self.roster, TAU_S, list(class_min))
        self.headroom = Headroom(contract, self.pool, self.roster, self.wfq)
        self.slos = DecodeSLOs()
        self.accounting = Accounting(contract, self.costs, self.wfq, self.roster, self.meter, self.headroom,
                                     self.slos, self.step_time)


def _req(rid, seq, tenant, klass="interactive", prompt=100, out=10, **kw):
    r = Request(rid, seq, tenant, klass, 0.0, prompt, out, **kw)
    r.predicted_output = out
    return r


def test_request_cost_weights_tokens_and_knows_when_sums_are_exact():
    costs = RequestCost(CONTRACT.costs)
    r = _req("r", 0, "a", prompt=100, out=10)
    assert costs.predicted(r) == 100 + 2 * 10 and costs.integral
    r.num_computed, r.num_output, r.used_cost = 103, 3, 0.0
    assert costs.used(r) == 100 + 2 * 3
    r.used_cost = 500.0                                   # never less than recorded before
    assert costs.used(r) == 500.0
    assert not RequestCost(parse_contract({"costs": {"decode_token": 1.5}}).costs).integral


def test_step_timer_is_a_moving_average_and_observe_all_repeats_observe():
    a, b = StepTimer(0.02), StepTimer(0.02)
    durations = [0.05, 0.01, 0.2, 0.03]
    for d in durations[:3]:
        a.observe(d)
    b.observe_all(durations, 3)                           # the first three only
    assert a.ewma_s == b.ewma_s
    expected = 0.02
    for d in durations[:3]:
        expected += STEP_EWMA_FACTOR * (d - expected)
    assert b.ewma_s == expected and 0.02 < expected < 0.2


def test_roster_makes_tenants_once_and_keeps_active_weight_and_running_count():
    p = Parts()
    gold = p.roster.tenant("gold")
    assert p.roster.tenant("gold") is gold and gold.seq == 0 and p.roster.tenant("x").seq == 1
    assert p.roster.guaranteed == [gold] and p.roster.rate_limited == [p.roster.tenant("capped")]
    assert p.roster.total_weight == 2 + 1 + 1 and p.admission.owners == [gold]   # 0.25 x 16 slots reserved
    r = _req("g", 0, "gold")
    gold.num_waiting = 1
    p.roster.touch(gold, 1.0)
    assert gold.active and p.roster.active_weight == 2.0 and gold.starved_since == 1.0   # waits, nothing runs
    gold.num_waiting = 0
    p.roster.start(gold, r)
    p.roster.touch(gold, 2.0)
    assert p.roster.num_running == 1 and gold.starved_since == math.inf
    assert p.roster.stop(gold, r) and not p.roster.stop(gold, r)
    p.roster.touch(gold, 3.0)
    assert p.roster.num_running == 0 and not gold.active and p.roster.active_weight == 0.0


def test_queue_keeps_every_view_and_the_backlog():
    p = Parts()
    a = p.roster.tenant("a")
    r1 = _req("r1", 0, "a", deadline_s=50.0, max_wait_s=30.0, tpot_slo_s=0.05)
    r2 = _req("r2", 1, "a", klass="reserved")
    p.queue.push(r1, a, 1.0, service_s=4.0)
    assert p.queue.num_queued == 1 and p.queue.backlog_since_s == 1.0 and p.queue.backlogged == {"a": a}
    assert p.queue.num_waiting_tpot == 1
    assert p.queue.deadlines.top()[0] == 50.0 - 4.0 and p.queue.overdue.top()[0] == 0.0 + 30.0
    assert a.head_cost == p.costs.predicted(r1) and p.wfq.num_backlogged == 1
    p.queue.push(r2, a, 2.0, service_s=0.0)
    assert p.queue.class_waiting == {"reserved": 1} and p.queue.class_heaps["reserved"].top()[-1] is r2
    assert a.queued_cost == {"interactive": 120.0, "reserved": 120.0}
    assert p.queue.num_waiting_tpot == 1                          # r2's class has no TPOT SLO
    p.queue.remove(r1, a, 3.0)
    assert p.queue.num_waiting_tpot == 0
    assert p.queue.deadlines.top() is None and p.queue.overdue.top() is None   # stale entries dropped
    assert a.num_waiting == 1 and p.queue.backlog_since_s == 1.0
    p.queue.remove(r2, a, 4.0)
    assert p.queue.num_queued == 0 and p.queue.backlog_since_s == math.inf and not p.queue.backlogged
    assert p.wfq.num_backlogged == 0 and p.queue.class_waiting == {"reserved": 0}


def test_live_change_moves_tenants_reprices_the_queue_and_rebuilds_min_share_classes():
    """rebind.py over the parts: weights and totals follow, queued cost is re-priced, a class
    that gains a min share gets a heap of its queued requests, one that loses it drops it."""
    p = Parts()
    a, gold = p.roster.tenant("a"), p.roster.tenant("gold")
    r1, r2 = _req("r1", 0, "a"), _req("r2", 1, "a", klass="reserved")
    for r in (r1, r2):
        p.queue.push(r, a, 1.0, service_s=0.0)
    p.roster.touch(a, 1.0)
    p.meter.class_recent["reserved"] = 7.0
    new = parse_contract({"tenants": {"a": {"weight": 4}, "gold": {"weight": 1}},
                          "classes": {"interactive": {"priority": 10, "min_share": 0.3},
                                      "reserved": {"priority": 5}, "batch": {"priority": 0}},
                          "costs": {"prefill_token": 0.5, "decode_token": 3}})
    p.costs.rebind(new.costs)
    retenant(p.roster, p.queue, p.wfq, p.admission, new, 2.0)
    reclass(p.queue, p.meter, p.roster, new)
    assert a.weight == 4 and gold.weight == 1 and p.roster.total_weight == 5
    assert p.roster.active_weight == 4 and p.wfq.backlogged_weight == 4
    assert p.roster.guaranteed == [] and p.admission.owners == [] and p.roster.rate_limited == []
    assert a.queued_cost == {"interactive": 50 + 30.0, "reserved": 50 + 30.0} and p.costs.integral is False
    assert p.queue.class_min == {"interactive": 0.3} and p.queue.class_waiting == {"interactive": 1}
    assert p.queue.class_heaps["interactive"].top()[-1] is r1 and p.meter.class_recent == {"interactive": 0.0}
    p.queue.remove(r1, a, 3.0)                  # the new heap is kept as push/remove keep it
    assert p.queue.class_waiting == {"interactive": 0} and p.queue.class_heaps["interactive"].top() is None


def test_fifo_queue_orders_by_arrival_and_edf_by_deadline():
    for order, first in (("fifo", "early"), ("edf", "urgent")):
        p = Parts()
        p.queue.order = order
        a = p.roster.tenant("a")
        early = _req("early", 0, "a", klass="batch")
        urgent = _req("urgent", 1, "a", klass="batch", order_deadline_s=12.0)
        urgent.enqueued_s = 1.0
        for r in (early, urgent):
            p.queue.push(r, a, 1.0, 0.0)
        assert a.queues["batch"].top()[-1].request_id == first


def test_share_meter_records_decays_and_finds_the_light():
    p = Parts()
    heavy, small = p.roster.tenant("heavy"), p.roster.tenant("small")
    for t in (heavy, small):
        t.active = True
    p.meter.add(heavy, "reserved", 1000.0, 0.0)
    p.meter.add(small, "batch", 10.0, 0.0)
    assert p.meter.recent_total == 1010.0 and p.meter.class_recent == {"reserved": 1000.0}
    assert p.meter.first_service_s == 0.0 and p.meter.service_rate(0.0) is None   # before the warm-up
    assert p.meter.is_light(small, 0.0) and not p.meter.is_light(heavy, 0.0)
    small.queued_cost["batch"] = 5000.0                   # what it still asks for counts
    p.meter.level_t = -math.inf
    assert p.meter.under_share(small, 0.0) and not p.meter.is_light(small, 0.0)
    p.meter.decay(TAU_S)
    assert p.meter.recent_total == pytest.approx(1010.0 / math.e)
    assert p.meter.service_rate(TAU_S + 1) == p.meter.recent_total / TAU_S


def test_share_meter_replays_decode_steps_exactly():
    one, many = Parts(), Parts()
    for parts in (one, many):
        for name in ("a", "b"):
            parts.roster.tenant(name).active = True
    reqs = [_req("a1", 0, "a", klass="reserved"), _req("a2", 1, "a"), _req("b1", 2, "b")]
    ends, durations = [0.1, 0.2, 0.35], [0.1, 0.1, 0.15]
    for now, dt in zip(ends, durations):
        one.meter.add_decoded(reqs, {"a": 2, "b": 1}, 2.0, now)
        one.meter.decay(dt)
    ts = many.roster.tenants
    many.meter.replay_recent([(ts["a"], 4.0), (ts["b"], 2.0)], ends)
    many.meter.replay_totals(6.0, {"reserved": 1}, 2.0, durations, 3)
    assert [(t.recent, t.recent_t) for t in ts.values()] == [(t.recent, t.recent_t)
                                                             for t in one.roster.tenants.values()]
    assert (many.meter.recent_total, many.meter.class_recent) == (one.meter.recent_total, one.meter.class_recent)


def test_share_meter_replays_one_tenant_without_classes_exactly(monkeypatch):
    """A tenant's traffic alone (its isolated run) with no min-share class: replay_recent's
    one-tenant path and replay_totals' total-only path give step-by-step's floats."""
    one, fast = Parts(), Parts()
    for parts in (one, fast):
        parts.meter = ShareMeter(CONTRACT, parts.roster, TAU_S, [])
        a = parts.roster.tenant("a")
        a.active, a.recent, a.recent_t = True, 5.0, 0.05
    reqs = [_req("a1", 0, "a"), _req("a2", 1, "a")]
    ends, durations = [0.1, 0.25, 0.3], [0.1, 0.15, 0.05]
    for now, dt in zip(ends, durations):
        one.meter.add_decoded(reqs, {"a": 2}, 2.0, now)
        one.meter.decay(dt)
    calls = []
    original = ShareMeter._replay_one
    try:      # the interpreted class only: a compiled one cannot be patched
        monkeypatch.setattr(ShareMeter, "_replay_one", lambda self, *a: (calls.append(1), original(self, *a))[1])
        patched = True
    except (TypeError, AttributeError):
        patched = False
    a = fast.roster.tenants["a"]
    fast.meter.replay_recent([(a, 4.0)], ends)
    fast.meter.replay_totals(4.0, {}, 2.0, durations, 3)
    ref = one.roster.tenants["a"]
    assert (a.recent, a.recent_t) == (ref.recent, ref.recent_t) and a.recent != 5.0
    assert fast.meter.recent_total == one.meter.recent_total and fast.meter.class_recent == {}
    assert calls == [1] or not patched


def test_headroom_reserves_for_tenants_within_their_share():
    p = Parts()
    big, small = p.roster.tenant("big"), p.roster.tenant("small")
    for t in (big, small):
        t.active = True
    p.roster.active_weight = 2.0
    small.kv_peak, small.slots_peak = 1600.0, 4.0         # its recent peak, none held now
    p.pool.held["big"] = 8000
    assert not p.headroom.within_share(big, 0, 0) and p.headroom.within_share(small, 100, 1)
    assert p.headroom.reserved(big, num_running=0) == (0, 0)    # an empty engine idles for nobody
    assert p.headroom.reserved(big, num_running=3) == (int(1.25 * 1600), max(4, int(1.25 * 4)))
    assert p.headroom.reserved(small, num_running=3) == (p.headroom.headroom_blocks, p.headroom.headroom_slots)
    small.kv_peak = 3200.0
    assert p.headroom.reserved(big, 3)[0] == 2000             # cached for the step ...
    p.headroom.invalidate()
    assert p.headroom.reserved(big, 3)[0] == 4000             # ... until it ends


def test_accounting_charges_corrects_and_refunds():
    p = Parts()
    a = p.roster.tenant("a")
    r = _req("r", 0, "a", prompt=100, out=10)
    assert p.accounting.charge_admission(r, a, 0.0) == 120.0 and a.vtime == 120.0 and r.charged == 120.0
    r.status, r.num_computed = Status.RUNNING, 100
    p.accounting.on_served(r, 100, 0, 0.1)               # the prompt: within the charge
    assert r.used_cost == 100.0 and a.vtime == 120.0 and p.meter.recent_total == 100.0
    r.num_computed, r.num_output = 101, 1
    for _ in range(14):                                   # 14 tokens > the 10 predicted
        p.accounting.on_decoded([r], 0.2, None)
    assert r.used_cost == 100.0 + 28 and r.charged == 128.0 and a.vtime == 128.0
    p.accounting.on_step_end(0.2, 0.1)
    assert p.step_time.ewma_s == 0.02 + STEP_EWMA_FACTOR * (0.1 - 0.02)
    r.charged = 200.0
    p.accounting.refund(r, a)                             # the unused part goes back
    assert r.charged == r.used_cost and a.vtime == 128.0 - 72.0


def test_accounting_fast_forward_equals_stepping():
    stepped, summed = Parts(), Parts()
    runs = []
    for parts in (stepped, summed):
        reqs = []
        for i, name in enumerate(("a", "a", "b")):
            t = parts.roster.tenant(name)
            t.active = True
            r = _req(f"r{i}", i, name, klass="reserved" if i == 0 else "batch", prompt=50, out=2 + i)
            parts.accounting.charge_admission(r, t, 0.0)
            r.status, r.num_computed, r.num_output, r.used_cost = Status.RUNNING, 51, 1, 52.0
            reqs.append(r)
        runs.append(reqs)
    ends, durations = [0.1, 0.2, 0.3, 0.4], [0.1, 0.1, 0.1, 0.1]
    for now, dt in zip(ends, durations):
        stepped.accounting.on_decoded(runs[0], now, None)
        stepped.accounting.on_step_end(now, dt)
    assert summed.accounting.can_sum_steps()
    summed.accounting.fast_forward(runs[1], 0.0, ends, durations, True, None)
    fields = lambda ps, rs: ([(t.vtime, t.recent) for t in ps.roster.tenants.values()],  # noqa: E731
                             [(r.used_cost, r.charged) for r in rs],
                             ps.meter.recent_total, ps.meter.class_recent, ps.step_time.ewma_s)
    assert fields(summed, runs[1]) == fields(stepped, runs[0])
    assert not Accounting(CONTRACT.model_copy(update={"costs": CONTRACT.costs.model_copy(update={"kv_block_s": 1.0})}),
                          summed.costs, summed.wfq, summed.roster, summed.meter, summed.headroom, summed.slos,
                          summed.step_time).can_sum_steps()


def test_budget_shaper_finds_the_largest_fitting_multiple_and_decode_count():
    shaper = BudgetShaper(PROFILE.cost)
    step = PROFILE.cost.chunk_s
    target = step(1024, 20_000, 40)
    got = shaper.shaped(2048, 20_000, 40, target)
    assert got == 1024 and shaper.last_shaped == 1024 and step(got + 64, 20_000, 40) > target
    assert shaper.shaped(2048, 20_000, 40, 0.0) == MIN_PREFILL_BUDGET     # nothing fits: the floor
    m = shaper.decodes_that_fit(2048, 100, 50_000, step(2048, 10_000, 20))
    assert m == 20


def test_budget_shaper_side_question_leaves_the_hint_alone():
    cost = BUILTIN_PROFILES["llama3-8b-a100"].cost          # a roofline: the prefix k costs attention
    shaper = BudgetShaper(cost)
    target = cost.chunk_s(1024, 20_000, 40)
    assert shaper.shaped(2048, 20_000, 40, target) == 1024
    side = shaper.shaped(2048, 20_000, 40, target, k=8_000, remember=False)
    assert side < 1024 and shaper.last_shaped == 1024                    # the next step's hint stays
    assert shaper.shaped(2048, 20_000, 40, target, k=8_000) == side and shaper.last_shaped == side


def test_prefill_shaper_shapes_for_running_decodes_and_holds_heavy_ones_for_a_light_prefill():
    p = Parts()
    shaper = PrefillShaper(CONTRACT, BudgetShaper(PROFILE.cost), p.roster, p.meter, p.wfq, p.queue, p.slos,
                           BackgroundPrefill(p.queue))
    assert shaper.prefill_budget((40, 20_000, []), 0.0) == 2048           # no decode with a TPOT SLO
    p.slos.start(_req("d", 0, "heavy", tpot_slo_s=0.05))
    shaped = shaper.prefill_budget((40, 20_000, []), 0.0)
    assert shaped < 2048 and shaper.hold is None
    heavy, light = p.roster.tenant("heavy"), p.roster.tenant("light")
    heavy.active = light.active = True
    heavy.running.add(_req("h", 1, "heavy"))
    p.meter.add(heavy, "batch", 10_000.0, 0.0)
    prefill = _req("l", 2, "light", prompt=4000)
    prefill.status = Status.RUNNING
    shaper.note_admitted(prefill)
    assert shaper.prefill_budget((40, 20_000, []), 0.0) == 2048 and shaper.light_prefilling
    assert shaper.hold is not None and shaper.hold.tenants == {"heavy"} and 0 < shaper.hold.num_to_hold <= 40
    assert shaper.chunk_for(prefill, 0.0) == 2048 and shaper.chunk_for(_req("x", 3, "heavy"), 0.0) == 512
    assert shaper.defer_prefill(_req("y", 4, "heavy"), 0.0)               # behind the light prefill


def test_urgency_expires_infeasible_deadlines_and_picks_victims():
    p = Parts()
    pre = PreemptionPolicy(CONTRACT, PROFILE)
    urg = Urgency(CONTRACT, PROFILE, pre, p.admission, p.roster, p.meter, p.wfq, p.step_time, p.queue.deadlines)
    a, b = p.roster.tenant("a"), p.roster.tenant("b")
    late = _req("late", 0, "a", prompt=2000, out=500, deadline_s=12.0)
    p.queue.push(late, a, 0.0, urg.estimate_service_s(late))
    assert urg.estimate_service_s(late) == PROFILE.step_s([(2000, 0)], 0, 0) + 500 * 0.02
    assert urg.next_expired(0.0) is None
    expired = urg.next_expired(2.0)                       # ~10.4 s of service cannot end by 12 s
    assert expired is not None and expired[0] is late and expired[1].code is ReasonCode.DEADLINE_INFEASIBLE
    a.vtime, b.vtime = 50.0, 500.0                        # b is further over its share
    ra, rb = _req("ra", 1, "a"), _req("rb", 2, "b")
    for r in (ra, rb):
        r.status, r.num_computed = Status.RUNNING, 100
    assert urg.victim_for_kv([ra, rb], ra, 10.0) is rb
    assert urg.urgent_victim(_req("c", 3, "a"), [rb], 10.0) is None      # not overdue, no min share


def test_picker_serves_forced_heads_then_min_shares_then_wfq():
    p = Parts()
    picker = Picker(p.queue, p.roster, p.meter, p.admission, p.wfq, p.costs, p.guarantee, FORCE_AFTER_S)
    a, gold = p.roster.tenant("a"), p.roster.tenant("gold")
    ra = _req("ra", 0, "a", klass="batch")
    rg = _req("rg", 1, "gold", klass="batch", prompt=5000)
    for r, t in ((ra, a), (rg, gold)):
        p.queue.push(r, t, 0.0, 0.0)
        p.roster.touch(t, 0.0)
    assert picker.pick(0.1, set()) is ra                  # the least finish tag
    p.meter.add(a, "batch", 100.0, 0.1)                   # gold got nothing of its 25%
    assert picker.pick(0.2, set()) is rg and picker.pick(0.2, {"gold"}) is ra
    assert picker.forced(0.2) is None and picker.forced(FORCE_AFTER_S + 0.1) is ra   # starved past its grace
    assert picker.pick(FORCE_AFTER_S + 0.1, {"a"}) is rg and picker.reserve is ra   # blocked: room is kept


def test_wait_forecast_counts_what_streams_give_up_while_a_backlog_runs_longer_steps():
    """u' = u - n w_d (1/s - 1/s_b): the running decodes with a TPOT SLO of tenants that are
    neither backlogged nor the forecast's own decode once a step, and a backlog's steps run at
    TPOT_MARGIN x the tightest SLO instead of the recent step time."""
    p = Parts()
    fc = WaitForecaster(CONTRACT, p.meter, p.queue, 1000.0, p.step_time, p.slos, p.costs.wd)
    plain = WaitForecaster(CONTRACT, p.meter, p.queue, 1000.0)
    streams = [_req(f"s{i}", i, "s") for i in range(3)] + [_req("own", 3, "a"), _req("b0", 4, "b")]
    for r in streams:
        r.tpot_slo_s = 0.05                               # the target step: 0.8 x 0.05 = 0.04 s
        p.slos.start(r)
    p.step_time.ewma_s = 0.02
    b = p.roster.tenant("b")
    p.queue.push(_req("bq", 5, "b"), b, 0.0, 0.0)         # b is backlogged: its decode is not in u
    given_up = 3 * p.costs.wd * (1 / 0.02 - 1 / (TPOT_MARGIN * 0.05))
    assert fc.decode_rate_given_up(p.queue.backlogged, "a") == pytest.approx(given_up)
    assert plain.decode_rate_given_up(p.queue.backlogged, "a") == 0.0
    p.step_time.ewma_s = 0.05                             # steps already at or past the target
    assert fc.decode_rate_given_up(p.queue.backlogged, "a") == 0.0
    p.step_time.ewma_s = 0.02
    a, s = p.roster.tenant("a"), p.roster.tenant("s")
    for i in range(50):
        p.queue.push(_req(f"q{i}", 10 + i, "a", prompt=2000), a, 0.0, 0.0)
    p.meter.add(a, "interactive", 100.0, 0.0)
    p.meter.add(s, "interactive", 3000.0, 99.0)           # the streams' recent service: u > 0
    new = _req("new", 99, "a", max_wait_s=30.0)           # after the warm-up
    assert 0.0 < fc.predicted_wait_s(a, new, 100.0) < plain.predicted_wait_s(a, new, 100.0)


def test_wait_forecaster_sheds_only_after_warm_up_and_over_the_max_wait():
    p = Parts()
    fc = WaitForecaster(CONTRACT, p.meter, p.queue, prefill_rate=1000.0)
    a = p.roster.tenant("a")
    for i in range(50):
        p.queue.push(_req(f"q{i}", i, "a", prompt=2000), a, 0.0, 0.0)
    new = _req("new", 99, "a", max_wait_s=30.0)
    assert fc.shed_reason(a, new, 0.0) is None and new.predicted_wait_s == 0.0   # no rate measured yet
    p.meter.add(a, "interactive", 100.0, 0.0)
    reason = fc.shed_reason(a, new, 100.0)                # ~100 x 2020 cost ahead at ~1000/s
    assert reason is not None and reason.code is ReasonCode.OVERLOADED and new.predicted_wait_s > 30.0
