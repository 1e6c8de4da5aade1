"""The wake channel carries a message only while some gateway waits for room (a refusal in
the last lease TTL), and a fleet client works over Redis's unix socket."""

from __future__ import annotations

import asyncio

import redis

from tokenfair.fleet.client import FleetClient
from tokenfair.fleet.redis_server import RedisServer

from test_fleet_client import ask


def test_wake_messages_only_while_someone_waits_over_a_unix_socket(redis_binary, tmp_path):
    srv = RedisServer(tmp_path / "r", persist=False, unix_socket=True).start()
    assert srv.url.startswith("unix://") and srv.socket_path.exists()
    admin = redis.Redis.from_url(srv.tcp_url)

    async def run():
        client = FleetClient(srv.url, "wake", "g1", timeout_s=2.0)
        sub = redis.asyncio.Redis.from_url(srv.url).pubsub(ignore_subscribe_messages=True)
        await sub.subscribe("tf:wake:wake")
        messages = []

        async def drain():
            while (m := await sub.get_message(timeout=0.2)) is not None:
                messages.append(m["data"].decode())
        first = ask(client, window=1)
        assert (await client.dispatch(first)).ok
        await client.complete(first, 10.0)
        await drain()
        assert messages == []                          # nobody waited: no message
        held = ask(client, window=1)
        assert (await client.dispatch(held)).ok
        refused = await client.dispatch(ask(client, window=1))
        assert not refused.ok and refused.reason == "window"
        await client.complete(held, 10.0)             # room again: the waiting gateway is told
        await drain()
        assert messages == ["b|0"]
        await sub.aclose()
        await client.redis.aclose()
    try:
        asyncio.run(run())
        assert admin.exists("tf:wake:wantwake")
    finally:
        admin.close()
        srv.stop()
