"""Starvation as "backlogged and receiving no service", read from the request records alone.

For a group of requests (a tenant, a class, or one tenant's requests of one class):
  * backlogged at time t: one of its requests has arrived and is not yet admitted
    (``arrival_s <= t < scheduled_s``; a request that never ran waits until it ended);
  * served at time t: one of its requests has been admitted and has not ended
    (``scheduled_s <= t < finish_s``);
  * a *service gap*: a maximal interval in which the group is backlogged and not served.
A *starvation event* is a gap of one tenant's requests of one class longer than that
class's ``max_wait_s``: a tenant whose requests keep running is not starving, however long
its own excess waits (that is an overdue request, ``overdue.py``).  Preemptions are not in
the records, so a preempted request counts as served from its first admission to its end.
O(n log n) per group (one sweep over sorted interval ends).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

def _intervals(recs: Iterable[dict]) -> list[tuple[float, int, int]]:
    """(time, d_waiting, d_running) events of the group's requests, in time order (every
    change at one instant is applied before the state is read: a request admitted the
    instant another ended leaves no gap)."""
    ev: list[tuple[float, int, int]] = []
    for r in recs:
        a, s, f = r["arrival_s"], r["scheduled_s"], r["finish_s"]
        start = s if s is not None else f
        if start is not None and start > a:
            ev.append((a, 1, 0))
            ev.append((start, -1, 0))
        if s is not None and f is not None and f > s:
            ev.append((s, 0, 1))
            ev.append((f, 0, -1))
    ev.sort()
    return ev


def service_gaps(recs: Iterable[dict]) -> list[tuple[float, float]]:
    """The group's service gaps as (start_s, end_s), in time order."""
    gaps: list[tuple[float, float]] = []
    waiting = running = 0
    open_s: float | None = None
    events = _intervals(recs)
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:      # every change at time t, then test
            waiting += events[i][1]
            running += events[i][2]
            i += 1
        starving = waiting > 0 and running == 0
        if starving and open_s is None:
            open_s = t
        elif not starving and open_s is not None:
            if t > open_s:
                gaps.append((open_s, t))
            open_s = None
    return gaps


def longest_gap_s(recs: Iterable[dict]) -> float:
    return max((b - a for a, b in service_gaps(recs)), default=0.0)


def starvation(recs: list[dict]) -> dict:
    """Per tenant and per class the longest service gap; the starvation events (gaps of a
    tenant's class longer than the class's max wait) per tenant, per class and in total."""
    by_pair: dict[tuple[str, str], list[dict]] = defaultdict(list)
    by_tenant: dict[str, list[dict]] = defaultdict(list)
    by_class: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        by_pair[(r["tenant"], r["class"])].append(r)
        by_tenant[r["tenant"]].append(r)
        by_class[r["class"]].append(r)
    events_t: dict[str, int] = defaultdict(int)
    events_c: dict[str, int] = defaultdict(int)
    worst: list[dict] = []
    for (tenant, klass), group in by_pair.items():
        limit = min((r["max_wait_s"] for r in group if r["max_wait_s"] is not None), default=None)
        if limit is None:
            continue
        for a, b in service_gaps(group):
            if b - a > limit:
                events_t[tenant] += 1
                events_c[klass] += 1
                worst.append({"tenant": tenant, "class": klass, "start_s": a, "gap_s": b - a,
                              "max_wait_s": limit})
    tenants = {t: {"longest_service_gap_s": longest_gap_s(g), "starvation_events": events_t.get(t, 0)}
               for t, g in sorted(by_tenant.items())}
    classes = {c: {"longest_service_gap_s": longest_gap_s(g), "starvation_events": events_c.get(c, 0)}
               for c, g in sorted(by_class.items())}
    worst.sort(key=lambda e: -e["gap_s"])
    return {
        "starvation_events": sum(events_t.values()),
        "longest_service_gap_s": max((m["longest_service_gap_s"] for m in tenants.values()), default=0.0),
        "tenants": tenants, "classes": classes, "events": worst[:20],
    }
