"""The live contract's change log on disk: ``DIR/live.jsonl`` in a contract store.

``serve`` / ``gateway --contract-store DIR`` append one JSON line per change of the contract
in force (or a refused one), so the log outlives a restart: ``tokenfair contract history
--store DIR`` prints it under the store's own history, and the service's ``GET
/admin/contract`` starts with the lines already there.  A line::

    {"event": "start" | "apply" | "reload" | "canary" | "canary_passed" | "rollback" | "refused",
     "version": "VERSION@HASH in force after it", "time_s": Unix seconds,
     "time": UTC ISO 8601, "reason": "...", "mode": "serve" | "gateway", "pid": N,
     "detail": {...}}                                   (detail only when there is one)

A contract that goes live with a version label is also recorded in the store's
``versions/<label>.yaml`` (so ``contract show LABEL`` and ``contract diff`` find it); one
whose label the store holds with other content is refused, as ``contract apply`` refuses it.
A line that cannot be read (a write cut short by a crash) is skipped when the log is read.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import yaml

from ..contracts.contract import Contract, ContractError
from ..contracts.store import UNVERSIONED, ContractStore, StoreError

LIVE_LOG = "live.jsonl"


class ContractEventLog:
    def __init__(self, store_dir: str | Path, mode: str) -> None:
        self.store = ContractStore(store_dir)
        self.path = self.store.root / LIVE_LOG
        self.mode = mode
        self.store.root.mkdir(parents=True, exist_ok=True)

    def append(self, event: dict) -> None:
        stamp = datetime.fromtimestamp(event["time_s"], timezone.utc).isoformat(timespec="seconds")
        line = {**event, "time": stamp, "mode": self.mode, "pid": os.getpid()}
        with self.path.open("a") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")

    def check_version(self, c: Contract) -> None:
        """Raise ContractError when the store holds ``c``'s label with other content."""
        if c.version == UNVERSIONED:
            return
        try:
            held = self.store.load(c.version) if c.version in self.store.versions() else None
        except (StoreError, ContractError):
            held = None
        if held is not None and held.content_hash != c.content_hash:
            raise ContractError(f"version {c.version!r} is already in the store {self.store.root} with other "
                                f"content (hash {held.content_hash}, this one {c.content_hash}); give the new "
                                f"content a new version label")

    def keep_version(self, c: Contract) -> None:
        """Record ``c`` in the store's versions/ the first time its label goes live."""
        if c.version == UNVERSIONED:
            return
        try:
            target = self.store.version_path(c.version)
        except StoreError:
            return                                  # a label that cannot name a file: logged only
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(yaml.safe_dump(c.model_dump(mode="json"), sort_keys=False))


def read_live_log(path: str | Path) -> list[dict]:
    """The log's readable lines, oldest first ([] when there is none)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(d, dict) and {"event", "version", "time_s"} <= set(d):
            out.append(d)
    return out


def previous_labels(events: list[dict], current: str) -> list[str]:
    """The rollback stack the log implies, oldest first, for a service now starting with the
    contract labelled ``current``: every applied change pushed the label it replaced
    (``detail.previous``), every rollback popped one, and a restart with another contract than
    the one last in force pushed that one.  Refusals and notes change nothing."""
    stack: list[str] = []
    last: str | None = None
    for d in events:
        event, version = d["event"], d["version"]
        if event == "refused":
            continue
        if event == "start":
            if last is not None and version != last:
                stack.append(last)
        elif event == "rollback":
            if stack:
                stack.pop()
        else:
            prev = (d.get("detail") or {}).get("previous")
            if prev is not None and prev != version:
                stack.append(prev)
        last = version
    if last is not None and last != current:
        stack.append(last)
    return stack


def restore_previous(log: ContractEventLog, current: str) -> list[Contract]:
    """The contracts of :func:`previous_labels` that the store's ``versions/`` holds with the
    same content hash (an unversioned contract cannot be restored and is left out)."""
    out = []
    for label in previous_labels(read_live_log(log.path), current):
        version, _, digest = label.rpartition("@")
        try:
            c = log.store.load(version) if version in log.store.versions() else None
        except (StoreError, ContractError, OSError):
            c = None
        if c is not None and c.content_hash == digest:
            out.append(c)
    return out
