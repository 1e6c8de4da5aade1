"""The contract in force in a running ``serve`` or ``gateway``, and changes to it without a restart.

A change (``POST /admin/contract``, SIGHUP re-reading ``--contract``, a canary's automatic
rollback, ``POST /admin/contract/rollback``) is decided, then applied:

  decide  the new contract is validated (pydantic, as at start-up) and checked for what a
          running scheduler cannot take live (:func:`live_change_error`: which classes have
          a min_share, the cost weights); its key ring is built (a key listed for two
          tenants is an error).  Any error refuses the change and the last good contract
          stays in force;
  apply   under the service's policy lock: the service's, the scheduler's and the policy's
          contract references are swapped and every known tenant's state takes its new spec
          (weight, min share, limits).  Nothing queued or running is aborted: requests keep
          the class parameters they were admitted with; new requests use the new version.

Tenants removed from the contract: their queued and running requests go on under the
default template; their keys stop authenticating, with a clear refusal (401
``tenant_removed`` naming the version that removed them).  A key names one tenant, so a
contract cannot list keys under ``default_tenant``: to keep serving a tenant, keep it.

Every response carries ``x-tokenfair-contract: VERSION@HASH``; every record names the version
that admitted the request (``contract_version``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..contracts.contract import Contract, ContractError, load_contract
from .auth import AuthError, KeyRing

log = logging.getLogger("tokenfair.contracts.contract")
MAX_EVENTS = 1000


def label_of(c: Contract) -> str:
    return f"{c.version}@{c.content_hash}"


def live_change_error(old: Contract, new: Contract) -> str | None:
    """Why ``new`` cannot replace ``old`` in a running scheduler (None: it can)."""
    mins = lambda c: sorted(k for k, s in c.classes.items() if s.min_share > 0)  # noqa: E731
    if mins(old) != mins(new):
        return (f"the classes with a min_share change ({mins(old)} -> {mins(new)}); a running scheduler keeps "
                f"one reservation queue per such class: restart the service to change which classes have one")
    if old.costs != new.costs:
        return "the cost weights (costs) change; charges already made would mix two units: restart the service"
    return None


def rebind_policy(policy, new: Contract) -> None:
    """Point ``policy`` at ``new``: tenants take their new specs; queued work is untouched."""
    policy.contract = new
    rebind = getattr(policy, "rebind_contract", None)
    if rebind is not None:
        rebind(new)         # the fair policy's parts; fifo / sjf / priority / vtc read the contract
    # the reservations cached by the fair policy are recomputed at its next on_step_end


class LiveKeyRing(KeyRing):
    """The new contract's keys, and a clear refusal for the keys of tenants it removed."""

    def __init__(self, contract: Contract, previous: "LiveKeyRing | KeyRing | None",
                 anonymous_tenant: str | None) -> None:
        super().__init__(contract, anonymous_tenant)
        self.removed: dict[str, str] = {}
        self.version = contract.version
        if previous is None:
            return
        old = dict(previous.by_hash) | dict(getattr(previous, "removed", {}))
        for digest, tenant in old.items():
            if digest not in self.by_hash:
                self.removed[digest] = tenant

    def tenant_for(self, authorization: str | None, x_api_key: str | None = None) -> str:
        try:
            return super().tenant_for(authorization, x_api_key)
        except AuthError:
            from .auth import hash_key
            key = self.presented_key(authorization, x_api_key)
            gone = self.removed.get(hash_key(key)) if key is not None else None
            if gone is None:
                raise
            raise AuthError(f"tenant_removed: tenant {gone!r} is not in contract version "
                            f"{self.version!r}") from None


@dataclass
class ContractEvent:
    """One change of the live contract (or a refused one)."""

    event: str                  # "start" | "apply" | "reload" | "rollback" | "canary" | "refused" ...
    version: str                # VERSION@HASH in force after the event
    time_s: float               # wall clock (Unix seconds)
    reason: str = ""            # what asked for it, or why it was refused / rolled back
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"event": self.event, "version": self.version, "time_s": self.time_s, "reason": self.reason,
                **({"detail": self.detail} if self.detail else {})}


class LiveContract:
    """The service's contract in force, the versions before it, and the change log."""

    def __init__(self, service, path: str | Path | None = None) -> None:
        self.service = service
        self.path = Path(path) if path is not None else None
        self.previous: list[Contract] = []
        self.events: list[ContractEvent] = []
        self.canary = None                  # the running canary (serve/canary.py), if any
        self.note("start", "the contract the service started with")

    @property
    def contract(self) -> Contract:
        return self.service.contract

    @property
    def label(self) -> str:
        return label_of(self.service.contract)

    def note(self, event: str, reason: str = "", **detail) -> ContractEvent:
        ev = ContractEvent(event, self.label, time.time(), reason, detail)
        self.events.append(ev)
        del self.events[:-MAX_EVENTS]
        log.warning("contract %s: %s %s", event, ev.version, reason)
        return ev

    def decide(self, new: Contract) -> LiveKeyRing:
        """The key ring for ``new``; raises ContractError when it cannot go live."""
        why = live_change_error(self.contract, new)
        if why is not None:
            raise ContractError(f"contract {label_of(new)} refused: {why}")
        try:
            return LiveKeyRing(new, self.service.keyring, self.service.keyring.anonymous_tenant)
        except ValueError as err:
            raise ContractError(f"contract {label_of(new)} refused: {err}") from None

    def apply(self, new: Contract, event: str = "apply", reason: str = "", *, push: bool = True) -> ContractEvent:
        ring = self.decide(new)
        if self.canary is not None:           # any other change ends a running canary
            running, self.canary = self.canary, None
            running.stop("superseded")
        svc = self.service
        old = svc.contract
        with svc.policy_lock:
            sched = getattr(svc, "sched", None)
            if sched is not None:
                sched.contract = new
            rebind_policy(svc.policy, new)
            svc.contract = new
            svc.keyring = ring
            svc.metrics.contract = new
        if push and label_of(old) != label_of(new):
            self.previous.append(old)
        return self.note(event, reason, previous=label_of(old))

    def refuse(self, err: Exception, source: str) -> ContractEvent:
        return self.note("refused", f"{source}: {err}")

    def rollback(self, reason: str = "rollback requested") -> ContractEvent:
        if not self.previous:
            raise ContractError(f"no earlier contract to roll back to (in force: {self.label})")
        back = self.previous.pop()
        return self.apply(back, "rollback", reason, push=False)

    def reload_file(self) -> ContractEvent:
        """SIGHUP: re-read ``--contract``; a bad file is refused and logged."""
        if self.path is None:
            return self.note("refused", "SIGHUP: the service was started without --contract; nothing to re-read")
        try:
            return self.apply(load_contract(self.path), "reload", f"SIGHUP re-read {self.path}")
        except ContractError as err:
            return self.refuse(err, "SIGHUP")
