"""A fleet gateway's sync loop: every ``heartbeat_s`` (and at once when a contract is
published anywhere in the fleet, or changed here) one VIEW script (``sync.py``), then the
fleet's shares of recent service into the fair policy (``sync.apply_recent``) and the
live contract (``contract_sync.py``).  Off the dispatch path; skipped while Redis is
unreachable (the client's heartbeat probes it and resynchronises)."""

from __future__ import annotations

import asyncio
import logging

from .client import LIVE_FACTOR, redis_errors
from .contract_sync import ContractSync
from .sync import RecentService, SharedView, ViewReader, apply_recent

log = logging.getLogger("tokenfair.fleet")


class GatewaySync:
    def __init__(self, gateway) -> None:
        fleet = gateway.fleet
        self.gateway = gateway
        self.fleet = fleet
        self.reader = ViewReader(fleet.redis, fleet.fleet, fleet.gateway_id)
        self.contracts = ContractSync(fleet.redis, fleet.fleet, gateway)
        tau = gateway.fair_policy.snapshot(gateway.now()).share_tau_s
        assert tau is not None                    # a fair policy keeps a share meter
        self.recent = RecentService(tau)          # per tenant, fleet-wide
        self.class_recent = RecentService(tau)    # per class, fleet-wide
        self.view: SharedView | None = None       # None until the first read
        self.num_reads = 0
        self.kick: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def _on_contract_change(self, new, event: str) -> None:
        self.contracts.on_local_change(new, event)
        if self.kick is not None:
            self.kick.set()

    def _on_published(self, seq: int) -> None:
        if self.kick is not None and seq != self.contracts.seen_seq:
            self.kick.set()

    async def start(self) -> None:
        self.kick = asyncio.Event()
        live = self.gateway.live
        if live is not None:
            live.on_apply.append(self._on_contract_change)
        self.fleet.on_contract = self._on_published
        try:
            await asyncio.wait_for(self.contracts.start(), self.fleet.timeout_s)
            await self.refresh()
        except redis_errors() as err:
            log.warning("fleet %s: first view failed (%s); retrying every %.2fs", self.fleet.fleet, err,
                        self.fleet.heartbeat_s)
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def refresh(self) -> None:
        gw, fleet = self.gateway, self.fleet
        with gw.policy_lock:
            queued = gw.fair_policy.snapshot(gw.now()).queued_costs()
        view = await asyncio.wait_for(self.reader.read(queued, LIVE_FACTOR * fleet.heartbeat_s, gw.now()),
                                      fleet.timeout_s)
        self.view = view
        self.num_reads += 1
        now = gw.now()
        self.recent.update(view.svc, now)
        self.class_recent.update(view.class_svc, now)
        with gw.policy_lock:
            apply_recent(gw.fair_policy, self.recent, self.class_recent, now)
        await asyncio.wait_for(self.contracts.tick(view.contract, view.contract_seq), fleet.timeout_s)

    async def _loop(self) -> None:
        assert self.kick is not None
        while True:
            try:
                await asyncio.wait_for(self.kick.wait(), self.fleet.heartbeat_s)
            except asyncio.TimeoutError:
                pass
            self.kick.clear()
            if not self.fleet.healthy:
                continue
            try:
                await self.refresh()
            except redis_errors() as err:
                log.debug("fleet view failed: %s", err)
            except Exception as err:  # noqa: BLE001 - the loop must keep running
                log.exception("fleet sync failed: %s", err)

    def status(self) -> dict:
        return {"view_reads": self.num_reads, **self.contracts.status()}
