"""The latency a Redis fleet adds to a gateway (``tokenfair bench fleet-latency``, and the
latency part of ``tokenfair bench fleet``).

Separate processes: one fake backend (20 ms to the first token, 10 ms per token, 16
tokens), a plain gateway and a ``--redis`` gateway in front of it, a ``redis-server`` on
loopback TCP or a unix socket, and a Poisson client (this process) sending each request to
one of the two gateways at random.  Per path:

  * *hold*: from the request's intake at the gateway to its release to the backend (the
    gateway's records, ``scheduled_s - arrival_s``): where the dispatch script's round trip
    sits, with nothing of the client's or the backend's noise;
  * TTFT and end-to-end latency as the client sees them.

The added latency is the Redis path's figure minus the plain path's, per run; the report
gives the median over runs of each.  Next to it, the floor any Redis path pays: one dispatch
script's round trip from an asyncio client doing nothing else (``script_latency``), back to
back and after ``IDLE_GAP_S`` of idling before each call, as a gateway between arrivals
idles (a process woken from idle, and the redis-server it calls, take longer to answer than
a busy one).  Redis calls per request come from Redis's command
statistics: dispatch scripts (the request's path) and all scripts (with the completion,
heartbeats and views, off the path) per request released.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ..serve.auth import hash_key
from ..serve.overhead import stop_processes, timed_stream, wait_port
from .redis_server import RedisServer, free_port

TRANSPORTS = ("tcp", "unix")
WARMUP_S = 2.0
KEY = "bench-key"
IDLE_GAP_S = 0.05                 # idling before each call of the idle round trip (10-20 requests/s)
WARMUP_CALLS = 100                # untimed first calls: the script cache and the connection warm up
NUM_IDLE_CALLS = 400              # WARMUP_CALLS of them untimed: 300 timed, 20 s of idling
BUSY_LOAD_PER_CPU = 0.5           # a load average over this x CPUs before the runs: a busy host


def pcts(xs: list[float]) -> dict:
    import numpy as np
    if not xs:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "n": 0}
    a = np.asarray(xs) * 1000.0
    return {"p50_ms": round(float(np.percentile(a, 50)), 2), "p99_ms": round(float(np.percentile(a, 99)), 2),
            "n": len(xs)}


def _holds(path: Path) -> list[float]:
    if not path.exists():
        return []
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["scheduled_s"] - r["arrival_s"] for r in recs
            if r.get("scheduled_s") is not None and r.get("arrival_s", 0.0) >= WARMUP_S]


def script_latency(url: str, num_ops: int = 2000, num_tenants: int = 8, gap_s: float = 0.0) -> dict:
    """The dispatch path's share of the Redis cost: ``num_ops`` dispatch scripts (each
    followed by its completion, off the timed path) from one asyncio client over loopback,
    ``num_tenants`` tenants backlogged, ``gap_s`` of idling before each; P50 / P99 of the
    dispatch round trip."""
    import redis.asyncio as aioredis

    from .model import Completion, DispatchAsk
    from .redis_store import RedisStore

    async def run() -> list[float]:
        client = aioredis.from_url(url)
        store = RedisStore(client, "script-latency")
        tenants = tuple(f"t{i}" for i in range(num_tenants))
        times = []
        for i in range(num_ops):
            t = tenants[i % num_tenants]
            ask = DispatchAsk(op_id=f"d{i}", lease_id=f"l{i}", gateway="g", tenant=t, weight=1.0, cost_pred=40.0,
                              cost_max=40.0, rate=1e9, burst=1e9, max_concurrency=64, backend="b", window=64,
                              lease_ttl_s=5.0, credit=2048.0, backlog=tenants)
            if gap_s > 0:
                await asyncio.sleep(gap_s)
            start = time.perf_counter()
            await store.dispatch(ask)
            times.append(time.perf_counter() - start)
            await store.complete(Completion(op_id=f"c{i}", lease_id=ask.lease_id, tenant=t, weight=1.0, backend="b",
                                            cost_pred=40.0, cost_max=40.0, cost_actual=40.0, rate=1e9, burst=1e9,
                                            credit=2048.0, dispatch_op=ask.op_id))
        await client.aclose()
        return times[WARMUP_CALLS:]
    return pcts(asyncio.run(run()))


def round_trip_floor(workdir: Path, transport: str, num_idle_calls: int = NUM_IDLE_CALLS) -> dict:
    """One dispatch script's round trip over ``transport``, back to back and (unless
    ``num_idle_calls`` is 0) after :data:`IDLE_GAP_S` of idling before each call (a fresh
    redis-server)."""
    srv = RedisServer(workdir / f"floor-{transport}", persist=False, unix_socket=transport == "unix").start()
    try:
        floor = {"back_to_back": script_latency(srv.url)}
        if num_idle_calls > 0:
            floor["after_idle"] = script_latency(srv.url, num_ops=num_idle_calls, gap_s=IDLE_GAP_S)
        return floor
    finally:
        srv.stop()


def latency_run(rate: float, duration_s: float, workdir: Path, seed: int = 0, transport: str = "tcp") -> dict:
    """One run: plain vs ``--redis`` gateway in front of one fake backend."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport {transport!r}: one of {', '.join(TRANSPORTS)}")
    workdir.mkdir(parents=True, exist_ok=True)
    cpath = workdir / "latency-contract.json"
    cpath.write_text(json.dumps({"tenants": {"bench": {"api_key_sha256": [hash_key(KEY)], "max_queued": 100000}},
                                 "admission": {"shed_over_max_wait": False}}))
    srv = RedisServer(workdir / f"r{seed}", persist=False, unix_socket=transport == "unix").start()
    be, plain, fleet = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    records = {p: workdir / f"{p}-{transport}-{seed}.jsonl" for p in ("plain", "redis")}
    gw = [sys.executable, "-m", "tokenfair", "gateway", "--backend", f"http://127.0.0.1:{be}", "--contract",
          str(cpath), "--log-level", "warning", "--grace-s", "1", "--initial-window", "64"]
    procs = [subprocess.Popen([sys.executable, "-m", "tokenfair.serve.overhead", "--role", "backend", "--port",
                               str(be), "--ttft", "0.02", "--token-delay", "0.01"], env=env),
             subprocess.Popen(gw + ["--port", str(plain), "--records", str(records["plain"])], env=env),
             subprocess.Popen(gw + ["--port", str(fleet), "--redis", srv.url, "--fleet", "latency",
                                    "--records", str(records["redis"])], env=env)]
    try:
        import redis
        for port in (be, plain, fleet):
            wait_port(port)
        admin = redis.Redis.from_url(srv.tcp_url)
        admin.config_resetstat()
        res = asyncio.run(poisson(rate, duration_s, {"plain": f"http://127.0.0.1:{plain}",
                                                     "redis": f"http://127.0.0.1:{fleet}"}, KEY, seed))
        stats = admin.info("commandstats")
        dispatched = sum(int(v) for v in admin.hgetall("tf:latency:dispatched").values())
        admin.close()
    finally:
        stop_processes(procs)
        srv.stop()
    scripts = int(stats.get("cmdstat_evalsha", {}).get("calls", 0)) + int(stats.get("cmdstat_eval", {}).get("calls", 0))
    out: dict = {"rate": rate, "duration_s": duration_s, "transport": transport, "errors": res["errors"],
                 "redis_scripts_per_request": round(scripts / max(1, dispatched), 2), "dispatched": dispatched}
    for path in ("plain", "redis"):
        out[path] = {"ttft": pcts([x[0] for x in res[path]]), "e2e": pcts([x[1] for x in res[path]]),
                     "hold": pcts(_holds(records[path]))}
    out["added_ms"] = {f"{m}_{p}": round(out["redis"][m][f"{p}_ms"] - out["plain"][m][f"{p}_ms"], 2)
                       for m in ("hold", "ttft", "e2e") for p in ("p50", "p99")}
    return out


