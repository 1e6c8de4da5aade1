"""The contract store: every applied contract version as plain files a team can keep in git.

Layout of a store folder::

    DIR/versions/<version>.yaml   the exact text that was applied, one file per version label
    DIR/history.jsonl             one JSON line per change: {"event": "apply" | "rollback",
                                  "version", "hash", "time" (UTC ISO 8601), "message", "previous"}
    DIR/CURRENT                   the label of the version in force (one line)

Rules: a contract must carry a ``version:`` label (``unversioned`` is refused) and be valid;
re-applying a label with the same content hash only makes it current again; the same label
with different content is an error (give the new content a new label).  ``rollback`` with
no version returns to the version that was current before the latest change.  Errors are
:class:`StoreError` (a ``ValueError``: the CLI exits 2) naming the file and the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .contract import Contract, ContractError, parse_contract, read_yaml

UNVERSIONED = "unversioned"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class StoreError(ValueError):
    """A store operation that cannot be done; the message names the place and the fix."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of ``history.jsonl``."""

    event: str              # "apply" | "rollback"
    version: str            # the label made current by this change
    hash: str               # its content hash (Contract.content_hash)
    time: str               # UTC, ISO 8601 with seconds
    message: str            # free text given by the operator ("" when none)
    previous: str | None    # the label current before this change (None: the store was empty)

    def as_dict(self) -> dict:
        return {"event": self.event, "version": self.version, "hash": self.hash, "time": self.time,
                "message": self.message, "previous": self.previous}


def check_label(label: str, source: str) -> str:
    if label == UNVERSIONED:
        raise StoreError(f"{source}: the contract has no version label; add a top-level 'version: <label>' "
                         f"(e.g. version: 2026-12-01a) before applying it")
    if not _LABEL.fullmatch(label):
        raise StoreError(f"{source}: version {label!r} cannot name a file; use letters, digits, '.', '_' or '-'")
    return label


class ContractStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- paths
    @property
    def versions_dir(self) -> Path:
        return self.root / "versions"

    @property
    def history_path(self) -> Path:
        return self.root / "history.jsonl"

    def version_path(self, label: str) -> Path:
        return self.versions_dir / f"{check_label(label, str(self.root))}.yaml"

    # -- reading
    def versions(self) -> list[str]:
        return sorted(p.stem for p in self.versions_dir.glob("*.yaml")) if self.versions_dir.is_dir() else []

    def current(self) -> str | None:
        p = self.root / "CURRENT"
        return p.read_text().strip() or None if p.exists() else None

    def history(self) -> list[Entry]:
        if not self.history_path.exists():
            return []
        out = []
        for n, line in enumerate(self.history_path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.append(Entry(d["event"], d["version"], d["hash"], d["time"], d.get("message", ""),
                                 d.get("previous")))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise StoreError(f"{self.history_path}:{n}: not a history line; restore the file from git") from None
        return out

    def text(self, label: str) -> str:
        p = self.version_path(label)
        if not p.exists():
            known = ", ".join(self.versions()) or "none"
            raise StoreError(f"{self.root}: no version {label!r} in the store (versions: {known})")
        return p.read_text()

    def load(self, label: str | None = None) -> Contract:
        """Version ``label`` (default: the current one) as a validated contract."""
        label = label or self.current()
        if label is None:
            raise StoreError(f"{self.root}: the store is empty; run 'tokenfair contract apply FILE --store {self.root}'")
        p = self.version_path(label)
        self.text(label)
        return parse_contract(read_yaml(p, "contract", ContractError), str(p))

    # -- changes
    def apply(self, path: str | Path, message: str = "", now: datetime | None = None) -> Entry:
        """Validate ``path`` and make its version current (recording it the first time)."""
        text = _read(path)
        c = parse_contract(read_yaml(path, "contract", ContractError), str(path))
        label = check_label(c.version, str(path))
        target = self.version_path(label)
        if target.exists():
            old = parse_contract(read_yaml(target, "contract", ContractError), str(target))
            if old.content_hash != c.content_hash:
                raise StoreError(f"{path}: version {label!r} is already recorded with different content "
                                 f"(hash {old.content_hash}, this file {c.content_hash}); give the new content "
                                 f"a new version label")
        else:
            self.versions_dir.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return self._record("apply", c, message, now)

    def rollback(self, label: str | None = None, message: str = "", now: datetime | None = None) -> Entry:
        """Make ``label`` current again; by default the version current before the latest change."""
        if label is None:
            hist = self.history()
            if not hist or hist[-1].previous is None:
                raise StoreError(f"{self.root}: nothing to roll back to (history has "
                                 f"{len(hist)} change(s) and no earlier version)")
            label = hist[-1].previous
        c = self.load(label)
        return self._record("rollback", c, message, now)

    def _record(self, event: str, c: Contract, message: str, now: datetime | None) -> Entry:
        stamp = (now or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat(timespec="seconds")
        entry = Entry(event, c.version, c.content_hash, stamp, message, self.current())
        self.root.mkdir(parents=True, exist_ok=True)
        with self.history_path.open("a") as fh:
            fh.write(json.dumps(entry.as_dict()) + "\n")
        (self.root / "CURRENT").write_text(c.version + "\n")
        return entry


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError as err:
        raise StoreError(f"{path}: cannot read the contract ({err.strerror}); check the path") from None


def resolve_contract_ref(ref: str, store: Path | None) -> Contract:
    """A contract named by a file path, or by a version label in ``store``."""
    p = Path(ref)
    if p.exists() and p.is_file():
        from .contract import load_contract
        return load_contract(p)
    if store is not None:
        return ContractStore(store).load(ref)
    raise StoreError(f"{ref}: no such contract file (pass --store DIR to name a stored version)")
