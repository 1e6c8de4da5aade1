"""The fleet store in Redis: every change is one atomic Lua script (``scripts.py``), so a
dispatch (check limits, fairness and the backend window, then charge) is one round trip."""

from __future__ import annotations

from typing import Any, Protocol

from .model import Completion, DispatchAnswer, DispatchAsk, FleetView, Heartbeat
from .scripts import COMPLETE, DISPATCH, HEARTBEAT

KEY_PREFIX = "tf"


def fleet_prefix(fleet: str) -> str:
    return f"{KEY_PREFIX}:{fleet}"


class FleetStore(Protocol):
    """What a gateway asks of the fleet's state (Redis, or the local fallback)."""

    async def dispatch(self, ask: DispatchAsk) -> DispatchAnswer: ...

    async def complete(self, done: Completion) -> DispatchAnswer: ...

    async def heartbeat(self, hb: Heartbeat) -> FleetView: ...


def _f(x: float) -> str:
    return repr(float(x))


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def parse_tags(flat: list) -> dict[str, float]:
    return {_s(flat[i]): float(_s(flat[i + 1])) for i in range(0, len(flat) - 1, 2)}


def parse_answer(reply: list) -> DispatchAnswer:
    status = _s(reply[0])
    return DispatchAnswer(ok=status in ("ok", "dup", "skip"), reason=_s(reply[1]), vtime=float(_s(reply[2])),
                          backend_inflight=int(reply[3]), retry_s=float(_s(reply[4])),
                          tags=parse_tags(reply[5:]))


class RedisStore:
    """:class:`FleetStore` over a redis-py asyncio client (``redis.asyncio.Redis``)."""

    def __init__(self, client: Any, fleet: str) -> None:
        self.client = client
        self.fleet = fleet
        self.prefix = fleet_prefix(fleet)
        self._dispatch = client.register_script(DISPATCH)
        self._complete = client.register_script(COMPLETE)
        self._heartbeat = client.register_script(HEARTBEAT)

    async def dispatch(self, ask: DispatchAsk) -> DispatchAnswer:
        args = [self.prefix, ask.op_id, ask.lease_id, ask.gateway, ask.tenant, _f(ask.weight), _f(ask.cost_pred),
                _f(ask.cost_max), _f(ask.rate), _f(ask.burst), str(int(ask.max_concurrency)), ask.backend,
                str(int(ask.window)), _f(ask.lease_ttl_s), _f(ask.credit), "1" if ask.force else "0",
                _f(ask.now), ask.klass, "1" if ask.check_ahead else "0", *ask.backlog]
        return parse_answer(await self._dispatch(keys=[], args=args))

    async def complete(self, done: Completion) -> DispatchAnswer:
        args = [self.prefix, done.op_id, done.lease_id, done.tenant, _f(done.weight), done.backend,
                _f(done.cost_pred), _f(done.cost_max), _f(done.cost_actual), _f(done.rate), _f(done.burst),
                _f(done.credit), _f(done.now), done.dispatch_op, done.klass]
        return parse_answer(await self._complete(keys=[], args=args))

    async def heartbeat(self, hb: Heartbeat) -> FleetView:
        queue = [x for t, n in sorted(hb.queue.items()) if n > 0 for x in (t, str(int(n)))]
        leases = [x for lease in hb.leases for x in lease]
        args = [self.prefix, hb.gateway, _f(hb.ttl_s), _f(hb.lease_ttl_s), hb.contract, str(int(hb.running)),
                _f(hb.now), "1" if hb.reassert else "0", str(len(queue) // 2), *queue, *leases]
        reply = await self._heartbeat(keys=[], args=args)
        num_backends = int(reply[3])
        inflight = {_s(reply[4 + 2 * i]): int(reply[5 + 2 * i]) for i in range(num_backends)}
        return FleetView(live_gateways=max(1, int(reply[0])), vtime=float(_s(reply[1])), contract=_s(reply[2]),
                         backend_inflight=inflight, tags=parse_tags(reply[4 + 2 * num_backends:]))
