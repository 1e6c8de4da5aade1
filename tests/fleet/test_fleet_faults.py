"""Faults on a real fleet: Redis killed mid-run and restarted (the gateways go degraded,
keep serving, resynchronise; nothing lost or double-charged), and a gateway killed with
SIGKILL (its leases expire within the TTL and another gateway takes its capacity)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack

import httpx
import redis
from typer.testing import CliRunner

from tokenfair.cli.app import app

from tokenfair.fleet.rehearsal import FleetSpec, closed_loop, start_fleet

from concurrency import wait_until
from fleet_helpers import KEYS, contract, cost, keyring


def health(url: str) -> dict:
    return httpx.get(url + "/healthz", timeout=5).json()


def test_redis_killed_and_restarted_nothing_lost(redis_server):
    c = contract()
    spec = FleetSpec(num_gateways=3, redis_url=redis_server.url, fleet="chaos", heartbeat_s=0.05, timeout_s=0.3)
    seen: dict[str, set] = {}
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)

        def chaos():
            time.sleep(0.6)
            redis_server.kill()
            assert wait_until(lambda: all(health(u)["status"] == "degraded" for u in fleet.urls), 5)
            seen["degraded"] = {health(u)["fleet"]["redis"] for u in fleet.urls}
            time.sleep(0.6)
            redis_server.start()
        t = threading.Thread(target=chaos)
        t.start()
        out = asyncio.run(closed_loop(fleet.urls, KEYS, {"a": 6, "b": 6, "c": 6}, 2.5))
        t.join()
        assert wait_until(lambda: all(gw.fleet.healthy and not gw.fleet.journal for gw in fleet.gateways), 10)
        assert wait_until(lambda: all(not gw.fleet._pending for gw in fleet.gateways), 5)
        after = [health(u) for u in fleet.urls]
        recs = [r for gw in fleet.gateways for r in gw.records.items]
        metrics = httpx.get(fleet.urls[0] + "/metrics").text
        replayed = sum(gw.fleet.num_replayed for gw in fleet.gateways)
    assert seen["degraded"] == {"degraded"}
    assert all(h["status"] == "ok" and h["fleet"]["redis"] == "ok" for h in after)
    assert all(h["fleet"]["contract_matches"] and h["fleet"]["journal_ops"] == 0 for h in after)
    degraded = [float(x.split()[1]) for x in metrics.splitlines() if x.startswith("tokenfair_fleet_degraded_total ")]
    assert degraded and degraded[0] >= 1
    assert replayed > 0
    # nothing lost: every client request was served
    assert all(set(v) == {"200"} for v in out.counts.values()), out.counts
    assert all(r["status"] == "finished" for r in recs)
    # nothing double-charged: the fleet's served cost per tenant is exactly the gateways' records
    r = redis.Redis.from_url(redis_server.url)
    served = {k.decode(): float(v) for k, v in r.hgetall("tf:chaos:served").items()}
    want: dict[str, float] = {}
    for rec in recs:
        want[rec["tenant"]] = want.get(rec["tenant"], 0.0) + cost(c, rec["prompt_tokens"], rec["output_tokens"])
    assert served == want, (served, want)
    per_class = {k.decode(): float(v) for k, v in r.hgetall("tf:chaos:served_tc").items()}
    assert sum(per_class.values()) == sum(want.values()) and all("|" in k for k in per_class)
    backends = r.smembers("tf:chaos:backends")
    assert len(backends) == 2 and all(r.zcard(b"tf:chaos:lb:" + b) == 0 for b in backends)


def write_contract(path) -> None:
    from tokenfair.serve.auth import hash_key
    import yaml
    tenants = {t: {"api_key_sha256": [hash_key(k)]} for t, k in KEYS.items()}
    path.write_text(yaml.safe_dump({"version": "fleet-kill", "tenants": tenants}))


def stream_forever(url: str, key: str, n: int, errors: list) -> None:
    try:
        with httpx.stream("POST", url + "/v1/completions", json={"prompt": "x y", "max_tokens": n, "stream": True},
                          headers={"authorization": f"Bearer {key}"}, timeout=30) as r:
            for _ in r.iter_lines():
                pass
    except httpx.HTTPError as err:
        errors.append(type(err).__name__)


def start_doomed_gateway(backend_url: str, cpath, redis_url: str, ttl: float):
    """A `tokenfair gateway --redis` process (id ``doomed``, window fixed at 2) and its URL,
    once it answers /healthz."""
    from tokenfair.fleet.redis_server import free_port
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tokenfair", "gateway", "--backend", backend_url, "--contract",
                             str(cpath), "--port", str(port), "--redis", redis_url, "--fleet", "kill",
                             "--gateway-id", "doomed", "--lease-ttl", str(ttl), "--heartbeat", "0.1",
                             "--initial-window", "2", "--min-window", "2", "--max-window", "2",
                             "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    assert wait_until(lambda: _up(url), 30), proc.stderr.read1(4000) if proc.poll() is not None else ""
    return proc, url


def test_killed_gateway_leases_expire_within_ttl(redis_server, tmp_path):
    from tokenfair.fleet.client import FleetClient
    from tokenfair.fleet.gateway import FleetGateway
    from tokenfair.serve.app import create_app
    from tokenfair.serve.fake_backend import create_fake_backend
    from tokenfair.serve.gateway import WindowConfig
    from tokenfair.serve.shutdown import ServerThread

    ttl = 1.0
    cpath = tmp_path / "contract.yaml"
    write_contract(cpath)
    with ExitStack() as stack:
        be = stack.enter_context(ServerThread(create_fake_backend(concurrency=2, token_delay_s=0.05)))
        proc, doomed = start_doomed_gateway(be.url, cpath, redis_server.url, ttl)
        try:
            errors: list = []
            threads = [threading.Thread(target=stream_forever, args=(doomed, KEYS["a"], 400, errors), daemon=True)
                       for _ in range(2)]
            for t in threads:
                t.start()
            r = redis.Redis.from_url(redis_server.url)
            key = "tf:kill:lb:" + be.url.split("://", 1)[1]
            assert wait_until(lambda: r.zcard(key) == 2, 10)
            c = contract()
            client = FleetClient(redis_server.url, "kill", "survivor", heartbeat_s=0.1, lease_ttl_s=ttl)
            gw = FleetGateway(c, keyring(c), [be.url], window=WindowConfig(initial=2, min=2, max=2), fleet=client)
            srv = stack.enter_context(ServerThread(create_app(gw, 2.0), gw, grace_s=2.0))
            waited: list = []
            t_req = threading.Thread(target=lambda: waited.append(_first_token_s(srv.url, KEYS["b"])))
            t_req.start()
            time.sleep(0.4)
            assert not waited and r.zcard(key) == 2        # the fleet's window is full: it waits
            status = CliRunner().invoke(app, ["fleet", "status", "--redis", redis_server.url, "--fleet", "kill",
                                              "--heartbeat", "0.1", "--json"])
            before = json.loads(status.output)
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            proc.wait(10)
            t_req.join(15)
            assert waited, "the surviving gateway never got the dead one's capacity"
            elapsed = time.monotonic() - killed
            after = CliRunner().invoke(app, ["fleet", "status", "--redis", redis_server.url, "--fleet", "kill",
                                             "--heartbeat", "0.1"])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    # within the TTL (+ a heartbeat, the backend's first token and a loaded machine's slack)
    assert elapsed <= ttl + 1.0, elapsed
    assert before["gateways"]["doomed"]["live"] and before["gateways"]["survivor"]["queue"] == {"b": 1}
    assert before["backends"][be.url.split("://", 1)[1]] == 2 and before["tenants"]["a"]["leases"] == 2
    assert before["tenants"]["a"]["dispatched"] == 2 and list(before["tenants"]["a"]["classes"]) in ([], ["interactive"])
    assert after.exit_code == 0 and "doomed" in after.output and "survivor" in after.output
    bad = CliRunner().invoke(app, ["fleet", "status", "--redis", "localhost:6379"])
    assert bad.exit_code == 2 and "--redis" in bad.output


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _first_token_s(url: str, key: str) -> float:
    t0 = time.monotonic()
    with httpx.stream("POST", url + "/v1/completions", json={"prompt": "p q", "max_tokens": 2, "stream": True},
                      headers={"authorization": f"Bearer {key}"}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.monotonic() - t0
    return time.monotonic() - t0


def test_killed_backend_fails_over_and_returns_every_lease(redis_server):
    """A backend dies mid-run (its connections dropped): requests not started yet are
    re-queued and go to the other backend, streams already running end with 502 (as with
    one gateway); every lease comes back and the fleet's served cost matches the records."""
    c = contract()
    spec = FleetSpec(num_gateways=2, redis_url=redis_server.url, fleet="bekill", heartbeat_s=0.1)
    with ExitStack() as stack:
        fleet = start_fleet(spec, c, keyring(c), stack)

        def kill_backend():
            time.sleep(0.8)
            srv = fleet.backend_servers[0].server
            srv.force_exit = True
            srv.should_exit = True
        t = threading.Thread(target=kill_backend)
        t.start()
        out = asyncio.run(closed_loop(fleet.urls, KEYS, {"a": 4, "b": 4}, 2.0))
        t.join()
        assert wait_until(lambda: all(not gw.fleet._pending and not gw.jobs for gw in fleet.gateways), 10)
        recs = [r for gw in fleet.gateways for r in gw.records.items]
        down = [b.up for gw in fleet.gateways for b in gw.backends[:1]]
    statuses = {k for v in out.counts.values() for k in v}
    assert statuses <= {"200", "502", "stream_error"}, out.counts     # after its first token: an error event
    assert sum(v.get("200", 0) for v in out.counts.values()) > 0 and not any(down)
    r = redis.Redis.from_url(redis_server.url)
    assert all(r.zcard(b"tf:bekill:lb:" + b) == 0 for b in r.smembers("tf:bekill:backends"))
    served = {k.decode(): float(v) for k, v in r.hgetall("tf:bekill:served").items()}
    want: dict[str, float] = {}
    for rec in recs:
        if rec["output_tokens"]:
            want[rec["tenant"]] = want.get(rec["tenant"], 0.0) + cost(c, rec["prompt_tokens"], rec["output_tokens"])
    assert served == want, (served, want)
