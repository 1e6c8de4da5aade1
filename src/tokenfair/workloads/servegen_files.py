"""The files of a ServeGen folder, read and validated: per client ``N``, ``chunk-N-trace.csv``
(no header; one row per window: ``window_start_s, rate_req_per_s, cv, distribution, param1,
param2``) and, for most clients, ``chunk-N-dataset.json`` (``{window_start_s: {"input_tokens":
"<PMF>", "output_tokens": "<PMF>"}}``, each PMF a string holding a Python dict literal).
:mod:`.servegen` generates traffic from them (its docstring: how)."""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .readers import SkippedRow
from .workload import WorkloadError, parse_number

DISTRIBUTIONS = ("Weibull", "Gamma", "Exponential", "")
DEFAULT_WINDOW_S = 600.0

Pmf = dict[int, float]


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    rate: float
    cv: float
    dist: str
    param1: float
    param2: float


def parse_pmf(text: object, where: str) -> Pmf | None:
    """A PMF string -> ``{tokens: probability}`` (normalised), or None for ``{}``.

    Uses ``ast.literal_eval`` only: anything but a plain literal is rejected."""
    if not isinstance(text, str):
        raise WorkloadError(f"{where}: expected a string holding a dict literal, got {type(text).__name__}")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
        raise WorkloadError(f"{where}: not a plain Python dict literal (rejected by ast.literal_eval: "
                            f"{type(err).__name__}); got {text[:60]!r}") from None
    if not isinstance(value, dict):
        raise WorkloadError(f"{where}: expected a dict literal {{tokens: probability}}, got {type(value).__name__}")
    if not value:
        return None
    pmf: Pmf = {}
    for k, p in value.items():
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise WorkloadError(f"{where}: token count {k!r} is not a non-negative integer")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
            raise WorkloadError(f"{where}: probability of {k} tokens is {p!r}; need a finite number >= 0")
        k = max(k, 1)  # 0 tokens -> 1 (see module doc)
        pmf[k] = pmf.get(k, 0.0) + float(p)
    total = sum(pmf.values())
    if not abs(total - 1.0) <= 0.01:
        raise WorkloadError(f"{where}: probabilities sum to {total:.6g}, not 1")
    return {k: p / total for k, p in sorted(pmf.items()) if p > 0}


def read_client_trace(path: Path, skipped: list[SkippedRow] | None = None) -> list[Window]:
    """One client's window rows, in file order; window end = next start (last: +600 s)."""
    raw: list[tuple[float, float, float, str, float, float]] = []
    with path.open(newline="") as fh:
        for i, fields in enumerate(csv.reader(fh), start=1):
            if not fields or not "".join(fields).strip():
                continue
            where = f"{path}:{i}"
            try:
                if len(fields) != 6:
                    raise WorkloadError(f"{where}: expected 6 fields (window_start_s, rate, cv, distribution, "
                                        f"param1, param2), got {len(fields)}")
                ts = parse_number(fields[0].strip(), float, where, "window_start_s", minimum=0)
                rate = parse_number(fields[1].strip(), float, where, "rate_req_per_s", minimum=0)
                cv = parse_number(fields[2].strip() or 0, float, where, "cv", minimum=0)
                dist = fields[3].strip()
                if dist not in DISTRIBUTIONS:
                    raise WorkloadError(f"{where}: field 'distribution': expected one of "
                                        f"{list(DISTRIBUTIONS[:3])} or empty, got {dist!r}")
                p1 = parse_number(fields[4].strip() or 0, float, where, "param1")
                p2 = parse_number(fields[5].strip() or 0, float, where, "param2")
                if raw and ts <= raw[-1][0]:
                    raise WorkloadError(f"{where}: field 'window_start_s': {fields[0]!r} is not after the previous window")
            except WorkloadError as err:
                if skipped is None:
                    raise
                skipped.append(SkippedRow(str(path), i, str(err)))
                continue
            raw.append((ts, rate, cv, dist, p1, p2))
    starts = [r[0] for r in raw]
    steps = sorted(b - a for a, b in zip(starts, starts[1:]))
    last = steps[len(steps) // 2] if steps else DEFAULT_WINDOW_S
    ends = starts[1:] + [starts[-1] + last] if raw else []
    return [Window(r[0], e, r[1], r[2], r[3], r[4], r[5]) for r, e in zip(raw, ends)]


_DATASET_CACHE: dict[tuple[str, int, int, bool], tuple[list, list[SkippedRow]]] = {}


def read_client_dataset(path: Path, skipped: list[SkippedRow] | None = None) -> list[tuple[float, Pmf, Pmf]]:
    """``[(window_start, input_pmf, output_pmf)]`` for windows with data, sorted by start.
    A bad window is reported as ``SkippedRow(file, 0, message)`` (JSON has no useful line).
    Parsed files are cached by (path, mtime, size); treat the result as read-only."""
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, skipped is not None)
    if key not in _DATASET_CACHE:
        mine: list[SkippedRow] | None = [] if skipped is not None else None
        _DATASET_CACHE[key] = (_parse_dataset(path, mine), mine or [])
    out, bad = _DATASET_CACHE[key]
    if skipped is not None:
        skipped.extend(bad)
    return out


def _parse_dataset(path: Path, skipped: list[SkippedRow] | None) -> list[tuple[float, Pmf, Pmf]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise WorkloadError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise WorkloadError(f"{path}: expected a JSON object {{window_start_s: {{input_tokens, output_tokens}}}}")
    out = []
    for key, fields in data.items():
        where = f"{path}: window {key!r}"
        try:
            ts = parse_number(key, float, where, "window_start_s", minimum=0)
            if not isinstance(fields, dict):
                raise WorkloadError(f"{where}: expected an object with 'input_tokens' and 'output_tokens'")
            pmfs = []
            for f in ("input_tokens", "output_tokens"):
                if f not in fields:
                    raise WorkloadError(f"{where}: field {f!r} is missing")
                pmfs.append(parse_pmf(fields[f], f"{where}: field {f!r}"))
        except WorkloadError as err:
            if skipped is None:
                raise
            skipped.append(SkippedRow(str(path), 0, str(err)))
            continue
        if pmfs[0] is not None and pmfs[1] is not None:
            out.append((ts, pmfs[0], pmfs[1]))
    out.sort(key=lambda t: t[0])
    return out


def client_files(folder: Path) -> dict[int, Path]:
    """``{client id: its chunk-N-trace.csv}``, by id."""
    found = {}
    for p in folder.glob("chunk-*-trace.csv"):
        m = re.fullmatch(r"chunk-(\d+)-trace\.csv", p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))
