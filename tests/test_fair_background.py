"""Layer 4, background prefill (sched/fair/background.py): prefill without a TPOT SLO yields
to streams with one, for a bounded time, unless the engine is deadline-bound."""

from tokenfair.contracts.contract import parse_contract
from tokenfair.core.costmodel import load_profile
from tokenfair.core.request import Request
from tokenfair.runtime.loop import VirtualClock, run
from tokenfair.sched.fair.background import (LATENCY_STEP_FACTOR, MAX_BACKGROUND_DEFER_S,
                                             TIGHT_WAIT_FRACTION, BackgroundPrefill)
from tokenfair.sched.fair.costs import RequestCost
from tokenfair.sched.fair.queue import WaitingQueue
from tokenfair.sched.fair.tenant import TenantState
from tokenfair.sched.fair.wfq import VirtualTimeWFQ
from tokenfair.sched.registry import make_policy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.engine import SimEngine
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.scenarios import build_scenario
from tokenfair.workloads.workload import TraceRow

from poisson_tenants import contract_of, fair_fairness, poisson_workload

PROFILE = load_profile("llama3-8b-a100")


def _contract(bulk_class: dict) -> object:
    return parse_contract({
        "tenants": {"bulk": {"weight": 1, "default_class": "bulk"}},
        "default_tenant": {"weight": 1, "default_class": "stream"},
        "classes": {"stream": {"priority": 20, "max_wait_s": 30, "tpot_slo_s": 0.1}, "bulk": bulk_class},
        "default_class": "stream",
        "engine": {"prefill_token_budget": 1024, "decode_token_budget": 256, "chunk_size": 512,
                   "max_running": 256}})


SLACK = _contract({"priority": 0, "max_wait_s": 900})          # background while streams decode
TIGHT = _contract({"priority": 0, "max_wait_s": 12})           # its backlog is deadline-bound
NO_BACKGROUND = _contract({"priority": 0, "max_wait_s": 900, "tpot_slo_s": 0.1})


def _req(name: str, tpot: float | None, computed: int = 0) -> Request:
    r = Request(name, 0, "t", "k", 0.0, 4000, 10, tpot_slo_s=tpot)
    r.num_computed = computed
    return r


def _part(waiting_tpot: bool = False) -> BackgroundPrefill:
    """The part over a waiting queue whose one backlogged tenant waits in the stream class
    (``waiting_tpot``: it has a TPOT SLO) or in the bulk class."""
    queue = WaitingQueue(SLACK, "edf", 16, RequestCost(SLACK.costs), VirtualTimeWFQ(credit=100.0), {})
    tenant = TenantState("x", SLACK.tenant("x"), 0.0, held={})
    tenant.queued_cost["stream" if waiting_tpot else "bulk"] = 500.0
    queue.backlogged["x"] = tenant
    queue.num_queued, queue.num_waiting_tpot = 1, int(waiting_tpot)
    return BackgroundPrefill(queue)


def test_a_step_of_background_prefill_only_is_shaped_short():
    part = _part()
    bulk = _req("b", None)
    part.refresh(True, [bulk], 1.0)
    assert part.active and part.background_running and not part.foreground
    cost = PROFILE.cost
    assert part.step_target(0.08, cost, 60 * 800, 60) == LATENCY_STEP_FACTOR * cost.decode_s(60 * 800, 60)
    assert not part.defers(bulk, 1.0)               # nothing of the foreground to wait behind
    part.refresh(False, [bulk], 1.0)                # no decode with a TPOT SLO: nothing changes
    assert not part.active and part.step_target(0.08, cost, 60 * 800, 60) == 0.08


def test_background_prefill_waits_behind_foreground_work_for_a_bounded_time():
    part = _part(waiting_tpot=True)
    bulk, stream = _req("b", None, computed=512), _req("s", 0.1)
    part.refresh(True, [bulk], 0.0)
    assert part.foreground and part.takes_whole_budget(stream) and not part.takes_whole_budget(bulk)
    assert part.step_target(0.08, PROFILE.cost, 1000, 10) == 0.08      # a foreground step: not shaped
    assert not part.defers(stream, 0.0)
    assert part.defers(bulk, 0.0) and part.defers(bulk, 0.9 * MAX_BACKGROUND_DEFER_S)
    assert not part.defers(bulk, MAX_BACKGROUND_DEFER_S)               # no progress for D: served
    bulk.num_computed += 256                                           # it was served: the clock restarts
    assert part.defers(bulk, 1.5 * MAX_BACKGROUND_DEFER_S)
    part.refresh(True, [bulk], 2.0)
    assert part.deferred_since                                         # still foreground work
    part.queue.backlogged.clear()
    part.queue.num_queued = part.queue.num_waiting_tpot = 0              # the stream was admitted
    part.refresh(True, [bulk], 2.0)
    assert not part.foreground and not part.deferred_since


