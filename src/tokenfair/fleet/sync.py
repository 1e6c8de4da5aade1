"""A gateway's slow link to its fleet: every ``heartbeat_s`` (off the dispatch path) one
script (``sync_scripts.VIEW``) publishes this gateway's queued cost per tenant and reads
what the fleet-wide decisions at this gateway need, besides the tags of ``client.py``:

  * each rate-limited tenant's fleet token bucket (level, when), for the door's 429 and the
    ``x-ratelimit-*-tokens`` headers;
  * each tenant's fleet service counter (``P:svc``: predicted cost at dispatch, corrected
    at completion), whose increments feed a decayed *recent service* per tenant with the
    policy's ``share_tau_s``: the min-share and light-tenant decisions then compare fleet
    shares, not this gateway's;
  * the cost waiting for each tenant at the other live gateways;
  * the live contract's tag and sequence: a gateway whose contract differs adopts the
    fleet's (``contract_sync.py``).

Staleness bound: what this view holds is at most ``heartbeat_s`` old plus one round trip
(a published contract is also announced on the wake channel, so it is usually picked up at
once).  While Redis is unreachable the view is not refreshed and the callers fall back to
local state (``door.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..sched.fair.adopt import adopt_recent
from ..sched.fair.policy import FairPolicy
from .redis_store import fleet_prefix
from .sync_scripts import VIEW


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


@dataclass
class SharedView:
    """What one VIEW script returned, with the gateway-clock time it was read."""

    read_s: float = -math.inf                 # gateway clock (Service.now()) when read
    redis_now: float = 0.0                    # Redis TIME of the read
    contract: str = ""                        # the fleet's live contract tag ("" = none yet)
    contract_seq: int = 0                     # >= 0, bumped at every publication
    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)   # tenant -> (level, Redis time)
    svc: dict[str, float] = field(default_factory=dict)                    # tenant -> service counter
    queued_elsewhere: dict[str, float] = field(default_factory=dict)       # tenant -> cost queued at others
    class_svc: dict[str, float] = field(default_factory=dict)              # class -> service counter

    def bucket_level(self, tenant: str, rate: float, burst: float, now: float) -> float | None:
        """The tenant's fleet bucket at gateway time ``now`` (None: not known)."""
        b = self.buckets.get(tenant)
        if b is None:
            return None
        level_at_read = min(burst, b[0] + max(0.0, self.redis_now - b[1]) * rate)
        return min(burst, level_at_read + max(0.0, now - self.read_s) * rate)


def parse_view(reply: list, read_s: float) -> SharedView:
    view = SharedView(read_s=read_s, redis_now=float(_s(reply[0])), contract=_s(reply[1]),
                      contract_seq=int(_s(reply[2]) or 0))
    for i in range(int(reply[3])):
        tenant, bk, bt, svc, others = (_s(x) for x in reply[4 + 5 * i: 9 + 5 * i])
        if bk and bt:
            view.buckets[tenant] = (float(bk), float(bt))
        view.svc[tenant] = float(svc)
        if float(others) > 0:
            view.queued_elsewhere[tenant] = float(others)
    at = 4 + 5 * int(reply[3])
    for i in range(int(reply[at])):
        view.class_svc[_s(reply[at + 1 + 2 * i])] = float(_s(reply[at + 2 + 2 * i]))
    return view


class RecentService:
    """Exponentially decayed fleet service per tenant from the increments of a cumulative
    counter (the policy's ``recent``, fleet-wide).  A gateway that joins sees nothing of the
    service before its first read; after ``tau_s`` that history has decayed anyway."""

    def __init__(self, tau_s: float) -> None:
        if not tau_s > 0:
            raise ValueError(f"share_tau_s must be > 0, got {tau_s}")
        self.tau_s = tau_s
        self.cumulative: dict[str, float] = {}
        self.recent: dict[str, float] = {}
        self.at_s: float | None = None          # gateway clock of the last update

    def update(self, svc: dict[str, float], now: float) -> None:
        decay = math.exp(-max(0.0, now - self.at_s) / self.tau_s) if self.at_s is not None else 1.0
        for t in set(self.recent) | set(svc):
            base = self.cumulative.get(t)
            delta = svc.get(t, base or 0.0) - base if base is not None else 0.0
            self.recent[t] = max(0.0, self.recent.get(t, 0.0) * decay + delta)
            if t in svc:
                self.cumulative[t] = svc[t]
        self.at_s = now

    def known(self) -> bool:
        return self.at_s is not None and len(self.cumulative) > 0


class ViewReader:
    """Runs the VIEW script for one gateway (``client`` is redis-py's asyncio client)."""

    def __init__(self, client, fleet: str, gateway_id: str) -> None:
        self.prefix = fleet_prefix(fleet)
        self.gateway_id = gateway_id
        self._view = client.register_script(VIEW)

    async def read(self, queued_cost: dict[str, float], ttl_s: float, read_s: float, now: float = 0.0) -> SharedView:
        q = [x for t, c in sorted(queued_cost.items()) if c > 0 for x in (t, repr(float(c)))]
        args = [self.prefix, self.gateway_id, repr(float(ttl_s)), repr(float(now)), str(len(q) // 2), *q]
        return parse_view(await self._view(keys=[], args=args), read_s)


def apply_recent(policy: FairPolicy, tenants: RecentService, classes: RecentService, now: float) -> bool:
    """Give the fair policy the fleet's *proportions* of recent service: each tenant's and
    min-share class's share of the fleet's recent service (decayed to ``now``, the
    policy's clock), scaled to this gateway's own recent total.  The shares that the
    min-share guarantees and the light-tenant test compare are then the fleet's, while the
    total -- the service rate the wait forecast drains this gateway's queue at -- stays
    this gateway's.  False: nothing to apply (no fleet service yet, or none here)."""
    if not tenants.known():
        return False
    for r in (tenants, classes):
        r.update(r.cumulative, now)              # decay to now (no new increments)
    return adopt_recent(policy, tenants.recent, classes.recent, now)
