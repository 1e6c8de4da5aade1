"""The service's request records as a replayable trace.

``serve`` and ``gateway`` write one JSON line per ended request (``--records FILE``): the
simulator's record fields plus ``mode``, ``endpoint``, ``http_status``, ``finish_reason``,
``max_tokens`` and ``contract_version`` (the version that admitted it).  With
``--records-max-mb`` the file is rotated by size: ``FILE`` -> ``FILE.1`` -> ... ->
``FILE.<keep>`` (the oldest is dropped); :func:`record_files` lists them oldest first.

:func:`records_workload` turns records into a :class:`~tokenfair.workloads.workload.Workload`:
arrival (the service's clock, seconds from its start), tenant, class, prompt tokens, output
tokens, max_tokens and the deadline relative to arrival.  A request that did not finish has
no true output length: it replays with the tokens it produced, or ``min(max_tokens,
UNKNOWN_OUTPUT_TOKENS)`` when it produced none (rejected at the door, failed before its
first token).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from .workload import TraceRow, Workload, WorkloadError

UNKNOWN_OUTPUT_TOKENS = 256
_ROTATED = re.compile(r"\.(\d+)$")


def record_files(path: str | Path) -> list[Path]:
    """``path`` and its rotated siblings (``path.1`` ...), oldest first."""
    p = Path(path)
    rotated = []
    for q in p.parent.glob(p.name + ".*"):
        m = _ROTATED.search(q.name)
        if m and q.name == f"{p.name}.{m.group(1)}":
            rotated.append((int(m.group(1)), q))
    files = [q for _, q in sorted(rotated, reverse=True)]
    if p.exists():
        files.append(p)
    return files


def is_records_file(path: str | Path) -> bool:
    """Whether ``path`` holds service records (its first line has ``mode`` and ``http_status``)."""
    p = Path(path)
    if not p.is_file() or p.suffix.lower() not in (".jsonl", ".ndjson", ".json") and not _ROTATED.search(p.name):
        return False
    with p.open() as fh:
        for line in fh:
            if line.strip():
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(d, dict) and "mode" in d and "http_status" in d
    return False


def read_records(path: str | Path) -> list[dict]:
    files = record_files(path)
    if not files:
        raise WorkloadError(f"{path}: no such records file; start serve/gateway with --records {path}")
    out = []
    for f in files:
        with f.open() as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    raise WorkloadError(f"{f}:{i}: not a JSON record (a line cut short? remove it)") from None
                if not isinstance(d, dict) or not {"request_id", "arrival_s", "tenant", "prompt_tokens"} <= set(d):
                    raise WorkloadError(f"{f}:{i}: not a request record (needs request_id, arrival_s, tenant, "
                                        f"prompt_tokens)")
                out.append(d)
    return out


def record_to_row(rec: dict) -> TraceRow:
    out_tokens = int(rec.get("output_tokens") or 0)
    max_tokens = rec.get("max_tokens")
    if rec.get("status") != "finished" and out_tokens <= 0:
        out_tokens = min(int(max_tokens or UNKNOWN_OUTPUT_TOKENS), UNKNOWN_OUTPUT_TOKENS)
    out_tokens = max(1, out_tokens)
    if max_tokens is not None:
        max_tokens = max(int(max_tokens), out_tokens)
    deadline = rec.get("deadline_s")
    rel = deadline - rec["arrival_s"] if deadline is not None and deadline > rec["arrival_s"] else None
    return TraceRow(request_id=str(rec["request_id"]), arrival_s=float(rec["arrival_s"]), tenant=str(rec["tenant"]),
                    prompt_tokens=max(1, int(rec["prompt_tokens"])), output_tokens=out_tokens,
                    klass=rec.get("class"), deadline_s=rel, max_tokens=max_tokens)


def records_workload(path: str | Path, name: str | None = None) -> Workload:
    recs = read_records(path)
    return workload_of(recs, name or Path(path).stem)


def workload_of(recs: list[dict], name: str) -> Workload:
    """The records as a trace re-based so the first arrival is at 0, sorted by arrival."""
    if not recs:
        raise WorkloadError(f"{name}: the records are empty")
    t0 = min(float(r["arrival_s"]) for r in recs)
    rows = []
    seen: set[str] = set()
    for r in recs:
        row = record_to_row(r)
        if row.request_id in seen:
            raise WorkloadError(f"{name}: request_id {row.request_id!r} appears twice; records of two "
                                f"runs mixed? give one run's file")
        seen.add(row.request_id)
        rows.append(replace(row, arrival_s=row.arrival_s - t0))
    rows.sort(key=lambda r: r.arrival_s)
    return Workload(name, tuple(rows))

