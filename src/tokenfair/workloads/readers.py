"""Per-source readers for the public LLM request traces (Azure 2023, Mooncake, VTC) and
tokenfair's own CSV/JSONL, re-exported by :mod:`tokenfair.workloads.traces`; also the
:class:`TraceWorkload` / :class:`SkippedRow` types and the shared row helpers.

Bad rows and ``skip_bad_rows``: the rules every reader keeps are in :mod:`tokenfair.workloads.traces`.
"""

from __future__ import annotations

import calendar
import csv
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Final, Iterable, NamedTuple, TypeVar

from tokenfair.workloads.gc_pause import with_gc_paused
from tokenfair.workloads.transforms import spread_tenants
from tokenfair.workloads.workload import (MAX_REQUEST_TOKENS, REQUIRED, TraceRow, Workload, WorkloadError, moved, parse_number, plain_row, json_object,
                                prefix_hashes_of, read_trace, row_from_mapping)


T = TypeVar("T")


class SkippedRow(NamedTuple):
    file: str
    line: int
    message: str


@dataclass(frozen=True)
class TraceWorkload(Workload):
    """A workload read from a trace; ``skipped`` lists the bad rows dropped on the way."""

    skipped: tuple[SkippedRow, ...] = ()


def _collect(skipped: list[SkippedRow] | None, path: Path, line: int, err: WorkloadError) -> None:
    if skipped is None:
        raise err
    skipped.append(SkippedRow(str(path), line, str(err)))


def parse_csv_rows(reader: csv.DictReader, path: Path, skipped: list[SkippedRow] | None,
                   parse: Callable[[dict[str, str], int, str], T]) -> list[T]:
    """``parse(row, line, where)`` of each data row (``where``: ``path:line``).  A row with more
    fields than the header, or one ``parse`` raises WorkloadError for, goes to ``skipped``
    (None: the error is raised)."""
    out: list[T] = []
    for i, d in enumerate(reader, start=2):
        where = f"{path}:{i}"
        try:
            if None in d:
                raise WorkloadError(f"{where}: more fields than the header has")
            out.append(parse(d, i, where))
        except WorkloadError as err:
            _collect(skipped, path, i, err)
    return out


def parse_jsonl_rows(fh: Iterable[str], path: Path, skipped: list[SkippedRow] | None,
                     parse: Callable[[dict, int, str], T]) -> list[T]:
    """``parse(object, line, where)`` of each non-blank line's JSON object (``where``:
    ``path:line``).  A line that is no JSON object, or one ``parse`` raises WorkloadError for,
    goes to ``skipped`` (None: the error is raised)."""
    out: list[T] = []
    for i, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            out.append(parse(json_object(line, where), i, where))
        except WorkloadError as err:
            _collect(skipped, path, i, err)
    return out


def finish_workload(name: str, rows: list[TraceRow], skipped: list[SkippedRow] | None, source: str,
            rebase: bool = True) -> TraceWorkload:
    """Sort (stable), check ids, re-base arrivals to the first request."""
    if not rows:
        raise WorkloadError(f"{source}: no usable requests")
    seen: set[str] = set()
    for r in rows:
        if r.request_id in seen:
            raise WorkloadError(f"{source}: request_id {r.request_id!r} appears twice; ids must be unique")
        seen.add(r.request_id)
    rows = sorted(rows, key=lambda r: r.arrival_s)
    t0 = rows[0].arrival_s
    if t0 and rebase:
        rows = [moved(r, r.arrival_s - t0) for r in rows]
    return TraceWorkload(name, tuple(rows), tuple(skipped or ()))


def _int_field(d: dict, field: str, where: str) -> int:
    return _int_value(d.get(field), field, where)


def _int_value(raw: object, field: str, where: str) -> int:
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise WorkloadError(f"{where}: field {field!r} is missing")
    if isinstance(raw, str):
        try:
            value = int(raw)                # what parse_number(raw, int, ...) does with a str
        except ValueError:
            value = 0                       # parse_number below names the error
        if 1 <= value <= MAX_REQUEST_TOKENS:
            return value
    return parse_number(raw.strip() if isinstance(raw, str) else raw, int, where, field, minimum=1,
                        maximum=MAX_REQUEST_TOKENS)


# --- Azure LLM inference trace 2023 -------------------------------------------------------

_TS = re.compile(r"^\s*(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?\s*$")


# performance: the seconds of each minute ``YYYY-MM-DD HH:MM`` parsed so far, so a trace's
# rows (thousands a minute) are read by slicing; filled only from fully parsed timestamps
_MINUTE_SECS: dict[str, int] = {}
_NS_DIGITS: Final = 9


