"""Three gateways sharing state through a real redis-server, in front of two fake FIFO
backends: fleet-wide weighted shares within 3% of one gateway's on the same load, and a
rate-limited tenant within one request's cost of its limit under 64 concurrent clients."""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack

import pytest

from tokenfair.fleet.rehearsal import FleetSpec, StopRule, closed_loop, shares, start_fleet

from fleet_helpers import KEYS, RATE, WEIGHTS, contract, cost, keyring

DURATION_S = 2.0
MIN_FINISHED = 120        # shares are measured on at least this many requests, however slow the machine
CLIENTS = {"a": 8, "b": 8, "c": 8}


def rule(min_finished: int = MIN_FINISHED) -> StopRule:
    return StopRule(DURATION_S, min_finished)


def entitled(tenants):
    total = sum(WEIGHTS[t] for t in tenants)
    return {t: WEIGHTS[t] / total for t in tenants}


def run(spec, c, load):
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)
        return asyncio.run(load(fleet.urls)), fleet


def test_fleet_shares_match_one_gateway(redis_server):
    c = contract()
    one, _ = run(FleetSpec(num_gateways=1), c, lambda urls: closed_loop(urls, KEYS, CLIENTS, rule()))
    three, fleet = run(FleetSpec(num_gateways=3, redis_url=redis_server.url, fleet="even"), c,
                       lambda urls: closed_loop(urls, KEYS, CLIENTS, rule()))
    s1, s3 = shares(one.served), shares(three.served)
    assert all(abs(s1[t] - s3[t]) <= 0.03 for t in CLIENTS), (s1, s3)
    assert all(abs(s3[t] - entitled(CLIENTS)[t]) <= 0.03 for t in CLIENTS), s3
    # every gateway took part, and no request failed
    assert all(any(r["status"] == "finished" for r in gw.records.items) for gw in fleet.gateways)
    assert all(set(v) == {"200"} for v in three.counts.values()), three.counts


@pytest.mark.parametrize("shared", [True, False], ids=["fleet", "independent"])
def test_skewed_spread_is_fair_only_with_shared_state(redis_server, shared):
    """Tenant a reaches only the first gateway, b and c all three.  Independent gateways
    each fill the backends (their windows add up) and a gets a third of its due; sharing
    tags, leases and backlogs, the fleet serves a as one gateway would."""
    c = contract()

    async def load(urls):
        both = rule()           # as many requests either way: with 40, noise reached the 5% margin
        first, rest = await asyncio.gather(closed_loop(urls[:1], KEYS, {"a": 8}, both),
                                           closed_loop(urls, KEYS, {"b": 8, "c": 8}, both))
        return {**first.served, **rest.served}

    spec = FleetSpec(num_gateways=3, redis_url=redis_server.url if shared else None, fleet="skew")
    served, _ = run(spec, c, load)
    s, want = shares(served), entitled(CLIENTS)
    if shared:
        assert all(abs(s[t] - want[t]) <= 0.03 for t in CLIENTS), s
    else:
        assert s["a"] < want["a"] - 0.05, s        # the failure the fleet state removes


@pytest.mark.parametrize("shared", [True, False], ids=["fleet", "independent"])
def test_rate_limit_holds_fleet_wide_under_64_clients(redis_server, shared):
    """64 clients of the rate-limited tenant r spread over three gateways: the cost admitted
    fleet-wide stays within burst + rate x time + one request's cost (LiteLLM's failure
    case is limit x replicas); independent gateways, each holding the whole limit, admit more
    than the limit (up to three times, as far as the machine keeps up)."""
    c = contract()
    spec = FleetSpec(num_gateways=3, num_backends=2, backend_concurrency=16, token_delay_s=0.001,
                     redis_url=redis_server.url if shared else None, fleet="rate")
    duration = 1.0
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)
        out = asyncio.run(closed_loop(fleet.urls, KEYS, {"r": 64}, duration, max_tokens=4, prompt_words=4,
                                      wp=c.costs.prefill_token, wd=c.costs.decode_token))
        recs, starts, arrivals = [], [], []
        for gw in fleet.gateways:
            origin = time.perf_counter() - gw.now()       # each gateway's clock starts at its construction
            done = [r for r in gw.records.items if r["status"] == "finished"]
            recs += done
            starts += [origin + r["scheduled_s"] for r in done]
            arrivals += [origin + r["arrival_s"] for r in done]
        admitted = sum(cost(c, r["prompt_tokens"], r["output_tokens"]) for r in recs)
        refused = sum(getattr(gw, "fleet").refusals.get("rate", 0) for gw in fleet.gateways) if shared else 0
    # the bucket runs on Redis's clock: its dispatches lie between the first arrival and the
    # last release seen here (a reply arrives after the script ran)
    span = max(starts) - min(arrivals)
    one_request = cost(c, 4 + 2, 4)               # prompt words (+ the estimate's slack) and max_tokens
    limit = RATE["burst_tokens"] + RATE["tokens_per_s"] * span
    if shared:
        print(f"rate-limited tenant: cost {admitted} over {span:.2f}s, limit {limit:.0f} + one request {one_request}")
        assert admitted <= limit + one_request, (admitted, limit, span)
        # the fleet bucket was what held r back, and it was not bought by refusing: every
        # request was served (queued at its gateway until the bucket allowed it)
        assert refused > 0
        assert all(set(v) <= {"200"} for v in out.counts.values()), out.counts
    else:
        assert admitted > limit + one_request, (admitted, limit)
