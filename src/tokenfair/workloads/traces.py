"""Readers for the public LLM request traces, and generic workload transforms.

Every reader returns a :class:`TraceWorkload` (a :class:`~tokenfair.workloads.workload.Workload`
with a ``skipped`` report): rows sorted by arrival (stable), ``arrival_s`` relative to
the first request, unique ``request_id``.

Bad rows: a row a reader cannot use raises :class:`WorkloadError` naming file, line and
field (``.../x.csv:17: field 'ContextTokens': expected an integer, got 'x'``).  With
``skip_bad_rows=True`` the row is dropped and reported in ``TraceWorkload.skipped`` as a
:class:`SkippedRow` ``(file, line, message)``.  A prompt or output length of 0 is a bad
row (a ``TraceRow`` needs at least one prompt token and one generated token); none of the
public traces has one.  Header errors and empty files always raise.

``num_tenants=N`` spreads requests over tenants ``t00..t{N-1}`` with a Zipf-like
popularity (weight of tenant i is ``1/(i+1)**zipf_s``), assigned per request in arrival
order by ``random.Random(seed)`` -- deterministic, and the tenants differ in volume.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import tokenfair.workloads.readers as _readers
from tokenfair.workloads.readers import (
    AZURE_COLS, VTC_COLS, SkippedRow, TraceWorkload, azure_tenant_for, read_azure, read_azure_sources, read_mooncake,
    read_tokenfair, read_vtc,
)
from tokenfair.workloads.transforms import limit, remap_tenants, scale_rate, slice_time, spread_tenants, tile
from tokenfair.workloads.servegen import generate_servegen
from tokenfair.workloads.workload import WorkloadError

__all__ = [
    "generate_servegen", "SkippedRow", "TraceWorkload", "find_traces_dir", "read_azure", "read_mooncake", "read_vtc",
    "read_tokenfair", "slice_time", "scale_rate", "remap_tenants", "limit", "spread_tenants", "tile",
    "load_workload",
]

# Readers live in traces_readers and transforms in traces_transforms; parse_timestamp_ns is
# also imported from here by callers.
parse_timestamp_ns = _readers.parse_timestamp_ns


# --- locating the traces and one entry point ------------------------------------------------

def find_traces_dir() -> Path:
    """``$TOKENFAIR_TRACES``, else the first ``shared/traces`` found walking up from the
    current directory, then from this package's location."""
    env = os.environ.get("TOKENFAIR_TRACES")
    if env:
        p = Path(env).expanduser()
        if not p.is_dir():
            raise WorkloadError(f"TOKENFAIR_TRACES={env!r} is not a directory")
        return p
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            if (d / "shared" / "traces").is_dir():
                return d / "shared" / "traces"
    raise WorkloadError("cannot find the public traces: set TOKENFAIR_TRACES or run inside a checkout next to shared/traces")


def _sniff(p: Path) -> str:
    if p.is_dir():
        if any(p.glob("chunk-*-trace.csv")):
            return "servegen"
        raise WorkloadError(f"{p}: a directory, but not a ServeGen folder (no chunk-N-trace.csv)")
    with p.open(newline="") as fh:
        first = next((ln for ln in fh if ln.strip()), "")
    if p.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            keys = set()
        return "mooncake" if {"input_length", "output_length"} <= keys else "tokenfair"
    header = {h.strip() for h in next(csv.reader([first]), [])}
    if set(AZURE_COLS) <= header:
        return "azure"
    if set(VTC_COLS) <= header:
        return "vtc"
    return "tokenfair"