def parse_timestamp_ns(text: str, where: str = "timestamp") -> int:
    """``2023-11-16 18:17:03.9799600`` -> integer nanoseconds (naive wall clock read as UTC).

    Integer arithmetic: any number of fractional digits, exact to the nanosecond.  A row in
    a minute already parsed is read by slicing (the same value as the full parse).
    """
    base = _MINUTE_SECS.get(text[:16]) if len(text) >= 19 else None
    if base is not None and text[16] == ":":
        sec, frac = text[17:19], text[20:]
        if (sec.isascii() and sec.isdigit() and int(sec) < 61
                and (len(text) == 19 or (text[19] == "." and frac.isascii() and frac.isdigit()))):
            return (base + int(sec)) * 1_000_000_000 + int(frac[:_NS_DIGITS].ljust(_NS_DIGITS, "0"))
    m = _TS.match(text or "")
    if not m:
        raise WorkloadError(f"{where}: field 'TIMESTAMP': expected 'YYYY-MM-DD HH:MM:SS[.fraction]', got {text!r}")
    y, mo, d, h, mi, s = map(int, m.group(1, 2, 3, 4, 5, 6))
    frac = (m.group(7) or "")[:9].ljust(9, "0")
    try:
        # calendar.timegm((y, mo, d, h, mi, s, ...)), its integer arithmetic split at the month
        secs = ((_month_start_days(y, mo) + d - 1) * 24 + h) * 3600 + mi * 60 + s
        if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and s < 61):
            raise ValueError
    except (ValueError, OverflowError):
        raise WorkloadError(f"{where}: field 'TIMESTAMP': not a valid date/time, got {text!r}") from None
    if m.start(4) == 11 and m.end(5) == 16:          # 'YYYY-MM-DD HH:MM' exactly: remember the minute
        _MINUTE_SECS[text[:16]] = secs - s
    return secs * 1_000_000_000 + int(frac)


@functools.lru_cache(maxsize=1024)
def _month_start_days(year: int, month: int) -> int:
    """Days from 1970-01-01 to the first of ``month`` (``calendar.timegm``'s own count; raises
    ValueError for a month or year out of range)."""
    return calendar.timegm((year, month, 1, 0, 0, 0, 0, 0, 0)) // 86400


AZURE_COLS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def check_header(reader: csv.DictReader, columns: tuple[str, ...], path: Path, what: str) -> None:
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise WorkloadError(f"{path}:1: header lacks column(s) {missing}; {what} has {list(columns)}")


def _azure_rows(path: Path, tenant: str, skipped: list[SkippedRow] | None) -> list[tuple[int, str, int, int]]:
    """(arrival ns, request id, prompt tokens, output tokens) of each data row.  The rows as
    ``csv.DictReader`` yields them (blank lines skipped, not counted; a short row's missing
    fields None; a repeated column's last value), read from its plain reader by index."""
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        check_header(reader, AZURE_COLS, path, "an Azure trace")
        names = reader.fieldnames or []
        column = {name: j for j, name in enumerate(names)}
        i_ts, i_ctx, i_gen = (column[c] for c in AZURE_COLS)
        width = len(names)
        out: list[tuple[int, str, int, int]] = []
        line = 1
        path_text = str(path)
        for row in reader.reader:
            if not row:
                continue
            line += 1
            where = f"{path_text}:{line}"
            n = len(row)
            try:
                if n > width:
                    raise WorkloadError(f"{where}: more fields than the header has")
                ns = parse_timestamp_ns(row[i_ts] if i_ts < n else "", where)
                prompt = _int_value(row[i_ctx] if i_ctx < n else None, "ContextTokens", where)
                output = _int_value(row[i_gen] if i_gen < n else None, "GeneratedTokens", where)
                out.append((ns, f"{tenant}-{line - 2}", prompt, output))
            except WorkloadError as err:
                _collect(skipped, path, line, err)
        return out


def read_azure(code_path: str | Path | None = None, conv_path: str | Path | None = None, *,
               skip_bad_rows: bool = False, num_tenants: int | None = None, seed: int = 0,
               zipf_s: float = 1.0) -> TraceWorkload:
    """Azure LLM inference trace 2023; both files replayed together as tenants "code" and
    "conv", or one file as one tenant (pass only one path).  ContextTokens -> prompt_tokens,
    GeneratedTokens -> output_tokens; request ids ``<tenant>-<row index>``."""
    sources = [(Path(p), t) for p, t in ((code_path, "code"), (conv_path, "conv")) if p is not None]
    if not sources:
        raise WorkloadError("read_azure: give code_path, conv_path or both")
    wl = read_azure_sources(sources, skip_bad_rows)
    return spread_tenants(wl, num_tenants, seed=seed, zipf_s=zipf_s) if num_tenants else wl


