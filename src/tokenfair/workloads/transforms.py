"""Generic workload transforms (re-exported by :mod:`tokenfair.workloads.traces`): time slicing, rate
scaling, tenant renaming, truncation, tiling in time and Zipf-like tenant spreading.  Each returns a new
:class:`~tokenfair.workloads.workload.Workload` of the same type."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Callable, Final, Iterable

from tokenfair.workloads.gc_pause import with_gc_paused
from tokenfair.workloads.workload import TraceRow, Workload, WorkloadError, check_span, moved, with_tenant


# spread_tenants builds a name and a weight per tenant: past this, memory (not the trace) is the limit
MAX_SPREAD_TENANTS: Final = 1_000_000


def _rebuilt(wl: Workload, rows: Iterable[TraceRow], name: str | None = None) -> Workload:
    return replace(wl, name=name or wl.name, rows=tuple(rows))


@with_gc_paused
def slice_time(wl: Workload, start_s: float, end_s: float | None = None) -> Workload:
    """Rows with ``start_s <= arrival_s < end_s``, re-based so the first kept row arrives at 0."""
    kept = [r for r in wl.rows if r.arrival_s >= start_s and (end_s is None or r.arrival_s < end_s)]
    t0 = kept[0].arrival_s if kept else 0.0
    return _rebuilt(wl, (moved(r, r.arrival_s - t0) for r in kept))


@with_gc_paused
def scale_rate(wl: Workload, factor: float) -> Workload:
    """Multiply the request rate by ``factor`` (arrival times divided by it)."""
    if not factor > 0 or factor == float("inf"):
        raise WorkloadError(f"scale_rate: factor must be a positive finite number, got {factor!r}")
    if wl.rows:
        check_span(wl.rows[-1].arrival_s / factor, f"scale_rate by {factor:g}")     # rows by arrival
    return _rebuilt(wl, (moved(r, r.arrival_s / factor) for r in wl.rows))


@with_gc_paused
def remap_tenants(wl: Workload, mapping: dict[str, str] | Callable[[str], str]) -> Workload:
    """Rename tenants: a dict (tenants not in it keep their name) or a callable."""
    fn = (lambda t: mapping.get(t, t)) if isinstance(mapping, dict) else mapping
    cache: dict[str, str] = {}
    for t in {r.tenant for r in wl.rows}:
        new = fn(t)
        if not isinstance(new, str) or not new.strip():
            raise WorkloadError(f"remap_tenants: tenant {t!r} maps to {new!r}; need a non-empty string")
        cache[t] = new.strip()
    return _rebuilt(wl, [with_tenant(r, cache[r.tenant]) for r in wl.rows])


def limit(wl: Workload, n: int) -> Workload:
    """The first ``n`` requests by arrival."""
    if n < 0:
        raise WorkloadError(f"limit: n must be >= 0, got {n}")
    return _rebuilt(wl, wl.rows[:n])


@with_gc_paused
def tile(wl: Workload, min_requests: int) -> Workload:
    """The trace repeated back to back in time until it has at least ``min_requests`` rows:
    copy i arrives ``i x period`` later (period = the trace's span plus its mean gap, so
    copies never overlap) and its ids get a ``#i`` suffix.  O(rows)."""
    rows = wl.rows
    if not rows:
        raise WorkloadError("tile: the workload is empty")
    copies = max(1, -(-min_requests // len(rows)))
    if copies == 1:
        return wl
    span = rows[-1].arrival_s - rows[0].arrival_s
    period = span + span / len(rows) if span > 0 else 1.0
    check_span(rows[-1].arrival_s + (copies - 1) * period, f"tile to {min_requests} requests ({copies} copies)")
    tiled = [moved(r, r.arrival_s + i * period, f"{r.request_id}#{i}") if i else r
             for i in range(copies) for r in rows]
    return _rebuilt(wl, tiled, f"{wl.name}x{copies}")


@with_gc_paused
def spread_tenants(wl: Workload, num_tenants: int, *, seed: int = 0, zipf_s: float = 1.0) -> Workload:
    """Assign each request to one of tenants ``t00..t{N-1}`` (Zipf-like popularity)."""
    if not isinstance(num_tenants, int) or num_tenants < 1:
        raise WorkloadError(f"num_tenants must be a positive integer, got {num_tenants!r}")
    if num_tenants > MAX_SPREAD_TENANTS:
        raise WorkloadError(f"num_tenants {num_tenants} is more than {MAX_SPREAD_TENANTS:,} tenants (each gets a "
                            f"name and a weight in memory); spread over at most {MAX_SPREAD_TENANTS}")
    width = max(2, len(str(num_tenants - 1)))
    names = [f"t{i:0{width}d}" for i in range(num_tenants)]
    weights = [1.0 / (i + 1) ** zipf_s for i in range(num_tenants)]
    picks = random.Random(seed).choices(names, weights=weights, k=len(wl.rows))
    return _rebuilt(wl, [with_tenant(r, t) for r, t in zip(wl.rows, picks)])