def test_would_defer_answers_as_defers_and_notes_nothing():
    part = _part(waiting_tpot=True)
    bulk, stream = _req("b", None, computed=512), _req("s", 0.1)
    part.refresh(True, [bulk], 0.0)
    assert part.would_defer(bulk, 0.0) and not part.would_defer(stream, 0.0)
    assert not part.deferred_since                                     # a query: nothing noted
    assert part.defers(bulk, 0.0)                                      # held from t = 0
    for now in (0.5 * MAX_BACKGROUND_DEFER_S, MAX_BACKGROUND_DEFER_S, 2 * MAX_BACKGROUND_DEFER_S):
        assert part.would_defer(bulk, now) == (now < MAX_BACKGROUND_DEFER_S)
        assert part.deferred_since[bulk] == (512, 0.0)
    assert not part.defers(bulk, MAX_BACKGROUND_DEFER_S)               # the mutation agrees
    bulk.num_computed += 256                                           # served: the clock restarts
    assert part.would_defer(bulk, 3.0) and part.deferred_since[bulk] == (512, 0.0)


def test_a_light_background_prefill_does_not_hold_back_the_foreground_it_waits_behind():
    """hol, seed 15: the docs tenant (no TPOT SLO) is light by the share meter while its
    19K-token prompt prefills next to a chat prompt (TPOT SLO) admitted after it.  The docs
    prefill is background and waits behind the chat one; counted as a light prefill it would
    defer the chat prefill in turn, and the two, both deferred, went in admission order: the
    docs prompt took the whole budget for ten steps, and the chat prompt's last 539 tokens
    came 1.23 s after its first chunk (chat's P99 TTFT 2.34x its isolated run)."""
    wl, contract = build_scenario("hol", 15)
    out = simulate(wl, "fair", contract, PROFILE)
    chat = out.summary["tenants"]["chat"]
    assert chat["ttft_p99_vs_isolated"] <= 2.0                        # 1.41x
    rec = next(r for r in out.records if r["request_id"] == "hol-000027")
    assert rec["first_token_s"] - rec["scheduled_s"] < 0.5            # 0.14 s


def test_a_forecast_past_half_the_max_wait_makes_the_engine_deadline_bound():
    part = _part()
    part.note_forecast(0.9 * TIGHT_WAIT_FRACTION * 100.0, 100.0, 5.0)
    part.note_forecast(None, 100.0, 5.0)
    assert part.tight_until_s == float("-inf")
    part.note_forecast(1.1 * TIGHT_WAIT_FRACTION * 100.0, 100.0, 5.0)
    assert part.tight_until_s == 105.0
    cost = PROFILE.cost
    bulk = _req("b", None)
    part.refresh(True, [bulk], 104.0)
    assert not part.active and part.step_target(0.08, cost, 1000, 10) == 0.08     # full steps
    part.refresh(True, [bulk], 105.0)
    assert part.active and part.step_target(0.08, cost, 1000, 10) < 0.08


def test_a_step_with_a_foreground_prefill_carries_no_background_prefill():
    part = _part(waiting_tpot=True)
    bulk, stream = _req("b", None, computed=512), _req("s", 0.1)
    part.tight_until_s = 1e9                       # deadline-bound: still, foreground goes first
    part.refresh(True, [bulk], 0.0)
    assert not part.active and part.foreground and not part.foreground_in_step
    assert part.defers(bulk, 0.0) and not part.yields_step(bulk, 0.0)
    part.note_admitted(stream)                     # the waiting stream is admitted into the step
    assert part.foreground_in_step and part.yields_step(bulk, 0.5) and not part.yields_step(stream, 0.5)
    assert not part.yields_step(bulk, MAX_BACKGROUND_DEFER_S)     # held D without progress: served
    part.refresh(True, [bulk, stream], 2.0)
    assert part.foreground_in_step                 # a foreground prefill still runs
    part.refresh(False, [bulk, stream], 2.0)       # no decode with a TPOT SLO: nothing yields
    assert not part.foreground_in_step and not part.defers(bulk, 2.0)


