"""Multi-tenant workloads generated from ServeGen per-client statistics.

A ServeGen folder holds, per client ``N``, ``chunk-N-trace.csv`` (no header; one row per
window: ``window_start_s, rate_req_per_s, cv, distribution, param1, param2``) and, for most
clients, ``chunk-N-dataset.json`` (``{window_start_s: {"input_tokens": "<PMF>",
"output_tokens": "<PMF>"}}``, each PMF a string holding a Python dict literal).

Arrivals.  Each window ``[start, next start)`` is an independent renewal process (it
restarts at the window start) whose mean inter-arrival time is ``1 / (rate * rate_scale)``,
so the generated rate matches the window's measured rate:

* ``Gamma``: shape ``k = param1``, scale ``mean / k``.  In the data ``param1 == 1/cv**2``
  (checked on every Gamma row) and ``param1 * param2 == 1/rate`` for ~98% of rows, i.e.
  this is the usual shape ``1/cv^2``, scale ``mean*cv^2`` parametrisation.
* ``Weibull``: shape ``k = param1`` (the fitted shape), scale ``mean / Gamma(1 + 1/k)``.
  ``param2`` is ignored: it does not reproduce the window's rate (``param2*Gamma(1+1/k)*rate``
  ranges 0.25..3.2), and the window rate is what the trace measured.
* ``Exponential`` (and an empty name with rate > 0): Poisson arrivals at the rate.
* If ``param1`` is not a positive finite number the shape comes from the CV instead:
  Gamma ``1/cv^2``; Weibull by solving ``cv(k) = cv`` numerically (bisection on log k).
  Rate 0 (or an empty distribution with rate 0) = no requests in that window.

Lengths.  Each request draws input and output tokens from its client's PMFs of the latest
dataset window at or before the request's trace window (else the earliest later one);
empty ``{}`` PMFs mean "no data" for that window.  Clients without any data use the pooled
PMF: the equal-weight mixture of the PMFs of the selected clients that have data (or, if
none does, of every client in the folder); if the folder has no data at all,
``DEFAULT_INPUT_PMF`` / ``DEFAULT_OUTPUT_PMF``.  PMFs are parsed with ``ast.literal_eval``
only, must be a dict of non-negative int tokens to non-negative finite probabilities
summing to 1 within 1% (then normalised).  Some output PMFs put mass on 0 tokens; that
mass is moved to 1 token (a request generates at least one token).

Tenants are ``c<NN>`` (client id), request ids ``c<NN>-<k>``.  Each client's random stream
is ``numpy.random.default_rng([seed, client_id])``, so a client's requests do not depend on
which other clients are selected.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from .readers import SkippedRow, TraceWorkload, finish_workload
from .workload import TraceRow, WorkloadError, parse_number

DISTRIBUTIONS = ("Weibull", "Gamma", "Exponential", "")
DEFAULT_WINDOW_S = 600.0
DEFAULT_INPUT_PMF = {128: 0.2, 256: 0.2, 512: 0.25, 1024: 0.2, 2048: 0.1, 4096: 0.05}
DEFAULT_OUTPUT_PMF = {16: 0.15, 64: 0.25, 128: 0.25, 256: 0.2, 512: 0.1, 1024: 0.05}

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


def weibull_shape_for_cv(cv: float) -> float:
    """The Weibull shape k whose coefficient of variation is ``cv`` (bisection on log k)."""
    def wcv(k: float) -> float:
        return math.sqrt(max(math.exp(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)) - 1, 0.0))
    if cv <= 0:
        return 1.0
    lo, hi = math.log(0.02), math.log(200.0)  # cv(0.02) ~ 1e14, cv(200) ~ 0.006
    for _ in range(100):
        mid = (lo + hi) / 2
        if wcv(math.exp(mid)) > cv:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _gap_sampler(w: Window, rate: float):
    mean = 1.0 / rate
    good = math.isfinite(w.param1) and w.param1 > 0
    if w.dist == "Gamma" or (w.dist == "" and w.cv > 0):
        k = w.param1 if good and w.dist == "Gamma" else 1.0 / max(w.cv, 1e-6) ** 2
        return lambda rng, n: rng.gamma(k, mean / k, n)
    if w.dist == "Weibull":
        k = w.param1 if good else weibull_shape_for_cv(w.cv)
        scale = mean / math.gamma(1 + 1 / k)
        return lambda rng, n: rng.weibull(k, n) * scale
    return lambda rng, n: rng.exponential(mean, n)


def _arrivals(rng: np.random.Generator, w: Window, a: float, b: float, rate: float) -> np.ndarray:
    draw = _gap_sampler(w, rate)
    chunks, t = [], w.start  # the renewal process starts at the window start
    batch = int(rate * (b - w.start) * 1.2) + 16
    while True:
        times = t + np.cumsum(draw(rng, batch))
        if times[-1] >= b:
            chunks.append(times[times < b])
            break
        chunks.append(times)
        t = float(times[-1])
    out = np.concatenate(chunks)
    return out[out >= a]


class _Sampler:
    def __init__(self, pmf: Pmf):
        self.values = np.fromiter(pmf.keys(), dtype=np.int64)
        self.cdf = np.cumsum(np.fromiter(pmf.values(), dtype=float))
        self.cdf /= self.cdf[-1]

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        idx = np.searchsorted(self.cdf, rng.random(n), side="right")
        return self.values[np.minimum(idx, len(self.values) - 1)]


def _nearest(data: list[tuple[float, Pmf, Pmf]], ts: float) -> tuple[float, Pmf, Pmf]:
    before = [d for d in data if d[0] <= ts]
    return before[-1] if before else data[0]


def _mix(pmfs: list[Pmf]) -> Pmf:
    out: Pmf = {}
    for pmf in pmfs:
        for k, p in pmf.items():
            out[k] = out.get(k, 0.0) + p / len(pmfs)
    return dict(sorted(out.items()))


def _client_files(folder: Path) -> dict[int, Path]:
    found = {}
    for p in folder.glob("chunk-*-trace.csv"):
        m = re.fullmatch(r"chunk-(\d+)-trace\.csv", p.name)
        if m:
            found[int(m.group(1))] = p
    return dict(sorted(found.items()))


def generate_servegen(folder: str | Path, *, duration_s: float, seed: int, max_clients: int | None = None,
                      start_window_s: float | None = None, rate_scale: float = 1.0,
                      clients: Iterable[int] | None = None, skip_bad_rows: bool = False,
                      max_requests: int = 2_000_000) -> TraceWorkload:
    """Generate ``duration_s`` seconds of multi-tenant traffic from a ServeGen folder.

    Clients: ``clients`` (ids) if given, else all, ranked by total requests over the whole
    trace (heaviest first, ties by id) and cut to ``max_clients``.  The span starts at
    ``start_window_s`` or at the first window where any selected client is active.
    Raises if the expected request count exceeds ``max_requests`` (lower ``rate_scale``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise WorkloadError(f"{folder}: no such ServeGen folder")
    if not duration_s > 0 or not rate_scale > 0:
        raise WorkloadError(f"duration_s and rate_scale must be > 0, got {duration_s!r}, {rate_scale!r}")
    files = _client_files(folder)
    if not files:
        raise WorkloadError(f"{folder}: no chunk-N-trace.csv files")
    skipped: list[SkippedRow] | None = [] if skip_bad_rows else None
    if clients is not None:
        ids = sorted(set(int(c) for c in clients))
        unknown = [c for c in ids if c not in files]
        if unknown:
            raise WorkloadError(f"{folder}: no trace for client(s) {unknown}; have {list(files)}")
    else:
        ids = list(files)
    traces = {c: read_client_trace(files[c], skipped) for c in ids}
    if clients is None:
        volume = {c: sum(w.rate * (w.end - w.start) for w in traces[c]) for c in ids}
        ids = sorted(ids, key=lambda c: (-volume[c], c))[: max_clients if max_clients is not None else None]
        if not ids:
            raise WorkloadError("max_clients must be >= 1")
    if start_window_s is None:
        active = [w.start for c in ids for w in traces[c] if w.rate > 0]
        if not active:
            raise WorkloadError(f"{folder}: the selected clients {ids} never send a request")
        start_window_s = min(active)
    t0, t1 = float(start_window_s), float(start_window_s) + duration_s
    spans = {c: [(w, max(w.start, t0), min(w.end, t1)) for w in traces[c]
                 if w.rate > 0 and w.end > t0 and w.start < t1] for c in ids}
    expected = sum(w.rate * rate_scale * (b - a) for c in ids for w, a, b in spans[c])
    if expected > max_requests:
        raise WorkloadError(f"ServeGen: about {expected:.0f} requests expected (> max_requests={max_requests}); "
                            f"lower rate_scale, duration_s or max_clients")

    datasets: dict[int, list] = {}

    def dataset(c: int) -> list:
        if c not in datasets:
            p = folder / f"chunk-{c}-dataset.json"
            datasets[c] = read_client_dataset(p, skipped) if p.exists() else []
        return datasets[c]

    pooled_cache: dict[tuple, tuple[_Sampler, _Sampler]] = {}

    def samplers(c: int, ts: float) -> tuple[_Sampler, _Sampler]:
        if dataset(c):
            donors = [(c, _nearest(dataset(c), ts))]
        else:
            pool = [d for d in ids if dataset(d)] or [d for d in files if dataset(d)]
            donors = [(d, _nearest(dataset(d), ts)) for d in pool]
        key = tuple((d, rec[0]) for d, rec in donors)
        if key not in pooled_cache:
            if donors:
                pin, pout = _mix([r[1] for _, r in donors]), _mix([r[2] for _, r in donors])
            else:
                pin, pout = DEFAULT_INPUT_PMF, DEFAULT_OUTPUT_PMF
            pooled_cache[key] = (_Sampler(pin), _Sampler(pout))
        return pooled_cache[key]

    rows: list[TraceRow] = []
    for c in sorted(ids):
        rng = np.random.default_rng([seed, c])
        tenant, k = f"c{c:02d}", 0
        for w, a, b in spans[c]:
            times = _arrivals(rng, w, a, b, w.rate * rate_scale)
            if not len(times):
                continue
            sin, sout = samplers(c, w.start)
            ins, outs = sin(rng, len(times)), sout(rng, len(times))
            for t, pi, po in zip(times.tolist(), ins.tolist(), outs.tolist()):
                rows.append(TraceRow(f"{tenant}-{k}", t - t0, tenant, pi, po))
                k += 1
    if not rows:
        raise WorkloadError(f"{folder}: no requests in [{t0}, {t1}) for clients {sorted(ids)}")
    return finish_workload(f"servegen-{folder.name}", rows, skipped, str(folder))
