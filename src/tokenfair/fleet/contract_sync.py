"""The fleet's live contract: one version for every gateway of a fleet.

Redis holds the live contract's tag (``P:contract``, version@hash), its text as JSON
(``P:contract_text``) and a sequence bumped at every publication (``sync_scripts.PUBLISH``).

  * a gateway starting publishes its ``--contract`` only when the fleet has none; otherwise
    it adopts the fleet's (a restarted replica comes back with the version in force);
  * a change on one gateway (``POST /admin/contract``, its rollback, SIGHUP, a canary's
    apply or automatic rollback) is published at once; the publication is announced on
    the wake channel;
  * every gateway compares the fleet's tag with its own at each view (every
    ``heartbeat_s``) and on the announcement, and applies the fleet's through
    ``LiveContract.apply`` (event ``fleet``), which validates it as any live change does.
    A contract it refuses (``LiveContract.decide``: a key listed for two tenants, say) is
    refused there, logged once, and ``/healthz`` shows ``contract_matches: false``.

Bound: a published contract is in force on every live gateway within ``heartbeat_s`` plus a
round trip (usually at once, from the announcement).  A change made while Redis is
unreachable is published when it answers again (the latest one).
"""

from __future__ import annotations

import json
import logging

from ..contracts.contract import Contract, ContractError, parse_contract
from ..serve.contract_live import label_of
from .redis_store import fleet_prefix
from .sync_scripts import PUBLISH

log = logging.getLogger("tokenfair.fleet")
FLEET_EVENT = "fleet"          # the LiveContract event of a contract adopted from the fleet


def contract_text(c: Contract) -> str:
    return json.dumps(c.model_dump(mode="json"), sort_keys=True)


class ContractSync:
    """Publishes this gateway's contract changes and adopts the fleet's (module docstring)."""

    def __init__(self, client, fleet: str, service) -> None:
        self.service = service
        self.prefix = fleet_prefix(fleet)
        self.client = client
        self._publish = client.register_script(PUBLISH)
        self.pending: Contract | None = None      # a local change not yet published
        self.seen_seq = -1                        # the last fleet sequence dealt with
        self.refused: dict[str, str] = {}         # fleet tag -> why this gateway could not take it
        self.num_adopted = 0
        self.fleet_tag = ""                       # the fleet's live tag as last read or published

    def on_local_change(self, new: Contract, event: str) -> None:
        """LiveContract's hook: a change made here goes to the fleet (not one adopted from it)."""
        if event != FLEET_EVENT:
            self.pending = new

    async def start(self) -> None:
        """Publish this gateway's contract if the fleet has none, else adopt the fleet's."""
        c = self.service.contract
        tag, text, seq = await self._publish(keys=[], args=[self.prefix, label_of(c), contract_text(c), "1"])
        self._adopt(_s(tag), _s(text), int(_s(seq)))

    async def tick(self, fleet_tag: str, fleet_seq: int) -> None:
        """Publish a pending local change, or adopt the fleet's contract if it moved."""
        if self.pending is not None:
            c, self.pending = self.pending, None
            try:
                tag, _, seq = await self._publish(keys=[], args=[self.prefix, label_of(c), contract_text(c), "0"])
            except BaseException:
                if self.pending is None:
                    self.pending = c               # publish it at the next tick
                raise
            self.seen_seq, self.fleet_tag = int(_s(seq)), _s(tag)
            log.warning("fleet: published contract %s (seq %d)", _s(tag), self.seen_seq)
            return
        if not fleet_tag or fleet_seq == self.seen_seq:
            return
        self.fleet_tag = fleet_tag
        if fleet_tag == label_of(self.service.contract):
            self.seen_seq = fleet_seq
            return
        raw = await self.client.get(self.prefix + ":contract_text")
        if raw is not None:
            self._adopt(fleet_tag, _s(raw), fleet_seq)

    def _adopt(self, tag: str, text: str, seq: int) -> None:
        self.seen_seq, self.fleet_tag = seq, tag
        live = self.service.live
        if tag == label_of(self.service.contract) or tag in self.refused:
            return
        try:
            new = parse_contract(json.loads(text), f"fleet contract {tag}")
            if live is None:
                raise ContractError("this gateway has no live contract to change")
            live.apply(new, FLEET_EVENT, f"adopted from the fleet (seq {seq})")
        except (ContractError, ValueError) as err:
            self.refused[tag] = str(err)
            log.error("fleet contract %s refused here: %s", tag, err)
            if live is not None:
                live.refuse(err, "fleet")
            return
        self.num_adopted += 1

    def status(self) -> dict:
        return {"contract": self.fleet_tag or None, "contract_seq": self.seen_seq, "contracts_adopted": self.num_adopted,
                "contract_refused": dict(self.refused) or None}


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)
