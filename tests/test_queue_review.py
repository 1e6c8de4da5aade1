"""The fair policy's queue review (``sched/fair/review.py``) and the cost ahead it reads
(``sched/fair/arrivals.py``): a request of a class whose max wait is over a minute is not
shed at arrival, nor one whose forecast is less than 25% over its max wait; every waiting
request with a max wait is reviewed when a minute (or half its max wait, if less) is left,
and again each time what is left halves, and shed when the forecast of the rest of its wait,
behind what its tenant has queued ahead of it, exceeds what is left."""

from hypothesis import given, settings, strategies as st

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.core.kv import BlockPool
from tokenfair.core.reasons import ReasonCode
from tokenfair.core.request import Request, Status
from tokenfair.evaluation.shedding import without_shedding
from tokenfair.sched.fair.admission import AdmissionControl
from tokenfair.sched.fair.arrivals import ArrivalCosts
from tokenfair.sched.fair.costs import RequestCost
from tokenfair.sched.fair.forecast import SHED_DOUBT_FACTOR, SHED_LOOKAHEAD_S, WaitForecaster
from tokenfair.sched.fair.guarantee import ServiceGuarantee
from tokenfair.sched.fair.queue import WaitingQueue
from tokenfair.sched.fair.review import MIN_REVIEW_LEFT_S, QueueReview
from tokenfair.sched.fair.roster import TenantRoster
from tokenfair.sched.fair.shares import ShareMeter
from tokenfair.sched.fair.wfq import VirtualTimeWFQ

MAX_WAIT_S = 300.0
CONTRACT = parse_contract({
    "classes": {"batch": {"priority": 0, "max_wait_s": MAX_WAIT_S}, "chat": {"priority": 20, "max_wait_s": 30},
                "bulk": {"priority": 0}},
    "default_class": "batch",
    "costs": {"prefill_token": 1, "decode_token": 2},
    "engine": {"prefill_token_budget": 2048, "chunk_size": 512, "max_running": 16}})


def _req(seq: int, at: float, klass: str = "batch", prompt: int = 1000) -> Request:
    cls = CONTRACT.classes[klass]
    r = Request(f"r{seq}", seq, "a", klass, at, prompt, 10, max_wait_s=cls.max_wait_s)
    r.predicted_output = 10
    return r


class Review:
    """The queue, the forecaster and the review wired as the policy wires them."""

    def __init__(self, contract=CONTRACT):
        pool = BlockPool(10_000, 16)
        self.costs = RequestCost(contract.costs)
        self.wfq = VirtualTimeWFQ(credit=100.0)
        self.roster = TenantRoster(contract, pool.held, AdmissionControl(contract, pool), ServiceGuarantee())
        self.queue = WaitingQueue(contract, "edf", 16, self.costs, self.wfq, {})
        self.meter = ShareMeter(contract, self.roster, 10.0, [])
        self.forecaster = WaitForecaster(contract, self.meter, self.queue, prefill_rate=1000.0)
        self.review = QueueReview(contract, self.roster.tenants, self.forecaster)
        self.a = self.roster.tenant("a")

    def push(self, req: Request) -> None:
        self.queue.push(req, self.a, req.enqueued_s, 0.0)
        self.review.note_queued(req)

    def shed_all(self, now: float) -> list[Request]:
        """What the policy's ``expire`` does with the review: take each shed request."""
        out = []
        while (shed := self.review.next_shed(now)) is not None:
            req, reason = shed
            assert reason.code is ReasonCode.OVERLOADED and "queued" in reason.text
            self.queue.remove(req, self.a, now)
            out.append(req)
        return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["push", "remove", "ask", "reprice"]), st.integers(0, 30),
                          st.integers(1, 9), st.integers(0, 3)), max_size=120))
def test_the_cost_before_a_request_is_what_waits_that_was_queued_before_it(ops):
    """Any order of pushes, removals, re-pricings and questions with any of four review
    rounds' cursors (each moving both ways): the answer is the sum over the requests still
    waiting that were pushed before."""
    costs = ArrivalCosts()
    waiting: list[tuple[Request, float]] = []          # in push order
    reqs = [_req(i, 0.0) for i in range(31)]
    for op, i, size, round_ in ops:
        r = reqs[i]
        here = [k for k, (q, _) in enumerate(waiting) if q is r]
        if op == "push" and not here:
            costs.push(r, 10.0 * size)
            waiting.append((r, 10.0 * size))
        elif op == "remove" and here:
            costs.remove(r)
            waiting.pop(here[0])
        elif op == "reprice" and here:
            costs.reprice(r, 7.0 * size)
            waiting[here[0]] = (r, 7.0 * size)
        elif op == "ask" and here:
            assert costs.cost_before(r, round_) == sum(c for _, c in waiting[:here[0]])
    assert set(costs.position) == {r for r, _ in waiting}


