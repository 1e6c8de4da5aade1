"""A real backend behind a fleet: one ``serve`` (the built-in PyTorch engine, tiny model)
behind two ``--redis`` gateways sharing a real redis-server; requests of two tenants spread
over both gateways are answered as by the backend directly and charged once, fleet-wide."""

from __future__ import annotations

import asyncio

import httpx
import pytest


@pytest.fixture
def fleet_on_serve(tiny_model_dir, h, tmp_path):
    pytest.importorskip("redis")
    from tokenfair.fleet.client import FleetClient
    from tokenfair.fleet.gateway import FleetGateway
    from tokenfair.fleet.redis_server import RedisServer, redis_server_path
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.shutdown import ServerThread

    if redis_server_path() is None:
        pytest.skip("redis-server is not installed: run `bash scripts/test-setup.sh` as root")
    srv = RedisServer(tmp_path / "redis", persist=False).start()
    contract = h.service_contract()
    svc, backend = h.start_serve(tiny_model_dir)
    gateways, threads = [], []
    try:
        for i in range(2):
            client = FleetClient(srv.url, "serve", f"gw{i}", timeout_s=2.0, heartbeat_s=0.1, lease_ttl_s=2.0)
            gw = FleetGateway(contract, KeyRing(contract), [backend.url], max_context=256, fleet=client)
            gateways.append(gw)
            threads.append(ServerThread(create_app(gw), gw).start())
        yield {"srv": srv, "backend": backend, "gateways": gateways, "urls": [t.url for t in threads],
               "contract": contract}
    finally:
        for t in threads:
            t.stop()
        backend.stop()
        srv.stop()


def test_two_gateways_on_a_real_backend_share_redis(fleet_on_serve, h):
    import redis
    f = fleet_on_serve
    body = {"prompt": "the quick brown fox", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    direct = httpx.post(f["backend"].url + "/v1/completions", json=body, headers=h.auth("a"), timeout=60).json()

    async def spread():
        async with httpx.AsyncClient(timeout=60) as http:
            jobs = [http.post(f["urls"][i % 2] + "/v1/completions", json=body, headers=h.auth(t))
                    for i, t in enumerate(["a", "heavy"] * 3)]
            return await asyncio.gather(*jobs)
    replies = asyncio.run(spread())
    assert [r.status_code for r in replies] == [200] * 6, [r.text for r in replies]
    assert all(r.json()["choices"][0]["text"] == direct["choices"][0]["text"] for r in replies)
    assert all(r.json()["usage"] == direct["usage"] for r in replies)
    gws = f["gateways"]
    assert all(len([x for x in gw.records.items if x["status"] == "finished"]) == 3 for gw in gws)
    assert h.wait_until(lambda: all(not gw.fleet._pending and not gw.fleet.leases for gw in gws), 10)
    r = redis.Redis.from_url(f["srv"].url)
    c = f["contract"].costs
    one = c.prefill_token * direct["usage"]["prompt_tokens"] + c.decode_token * direct["usage"]["completion_tokens"]
    served = {k.decode(): float(v) for k, v in r.hgetall("tf:serve:served").items()}
    dispatched = {k.decode(): int(v) for k, v in r.hgetall("tf:serve:dispatched").items()}
    assert dispatched == {"a": 3, "heavy": 3}
    assert served == pytest.approx({"a": 3 * one, "heavy": 3 * one})   # the backend's usage, charged once
    assert r.zcard(f"tf:serve:lb:{gws[0].backends[0].name}") == 0         # every lease given back
    tags = {k.decode(): float(v) for k, v in r.hgetall("tf:serve:S").items()}
    assert tags["a"] == pytest.approx(tags["heavy"], rel=0.35)           # equal weights, equal service
    r.close()
