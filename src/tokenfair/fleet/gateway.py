"""``tokenfair gateway --redis URL --fleet NAME``: a gateway replica whose dispatch asks the
fleet's shared state before releasing a request.

Each replica keeps its own clients' requests in its own fair-policy queue.  A dispatch round
first copies the fleet's tags (S per tenant) and virtual time into the local policy, so its
``pick`` orders tenants by fleet-wide service; then, per candidate, one ask to the store
(``client.FleetClient.dispatch``, one Lua script on Redis) checks and charges atomically:

  * the backend's fleet-wide window: leases on it < the window (a lease per released
    request, renewed by heartbeats, expiring ``lease_ttl_s`` after the last one, so a dead
    replica's capacity comes back within the TTL);
  * the tenant's fleet-wide ``max_concurrency`` (its leases) and token bucket (charged
    prompt estimate + max_tokens at dispatch, so the bucket never goes below minus one
    request's cost; refunded to the true cost at completion);
  * fairness across replicas: the tenant's tag is at most one request (its predicted cost /
    weight) ahead of every tenant backlogged anywhere in the fleet (heartbeats publish each
    replica's queue) that is not blocked by its own limits -- a replica holding only a
    tenant that is ahead waits for the replicas serving the others.  A tenant with a min
    share is exempt (its guarantee may put it ahead of its weight share);
  * then the tag is charged the predicted cost (lifted to V - C / w first, the returning
    tenant's rule) and corrected to the true cost when the request ends.

A refusal puts the candidate's tenant aside for the round (or the backend, when its window
is full); a request cancelled while its ask was in flight gives its lease straight back.
Lease lifecycle = proxy task lifecycle: each attempt (a retry re-queues and asks again)
holds one lease, released with the attempt's true cost (0 for an attempt re-queued before
its first token).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, fields

from ..core.reasons import Reason, ReasonCode
from ..core.request import Status
from ..sched.fair.adopt import adopt_tags
from ..sched.fair.policy import FairPolicy
from ..serve.gateway import Gateway
from ..serve.gateway_backend import GatewayJob
from ..serve.gateway_dispatch import IDLE_POLL_S
from ..serve.gateway_window import Backend
from .client import FleetClient
from .door import door_wait_s, fleet_bucket
from .gateway_sync import GatewaySync
from .model import REASON_RATE, REASON_WINDOW, DispatchAsk, Heartbeat


@dataclass
class FleetBackend(Backend):
    fleet_inflight: int = 0           # requests in flight on it fleet-wide (the last count seen)

    def room(self) -> int:
        return self.window.limit - max(self.inflight, self.fleet_inflight)


class FleetGateway(Gateway):
    mode = "gateway"

    def __init__(self, *args, fleet: FleetClient, **kw) -> None:
        super().__init__(*args, **kw)
        if not isinstance(self.policy, FairPolicy):
            raise ValueError("--redis: a fleet shares the fair policy's tags; use --policy fair")
        self.fair_policy: FairPolicy = self.policy
        self.fleet = fleet
        # in place: the gateway's parts (dispatcher, prober, job book) hold this list
        self.backends[:] = [FleetBackend(**{f.name: getattr(b, f.name) for f in fields(b)}) for b in self.backends]
        self.by_name = {b.name: b for b in self.backends}
        self._task_asks: dict[asyncio.Task, DispatchAsk] = {}
        costs = self.contract.costs
        self.wp, self.wd = costs.prefill_token, costs.decode_token
        fleet.heartbeat_fn = self._heartbeat
        fleet.on_wake = self._on_wake
        self.sync = GatewaySync(self)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        await super().start()
        await self.fleet.start()
        await self.sync.start()

    async def stop(self) -> None:
        await self.sync.stop()
        await self.fleet.stop()
        await super().stop()

    def _contract_tag(self) -> str:
        return f"{self.contract.version}@{self.contract.content_hash}"

    def _heartbeat(self) -> Heartbeat:
        snap = self.fair_policy.snapshot(self.now())
        queue = {n: v.num_waiting for n, v in snap.tenants.items() if v.num_waiting > 0}
        return Heartbeat(gateway=self.fleet.gateway_id, ttl_s=0.0, lease_ttl_s=0.0, contract=self._contract_tag(),
                         queue=queue, running=len(self.running))

    def _on_wake(self, backend: str, inflight: int) -> None:
        b = self.by_name.get(backend)
        if b is not None:
            b.fleet_inflight = inflight
        if self.wake is not None:
            self.wake.set()

    # ------------------------------------------------------------------ dispatch
    def _sync_tags(self) -> None:
        """The fleet's tags and V into the local policy (re-keying the tenants that moved)."""
        view = self.fleet.view
        adopt_tags(self.fair_policy, view.vtime, view.tags)
        counts = self.fleet.backend_inflight()
        for b in self.backends:
            b.fleet_inflight = counts.get(b.name, 0)

    def _ask(self, req, b: FleetBackend) -> DispatchAsk:
        spec = self.contract.tenant(req.tenant)
        rl = spec.rate_limit
        prompt = self.wp * req.prompt_tokens
        snap = self.fair_policy.snapshot(self.now())
        assert snap.wfq_credit is not None        # a fair policy keeps a virtual-time queue
        return DispatchAsk(op_id=self.fleet.next_id("d"), lease_id=self.fleet.next_id("l"),
                           gateway=self.fleet.gateway_id, tenant=req.tenant, weight=spec.weight,
                           cost_pred=prompt + self.wd * req.predicted_output,
                           cost_max=prompt + self.wd * max(req.max_tokens, req.predicted_output),
                           rate=rl.tokens_per_s if rl else 0.0, burst=rl.burst_tokens if rl else 0.0,
                           max_concurrency=spec.max_concurrency or 0, backend=b.name, window=b.window.limit,
                           lease_ttl_s=self.fleet.lease_ttl_s, credit=snap.wfq_credit, klass=req.klass,
                           check_ahead=spec.min_share == 0, backlog=snap.backlogged())

    async def _round(self) -> None:
        now = self.now()
        dispatcher = self.dispatcher
        dispatcher.round_start(now)
        self._sync_tags()
        blocked: set[str] = set()
        misses = 0
        retry_s = IDLE_POLL_S
        while misses <= len(self.backends) and (nxt := dispatcher.next_release(now, blocked)) is not None:
            if not nxt:
                continue
            cand, b, tokens = nxt
            ask = self._ask(cand, b)
            ans = await self.fleet.dispatch(ask)
            now = self.now()
            b.fleet_inflight = ans.backend_inflight
            if cand.status is not Status.WAITING or cand.request_id not in self.jobs:
                if ans.ok:                              # cancelled while we asked
                    self.fleet.complete_soon(ask, 0.0)
                self._sync_tags()
                continue
            if not ans.ok:
                if ans.reason == REASON_WINDOW:
                    misses += 1
                else:
                    blocked.add(cand.tenant)
                    if ans.reason == REASON_RATE:
                        retry_s = min(retry_s, ans.retry_s)
                self._sync_tags()
                continue
            task = dispatcher.release(cand, b, tokens, now)
            self._task_asks[task] = ask
            self._sync_tags()
        dispatcher.set_sleep(now)
        dispatcher.sleep_s = max(0.001, min(dispatcher.sleep_s, retry_s))   # a fleet bucket refills then

    def _proxy_done(self, job: GatewayJob, b: Backend, tokens: int, task: asyncio.Task) -> None:
        super()._proxy_done(job, b, tokens, task)
        ask = self._task_asks.pop(task, None)
        if ask is not None:
            req = job.req
            actual = self.wp * req.prompt_tokens + self.wd * req.num_output if req.num_output > 0 else 0.0
            self.fleet.complete_soon(ask, actual)

    # ------------------------------------------------------------------ the door (door.py)
    def _fleet_bucket(self, tenant: str, rl, now: float) -> float | None:
        return fleet_bucket(self.sync.view, self.fleet.local, self.fleet.healthy, tenant, rl.tokens_per_s,
                            rl.burst_tokens, now, time.monotonic())

    def door_check(self, req, now: float):
        """The door's ``rate_limited`` against the tenant's fleet bucket and the cost it has
        queued at every gateway (the policy's own bucket before the first fleet view)."""
        rl = self.contract.tenant(req.tenant).rate_limit
        adm = self.contract.admission
        if rl is None or req.max_wait_s is None or not adm.shed_over_max_wait:
            return None
        level = self._fleet_bucket(req.tenant, rl, now)
        if level is None:
            return super().door_check(req, now)
        elsewhere = self.sync.view.queued_elsewhere.get(req.tenant, 0.0) if self.fleet.healthy else 0.0
        view = self.fair_policy.tenant_view(req.tenant, now)
        wait = door_wait_s(level, view.queued_cost if view is not None else 0.0, elsewhere, rl.tokens_per_s)
        limit = adm.shed_margin * req.max_wait_s
        if wait <= limit:
            return None
        scope = "fleet-wide" if self.fleet.healthy else f"this gateway's share ({self.fleet.local.share:.2g})"
        return (Reason(ReasonCode.RATE_LIMITED, f"tenant {req.tenant!r} token rate limit ({rl.tokens_per_s:g}/s, "
                       f"{scope}) admits this request in ~{wait:.1f}s > {limit:.1f}s (class {req.klass!r}); "
                       f"retry after ~{wait - limit:.0f}s"), wait - limit)

    def ratelimit_headers(self, tenant: str, retry_after: float) -> dict[str, str]:
        h = super().ratelimit_headers(tenant, retry_after)
        rl = self.contract.tenant(tenant).rate_limit
        level = self._fleet_bucket(tenant, rl, self.now()) if rl is not None else None
        if level is not None:
            burst = rl.burst_tokens * (1.0 if self.fleet.healthy else self.fleet.local.share)
            h["x-ratelimit-limit-tokens"] = str(int(burst))
            h["x-ratelimit-remaining-tokens"] = str(max(0, int(level)))
            h["x-ratelimit-reset-tokens"] = f"{max(0.0, (burst - level) / rl.tokens_per_s):.3f}s"
            h["x-tokenfair-ratelimit-scope"] = "fleet" if self.fleet.healthy else "local-share"
        return h

    # ------------------------------------------------------------------ views
    def health(self) -> tuple[bool, dict]:
        ok, info = super().health()
        st = {**self.fleet.status(), **self.sync.status()}
        own = self._contract_tag()
        st["contract_here"] = own
        st["contract_matches"] = st["contract"] in (None, own)
        info["fleet"] = st
        if ok and st["redis"] != "ok":
            info["status"] = "degraded"
        return ok, info

    def snapshot(self) -> dict:
        snap = super().snapshot()
        st = self.fleet.status()
        one = lambda v: {(): float(v)}  # noqa: E731
        snap["extra"] = snap.get("extra", []) + [
            ("tokenfair_fleet_degraded", "1 while Redis is unreachable and this gateway uses its share of local state",
             (), one(st["redis"] != "ok")),
            ("tokenfair_fleet_live_gateways", "Gateways of the fleet with a recent heartbeat", (),
             one(st["live_gateways"])),
            ("tokenfair_fleet_journal_ops", "Decisions taken while degraded, not yet replayed onto Redis", (),
             one(st["journal_ops"])),
            ("tokenfair_fleet_degraded_total", "Times this gateway fell back to local state", (),
             one(st["times_degraded"])),
            ("tokenfair_fleet_view_age_seconds", "Age of the shared view (fleet buckets, shares, contract) in use here",
             (), one(self.now() - self.sync.view.read_s if self.sync.view is not None else -1.0)),
            ("tokenfair_fleet_contract_matches", "1 while this gateway's contract is the fleet's live contract", (),
             one(self.sync.contracts.fleet_tag in ("", self._contract_tag()))),
            ("tokenfair_fleet_contracts_adopted_total", "Contract changes adopted from the fleet", (),
             one(self.sync.contracts.num_adopted)),
            ("tokenfair_fleet_refusals", "Dispatch asks the fleet store refused, by reason (window, concurrency, "
             "rate, ahead)", ("reason",), {(k,): float(v) for k, v in sorted(self.fleet.refusals.items())}),
            ("tokenfair_fleet_backend_leases", "Requests in flight per backend, fleet-wide (leases)", ("backend",),
             {(b.name,): float(b.fleet_inflight) for b in self.backends}),
            ("tokenfair_fleet_tag", "Fleet-wide normalised service S per tenant (cost / weight)", ("tenant",),
             {(self.metrics.tenant(n),): float(s) for n, s in sorted(self.fleet.view.tags.items())}),
        ]
        return snap


def fleet_gateway(contract, keyring, backends: list[str], redis_url: str, fleet: str, gateway_id: str, *,
                  lease_ttl_s: float, heartbeat_s: float, timeout_s: float, **kw) -> FleetGateway:
    """A :class:`FleetGateway` for ``tokenfair gateway --redis URL --fleet NAME`` (a bad URL,
    fleet name or fleet policy is a ``ValueError`` naming the option)."""
    if not redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--redis {redis_url!r}: expected redis://host:port[/db], rediss://... or unix:///path")
    if not fleet or any(ch in fleet for ch in ": \t\n"):
        raise ValueError(f"--fleet {fleet!r}: a non-empty name without ':' or spaces")
    if kw.get("policy", "fair").split(":", 1)[0] != "fair":
        raise ValueError("--redis: a fleet shares the fair policy's tags; use --policy fair")
    try:
        import redis  # noqa: F401
    except ImportError:
        raise ValueError("--redis needs redis-py: pip install 'tokenfair[serve]'") from None
    client = FleetClient(redis_url, fleet, gateway_id, timeout_s=timeout_s, heartbeat_s=heartbeat_s,
                         lease_ttl_s=lease_ttl_s)
    return FleetGateway(contract, keyring, backends, fleet=client, **kw)
