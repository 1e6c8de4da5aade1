"""The fleet client: with Redis unreachable it decides from local state holding 1 / live
replicas of every fleet limit and journals each decision; when Redis answers again the
journal is replayed once, in order, and it is healthy again."""

from __future__ import annotations

import asyncio

import redis

from tokenfair.fleet.client import FleetClient
from tokenfair.fleet.local_store import LocalStore
from tokenfair.fleet.model import REASON_RATE, REASON_WINDOW, DispatchAsk
from tokenfair.fleet.redis_server import RedisServer, free_port


def ask(client: FleetClient, tenant: str = "t", backend: str = "b", **kw) -> DispatchAsk:
    base = dict(op_id=client.next_id("d"), lease_id=client.next_id("l"), gateway=client.gateway_id, tenant=tenant,
                weight=1.0, cost_pred=10.0, cost_max=10.0, rate=0.0, burst=0.0, max_concurrency=0, backend=backend,
                window=6, lease_ttl_s=5.0, credit=0.0)
    base.update(kw)
    return DispatchAsk(**base)


def test_local_store_holds_its_share_of_every_limit():
    async def run():
        s = LocalStore(share=1 / 3)
        win = [await s.dispatch(DispatchAsk(op_id=f"d{i}", lease_id=f"l{i}", gateway="g", tenant="t", weight=1.0,
                                            cost_pred=1.0, cost_max=1.0, rate=0.0, burst=0.0, max_concurrency=0,
                                            backend="b", window=6, lease_ttl_s=5.0, credit=0.0, now=10.0))
               for i in range(3)]
        assert [a.ok for a in win] == [True, True, False] and win[2].reason == REASON_WINDOW   # 6 / 3
        # a bucket of burst 30 at 1/3 holds 10: one request of 10 (to 0), a second (to -10), then refused
        rl = [await s.dispatch(DispatchAsk(op_id=f"e{i}", lease_id=f"m{i}", gateway="g", tenant="r", weight=1.0,
                                           cost_pred=10.0, cost_max=10.0, rate=3.0, burst=30.0, max_concurrency=0,
                                           backend=f"x{i}", window=6, lease_ttl_s=5.0, credit=0.0, now=10.0))
              for i in range(3)]
        assert [a.ok for a in rl] == [True, True, False] and rl[2].reason == REASON_RATE
        assert abs(rl[2].retry_s - 10.0) < 1e-9           # -10 refilled at 3 x 1/3 per second
    asyncio.run(run())


def test_unreachable_redis_degrades_then_replays_once(redis_binary, tmp_path):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"

    async def degraded_phase(client: FleetClient):
        await client.beat()
        assert not client.healthy and client.status()["redis"] == "degraded"
        granted = []
        for _ in range(3):
            a = ask(client)
            assert (await client.dispatch(a)).ok
            granted.append(a)
        await client.complete(granted[0], 7.0)
        return granted

    async def recovered_phase(client: FleetClient, granted):
        assert len(client.journal) == 4                 # three dispatches and a completion
        await client.beat()
        assert client.healthy and not client.journal and client.num_replayed == 4
        await client.complete(granted[1], 5.0)          # straight to Redis now
        await client.beat()                             # a replay of nothing: no double charge
        await client.redis.aclose()

    async def run():
        client = FleetClient(url, "deg", "g0", timeout_s=0.2, heartbeat_s=0.1, lease_ttl_s=5.0)
        granted = await degraded_phase(client)
        srv = RedisServer(tmp_path / "r", port=port).start()
        try:
            await recovered_phase(client, granted)
            r = redis.Redis.from_url(url)
            assert float(r.hget("tf:deg:served", "t")) == 12.0
            assert int(r.hget("tf:deg:dispatched", "t")) == 3 and int(r.hget("tf:deg:completed", "t")) == 2
            assert r.zcard("tf:deg:lb:b") == 1            # the third request still runs
            # S: three charges of 10, corrected +(-3) and +(-5): 22
            assert abs(float(r.hget("tf:deg:S", "t")) - 22.0) < 1e-9
        finally:
            srv.stop()
    asyncio.run(run())


def test_fleet_client_parses_replies_with_hiredis(redis_server):
    """The serve extra installs hiredis; the client's connections parse with it (a third of
    the dispatch round trip in pure Python), and a dispatch works through it."""
    from redis.asyncio.connection import _AsyncHiredisParser

    async def run():
        c = FleetClient(redis_server.url, "hiredis", "g1")
        ans = await c.dispatch(ask(c))
        conn = await c.redis.connection_pool.get_connection()
        try:
            parser = type(conn._parser)
        finally:
            await c.redis.connection_pool.release(conn)
            await c.redis.aclose()
        return ans, parser

    ans, parser = asyncio.run(run())
    assert ans.ok, ans
    assert parser is _AsyncHiredisParser