def latency_bench(rate: float, duration_s: float, workdir: Path, runs: int = 3,
                  transports: tuple[str, ...] = TRANSPORTS, num_idle_calls: int = NUM_IDLE_CALLS,
                  load_before: float | None = None) -> dict:
    """``runs`` runs per transport (alternating), and the median of every figure over them;
    first, each transport's round-trip floor.  ``load_before``: the host's load average before
    the caller's own work began (default: read now)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if load_before is None:
        load_before = os.getloadavg()[0]
    floor = {t: round_trip_floor(workdir, t, num_idle_calls) for t in transports}
    per: dict[str, list[dict]] = {t: [] for t in transports}
    for i in range(runs):
        for t in transports:
            per[t].append(latency_run(rate, duration_s, workdir, seed=i, transport=t))
    out: dict = {"rate": rate, "duration_s": duration_s, "runs": runs, "load_average": os.getloadavg()[0],
                 "load_average_before": load_before, "cpus": os.cpu_count() or 1}
    for t, rs in per.items():
        med = lambda f: round(statistics.median(f(r) for r in rs), 2)  # noqa: E731
        out[t] = {"runs": rs,
                  "added_ms": {k: med(lambda r, k=k: r["added_ms"][k]) for k in rs[0]["added_ms"]},
                  "paths": {p: {m: {q: med(lambda r, p=p, m=m, q=q: r[p][m][q]) for q in ("p50_ms", "p99_ms")}
                                for m in ("hold", "ttft", "e2e")} for p in ("plain", "redis")},
                  "redis_scripts_per_request": med(lambda r: r["redis_scripts_per_request"]),
                  "round_trip": floor[t],
                  "errors": sum(sum(r["errors"].values()) for r in rs)}
    return out


def format_latency(lat: dict) -> str:
    lines = ["| Redis over | path | hold p50 / p99 (ms) | TTFT p50 / p99 (ms) | end-to-end p50 / p99 (ms) |",
             "|---|---|---|---|---|"]
    for t in TRANSPORTS:
        if t not in lat:
            continue
        v = lat[t]
        for p in ("plain", "redis"):
            x = v["paths"][p]
            lines.append(f"| {t} | {p} gateway | {x['hold']['p50_ms']} / {x['hold']['p99_ms']} | "
                         f"{x['ttft']['p50_ms']} / {x['ttft']['p99_ms']} | {x['e2e']['p50_ms']} / {x['e2e']['p99_ms']} |")
        a = v["added_ms"]
        lines.append(f"| {t} | **added by Redis** | **{a['hold_p50']:+.2f} / {a['hold_p99']:+.2f}** | "
                     f"**{a['ttft_p50']:+.2f} / {a['ttft_p99']:+.2f}** | **{a['e2e_p50']:+.2f} / {a['e2e_p99']:+.2f}** |")
    lines.append("")
    lines.append(f"medians of {lat['runs']} runs per transport, {lat['rate']:g} requests/s for {lat['duration_s']:g} s "
                 f"each; load average {lat['load_average']:.1f}; Redis scripts per request released: "
                 + ", ".join(f"{t} {lat[t]['redis_scripts_per_request']}" for t in TRANSPORTS if t in lat)
                 + " (one dispatch on the path; the rest off it); errors: "
                 + ", ".join(f"{t} {lat[t]['errors']}" for t in TRANSPORTS if t in lat))
    busy = busy_host_warning(lat)
    if busy:
        lines.append(busy)
    for t in TRANSPORTS:
        rt = lat.get(t, {}).get("round_trip")
        if rt:
            b, i = rt["back_to_back"], rt.get("after_idle")      # none when num_idle_calls was 0
            idle = f", after {1000 * IDLE_GAP_S:g} ms idle {i['p50_ms']} / {i['p99_ms']} ({i['n']} calls)" if i else ""
            lines.append(f"one dispatch script's round trip over {t}, p50 / p99 (ms): back to back "
                         f"{b['p50_ms']} / {b['p99_ms']} ({b['n']} calls){idle}")
    return "\n".join(lines)


def busy_host_warning(lat: dict) -> str:
    """A line saying the host was busy before the runs ('' when it was not): then a P99 is
    set by stalls in which a process waits for a core, and the Redis path, which needs two
    processes scheduled instead of one, pays them more often than the plain path."""
    load, cpus = lat.get("load_average_before"), lat.get("cpus") or 1
    if load is None or load <= BUSY_LOAD_PER_CPU * cpus:
        return ""
    return (f"warning: the host was busy before the runs (load average {load:.1f} on {cpus} CPUs): "
            f"the P99 figures measure its stalls as much as Redis; run the benchmark alone")


async def poisson(rate: float, duration_s: float, urls: dict[str, str], key: str, seed: int,
                  warmup_s: float = WARMUP_S) -> dict:
    """Poisson arrivals at ``rate`` for ``duration_s``, each to one of ``urls`` at random;
    per path the (TTFT, end-to-end) of each request that arrived after ``warmup_s``."""
    import httpx
    rng = random.Random(seed)
    res: dict = {p: [] for p in urls}
    res["errors"] = {p: 0 for p in urls}
    async with httpx.AsyncClient(timeout=60.0, limits=httpx.Limits(max_connections=1024)) as client:
        t0 = time.perf_counter()

        async def one(at: float, path: str) -> None:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
            got = await timed_stream(client, urls[path] + "/v1/completions", key, 16)
            if got is None:
                res["errors"][path] += 1
            elif at >= warmup_s and got[0] is not None:
                res[path].append(got)

        tasks, t = [], 0.0
        paths = sorted(urls)
        while True:
            t += rng.expovariate(rate)
            if t > duration_s:
                break
            tasks.append(one(t, rng.choice(paths)))
        await asyncio.gather(*tasks)
    return res
