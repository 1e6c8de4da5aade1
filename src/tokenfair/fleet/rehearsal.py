"""A fleet on loopback in one process, for the fleet tests and benchmark: fake backends,
N gateway replicas (each a uvicorn server in its own thread and event loop) sharing one
Redis -- or, without a Redis URL, N independent gateways -- and a closed-loop client load
that spreads each tenant's requests over the replicas round-robin.

The load is closed-loop on purpose: ``clients`` concurrent clients per tenant each send the
next request when the last one ended, so every tenant stays backlogged for the whole run
and its share of the served cost is the fair-queueing share to compare."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import httpx

from ..contracts.contract import Contract
from ..serve.app import create_app
from ..serve.auth import KeyRing
from ..serve.fake_backend import create_fake_backend
from ..serve.gateway import Gateway, WindowConfig
from ..serve.shutdown import ServerThread
from .client import FleetClient
from .gateway import FleetGateway


@dataclass
class FleetSpec:
    num_gateways: int = 3
    num_backends: int = 2
    backend_concurrency: int = 2          # requests each fake backend runs at once (FIFO beyond)
    token_delay_s: float = 0.004
    redis_url: str | None = None          # None: independent gateways (no shared state)
    fleet: str = "test"
    heartbeat_s: float = 0.1
    lease_ttl_s: float = 1.0
    timeout_s: float = 1.0                # generous: a loaded test machine is not a Redis outage
    inject_latency_s: float = 0.0


@dataclass
class Fleet:
    gateways: list[Gateway]
    servers: list[ServerThread]
    backend_servers: list[ServerThread]
    backend_apps: list = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]


def start_fleet(spec: FleetSpec, contract: Contract, keyring: KeyRing, stack: ExitStack) -> Fleet:
    """Start the backends and gateways; ``stack`` stops them (gateways first)."""
    apps = [create_fake_backend(concurrency=spec.backend_concurrency, token_delay_s=spec.token_delay_s)
            for _ in range(spec.num_backends)]
    bsrv = [stack.enter_context(ServerThread(a)) for a in apps]
    window = WindowConfig(initial=spec.backend_concurrency, min=spec.backend_concurrency,
                          max=spec.backend_concurrency)
    gws: list[Gateway] = []
    srvs: list[ServerThread] = []
    for i in range(spec.num_gateways):
        urls = [s.url for s in bsrv]
        if spec.redis_url is None:
            gw: Gateway = Gateway(contract, keyring, urls, window=window)
        else:
            client = FleetClient(spec.redis_url, spec.fleet, f"gw{i}", timeout_s=spec.timeout_s,
                                 heartbeat_s=spec.heartbeat_s, lease_ttl_s=spec.lease_ttl_s,
                                 inject_latency_s=spec.inject_latency_s)
            gw = FleetGateway(contract, keyring, urls, window=window, fleet=client)
        gws.append(gw)
        srvs.append(stack.enter_context(ServerThread(create_app(gw, 2.0), gw, grace_s=2.0)))
    return Fleet(gws, srvs, bsrv, apps)


@dataclass
class LoadOutcome:
    served: dict[str, float]            # tenant -> cost (wp x prompt + wd x output) of requests finished
                                        # before the stop rule fired (the drain after it would even the
                                        # shares out)
    counts: dict[str, dict[str, int]]   # tenant -> status -> requests
    latencies_s: list[float]            # end-to-end time of each finished request
    wall_s: float


@dataclass
class StopRule:
    """When closed-loop clients stop sending (shared by several loops): once ``duration_s``
    has passed *and* ``min_finished`` requests finished -- so a slow machine runs longer
    instead of measuring shares on a handful of requests -- or at ``max_s`` regardless."""
    duration_s: float
    min_finished: int = 0
    max_s: float = 60.0
    t0: float = field(default_factory=time.perf_counter)
    finished: int = 0
    stopped_s: float | None = None      # perf_counter time the rule fired

    def should_stop(self) -> bool:
        if self.stopped_s is None:
            elapsed = time.perf_counter() - self.t0
            if (elapsed >= self.duration_s and self.finished >= self.min_finished) or elapsed >= self.max_s:
                self.stopped_s = time.perf_counter()
        return self.stopped_s is not None


async def closed_loop(urls: list[str], keys: dict[str, str], clients: dict[str, int], duration_s: float | StopRule,
                      max_tokens: int = 16, prompt_words: int = 8, wp: float = 1.0, wd: float = 1.0,
                      deadline_s: float = 60.0) -> LoadOutcome:
    """``clients[t]`` clients per tenant until the stop rule fires (a number: that many
    seconds); tenant t's n-th request goes to ``urls[(n + offset_t) % len(urls)]``.
    ``served`` counts requests that finished before the rule fired (every tenant still
    backlogged).  Bounded: no request starts after the rule fired."""
    rule = duration_s if isinstance(duration_s, StopRule) else StopRule(duration_s)
    served: dict[str, float] = {t: 0.0 for t in clients}
    counts: dict[str, dict[str, int]] = {t: {} for t in clients}
    lat: list[float] = []
    t0 = time.perf_counter()
    prompt = " ".join(["word"] * prompt_words)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=deadline_s, limits=limits) as http:
        rr = {t: itertools.count(i) for i, t in enumerate(sorted(clients))}

        async def client(tenant: str) -> None:
            while not rule.should_stop():
                url = urls[next(rr[tenant]) % len(urls)]
                start = time.perf_counter()
                status, cost = await _one(http, url, keys[tenant], prompt, max_tokens, wp, wd)
                counts[tenant][status] = counts[tenant].get(status, 0) + 1
                end = time.perf_counter()
                if status == "200":
                    lat.append(end - start)
                    if not rule.should_stop():          # while every tenant is still backlogged
                        served[tenant] += cost
                        rule.finished += 1
                else:
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(client(t) for t, n in clients.items() for _ in range(n)))
    return LoadOutcome(served, counts, lat, time.perf_counter() - t0)


async def _one(http: httpx.AsyncClient, url: str, key: str, prompt: str, max_tokens: int, wp: float,
               wd: float) -> tuple[str, float]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with http.stream("POST", url + "/v1/completions", json=body,
                               headers={"authorization": f"Bearer {key}"}) as r:
            if r.status_code != 200:
                await r.aread()
                return str(r.status_code), 0.0
            usage = None
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:            # failed after its first token (an SSE error event)
                    return "stream_error", 0.0
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as err:
        return type(err).__name__, 0.0
    if not usage:
        return "no_usage", 0.0
    return "200", wp * usage["prompt_tokens"] + wd * usage["completion_tokens"]


def shares(served: dict[str, float]) -> dict[str, float]:
    total = sum(served.values())
    return {t: (v / total if total > 0 else 0.0) for t, v in served.items()}
