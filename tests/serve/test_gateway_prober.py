"""The gateway's health prober built alone (no Gateway, no server; httpx's MockTransport as
the backends): down after N failed probes, back-off while down, up again, backend keys."""

from __future__ import annotations

import asyncio

import httpx

from gateway_parts_helpers import Clock, backends
from tokenfair.serve.gateway_health import HealthConfig, HealthProber


def test_prober_marks_down_after_n_failures_backs_off_and_comes_back_up():
    bs = backends(2)
    answers = {"10.0.0.1": 200, "10.0.0.2": 200}

    def handler(request: httpx.Request) -> httpx.Response:
        status = answers[request.url.host]
        if status == 0:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(status, json={"data": [{"id": "m-" + request.url.host}]})

    clock, wakes, drained = Clock(), [], []
    cfg = HealthConfig(probe_failures_down=2, probe_interval_s=1.0, max_probe_backoff_s=5.0)
    prober = HealthProber(bs, cfg, None, now=clock, wake=lambda: wakes.append(1),
                          drain=lambda b, reason: drained.append((b.name, reason.text)))
    b = bs[0]

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await prober.first_probes(client)
            assert all(x.up for x in bs) and prober.model_names() == ["m-10.0.0.1", "m-10.0.0.2"]
            assert b.next_probe_s == 1.0
            answers["10.0.0.1"] = 0
            clock.t = 2.0
            assert await prober.probe(client, b) is False
            assert b.up and b.next_probe_s == 2.0 and prober.state(b).failures == 1   # probe again at once
            assert await prober.probe(client, b) is False
            assert not b.up and drained == [("10.0.0.1:8000", "backend_unavailable: backend 1 stopped "
                                             "answering (ConnectError after 1.5 s)")]
            backoffs = []
            for _ in range(4):                      # down: the probe interval doubles up to the cap
                await prober.probe(client, b)
                backoffs.append(b.probe_backoff_s)
            assert backoffs == [2.0, 4.0, 5.0, 5.0] and b.next_probe_s == clock.t + 5.0
            assert not wakes
            answers["10.0.0.1"] = 200
            assert await prober.probe(client, b) is True
            assert b.up and wakes == [1] and prober.state(b).failures == 0 and b.probe_backoff_s == 1.0
            assert len(drained) == 1 and bs[1].up

    asyncio.run(scenario())


def test_prober_backend_key_401_is_a_failure_only_with_a_key():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": "bad key"}})

    for key, up in ((None, True), ("admin", False)):
        bs = backends(1)
        down = []
        prober = HealthProber(bs, HealthConfig(probe_failures_down=1), key, now=Clock(), wake=lambda: None,
                              drain=lambda b, reason: down.append(reason.text))

        async def scenario():
            async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
                await prober.first_probes(client)

        asyncio.run(scenario())
        assert bs[0].up is up and len(down) == (0 if up else 1)
        if not up:
            assert "rejects the gateway's --backend-key 401" in prober.state(bs[0]).reason


def test_prober_lists_models_with_the_clients_key_when_no_probe_could():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != "Bearer client":
            return httpx.Response(401)
        return httpx.Response(200, json={"data": [{"id": "tiny"}]})

    bs = backends(1)
    prober = HealthProber(bs, HealthConfig(), None, now=Clock(), wake=lambda: None, drain=lambda b, r: None)

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await prober.first_probes(client)                  # 401 without a key: alive, no models
            assert bs[0].up and prober.model_names() == []
            return await prober.list_models(client, {"Authorization": "Bearer client", "x-other": "1"})

    assert asyncio.run(scenario()) == ["tiny"] and seen == [None, "Bearer client"]
