"""The contract in force in a running ``serve`` or ``gateway``, and changes to it without a restart.

A change (``POST /admin/contract``, SIGHUP re-reading ``--contract``, a canary's automatic
rollback, ``POST /admin/contract/rollback``) is decided, then applied:

  decide  the new contract is validated (pydantic, as at start-up) and its key ring is
          built (a key listed for two tenants is an error).  Any error refuses the change
          and the last good contract stays in force;
  apply   under the service's policy lock: the service's, the scheduler's and the policy's
          contract references are swapped and the policy re-derives what it keeps of the
          contract (``Policy.on_contract_change``; the fair policy: cost weights, WFQ credit,
          grace, headroom, preemption, every known tenant's spec and weight, the min-share
          classes' reservation queues, sched/fair/rebind.py; vtc: the tenants' weights).
          Every field takes effect for what is decided from then on -- engine budgets at the
          next step, classes, keys, limits, costs at the next request or token.  Nothing
          queued or running is aborted: requests keep the class parameters they were
          admitted with (priority, max wait, SLOs, deadline); new requests use the new
          version.  A cost change prices the tokens served from then on; charges already
          made stay.  A lower ``engine.max_running`` stops admissions until the running
          requests fall below it; none is evicted for it.

Tenants removed from the contract: their queued and running requests go on under the
default template; their keys, as the new contract's ``removed_tenants`` says, stop
authenticating with a clear refusal (``reject``, the default: 401 ``tenant_removed`` naming
the version that removed them) or go on authenticating the tenant, now served under
``default_tenant`` (``default_template``; until the service restarts, when only the
contract's own keys are known).  A key names one tenant, so a contract cannot list keys under
``default_tenant``.

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


class LiveKeyRing(KeyRing):
    """The new contract's keys, and a clear refusal for the keys of tenants it removed."""

    def __init__(self, contract: Contract, previous: "LiveKeyRing | KeyRing | None",
                 anonymous_tenant: str | None) -> None:
        super().__init__(contract, anonymous_tenant)
        self.removed: dict[str, str] = {}
        self.version = contract.version
        self.keep_removed = contract.removed_tenants == "default_template"
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
            if self.keep_removed:
                return gone                 # served under default_tenant (contract.tenant(gone))
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

    def __init__(self, service, path: str | Path | None = None, log=None) -> None:
        self.service = service
        self.path = Path(path) if path is not None else None
        self.log = log                      # serve/contract_events.ContractEventLog, or None (memory only)
        self.previous: list[Contract] = []
        self.events: list[ContractEvent] = []
        self.canary = None                  # the running canary (serve/canary.py), if any
        if log is not None:                 # the changes before this start, from the store's live log
            from .contract_events import read_live_log, restore_previous
            self.events = [ContractEvent(d["event"], d["version"], float(d["time_s"]), d.get("reason", ""),
                                         d.get("detail") or {}) for d in read_live_log(log.path)[-MAX_EVENTS:]]
            self.previous = restore_previous(log, self.label)   # rollback works across a restart
            log.keep_version(self.contract)
        self.on_apply: list = []            # callables (contract, event) run after each applied change
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
        if self.log is not None:
            try:
                self.log.append(ev.as_dict())
            except OSError as err:          # a full disk must not stop a contract change
                log.error("contract log %s not written: %s", self.log.path, err)
        log.warning("contract %s: %s %s", event, ev.version, reason)
        return ev

    def decide(self, new: Contract) -> LiveKeyRing:
        """The key ring for ``new``; raises ContractError when it cannot go live."""
        if self.log is not None:
            try:
                self.log.check_version(new)
            except ContractError as err:
                raise ContractError(f"contract {label_of(new)} refused: {err}") from None
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
                sched.set_contract(new)
            # every field holds for what the policy decides from now on; queued and running
            # work is untouched (sched/policy.py on_contract_change, sched/fair/rebind.py)
            svc.policy.on_contract_change(new, svc.now())
            svc.contract = new
            svc.keyring = ring
            svc.metrics.contract = new
            svc.metrics.classes |= set(new.classes)      # a class added live gets its own label
        if push and label_of(old) != label_of(new):
            self.previous.append(old)
        if self.log is not None:
            try:
                self.log.keep_version(new)
            except OSError as err:
                log.error("contract store %s: version not recorded: %s", self.log.store.root, err)
        ev = self.note(event, reason, previous=label_of(old))
        for hook in self.on_apply:          # e.g. a fleet gateway publishes the change (fleet/contract_sync.py)
            hook(new, event)
        return ev

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