class _Steps:
    """A simulated engine that records each step: its prefill by tenant and its duration."""

    def __init__(self) -> None:
        self.sim = SimEngine(PROFILE)
        self.steps: list[tuple[int, int, bool, float]] = []    # (bulk prefill, stream prefill, decodes?, s)

    def add(self, req, row):
        self.sim.add(req, row.output_tokens)

    def forget(self, req):
        self.sim.forget(req)

    def advance(self, durations):
        self.sim.advance(durations)

    def execute(self, out):
        result = self.sim.execute(out)
        bulk = sum(n for r, n in out.prefill if r.tenant == "bulk")
        stream = sum(n for r, n in out.prefill if r.tenant != "bulk")
        self.steps.append((bulk, stream, bool(out.decode), result.duration_s))
        return result


def _run(contract):
    rows = [TraceRow(f"s-{i:03d}", 0.25 * i, "stream", 300 + 7 * (i % 50), 200) for i in range(160)]
    rows += [TraceRow(f"b-{i:03d}", 10.0 + 0.1 * i, "bulk", 8000, 20) for i in range(30)]
    rows.sort(key=lambda r: (r.arrival_s, r.request_id))
    sched = IterationScheduler(make_policy("fair"), contract, PROFILE)
    eng = _Steps()
    records = run(rows, contract, sched, eng, VirtualClock())
    by_id = {r.request_id: r for r in records.requests}
    ttft = sorted(by_id[r.request_id].first_token_s - r.arrival_s for r in rows if r.tenant == "stream")
    finished = sum(by_id[r.request_id].status.value == "finished" for r in rows)
    return eng.steps, ttft[int(0.99 * len(ttft))], finished


def test_streams_keep_their_first_token_time_while_a_burst_prefills_in_the_background():
    steps, p99, finished = _run(SLACK)
    _, p99_without, finished_without = _run(NO_BACKGROUND)
    assert finished == finished_without == 190         # nothing refused, all served
    assert p99 < 0.6 * p99_without
    # the burst's own steps (bulk prefill only, beside the streams' decodes) were short
    bulk_only = [s for b, st, dec, s in steps if b and not st and dec]
    assert bulk_only and sorted(bulk_only)[len(bulk_only) // 2] < 0.05


def test_a_deadline_bound_burst_is_prefilled_in_full_steps():
    steps, _, _ = _run(TIGHT)
    slack_steps, _, _ = _run(SLACK)
    def mean_bulk(ss):
        chunks = [b for b, st, dec, s in ss if b and dec]
        return sum(chunks) / len(chunks)
    assert mean_bulk(steps) > 1.5 * mean_bulk(slack_steps)


def test_a_backlogged_background_tenant_keeps_its_share_under_a_foreground_flood():
    """A front end floods the TPOT-SLO class without pause while an analytics tenant keeps a
    queue in a class without one: deferring the analytics prefill behind every foreground
    admission would leave it the budget the flood does not use (about 22% of the service,
    against an equal weight's 50%).  Once it has been backlogged for the share meter's time
    constant and is under its share, it is no longer deferred."""
    contract = contract_of(
        {"analytics": {"weight": 1, "default_class": "batch", "max_queued": 5000},
         "fe": {"weight": 1, "max_queued": 20000}},
        {"interactive": {"priority": 20, "max_wait_s": 30, "ttft_slo_s": 2.0, "tpot_slo_s": 0.1},
         "batch": {"priority": 0, "max_wait_s": 300}})
    workload = poisson_workload("bg-flood", 7, [
        ("fe", 14.0, 0, 180, (600, 0.6, 32, 6000), (200, 0.6, 8, 1200)),
        ("analytics", 2.0, 0, 180, (3000, 0.5, 64, 8000), (300, 0.5, 16, 1500))])
    fairness = fair_fairness(workload, contract)
    assert fairness["jain_windows"] >= 2
    assert fairness["jain_min"] >= 0.98                     # 0.75 while the flood deferred it
    assert fairness["share_deviation"]["analytics"]["mean"] > -0.05      # -0.28 then