@with_gc_paused
def read_azure_sources(sources: list[tuple[Path, str]], skip_bad_rows: bool) -> TraceWorkload:
    skipped: list[SkippedRow] | None = [] if skip_bad_rows else None
    stamped: list[tuple[int, str, str, int, int]] = []     # ns, request id, tenant, prompt, output
    for p, tenant in sources:
        if not p.exists():
            raise WorkloadError(f"{p}: no such trace file")
        stamped += [(ns, rid, tenant, prompt, output) for ns, rid, prompt, output in _azure_rows(p, tenant, skipped)]
    if not stamped:
        raise WorkloadError(f"{', '.join(str(p) for p, _ in sources)}: no usable requests")
    ns0 = min(s[0] for s in stamped)
    rows = [plain_row(rid, (ns - ns0) / 1e9, tenant, prompt, output) for ns, rid, tenant, prompt, output in stamped]
    name = "azure" if len(sources) == 2 else f"azure-{sources[0][1]}"
    return finish_workload(name, rows, skipped, ", ".join(str(p) for p, _ in sources))


def azure_tenant_for(path: Path) -> str:
    m = re.search(r"_(code|conv)$", path.stem, re.IGNORECASE)
    return m.group(1).lower() if m else path.stem


# --- Mooncake ------------------------------------------------------------------------------

def read_mooncake(path: str | Path, *, tenant: str = "default", skip_bad_rows: bool = False,
                  num_tenants: int | None = None, seed: int = 0, zipf_s: float = 1.0) -> TraceWorkload:
    """Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``);
    hash_ids are kept as ``TraceRow.prefix_hashes`` (512-token prefix blocks)."""
    p = Path(path)
    if not p.exists():
        raise WorkloadError(f"{p}: no such trace file")
    skipped: list[SkippedRow] | None = [] if skip_bad_rows else None

    def parse(d: dict, line: int, where: str) -> TraceRow:
        if d.get("timestamp") is None:
            raise WorkloadError(f"{where}: field 'timestamp' is missing")
        ts = parse_number(d["timestamp"], float, where, "timestamp", minimum=0)
        hashes = prefix_hashes_of(d.get("hash_ids") or None, where, "hash_ids")
        return TraceRow(f"mc-{line - 1}", ts / 1000.0, tenant, _int_field(d, "input_length", where),
                        _int_field(d, "output_length", where), prefix_hashes=hashes)
    with p.open() as fh:
        rows = parse_jsonl_rows(fh, p, skipped, parse)
    wl = finish_workload(f"mooncake-{p.stem}", rows, skipped, str(p))
    return spread_tenants(wl, num_tenants, seed=seed, zipf_s=zipf_s) if num_tenants else wl


# --- VTC multi-client trace ---------------------------------------------------------------

VTC_COLS = ("req_id", "client", "arrival_s", "prompt_len", "output_len")


def read_vtc(path: str | Path, *, skip_bad_rows: bool = False, num_tenants: int | None = None,
             seed: int = 0, zipf_s: float = 1.0) -> TraceWorkload:
    """VTC trace CSV (``req_id, client, arrival_s, prompt_len, output_len``); tenant = client."""
    p = Path(path)
    if not p.exists():
        raise WorkloadError(f"{p}: no such trace file")
    skipped: list[SkippedRow] | None = [] if skip_bad_rows else None

    def parse(d: dict[str, str], line: int, where: str) -> TraceRow:
        for f in ("req_id", "client", "arrival_s"):
            if not (d.get(f) or "").strip():
                raise WorkloadError(f"{where}: field {f!r} is missing")
        return TraceRow(d["req_id"].strip(), parse_number(d["arrival_s"].strip(), float, where, "arrival_s", minimum=0),
                        d["client"].strip(), _int_field(d, "prompt_len", where), _int_field(d, "output_len", where))
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        check_header(reader, VTC_COLS, p, "a VTC trace")
        rows = parse_csv_rows(reader, p, skipped, parse)
    wl = finish_workload(f"vtc-{p.stem}", rows, skipped, str(p))
    return spread_tenants(wl, num_tenants, seed=seed, zipf_s=zipf_s) if num_tenants else wl


# --- tokenfair's own format -----------------------------------------------------------------

def read_tokenfair(path: str | Path, *, skip_bad_rows: bool = False) -> TraceWorkload:
    """tokenfair CSV/JSONL; without skipping this is :func:`tokenfair.workloads.workload.read_trace`.
    Arrival times are kept as written (not re-based)."""
    p = Path(path)
    if not skip_bad_rows:
        wl = read_trace(p)
        return TraceWorkload(wl.name, wl.rows)
    skipped: list[SkippedRow] = []
    rows: list[TraceRow]
    if p.suffix.lower() == ".csv":
        with p.open(newline="") as fh:
            reader = csv.DictReader(fh)
            if any(f not in (reader.fieldnames or []) for f in REQUIRED):
                return read_tokenfair(p)  # header error: read_trace raises it
            rows = parse_csv_rows(reader, p, skipped, lambda d, line, where: row_from_mapping(d, where))
    else:
        with p.open() as fh:
            rows = parse_jsonl_rows(fh, p, skipped, lambda d, line, where: row_from_mapping(d, where))
    return finish_workload(p.stem, rows, skipped, str(p), rebase=False)
