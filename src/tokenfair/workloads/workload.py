"""Workloads: trace rows, and the CSV/JSONL trace format.

Columns: ``request_id, arrival_s, tenant, prompt_tokens, output_tokens`` and optional
``class, deadline_s, priority, max_tokens``.  ``output_tokens`` is the true generated
length, which only the engine may read.  ``deadline_s`` is relative to arrival (a latency
budget, seconds); ``priority`` may only lower the class priority.  A bad row raises
:class:`WorkloadError` naming file, line and field.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Final, Iterable

REQUIRED = ("request_id", "arrival_s", "tenant", "prompt_tokens", "output_tokens")
OPTIONAL = ("class", "deadline_s", "priority", "max_tokens")


# the latest arrival a workload may have (about 116 days): the timeline is bucketed per
# second, so a longer span is sliced (--start-s/--end-s) or compressed (--rate-scale) first
MAX_ARRIVAL_S: Final = 1e7
# the most tokens one request's prompt, output or max_tokens may give: beyond any context
# (such a prompt is rejected for the KV pool, such an output capped), and a million of them
# still sum within the int64 columns of the records (a larger one overflowed them)
MAX_REQUEST_TOKENS: Final = 10**12


class WorkloadError(ValueError):
    """A trace that cannot be read; the message names file, line and field."""


def check_span(last_arrival_s: float, what: str) -> None:
    """A WorkloadError naming ``what`` when the latest arrival is past ``MAX_ARRIVAL_S``."""
    if not last_arrival_s <= MAX_ARRIVAL_S:
        raise WorkloadError(f"{what}: the last arrival would be at {last_arrival_s:.4g} s, past the "
                            f"{MAX_ARRIVAL_S:.0e} s a workload may span (its timeline is bucketed per second); "
                            "keep a part of it (--start-s/--end-s, --max-requests) or raise the rate (--rate-scale)")


@dataclass(frozen=True, slots=True)
class TraceRow:
    request_id: str
    arrival_s: float
    tenant: str
    prompt_tokens: int
    output_tokens: int
    klass: str | None = None
    deadline_s: float | None = None
    priority: float | None = None
    max_tokens: int | None = None
    prefix_hashes: tuple[int, ...] = ()


# performance: a row rebuilt by a transform is made by setting its slots directly (the
# dataclass's frozen __init__ calls object.__setattr__ once per field: about twice the time;
# a tiled, re-spread, rate-scaled trace rebuilds every row three times); TraceRow has no
# __post_init__, so the result is the same row (tests/test_workload.py, tests/test_isolated.py)
_new_object = object.__new__
(_set_request_id, _set_arrival_s, _set_tenant, _set_prompt_tokens, _set_output_tokens, _set_klass,
 _set_deadline_s, _set_priority, _set_max_tokens, _set_prefix_hashes) = (
    TraceRow.__dict__[f.name].__set__ for f in fields(TraceRow))


def _row(request_id: str, arrival_s: float, tenant: str, prompt_tokens: int, output_tokens: int,
         klass: str | None, deadline_s: float | None, priority: float | None, max_tokens: int | None,
         prefix_hashes: tuple[int, ...]) -> TraceRow:
    """``TraceRow(...)`` of every field, by setting its slots."""
    out = _new_object(TraceRow)
    _set_request_id(out, request_id)
    _set_arrival_s(out, arrival_s)
    _set_tenant(out, tenant)
    _set_prompt_tokens(out, prompt_tokens)
    _set_output_tokens(out, output_tokens)
    _set_klass(out, klass)
    _set_deadline_s(out, deadline_s)
    _set_priority(out, priority)
    _set_max_tokens(out, max_tokens)
    _set_prefix_hashes(out, prefix_hashes)
    return out


def _rebuilt_row(row: TraceRow, request_id: str, arrival_s: float, tenant: str) -> TraceRow:
    """``row`` with these three fields."""
    return _row(request_id, arrival_s, tenant, row.prompt_tokens, row.output_tokens, row.klass, row.deadline_s,
                row.priority, row.max_tokens, row.prefix_hashes)


def plain_row(request_id: str, arrival_s: float, tenant: str, prompt_tokens: int, output_tokens: int) -> TraceRow:
    """``TraceRow(request_id, arrival_s, tenant, prompt_tokens, output_tokens)``, its other
    fields at their defaults (a trace reader's row)."""
    return _row(request_id, arrival_s, tenant, prompt_tokens, output_tokens, None, None, None, None, ())


def with_tenant(row: TraceRow, tenant: str) -> TraceRow:
    """``dataclasses.replace(row, tenant=tenant)`` without its per-call field introspection
    (every field passed; ``tests/test_workload.py`` checks it against ``replace``)."""
    return _rebuilt_row(row, row.request_id, row.arrival_s, tenant)


def moved(row: TraceRow, arrival_s: float, request_id: str | None = None) -> TraceRow:
    """``dataclasses.replace(row, arrival_s=arrival_s[, request_id=request_id])`` without its
    per-call field introspection (performance: ``replace`` was most of reading a tiled,
    rate-scaled trace; ``tests/test_isolated.py`` checks it against ``replace``)."""
    return _rebuilt_row(row, row.request_id if request_id is None else request_id, arrival_s, row.tenant)


@dataclass(frozen=True)
class Workload:
    name: str
    rows: tuple[TraceRow, ...]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def tenants(self) -> list[str]:
        return sorted({r.tenant for r in self.rows})

    def only_tenant(self, tenant: str) -> "Workload":
        return Workload(f"{self.name}[{tenant}]", tuple(r for r in self.rows if r.tenant == tenant))


def parse_number(raw: object, kind: type, where: str, field: str, *, minimum: float | None = None,
                 maximum: float | None = None):
    if isinstance(raw, bool):
        raise WorkloadError(f"{where}: field {field!r}: expected a number, got {raw!r}")
    try:
        value = kind(raw)
        if kind is int and isinstance(raw, float) and raw != int(raw):
            raise ValueError
    except (TypeError, ValueError):
        raise WorkloadError(f"{where}: field {field!r}: expected {'an integer' if kind is int else 'a number'}, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise WorkloadError(f"{where}: field {field!r}: must be finite, got {raw!r}")
    if minimum is not None and value < minimum:
        raise WorkloadError(f"{where}: field {field!r}: must be >= {minimum}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise WorkloadError(f"{where}: field {field!r}: must be <= {maximum:g}, got {raw!r}")
    return value


def _blank(v: object) -> bool:
    return v is None or (isinstance(v, str) and v.strip() == "")


def prefix_hashes_of(raw: object, where: str, field: str = "prefix_hashes/hash_ids") -> tuple[int, ...]:
    """A row's prompt block hashes (``prefix_hashes`` or Mooncake's ``hash_ids``): a list of
    integers (none: no blocks).  A string, a scalar or a non-integer item is refused, naming
    the row (a string was read character by character, ``1.5`` truncated, ``5`` crashed)."""
    if _blank(raw) or raw == []:
        return ()
    if not isinstance(raw, (list, tuple)):
        raise WorkloadError(f"{where}: field {field!r}: expected a list of integer block hashes, got {raw!r:.60}")
    for h in raw:
        if isinstance(h, bool) or not isinstance(h, int):
            raise WorkloadError(f"{where}: field {field!r}: expected integer block hashes, got {h!r}")
    return tuple(raw)


def row_from_mapping(d: dict, where: str) -> TraceRow:
    """Validate one trace record (already split into fields)."""
    unknown = set(d) - set(REQUIRED) - set(OPTIONAL) - {"prefix_hashes", "hash_ids"}
    if unknown:
        raise WorkloadError(f"{where}: unknown field(s) {sorted(unknown)}; allowed: {list(REQUIRED + OPTIONAL)}")
    for f in REQUIRED:
        if _blank(d.get(f)):
            raise WorkloadError(f"{where}: field {f!r} is missing; every row needs {list(REQUIRED)}")
    tenant = str(d["tenant"]).strip()
    rid = str(d["request_id"]).strip()
    opt = {}
    if not _blank(d.get("class")):
        opt["klass"] = str(d["class"]).strip()
    if not _blank(d.get("deadline_s")):
        opt["deadline_s"] = parse_number(d["deadline_s"], float, where, "deadline_s", minimum=0)
        if opt["deadline_s"] <= 0:
            raise WorkloadError(f"{where}: field 'deadline_s': must be > 0 seconds after arrival")
    if not _blank(d.get("priority")):
        opt["priority"] = parse_number(d["priority"], float, where, "priority")
    if not _blank(d.get("max_tokens")):
        opt["max_tokens"] = parse_number(d["max_tokens"], int, where, "max_tokens", minimum=1,
                                         maximum=MAX_REQUEST_TOKENS)
    hashes = prefix_hashes_of(d.get("prefix_hashes", d.get("hash_ids")), where)
    row = TraceRow(
        request_id=rid,
        arrival_s=parse_number(d["arrival_s"], float, where, "arrival_s", minimum=0, maximum=MAX_ARRIVAL_S),
        tenant=tenant,
        prompt_tokens=parse_number(d["prompt_tokens"], int, where, "prompt_tokens", minimum=1,
                                   maximum=MAX_REQUEST_TOKENS),
        output_tokens=parse_number(d["output_tokens"], int, where, "output_tokens", minimum=1,
                                   maximum=MAX_REQUEST_TOKENS),
        prefix_hashes=hashes,
        **opt,
    )
    if row.max_tokens is not None and row.output_tokens > row.max_tokens:
        raise WorkloadError(f"{where}: field 'output_tokens': {row.output_tokens} exceeds max_tokens {row.max_tokens}")
    return row


def json_object(line: str, where: str) -> dict:
    """One JSONL line as a mapping; anything else is a WorkloadError naming ``where``."""
    try:
        d = json.loads(line)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"{where}: not valid JSON ({err.msg})") from None
    if not isinstance(d, dict):
        raise WorkloadError(f"{where}: each line must be a JSON object")
    return d


def _check_ids(rows: list[TraceRow], source: str) -> None:
    seen: set[str] = set()
    for r in rows:
        if r.request_id in seen:
            raise WorkloadError(f"{source}: request_id {r.request_id!r} appears twice; ids must be unique")
        seen.add(r.request_id)


def read_trace(path: str | Path) -> Workload:
    """Read a CSV (header required) or JSONL trace, sorted by arrival (stable)."""
    p = Path(path)
    if not p.exists():
        raise WorkloadError(f"{p}: no such trace file (and not a built-in scenario name)")
    rows: list[TraceRow] = []
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        with p.open() as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                rows.append(row_from_mapping(json_object(line, f"{p}:{i}"), f"{p}:{i}"))
    elif p.suffix.lower() == ".csv":
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [f for f in REQUIRED if f not in header]
            if missing:
                raise WorkloadError(f"{p}:1: header lacks column(s) {missing}; a CSV trace needs a header with {list(REQUIRED)}")
            for i, d in enumerate(reader, start=2):
                if None in d:
                    raise WorkloadError(f"{p}:{i}: more fields than the header has")
                rows.append(row_from_mapping(d, f"{p}:{i}"))
    else:
        raise WorkloadError(f"{p}: unknown trace format {p.suffix!r}; use .csv or .jsonl")
    _check_ids(rows, str(p))
    rows.sort(key=lambda r: r.arrival_s)
    return Workload(p.stem, tuple(rows))


def write_trace(rows: Iterable[TraceRow], path: str | Path) -> None:
    with Path(path).open("w") as fh:
        for r in rows:
            d = {"request_id": r.request_id, "arrival_s": r.arrival_s, "tenant": r.tenant,
                 "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens}
            if r.klass is not None:
                d["class"] = r.klass
            for f in ("deadline_s", "priority", "max_tokens"):
                if getattr(r, f) is not None:
                    d[f] = getattr(r, f)
            if r.prefix_hashes:
                d["prefix_hashes"] = list(r.prefix_hashes)
            fh.write(json.dumps(d) + "\n")
