"""Random tenant mixes with random contracts (``workloads/random_mix.py``): workloads outside
the built-in scenarios, for ``scripts/outside_acceptance.py``; and the rules they showed
missing:

* a reservation is owned, and the reserved slots taken, only by a tenant within its share of
  service as well as of slots (``fair/headroom.py``): on mix 16 a weight-1 tenant sending a
  burst of 11K-token prompts held fewer slots than its share and so took the reserved slots
  past two weight-3 tenants whose requests were decodes -- 0.47 of the service of the three
  over a minute against its entitled 0.14 (Jain 0.59, vtc 1.00);
* no shedding decision extrapolates the load more than a minute ahead: a class with a longer
  max wait is not shed at arrival, and its requests are reviewed a minute before their max
  wait (``fair/forecast.py``, Horizon; ``fair/review.py``): on mix 44 a batch tenant (max
  wait 600 s) flooding beside interactive streams for the trace's 300 s would have 1,346 of
  its 1,708 requests shed by a forecast over 600 s at arrival, at a precision of 6% (kept,
  every one starts within 480 s);
* a request that can no longer make it leaves the queue then, instead of being served late
  ahead of later ones that still can: on mix 40, whose 1,225-request batch burst of a
  weight-1 tenant waits up to 500 s, fair's in-time goodput served in key order without
  shedding is 4.36 M tokens against fifo's 4.76 M, and with the review 5.49 M.
"""

from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.shedding import bench_shedding
from tokenfair.sched.fair.policy import FairPolicy
from tokenfair.sched.scheduler import IterationScheduler
from tokenfair.sim.simulate import simulate
from tokenfair.workloads.random_mix import random_mix


def test_a_mix_is_the_same_for_a_seed_and_valid():
    wl, contract, light = random_mix(16)
    again, contract2, light2 = random_mix(16)
    assert wl.rows == again.rows and contract == contract2 and light == light2
    assert [r.arrival_s for r in wl.rows] == sorted(r.arrival_s for r in wl.rows)
    assert {r.tenant for r in wl.rows} == set(contract.tenants)
    assert "burst" in contract.tenants and contract.classes["batch"].max_wait_s == 600
    assert light and set(light) < set(contract.tenants)
    assert random_mix(17)[0].rows != wl.rows


def test_a_tenant_ahead_in_service_owns_no_reservation():
    _, contract, _ = random_mix(16)
    policy = FairPolicy()
    IterationScheduler(policy, contract, load_profile(None))
    roster, headroom, wfq = policy.roster, policy.headroom, policy.wfq
    for name in ("s0", "burst"):
        t = roster.tenant(name, 0.0)
        t.active, t.slots_peak, t.kv_peak = True, 4.0, 100.0        # within its share of both
        roster.active_weight += t.weight
    assert set(headroom.reservations()[0]) == {"s0", "burst"}
    roster.tenants["burst"].vtime = wfq.vnow + 2 * wfq.credit      # ahead of V by more than C / w
    assert not wfq.within_share(roster.tenants["burst"])
    headroom.invalidate()
    assert set(headroom.reservations()[0]) == {"s0"}


def test_long_prompts_do_not_take_the_reserved_slots_past_heavier_tenants():
    wl, contract, _ = random_mix(16)
    fairness = simulate(wl, "fair", contract, load_profile(None), isolated=False).summary["fairness"]
    assert fairness["jain_windows"] >= 3
    assert fairness["jain_min"] >= 0.98                           # 0.587 when slots alone counted
    assert fairness["share_deviation"]["burst"]["max_abs"] < 0.05   # 0.33


def test_a_flood_shorter_than_its_max_wait_is_not_shed():
    wl, contract, _ = random_mix(44)
    scores = bench_shedding(wl, contract, load_profile(None))
    assert scores["precision"] is not None and scores["precision"] >= 0.9     # 0.06 shed at arrival
    assert scores["tenants"].get("h0", {}).get("shed", 0) == 0                # 1,346 of 1,708 at arrival
    assert scores["on"]["in_time_tokens"] >= scores["off"]["in_time_tokens"]


def _started_after_a_later_arrival(recs: list[dict]) -> list[dict]:
    """The requests that started late (past their max wait) after a request of the same tenant
    and class that arrived after them had started: O(n log n)."""
    out = []
    for group in {(r["tenant"], r["class"]) for r in recs}:
        rows = sorted((r for r in recs if (r["tenant"], r["class"]) == group), key=lambda r: r["arrival_s"])
        first_later_start = float("inf")
        for r in reversed(rows):
            if r["scheduled_s"] - r["arrival_s"] > r["max_wait_s"] and first_later_start < r["scheduled_s"]:
                out.append(r)
            first_later_start = min(first_later_start, r["scheduled_s"])
    return out


def test_a_burst_past_its_max_wait_leaves_the_queue_it_cannot_make_and_keeps_arrival_order():
    wl, contract, _ = random_mix(40)
    fifo = simulate(wl, "fifo", contract, load_profile(None), isolated=False)
    scores = bench_shedding(wl, contract, load_profile(None))
    assert scores["on"]["in_time_tokens"] >= fifo.summary["goodput"]["in_time_tokens"]    # 5.62 M against 4.76 M
    assert scores["off"]["in_time_tokens"] < fifo.summary["goodput"]["in_time_tokens"]    # 4.36 M unshed
    assert scores["precision"] >= 0.95                                                     # 712 shed, 99.4%
    assert set(scores["tenants"]) <= {"h1", "burst"} and scores["on"]["outcomes"] == {"expired": {"overloaded": 712}}
    fair = simulate(wl, "fair", contract, load_profile(None), isolated=False)
    started = [r for r in fair.records if r["status"] == "finished"]
    assert len(started) + scores["shed"] == len(fair.records)
    assert not _started_after_a_later_arrival(started)      # no late request waits for a later one
    assert not _started_after_a_later_arrival(fifo.records)


def test_a_low_weight_tenant_a_few_credits_ahead_is_not_left_starving():
    # mix 11: h0 (weight 1, prompts of 1-5K tokens) is credits ahead of V after a burst of
    # its service; forced only within its share (STARVING_LEAD_CREDITS 0) it waits 6.70 s
    # with nothing running
    wl, contract, _ = random_mix(11)
    runs = {p: simulate(wl, p, contract, load_profile(None), isolated=False) for p in ("vtc", "fair")}
    gap = {p: res.summary["longest_service_gap_s"] for p, res in runs.items()}
    assert gap["fair"] <= gap["vtc"]                      # 0.90 s against 2.26 s
    by_tenant = runs["fair"].summary["tenants"]
    assert by_tenant["h0"]["longest_service_gap_s"] < 1.5        # 0.77 s


def test_the_script_refuses_a_bad_seed_range_with_exit_2():
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).parent.parent / "scripts" / "outside_acceptance.py"
    for bad in ("x", "5-2", "-3"):
        res = subprocess.run([sys.executable, str(script), "--seeds", bad], capture_output=True, text=True)
        assert res.returncode == 2 and "--seeds" in res.stderr and "LO-HI" in res.stderr, (bad, res.stderr)