def _backlog(p: Review, n: int) -> list[Request]:
    reqs = [_req(i, 0.01 * i) for i in range(n)]
    for r in reqs:
        p.push(r)
    p.meter.add(p.a, "batch", 100.0, 0.0)         # a rate measured: the forecast is on
    return reqs


def test_a_request_is_reviewed_a_minute_before_its_max_wait_behind_what_is_ahead_of_it():
    p = Review()
    reqs = _backlog(p, 100)
    due = MAX_WAIT_S - SHED_LOOKAHEAD_S
    assert p.shed_all(due - 1.0) == []                                   # none due yet
    now = due + 1.0                                                      # all 100 due
    priority = p.forecaster.base_priority(reqs[0])
    cost = p.costs.predicted(reqs[0])
    # in key order: the first whose forecast of the cost ahead is over the minute left, and
    # every one after it (shedding one leaves the next with the same cost ahead)
    first = next(k for k in range(100)
                 if p.forecaster.wait_behind_s(p.a, priority, k * cost, now) > reqs[k].enqueued_s + MAX_WAIT_S - now)
    assert 0 < first < 100
    shed = p.shed_all(now)
    assert shed == reqs[first:]
    assert p.a.num_waiting == first
    # the ones kept are due again halfway to their max wait, in the next round
    assert sorted((due, round_, r.seq) for due, _, round_, r in p.review.pending) == [
        (now + (r.enqueued_s + MAX_WAIT_S - now) / 2, 1, r.seq) for r in reqs[:first]]


def test_a_request_is_reviewed_each_time_what_is_left_halves_until_a_second():
    p = Review()
    r = _req(0, 0.0)
    p.push(r)                                     # nothing ahead of it: never shed
    p.meter.add(p.a, "batch", 100.0, 0.0)
    dues = []
    while p.review.pending:
        due, _, round_, _ = p.review.pending[0]
        assert round_ == len(dues)
        dues.append(due)
        assert p.shed_all(due) == []
    lefts = [MAX_WAIT_S - d for d in dues]
    assert lefts[0] == SHED_LOOKAHEAD_S and all(b == a / 2 for a, b in zip(lefts, lefts[1:]))
    assert lefts[-1] >= MIN_REVIEW_LEFT_S > lefts[-1] / 2 and len(dues) == 6      # 60 s .. 1.875 s
    chat = _req(1, 0.0, klass="chat")            # a 30 s max wait: first when half of it is left
    p.push(chat)
    assert p.review.pending[0][0] == 15.0 and p.review.next_due_s() == 15.0


def test_a_forecast_less_than_a_quarter_over_the_max_wait_is_not_shed_at_arrival():
    """The same tenant's chat requests arriving one after another behind a growing queue:
    each is shed at arrival exactly when its forecast exceeds 1.25 x its 30 s max wait, and
    the doubtful ones (over 30 s, at most 37.5 s) are queued for review."""
    p = Review()
    p.meter.add(p.a, "chat", 100.0, 0.0)
    limit = CONTRACT.classes["chat"].max_wait_s
    seen = {"queued in time": 0, "doubtful": 0, "shed": 0}
    for i in range(200):
        r = _req(i, 100.0, klass="chat", prompt=1000)     # past the warm-up: the forecast is on
        reason = p.forecaster.shed_reason(p.a, r, 100.0)
        wait = r.predicted_wait_s
        assert (reason is not None) == (wait > SHED_DOUBT_FACTOR * limit), (i, wait)
        if reason is not None:
            assert reason.code is ReasonCode.OVERLOADED and "exceeds 30.0s" in reason.text
            seen["shed"] += 1
            continue
        seen["doubtful" if wait > limit else "queued in time"] += 1
        p.push(r)
    assert all(seen.values()), seen
    assert len(p.review.pending) == seen["doubtful"] + seen["queued in time"]   # every one reviewed


def test_what_is_not_reviewed():
    p = Review()
    reqs = _backlog(p, 100)
    started, has_token = reqs[60], reqs[61]
    started.num_computed = 512                    # preempted mid-prefill: waits again, not reviewed
    has_token.first_token_s = 5.0
    bulk = _req(201, 0.0, klass="bulk")           # no max wait
    p.push(bulk)
    assert p.review.pending and bulk not in [x[3] for x in p.review.pending]
    shed = p.shed_all(1000.0)
    assert started not in shed and has_token not in shed and len(shed) > 0
    off = Review(without_shedding(CONTRACT))
    _backlog(off, 100)
    assert off.shed_all(1000.0) == [] and not off.review.pending       # reviewed, none shed


