"""The gateway restores fairness that a bare FIFO backend does not give.

A FAKE OpenAI-compatible backend serves requests strictly FIFO, two at a time, 4 ms per
token.  A heavy tenant sends 16 requests at once, a light tenant 3 small ones shortly
after.  Direct, the light requests wait behind the whole heavy burst; through the gateway
(fair policy, adaptive window) they are released as soon as the backend has room.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx


async def _one(client, url, key, delay, max_tokens):
    await asyncio.sleep(delay)
    t0 = time.perf_counter()
    ttft = None
    async with client.stream("POST", url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                             json={"prompt": "a b c d", "max_tokens": max_tokens, "stream": True}) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if ttft is None and line.startswith("data: ") and '" t0"' in line:
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0, t0 + ttft, time.perf_counter()


async def _scenario(url, keys):
    async with httpx.AsyncClient(timeout=60) as client:
        heavy = [_one(client, url, keys["heavy"], 0.0, 20) for _ in range(16)]
        light = [_one(client, url, keys["light"], 0.1 + 0.05 * i, 5) for i in range(3)]
        t0 = time.perf_counter()
        res = await asyncio.gather(*heavy, *light)
        return res[:16], res[16:], time.perf_counter() - t0


def test_gateway_gives_light_tenant_low_ttft(h):
    from tokenfair.serve.app import create_app
    from tokenfair.serve.auth import KeyRing
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import Gateway
    from tokenfair.serve.shutdown import ServerThread

    contract = h.service_contract()
    fake = create_fake_backend(concurrency=2, token_delay_s=0.004)
    with ServerThread(fake) as be:
        gw = Gateway(contract, KeyRing(contract), [be.url])
        with ServerThread(create_app(gw), gw) as gst:
            d_heavy, d_light, d_span = asyncio.run(_scenario(be.url, h.KEYS))
            g_heavy, g_light, g_span = asyncio.run(_scenario(gst.url, h.KEYS))
        assert fake.state.stats["max_active"] == 2
    direct = statistics.median(r[0] for r in d_light)
    via = statistics.median(r[0] for r in g_light)

    def heavy_done_before(light, heavy):
        """How many heavy requests finished before each light one got its first token:
        an order, so it does not stretch when the machine is loaded as times do."""
        return statistics.median(sum(1 for hv in heavy if hv[3] < lt[2]) for lt in light)

    # FIFO: the light tenant waits for most of the heavy burst; the gateway serves it next
    assert heavy_done_before(d_light, d_heavy) >= 10
    assert heavy_done_before(g_light, g_heavy) <= 4
    assert direct > 0.3, direct
    assert via < 0.6 * direct, (via, direct)
    # the backend stays busy: the gateway costs little throughput
    assert g_span < 1.5 * d_span + 0.3, (g_span, d_span)
    recs = list(gw.records.items)
    assert len(recs) == 19 and all(r["status"] == "finished" for r in recs)
    assert all(r["output_tokens"] in (5, 20) for r in recs)
    assert 1 <= gw.backends[0].window.window <= 8
    assert not gw.jobs and not gw.running
