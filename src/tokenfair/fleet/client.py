"""A gateway's link to its fleet: Redis when it answers, the local store when it does not.

Healthy: every dispatch is one Lua script on Redis (one round trip, the only one on the
request's path); its completion is another, sent in the background when the request ends.
The reply carries every tenant's tag and V, so the gateway's cache is never older than its
own last operation, and a heartbeat (every ``heartbeat_s``) and the ``wake`` channel (a
message per dispatch / completion anywhere in the fleet while some gateway waits for room,
i.e. was refused in the last lease TTL) refresh it in between.  Staleness bound: a tag or
backend count used for a pick is at most ``heartbeat_s`` old, or one message late; the
script re-checks every limit atomically, so a stale cache costs a refused ask, never an
overshoot.

Degraded (a call failed or took over ``timeout_s``): decisions come from a
:class:`LocalStore` seeded with the last tags, holding 1 / live replicas of every fleet
limit (replicas counted from heartbeats), and every decision is appended to a journal.  A
background probe replays the journal in order when Redis answers again -- each op carries
an id the scripts apply at most once, and a completion whose dispatch never reached Redis
is skipped -- then switches back.  So an op that ran on Redis before its reply was lost is
not applied twice, and none is dropped: nothing is lost or double-charged.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import replace
from typing import Any, Callable

from .local_store import LocalStore
from .model import Completion, DispatchAnswer, DispatchAsk, FleetView, Heartbeat
from .redis_store import RedisStore, fleet_prefix

log = logging.getLogger("tokenfair.fleet")

DEFAULT_TIMEOUT_S = 0.25
DEFAULT_HEARTBEAT_S = 0.25
DEFAULT_LEASE_TTL_S = 5.0
CONTRACT_MESSAGE = "contract"   # a wake message "contract|seq": the live contract changed (sync_scripts.py)
LIVE_FACTOR = 4          # a gateway is live while its last heartbeat is under LIVE_FACTOR x heartbeat_s old


def redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError
    return (RedisError, OSError, asyncio.TimeoutError)


class FleetClient:
    def __init__(self, url: str, fleet: str, gateway_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 heartbeat_s: float = DEFAULT_HEARTBEAT_S, lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
                 inject_latency_s: float = 0.0) -> None:
        import redis.asyncio as aioredis
        if not (timeout_s > 0 and heartbeat_s > 0 and lease_ttl_s > heartbeat_s):
            raise ValueError("fleet: need timeout_s > 0, heartbeat_s > 0 and lease_ttl_s > heartbeat_s")
        self.url, self.fleet, self.gateway_id = url, fleet, gateway_id
        self.timeout_s, self.heartbeat_s, self.lease_ttl_s = timeout_s, heartbeat_s, lease_ttl_s
        self.inject_latency_s = inject_latency_s
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        # one retry on a fresh connection: pooled connections die with a restarted server
        # (a retried script that had run answers "dup": its op id is applied once)
        self.redis = aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                       retry=Retry(NoBackoff(), 1), retry_on_error=[RedisConnectionError])
        self.store = RedisStore(self.redis, fleet)
        self.local = LocalStore(share=1.0)
        self.healthy = True
        self.journal: deque[DispatchAsk | Completion] = deque()
        self.view = FleetView()
        self.leases: dict[str, DispatchAsk] = {}        # this gateway's live leases
        self.num_degraded = 0                           # times it fell back to local state
        self.num_replayed = 0                           # journal ops replayed onto Redis
        self.refusals: dict[str, int] = {}              # refused dispatch asks by reason
        self.last_error = ""
        self.on_wake: Callable[[str, int], None] = lambda backend, inflight: None
        self.on_contract: Callable[[int], None] = lambda seq: None   # a contract was published (sync.py)
        self.heartbeat_fn: Callable[[], Heartbeat] | None = None
        self._tasks: list[asyncio.Task] = []
        self._pending: set[asyncio.Task] = set()
        self._seq = 0

    # ------------------------------------------------------------------ ids
    def next_id(self, kind: str) -> str:
        self._seq += 1
        return f"{self.gateway_id}:{kind}{self._seq}"

    # ------------------------------------------------------------------ calls
    async def _call(self, coro: Any) -> Any:
        if self.inject_latency_s > 0:
            await asyncio.sleep(self.inject_latency_s)
        async with asyncio.timeout(self.timeout_s):      # inline: no task per call (unlike wait_for)
            return await coro

    def _degrade(self, err: BaseException) -> None:
        self.last_error = f"{type(err).__name__}: {err}"
        if self.healthy:
            self.healthy = False
            self.num_degraded += 1
            self.local.share = 1.0 / max(1, self.view.live_gateways)
            self.local.seed(self.view.tags, self.view.vtime)
            log.warning("fleet %s: Redis unreachable (%s); local state with 1/%d of every fleet limit",
                        self.fleet, self.last_error, max(1, self.view.live_gateways))

    def _absorb(self, ans: DispatchAnswer, backend: str | None = None) -> None:
        if ans.tags:
            self.view.tags = ans.tags
        self.view.vtime = max(self.view.vtime, ans.vtime)
        if backend is not None:
            self.view.backend_inflight[backend] = ans.backend_inflight

    async def dispatch(self, ask: DispatchAsk) -> DispatchAnswer:
        """Ask to release a request: Redis's answer, or the local store's while degraded."""
        uncertain = False
        if self.healthy and not self.journal:
            try:
                ans = await self._call(self.store.dispatch(ask))
            except redis_errors() as err:
                self._degrade(err)
                uncertain = True          # the script may have run before the reply was lost
            else:
                if ans.ok:
                    self.leases[ask.lease_id] = ask
                    self.local.adopt(ask)
                else:
                    self.refusals[ans.reason] = self.refusals.get(ans.reason, 0) + 1
                self._absorb(ans, ask.backend)
                return ans
        ans = await self.local.dispatch(ask)
        if ans.ok:
            self.leases[ask.lease_id] = ask
            self.journal.append(replace(ask, force=True))     # same op id: applied once
        else:
            self.refusals[ans.reason] = self.refusals.get(ans.reason, 0) + 1
            if uncertain:                # undo it on Redis if it did run there
                self.journal.append(self._completion(ask, 0.0))
        self._absorb(ans)
        return ans

    def _completion(self, ask: DispatchAsk, cost_actual: float) -> Completion:
        return Completion(op_id=self.next_id("c"), lease_id=ask.lease_id, tenant=ask.tenant, weight=ask.weight,
                          backend=ask.backend, cost_pred=ask.cost_pred, cost_max=ask.cost_max,
                          cost_actual=max(0.0, cost_actual), rate=ask.rate, burst=ask.burst, credit=ask.credit,
                          dispatch_op=ask.op_id, klass=ask.klass)

    def complete_soon(self, ask: DispatchAsk, cost_actual: float) -> None:
        """Reconcile ``ask``'s charges with the request's true cost and release its lease
        (in the background: the caller is a task's done callback)."""
        task = asyncio.ensure_future(self.complete(ask, cost_actual))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def complete(self, ask: DispatchAsk, cost_actual: float) -> None:
        done = self._completion(ask, cost_actual)
        self.leases.pop(ask.lease_id, None)
        if self.healthy and not self.journal:
            try:
                ans = await self._call(self.store.complete(done))
            except redis_errors() as err:
                self._degrade(err)
            else:
                self.local.release(ask.lease_id)
                self._absorb(ans, ask.backend)
                return
        await self.local.complete(done)
        self.journal.append(done)

    # ------------------------------------------------------------------ background
    async def start(self) -> None:
        await self.beat()
        self._tasks = [asyncio.ensure_future(self._heartbeat_loop()), asyncio.ensure_future(self._wake_loop())]

    async def stop(self) -> None:
        if self._pending:
            await asyncio.wait(list(self._pending), timeout=max(1.0, 4 * self.timeout_s))
        if self.journal:
            await self.beat()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.redis.aclose()
        except redis_errors():
            pass

    def _heartbeat(self) -> Heartbeat:
        if self.heartbeat_fn is not None:
            hb = self.heartbeat_fn()
        else:
            hb = Heartbeat(gateway=self.gateway_id, ttl_s=0.0, lease_ttl_s=0.0, contract="", queue={}, running=0)
        leases = tuple((a.lease_id, a.backend, a.tenant) for a in self.leases.values())
        return replace(hb, gateway=self.gateway_id, ttl_s=LIVE_FACTOR * self.heartbeat_s,
                       lease_ttl_s=self.lease_ttl_s, leases=leases)

    async def beat(self, reassert: bool = False) -> None:
        """One heartbeat; while degraded, a probe that replays the journal and switches back."""
        hb = replace(self._heartbeat(), reassert=reassert)
        try:
            view = await self._call(self.store.heartbeat(hb))
        except redis_errors() as err:
            self._degrade(err)
            await self.local.heartbeat(hb)
            return
        live = view.live_gateways
        self.view.live_gateways = live
        self.view.backend_inflight = view.backend_inflight
        self.view.contract = view.contract
        self._absorb(DispatchAnswer(ok=True, tags=view.tags, vtime=view.vtime))
        if not self.healthy:
            self.local.share = 1.0 / max(1, live)
            if await self._replay():
                await self.beat(reassert=True)

    async def _replay(self) -> bool:
        """Replay the journal onto Redis in order; True once it is empty (healthy again)."""
        while self.journal:
            op = self.journal[0]
            try:
                if isinstance(op, DispatchAsk):
                    ans = await self._call(self.store.dispatch(op))
                else:
                    ans = await self._call(self.store.complete(op))
            except redis_errors() as err:
                self.last_error = f"{type(err).__name__}: {err}"
                return False
            self.journal.popleft()
            self.num_replayed += 1
            self._absorb(ans)
        self.healthy = True
        log.warning("fleet %s: Redis back; journal replayed (%d ops so far)", self.fleet, self.num_replayed)
        return True

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.beat()
            except Exception as err:  # noqa: BLE001 - the heartbeat must keep running
                log.exception("fleet heartbeat failed: %s", err)

    async def _wake_loop(self) -> None:
        """Subscribe to the fleet's wake channel (its own connection, no read timeout)."""
        import redis.asyncio as aioredis
        channel = fleet_prefix(self.fleet) + ":wake"
        while True:
            sub = aioredis.from_url(self.url, socket_connect_timeout=self.timeout_s)
            ps = sub.pubsub(ignore_subscribe_messages=True)
            try:
                await ps.subscribe(channel)
                while True:
                    msg = await ps.get_message(timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        self._on_message(msg.get("data"))
            except redis_errors():
                await asyncio.sleep(self.heartbeat_s)
            finally:
                try:
                    await ps.aclose()
                    await sub.aclose()
                except redis_errors():
                    pass

    def _on_message(self, data: Any) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        backend, _, count = text.rpartition("|")
        try:
            n = int(count)
        except ValueError:
            return
        if backend == CONTRACT_MESSAGE:
            self.on_contract(n)
            return
        self.view.backend_inflight[backend] = n
        self.on_wake(backend, n)

    # ------------------------------------------------------------------ view
    def backend_inflight(self) -> dict[str, int]:
        """Requests in flight per backend as the deciding store sees them: the fleet's last
        count while healthy, this gateway's own while degraded."""
        if self.healthy:
            return self.view.backend_inflight
        return self.local.inflight_by_backend()

    def status(self) -> dict:
        return {"fleet": self.fleet, "gateway": self.gateway_id, "redis": "ok" if self.healthy else "degraded",
                "live_gateways": self.view.live_gateways, "journal_ops": len(self.journal),
                "times_degraded": self.num_degraded, "replayed_ops": self.num_replayed,
                "limit_share": 1.0 if self.healthy else self.local.share, "last_error": self.last_error or None,
                "contract": self.view.contract or None}