def test_a_requeued_request_is_not_scheduled_twice():
    p = Review()
    r = _req(0, 0.0)
    p.push(r)
    p.queue.remove(r, p.a, 1.0)
    r.status = Status.WAITING
    p.push(r)                                     # pushed again (qtoken 3): no second review
    assert len(p.review.pending) == 1


def test_in_the_simulator_no_long_wait_class_is_shed_at_arrival_and_the_shed_end_from_the_queue():
    """A batch tenant flooding at twice what the engine leaves it beside an interactive
    stream: its requests are shed from the queue at their reviews, most 240 s into their
    300 s max wait (at the first step after), all before it, never at arrival, and nearly
    all of them would have waited past it with shedding off."""
    from poisson_tenants import poisson_workload
    from tokenfair.evaluation.shedding import bench_shedding
    from tokenfair.sim.simulate import simulate
    contract = parse_contract({
        "tenants": {"flood": {"weight": 1, "max_queued": 50000, "default_class": "batch"},
                    "stream": {"weight": 1, "default_class": "interactive"}},
        "classes": {"interactive": {"priority": 20, "max_wait_s": 30, "ttft_slo_s": 2.0, "tpot_slo_s": 0.1},
                    "batch": {"priority": 0, "max_wait_s": MAX_WAIT_S}},
        "default_class": "interactive",
        "engine": {"prefill_token_budget": 1024, "decode_token_budget": 256, "chunk_size": 512, "max_running": 256}})
    wl = poisson_workload("flood", 0, [("flood", 10.0, 0, 600, (2000, 0.5, 64, 8000), (200, 0.5, 8, 800)),
                                       ("stream", 2.0, 0, 600, (500, 0.5, 16, 2000), (300, 0.5, 8, 1000))])
    recs = simulate(wl, "fair", contract, load_profile(None), isolated=False).records
    shed = [r for r in recs if r["reason"].startswith("overloaded")]
    assert len(shed) > 1000 and all(r["status"] == "expired" and r["tenant"] == "flood" for r in shed)
    waits = [r["finish_s"] - r["arrival_s"] for r in shed]
    assert min(waits) >= MAX_WAIT_S - SHED_LOOKAHEAD_S and max(waits) < MAX_WAIT_S
    first_round = [w for w in waits if w < MAX_WAIT_S - SHED_LOOKAHEAD_S + 0.5]
    assert len(first_round) > 0.9 * len(shed)
    scores = bench_shedding(wl, contract, load_profile(None))
    assert scores["precision"] >= 0.95
    assert scores["on"]["in_time_tokens"] > 1.3 * scores["off"]["in_time_tokens"]
    assert scores["on"]["outcomes"] == {"expired": {"overloaded": scores["shed"]}}


def test_a_queue_held_by_a_rate_limit_wakes_for_the_next_review():
    """A tenant whose token bucket is empty for minutes: the scheduler's next wake-up is the
    first review due, not the bucket's refill, so a request that cannot start in time is
    judged then.  Without a rate-limit wake-up there is none (what waits while nothing runs
    can never start: the loop fails it at once)."""
    from tokenfair.sched.registry import make_policy
    from tokenfair.sched.scheduler import IterationScheduler
    limited = parse_contract({**CONTRACT.model_dump(mode="json", exclude={"version"}),
                              "tenants": {"a": {"rate_limit": {"tokens_per_s": 1, "burst_tokens": 50}}}})
    sched = IterationScheduler(make_policy("fair"), limited, load_profile(None))
    sched.add_request(_req(0, 0.0, klass="chat"), 0.0)
    assert [r.request_id for r, _ in sched.schedule(0.0).prefill] == ["r0"]     # the bucket goes negative
    sched.add_request(_req(1, 1.0, klass="chat"), 1.0)
    refill = sched.policy.admission.wakeup(sched.policy.roster.rate_limited, 1.0)
    # r0's review (15 s; r0 runs, so it finds nothing to do), then r1's, long before the refill
    assert refill > 100.0 and sched.policy_wakeup(1.0) == 0.0 + 30.0 / 2
    assert sched.policy.expire(15.0) == [] and sched.policy_wakeup(15.0) == 1.0 + 30.0 / 2
    free = IterationScheduler(make_policy("fair"), CONTRACT, load_profile(None))
    free.add_request(_req(2, 5.0, klass="chat"), 5.0)
    assert free.policy.review.next_due_s() == 20.0 and free.policy_wakeup(5.0) == float("inf")
