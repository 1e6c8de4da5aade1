"""Multi-tenant workloads generated from ServeGen per-client statistics.

A ServeGen folder holds, per client, a trace of windows and a dataset of length PMFs
(:mod:`.servegen_files` reads and validates them).

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

import math
from pathlib import Path
from typing import Iterable

import numpy as np

from .readers import SkippedRow, TraceWorkload, finish_workload
from .servegen_files import Pmf, Window, client_files, read_client_dataset, read_client_trace
from .workload import TraceRow, WorkloadError

DEFAULT_INPUT_PMF = {128: 0.2, 256: 0.2, 512: 0.25, 1024: 0.2, 2048: 0.1, 4096: 0.05}
DEFAULT_OUTPUT_PMF = {16: 0.15, 64: 0.25, 128: 0.25, 256: 0.2, 512: 0.1, 1024: 0.05}


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
    files = client_files(folder)
    if not files:
        raise WorkloadError(f"{folder}: no chunk-N-trace.csv files")
    skipped: list[SkippedRow] | None = [] if skip_bad_rows else None
    ids, traces = _select_clients(folder, files, clients, max_clients, skipped)
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
    lengths = _LengthSamplers(folder, ids, files, skipped)
    rows: list[TraceRow] = []
    for c in sorted(ids):
        rows += _client_rows(c, spans[c], lengths, seed, rate_scale, t0)
    if not rows:
        raise WorkloadError(f"{folder}: no requests in [{t0}, {t1}) for clients {sorted(ids)}")
    return finish_workload(f"servegen-{folder.name}", rows, skipped, str(folder))


def _select_clients(folder: Path, files: dict[int, Path], clients: Iterable[int] | None,
                    max_clients: int | None, skipped: list[SkippedRow] | None) -> tuple[list[int], dict]:
    """(client ids, {id: windows}): ``clients`` if given, else the heaviest ``max_clients``."""
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
    return ids, traces


class _LengthSamplers:
    """Input and output length samplers per (client, trace window): the client's own dataset
    window nearest before, else the pooled PMF (module doc).  Datasets are read once."""

    def __init__(self, folder: Path, ids: list[int], files: dict[int, Path], skipped: list[SkippedRow] | None):
        self.folder, self.ids, self.files, self.skipped = folder, ids, files, skipped
        self.datasets: dict[int, list] = {}
        self.pooled: dict[tuple, tuple[_Sampler, _Sampler]] = {}

    def dataset(self, c: int) -> list:
        if c not in self.datasets:
            p = self.folder / f"chunk-{c}-dataset.json"
            self.datasets[c] = read_client_dataset(p, self.skipped) if p.exists() else []
        return self.datasets[c]

    def for_window(self, c: int, ts: float) -> tuple[_Sampler, _Sampler]:
        if self.dataset(c):
            donors = [(c, _nearest(self.dataset(c), ts))]
        else:
            pool = [d for d in self.ids if self.dataset(d)] or [d for d in self.files if self.dataset(d)]
            donors = [(d, _nearest(self.dataset(d), ts)) for d in pool]
        key = tuple((d, rec[0]) for d, rec in donors)
        if key not in self.pooled:
            if donors:
                pin, pout = _mix([r[1] for _, r in donors]), _mix([r[2] for _, r in donors])
            else:
                pin, pout = DEFAULT_INPUT_PMF, DEFAULT_OUTPUT_PMF
            self.pooled[key] = (_Sampler(pin), _Sampler(pout))
        return self.pooled[key]


def _client_rows(c: int, spans: list, lengths: _LengthSamplers, seed: int, rate_scale: float,
                 t0: float) -> list[TraceRow]:
    """One client's requests over its window spans, from its own random stream."""
    rng = np.random.default_rng([seed, c])
    tenant, k = f"c{c:02d}", 0
    rows = []
    for w, a, b in spans:
        times = _arrivals(rng, w, a, b, w.rate * rate_scale)
        if not len(times):
            continue
        sin, sout = lengths.for_window(c, w.start)
        ins, outs = sin(rng, len(times)), sout(rng, len(times))
        for t, pi, po in zip(times.tolist(), ins.tolist(), outs.tolist()):
            rows.append(TraceRow(f"{tenant}-{k}", t - t0, tenant, pi, po))
            k += 1
    return rows
