"""Metrics that cannot be gamed: service gaps, starvation events, overdue split, goodput."""

import numpy as np

from tokenfair.evaluation.goodput import finished_tokens_by, goodput, in_time, outcomes, vs_baseline
from tokenfair.evaluation.bucket_series import BacklogIntervals, ServiceSeries
from tokenfair.evaluation.metrics import entitled_shares
from tokenfair.evaluation.overdue import overdue_split
from tokenfair.evaluation.servicegaps import longest_gap_s, service_gaps, starvation


def rec(tenant, arrival, scheduled, finish, *, klass="c", max_wait=None, status="finished", prompt=100,
        output=10, first=None, reason=None, ttft_slo=None, tpot_slo=None):
    return {"tenant": tenant, "class": klass, "arrival_s": arrival, "scheduled_s": scheduled,
            "first_token_s": first if first is not None else scheduled, "finish_s": finish,
            "status": status, "max_wait_s": max_wait, "prompt_tokens": prompt, "output_tokens": output,
            "reason": reason, "ttft_slo_s": ttft_slo, "tpot_slo_s": tpot_slo, "deadline_s": None}


def test_a_gap_is_backlogged_and_unserved():
    recs = [rec("a", 0.0, 5.0, 10.0), rec("a", 2.0, 12.0, 20.0)]
    assert service_gaps(recs) == [(0.0, 5.0), (10.0, 12.0)]
    assert longest_gap_s(recs) == 5.0


def test_a_request_admitted_as_another_ends_leaves_no_gap():
    recs = [rec("a", 0.0, 0.0, 10.0), rec("a", 1.0, 10.0, 20.0)]
    assert service_gaps(recs) == []


def test_rejected_requests_are_never_backlogged():
    recs = [rec("a", 3.0, None, 3.0, status="rejected", reason="overloaded: predicted wait 99s")]
    assert service_gaps(recs) == []


def test_a_tenant_served_throughout_does_not_starve_however_long_its_excess_waits():
    # the flooder always has a request running; its queued excess waits 100 s past max wait
    flood = [rec("f", 0.0, 0.0, 50.0, max_wait=10), rec("f", 0.0, 50.0, 100.0, max_wait=10),
             rec("f", 1.0, 100.0, 150.0, max_wait=10)]
    starved = rec("s", 20.0, 45.0, 60.0, max_wait=10)        # 25 s with nothing running
    s = starvation(flood + [starved])
    assert s["tenants"]["f"] == {"longest_service_gap_s": 0.0, "starvation_events": 0}
    assert s["tenants"]["s"] == {"longest_service_gap_s": 25.0, "starvation_events": 1}
    assert s["starvation_events"] == 1 and s["longest_service_gap_s"] == 25.0
    assert s["events"][0]["tenant"] == "s" and s["events"][0]["gap_s"] == 25.0
    # a class is backlogged and unserved only when none of its tenants is served
    assert s["classes"]["c"]["longest_service_gap_s"] == 0.0


def test_a_gap_within_the_max_wait_is_no_event():
    s = starvation([rec("s", 0.0, 9.0, 20.0, max_wait=10)])
    assert s["starvation_events"] == 0 and s["tenants"]["s"]["longest_service_gap_s"] == 9.0


def test_goodput_counts_in_time_and_slo_tokens_of_finished_requests():
    recs = [rec("a", 0.0, 1.0, 5.0, max_wait=2.0, prompt=100, output=10),      # in time
            rec("a", 0.0, 3.0, 9.0, max_wait=2.0, prompt=200, output=20),      # first token late
            rec("a", 0.0, None, 0.0, max_wait=2.0, status="rejected", reason="overloaded: x"),
            rec("a", 0.0, None, 4.0, status="expired", reason="deadline_infeasible: y"),
            rec("b", 0.0, 8.0, 9.0, prompt=50, output=5)]                      # no max wait: in time
    g = goodput(recs, [True, False, False, False, True])
    assert g == {"finished_tokens": 385, "in_time_tokens": 165, "in_time_requests": 2, "slo_tokens": 165}
    assert not in_time(recs[2])
    assert outcomes(recs) == {"expired": {"deadline_infeasible": 1}, "rejected": {"overloaded": 1}}
    stored = [rec("a", 0.0, None, 1.0, status="failed", reason=r) for r in (None, "", "http_502: bad gateway")]
    assert outcomes(stored) == {"failed": {"other": 1, "unspecified": 2}}   # code_of's fallbacks


def test_throughput_against_a_baseline_uses_one_horizon():
    mine = [rec("a", 0.0, 0.0, 10.0, prompt=100, output=0), rec("a", 0.0, 0.0, 30.0, prompt=100, output=0)]
    # the baseline rejected nothing and is slower: by t=20 it finished 100 tokens, by t=40 300
    base = [rec("a", 0.0, 0.0, 20.0, prompt=100, output=0), rec("a", 0.0, 0.0, 40.0, prompt=200, output=0)]
    v = vs_baseline(mine, base)
    assert v["horizon_s"] == 30.0 and v["finished_tokens"] == 200 and v["baseline_finished_tokens"] == 100
    assert v["ratio"] == 2.0
    assert finished_tokens_by(base, 39.9) == 100


def _all_along(n):
    return BacklogIntervals.merged(np.array([0]), np.array([n]))


def _flat(n, value):
    return ServiceSeries(np.arange(n), np.full(n, value))


def _entitled(weights):
    return lambda members: entitled_shares({t: weights[t] for t in members}, {})


def test_overdue_split_by_the_share_the_tenant_received_while_it_waited():
    n = 100
    backlog = {"a": _all_along(n), "b": _all_along(n)}
    # a received 10% of the service while both were backlogged: its overdue request is a
    # scheduling failure; b's (90%) is its own excess
    service = {"a": _flat(n, 1.0), "b": _flat(n, 9.0)}
    recs = [rec("a", 10.0, 80.0, 90.0, max_wait=30), rec("b", 10.0, 80.0, 90.0, max_wait=30),
            rec("b", 10.0, 20.0, 30.0, max_wait=30)]                          # not overdue
    split = overdue_split(recs, service, backlog, n, 1.0, _entitled({"a": 1.0, "b": 1.0}))
    assert split["within_share"] == 1 and split["over_share"] == 1
    assert split["tenants"] == {"a": {"within_share": 1, "over_share": 0}, "b": {"within_share": 0, "over_share": 1}}


def test_two_tenants_splitting_evenly_are_both_over_share():
    n = 100
    backlog = {"a": _all_along(n), "b": _all_along(n)}
    service = {"a": _flat(n, 4.9), "b": _flat(n, 5.1)}
    recs = [rec("a", 10.0, 80.0, 90.0, max_wait=30), rec("b", 10.0, 80.0, 90.0, max_wait=30)]
    split = overdue_split(recs, service, backlog, n, 1.0, _entitled({"a": 1.0, "b": 1.0}))
    assert split["within_share"] == 0 and split["over_share"] == 2
