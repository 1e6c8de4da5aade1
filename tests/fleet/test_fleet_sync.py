"""The fleet's slow path on a real redis-server: the live contract reaches every gateway, the
door's 429 and x-ratelimit-* headers and the policy's recent shares come from the fleet."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from contextlib import ExitStack

import httpx
import pytest
import redis

from tokenfair.contracts.contract import parse_contract
from tokenfair.fleet.contract_sync import contract_text
from tokenfair.fleet.rehearsal import FleetSpec, closed_loop, start_fleet
from tokenfair.fleet.sync import RecentService, SharedView
from tokenfair.serve.auth import hash_key
from tokenfair.serve.contract_live import label_of

from concurrency import wait_until
from fleet_helpers import KEYS, RATE, WEIGHTS, contract, keyring

ADMIN_KEY = "fleet-admin-key"


def _with_admin(fleet) -> None:
    for gw in fleet.gateways:
        gw.live.admin_key_sha256 = hashlib.sha256(ADMIN_KEY.encode()).hexdigest()


def test_contract_text_round_trips_to_the_same_tag():
    c = contract()
    assert label_of(parse_contract(json.loads(contract_text(c)))) == label_of(c)


def test_recent_service_decays_increments():
    r = RecentService(tau_s=10.0)
    r.update({"a": 100.0}, now=0.0)            # the history before the first read is not known
    assert r.recent == {"a": 0.0} and r.known()
    r.update({"a": 150.0, "b": 30.0}, now=10.0)
    assert r.recent["a"] == pytest.approx(50.0) and r.recent["b"] == 0.0
    r.update({"a": 150.0, "b": 60.0}, now=20.0)
    assert r.recent["a"] == pytest.approx(50.0 / 2.718281828, rel=1e-6) and r.recent["b"] == pytest.approx(30.0)


def test_shared_view_bucket_refills_to_now():
    v = SharedView(read_s=5.0, redis_now=100.0, buckets={"r": (-60.0, 99.0)})
    assert v.bucket_level("r", rate=10.0, burst=50.0, now=5.0) == pytest.approx(-50.0)
    assert v.bucket_level("r", rate=10.0, burst=50.0, now=7.0) == pytest.approx(-30.0)
    assert v.bucket_level("r", rate=10.0, burst=50.0, now=100.0) == 50.0
    assert v.bucket_level("x", rate=10.0, burst=50.0, now=5.0) is None


def test_contract_change_reaches_every_gateway(redis_server):
    c = contract()
    spec = FleetSpec(num_gateways=3, redis_url=redis_server.url, fleet="live", heartbeat_s=0.1)
    r = redis.Redis.from_url(redis_server.url)
    data = c.model_dump(mode="json")
    data["version"] = "fleet-test-2"
    data["tenants"]["a"]["weight"] = 5.0
    new = parse_contract(data)
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)
        _with_admin(fleet)
        assert r.get("tf:live:contract").decode() == label_of(c)
        t0 = time.perf_counter()
        resp = httpx.post(fleet.urls[0] + "/admin/contract", content=json.dumps(data),
                          headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        assert resp.status_code == 200, resp.text
        assert wait_until(lambda: all(gw.contract.version == "fleet-test-2" for gw in fleet.gateways), 5)
        took = time.perf_counter() - t0
        assert r.get("tf:live:contract").decode() == label_of(new)
        assert all(gw.policy.tenants.get("a") is None or gw.policy.tenants["a"].weight == 5.0 for gw in fleet.gateways)
        health = [httpx.get(u + "/healthz").json()["fleet"] for u in fleet.urls]
        assert all(h["contract_matches"] and h["contract_here"] == label_of(new) for h in health)
        assert [h["contracts_adopted"] for h in health] == [0, 1, 1]
        events = [e.event for e in fleet.gateways[1].live.events]
        assert events[-1] == "fleet"
        metrics = httpx.get(fleet.urls[1] + "/metrics").text.splitlines()
        assert "tokenfair_fleet_contracts_adopted_total 1.0" in metrics
        assert "tokenfair_fleet_contract_matches 1.0" in metrics
        age = [float(x.split()[1]) for x in metrics if x.startswith("tokenfair_fleet_view_age_seconds ")]
        assert age and 0 <= age[0] < 5
        # a rollback on another gateway goes back everywhere
        resp = httpx.post(fleet.urls[2] + "/admin/contract/rollback",
                          headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        assert resp.status_code == 200, resp.text
        assert wait_until(lambda: all(gw.contract.version == "fleet-test" for gw in fleet.gateways), 5)
        # a gateway starting with an older file adopts the fleet's live contract
        resp = httpx.post(fleet.urls[1] + "/admin/contract", content=json.dumps(data),
                          headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
        assert resp.status_code == 200
        late = start_fleet(FleetSpec(num_gateways=1, num_backends=1, redis_url=redis_server.url, fleet="live",
                                     heartbeat_s=0.1), c, keyring(c), stack)
        assert wait_until(lambda: late.gateways[0].contract.version == "fleet-test-2", 5)
    print(f"contract reached 3 gateways in {took * 1000:.0f} ms")
    assert took < 5


def _tight_contract():
    tenants = {t: {"weight": WEIGHTS[t], "api_key_sha256": [hash_key(k)]} for t, k in KEYS.items()}
    tenants["r"].update(rate_limit=RATE, default_class="tight")
    return parse_contract({"version": "fleet-door", "tenants": tenants,
                           "classes": {"tight": {"priority": 10, "max_wait_s": 0.4}, "interactive": {}}})


@pytest.mark.parametrize("shared", [True, False], ids=["fleet", "independent"])
def test_rate_limited_tenant_gets_429s_from_the_fleet_limit(redis_server, shared):
    """Tenant r (300 cost/s, max wait 0.4 s) with 6 clients per gateway over three: a
    gateway's own clients never queue more than ~0.3 s of r's rate, so a door that looked at
    its own bucket and queue would not refuse; the fleet's bucket and queues (three times
    that) do, at every gateway, with headers from the fleet's bucket.  Independent gateways
    may still shed ``overloaded`` when a loaded machine drains slowly; that is the scheduler,
    not the door.  The probes (a seventh client per gateway, looking for a 429's headers) run
    in the fleet case only: beside independent doors they would only bring each gateway's
    queue nearer its max wait."""
    c = _tight_contract()
    spec = FleetSpec(num_gateways=3, num_backends=2, backend_concurrency=16, token_delay_s=0.001,
                     redis_url=redis_server.url if shared else None, fleet="door", heartbeat_s=0.05)
    seen: list[httpx.Response] = []
    load_over = threading.Event()
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)

        def probe(u: str) -> None:   # from when the fleet's queues have built up to the load's end
            time.sleep(0.8)
            while not load_over.is_set() and not seen:
                resp = httpx.post(u + "/v1/completions", json={"prompt": "word word word word", "max_tokens": 4},
                                  headers={"authorization": f"Bearer {KEYS['r']}"}, timeout=10)
                if resp.status_code == 429:
                    seen.append(resp)
        probes = [threading.Thread(target=probe, args=(u,)) for u in fleet.urls if shared]   # one per gateway
        for t in probes:
            t.start()
        try:
            out = asyncio.run(closed_loop(fleet.urls, KEYS, {"r": 18}, 2.0, max_tokens=4, prompt_words=4,
                                          wp=c.costs.prefill_token, wd=c.costs.decode_token))
        finally:
            load_over.set()
        for t in probes:
            t.join()
        per_gateway = [sum(1 for x in gw.records.items if x["status"] == "rejected"
                           and x["reason"].startswith("rate_limited")) for gw in fleet.gateways]
        shed = [x["reason"] for gw in fleet.gateways for x in gw.records.items
                if x["status"] in ("rejected", "expired") and not x["reason"].startswith("rate_limited")]
    counts = out.counts["r"]
    if not shared:
        # no door refuses for the rate limit; a machine too loaded to drain 0.4 s of queue in
        # time may still shed (the scheduler's ``overloaded``), and each such 429 is on record
        assert sum(per_gateway) == 0, (counts, per_gateway)
        assert counts.get("429", 0) == len(shed), (counts, shed)
        assert all(r.startswith(("overloaded", "queue_full")) for r in shed), shed
        return
    assert counts.get("429", 0) > 0 and counts.get("200", 0) > 0, counts
    assert sum(1 for n in per_gateway if n > 0) >= 2, per_gateway
    assert seen, "no probe saw a 429 while the load ran"
    h = seen[0].headers
    assert h["x-tokenfair-ratelimit-scope"] == "fleet"
    assert "fleet-wide" in seen[0].json()["error"]["message"]
    assert int(h["x-ratelimit-limit-tokens"]) == int(RATE["burst_tokens"])
    # the fleet bucket's level: the door refuses on the predicted wait, which counts the cost
    # queued at every gateway, so the bucket itself may be full at that moment (it refills while
    # the queued requests wait to be dispatched on a loaded machine)
    assert 0 <= int(h["x-ratelimit-remaining-tokens"]) <= int(RATE["burst_tokens"])


def test_recent_shares_are_the_fleets(redis_server):
    """Tenant a sends only to gateway 0, tenant b only to gateway 1: gateway 0's fair policy
    sees b's service too (so a's share there is not 100%): the min-share and light-tenant
    decisions compare fleet shares."""
    c = contract()
    spec = FleetSpec(num_gateways=2, redis_url=redis_server.url, fleet="shares", heartbeat_s=0.05)
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)
        g0, g1 = fleet.gateways

        async def load():
            await asyncio.gather(closed_loop(fleet.urls[:1], KEYS, {"a": 2}, 1.0),
                                 closed_loop(fleet.urls[1:], KEYS, {"b": 6}, 1.0))
        asyncio.run(load())
        reads = g0.sync.num_reads
        assert wait_until(lambda: g0.sync.num_reads > reads + 1, 3)
        pol = g0.policy
        fleet = dict(g0.sync.recent.recent)
        local_share = pol.tenants["a"].recent / pol.meter.recent_total
    assert "b" not in pol.tenants                 # gateway 0 never saw tenant b's requests
    a, b = fleet["a"], fleet.get("b", 0.0)
    assert a > 0 and b > a                        # b had 3x the clients
    # a's share at gateway 0 is its fleet share (alone there, its local share would be 100%)
    assert local_share == pytest.approx(a / (a + b), abs=0.05) and local_share < 0.5


def test_a_fleet_contract_a_gateway_cannot_take_live_is_refused_there(redis_server):
    """A contract published to the fleet that does not validate (a negative weight) is refused
    by every running gateway, which keeps its contract and says so."""
    import json

    from tokenfair.fleet.sync_scripts import PUBLISH
    c = contract()
    data = c.model_dump(mode="json")
    data["version"] = "bad-weight"
    next(iter(data["tenants"].values()))["weight"] = -1.0
    tag = "bad-weight@000000000000"
    spec = FleetSpec(num_gateways=2, redis_url=redis_server.url, fleet="refuse", heartbeat_s=0.05)
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)
        r = redis.Redis.from_url(redis_server.url)
        r.register_script(PUBLISH)(keys=[], args=["tf:refuse", tag, json.dumps(data), "0"])
        assert wait_until(lambda: all(tag in gw.sync.contracts.refused for gw in fleet.gateways), 5)
        health = [httpx.get(u + "/healthz").json()["fleet"] for u in fleet.urls]
        metrics = httpx.get(fleet.urls[0] + "/metrics").text.splitlines()
        r.close()
    assert all(gw.contract.version == "fleet-test" for gw in fleet.gateways)
    assert all(not h["contract_matches"] and h["contract"] == tag for h in health)
    assert all("weight" in h["contract_refused"][tag] for h in health)
    assert "tokenfair_fleet_contract_matches 0.0" in metrics
    assert fleet.gateways[0].live.events[-1].event == "refused"
