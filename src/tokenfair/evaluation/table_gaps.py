"""``servicegaps.starvation`` over a :class:`~.record_table.RecordTable`'s columns.

The same definitions as :mod:`.servicegaps` (backlogged: arrived and not yet admitted;
served: admitted and not ended; a gap: backlogged and not served), swept for every group
at once: the events of all groups sorted by (group, time), the waiting and running counts
as running sums (each group's sums return to zero at its end, so one sum serves them all),
read after the last event of each (group, instant).  O(n log n) for the sort.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .record_table import RecordTable

MAX_WORST_GAPS = 20


@dataclass
class _Events:
    """Interval ends of every request: time, change of waiting / running, row."""
    time: np.ndarray
    d_wait: np.ndarray
    d_run: np.ndarray
    row: np.ndarray


def _events(t: RecordTable) -> _Events:
    v, p = t.values, t.present
    arr, sch, fin = v["arrival_s"], v["scheduled_s"], v["finish_s"]
    start = np.where(p["scheduled_s"], sch, fin)
    waits = (p["scheduled_s"] | p["finish_s"]) & (start > arr)
    runs = p["scheduled_s"] & p["finish_s"] & (fin > sch)
    w, r = np.flatnonzero(waits), np.flatnonzero(runs)
    nw, nr = len(w), len(r)
    time = np.concatenate((arr[w], start[w], sch[r], fin[r]))
    d_wait = np.concatenate((np.ones(nw, np.int8), -np.ones(nw, np.int8), np.zeros(2 * nr, np.int8)))
    d_run = np.concatenate((np.zeros(2 * nw, np.int8), np.ones(nr, np.int8), -np.ones(nr, np.int8)))
    return _Events(time, d_wait, d_run, np.concatenate((w, w, r, r)).astype(np.int32))


def gaps(ev: _Events, group: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every service gap of every group (``group``: a code per row): (group, start_s, end_s),
    ordered by group, then time."""
    g = group[ev.row]
    order = np.lexsort((ev.time, g))
    g, time = g[order], ev.time[order]
    waiting = np.cumsum(ev.d_wait[order], dtype=np.int32)   # requests of one group at once
    running = np.cumsum(ev.d_run[order], dtype=np.int32)
    del order
    if not len(time):
        empty = np.zeros(0)
        return empty.astype(np.int64), empty, empty
    last = np.ones(len(time), dtype=bool)          # the last event of its (group, instant)
    last[:-1] = (g[1:] != g[:-1]) | (time[1:] != time[:-1])
    g, time = g[last], time[last]
    starving = (waiting[last] > 0) & (running[last] == 0)
    before = np.concatenate(([False], starving[:-1]))
    opens = np.flatnonzero(starving & ~before)
    closes = np.flatnonzero(~starving & before)     # each group ends not starving
    return g[opens], time[opens], time[closes]


def _longest(groups: np.ndarray, lengths: np.ndarray, num_groups: int) -> np.ndarray:
    out = np.zeros(num_groups)
    np.maximum.at(out, groups, lengths)
    return out


def starvation_of(t: RecordTable) -> dict[str, Any]:
    """``servicegaps.starvation(records)`` for the table's records."""
    ev = _events(t)
    tc, cc = t.codes["tenant"], t.codes["class"]
    tnames, cnames = t.names["tenant"], t.names["class"]
    per_tenant = _longest(*_lengths(gaps(ev, tc)), len(tnames))
    per_class = _longest(*_lengths(gaps(ev, cc)), len(cnames))
    pair = tc.astype(np.int64) * max(1, len(cnames)) + cc
    pg, a, b = gaps(ev, pair)
    limit = np.full(int(pair.max()) + 1 if t.n else 0, np.inf)
    mw = t.present["max_wait_s"]
    np.minimum.at(limit, pair[mw], t.values["max_wait_s"][mw])
    long = (b - a) > limit[pg]                      # no limit: inf, never exceeded
    pg, a, b = pg[long], a[long], b[long]
    events_t = np.bincount(pg // max(1, len(cnames)), minlength=len(tnames))
    events_c = np.bincount(pg % max(1, len(cnames)), minlength=len(cnames))
    first_row = np.full(len(limit), t.n)
    np.minimum.at(first_row, pair, np.arange(t.n))
    order = np.lexsort((a, first_row[pg]))          # records' first-seen pair order, then time
    worst = [{"tenant": tnames[k // max(1, len(cnames))], "class": cnames[k % max(1, len(cnames))],
              "start_s": s, "gap_s": e - s, "max_wait_s": float(limit[k])}
             for k, s, e in zip(pg[order].tolist(), a[order].tolist(), b[order].tolist())]
    worst.sort(key=lambda e: -e["gap_s"])
    tenants = {tnames[i]: {"longest_service_gap_s": float(per_tenant[i]), "starvation_events": int(events_t[i])}
               for i in sorted(range(len(tnames)), key=tnames.__getitem__)}
    classes = {cnames[i]: {"longest_service_gap_s": float(per_class[i]), "starvation_events": int(events_c[i])}
               for i in sorted(range(len(cnames)), key=cnames.__getitem__)}
    return {
        "starvation_events": int(events_t.sum()),
        "longest_service_gap_s": max((m["longest_service_gap_s"] for m in tenants.values()), default=0.0),
        "tenants": tenants, "classes": classes, "events": worst[:MAX_WORST_GAPS],
    }


def _lengths(found: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    g, a, b = found
    return g, b - a