def load_workload(spec: str, *, seed: int = 0, skip_bad_rows: bool = False, num_tenants: int | None = None,
                  zipf_s: float = 1.0, traces_dir: str | Path | None = None, duration_s: float = 600.0,
                  max_clients: int | None = None, start_window_s: float | None = None,
                  rate_scale: float = 1.0) -> TraceWorkload:
    """Load a public trace by name or a trace file/folder by path.

    Names: ``azure`` (code+conv as two tenants), ``azure:code``, ``azure:conv``, ``mooncake``
    (= ``mooncake:conversation``), ``mooncake:synthetic``, ``vtc``, ``servegen`` (the
    language-m-small statistics; ``servegen:<folder>`` for another folder under servegen/),
    ``chat[:key=value,...]`` (synthetic multi-turn chats with shared system prompts and prefix
    hashes, ``tokenfair.workloads.prefix``; needs no trace files).
    Names take precedence over files of the same name.  A path is sniffed by header/keys: Azure CSV, VTC CSV, Mooncake JSONL, a ServeGen folder,
    else tokenfair's own CSV/JSONL.  ``duration_s``, ``max_clients``, ``start_window_s`` and
    ``rate_scale`` apply to ServeGen only; ``num_tenants`` re-spreads any workload.
    """

    servegen = dict(duration_s=duration_s, seed=seed, max_clients=max_clients, start_window_s=start_window_s,
                    rate_scale=rate_scale, skip_bad_rows=skip_bad_rows)
    kind, _, sub = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "chat":                # synthetic shared-prefix chats (tokenfair.workloads.prefix)
        from tokenfair.workloads.prefix import generate_chat, parse_chat_spec
        wl = generate_chat(parse_chat_spec(sub), seed)
    elif kind in ("azure", "mooncake", "vtc", "servegen"):     # names win; use ./vtc for a file
        root = Path(traces_dir) if traces_dir is not None else find_traces_dir()
        wl = _load_named(spec, kind, sub.strip().lower(), root, servegen)
    else:
        wl = _load_path(spec, servegen)
    return spread_tenants(wl, num_tenants, seed=seed, zipf_s=zipf_s) if num_tenants else wl


def _load_named(spec: str, kind: str, sub: str, root: Path, servegen: dict) -> TraceWorkload:
    """A public trace by name under ``root`` (the traces folder)."""
    common = dict(skip_bad_rows=servegen["skip_bad_rows"])
    if kind == "azure":
        az = root / "azure2023"
        files = {"code": az / "AzureLLMInferenceTrace_code.csv", "conv": az / "AzureLLMInferenceTrace_conv.csv"}
        if sub not in ("", "code", "conv"):
            raise WorkloadError(f"unknown Azure trace {spec!r}; use azure, azure:code or azure:conv")
        return read_azure(files["code"] if sub in ("", "code") else None,
                          files["conv"] if sub in ("", "conv") else None, **common)
    if kind == "mooncake":
        files = {"": "conversation", "conversation": "conversation", "conv": "conversation", "synthetic": "synthetic"}
        if sub not in files:
            raise WorkloadError(f"unknown Mooncake trace {spec!r}; use mooncake or mooncake:synthetic")
        return read_mooncake(root / "mooncake" / f"{files[sub]}_trace.jsonl", **common)
    if kind == "vtc":
        if sub:
            raise WorkloadError(f"unknown VTC trace {spec!r}; use vtc")
        return read_vtc(root / "vtc" / "real_trace.csv", **common)
    return generate_servegen(root / "servegen" / (sub or "language-m-small"), **servegen)


def _load_path(spec: str, servegen: dict) -> TraceWorkload:
    """A trace file or ServeGen folder, its format sniffed."""
    common = dict(skip_bad_rows=servegen["skip_bad_rows"])
    p = Path(spec).expanduser()
    if not p.exists():
        raise WorkloadError(f"{spec}: not a trace name (azure, azure:code, azure:conv, mooncake, "
                            f"mooncake:synthetic, vtc, servegen) and no such file")
    fmt = _sniff(p)
    if fmt == "azure":
        return read_azure_sources([(p, azure_tenant_for(p))], servegen["skip_bad_rows"])
    if fmt == "mooncake":
        return read_mooncake(p, **common)
    if fmt == "vtc":
        return read_vtc(p, **common)
    if fmt == "servegen":
        return generate_servegen(p, **servegen)
    return read_tokenfair(p, **common)
