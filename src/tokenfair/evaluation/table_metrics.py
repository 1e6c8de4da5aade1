"""``metrics.group_metrics`` over a :class:`~.record_table.RecordTable`'s columns.

The derived per-request figures (TTFT, TPOT, e2e, wait, slowdown, SLO met, in time) are
computed once for the whole table as arrays (:class:`Derived`), then each group -- a tenant,
a class, a prompt bucket, everything -- reads its rows (``Derived.grouped``: a stable sort
by the group's code) in record order, so every sum and mean adds in the order a loop over
the records would.  The definitions are
``metrics.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np

from .goodput import outcomes
from .record_table import RecordTable

MIN_ISOLATED_E2E_S = 1e-9


@dataclass
class Derived:
    """Per-request arrays (all of length n, in one row order); ``row`` maps back to the table."""
    row: np.ndarray
    status: np.ndarray          # status codes
    finished: np.ndarray
    has_ttft: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray             # meaningful where finished
    has_tpot: np.ndarray
    tpot: np.ndarray
    has_wait: np.ndarray
    wait: np.ndarray
    overdue: np.ndarray
    miss: np.ndarray
    preemptions: np.ndarray
    met: np.ndarray
    in_time: np.ndarray
    tokens: np.ndarray
    has_slow: np.ndarray
    slow: np.ndarray

    def take(self, index: np.ndarray) -> "Derived":
        return Derived(**{k: v[index] for k, v in vars(self).items()})

    def grouped(self, codes: np.ndarray, names: list[str]) -> Iterator[tuple[str, "Derived"]]:
        """(name, that group's rows) for every code present, in code order."""
        c = codes[self.row]
        order = np.argsort(c, kind="stable")
        counts = np.bincount(c, minlength=len(names))
        ends = np.cumsum(counts)
        for code in np.flatnonzero(counts).tolist():
            yield names[code], self.take(order[int(ends[code] - counts[code]):int(ends[code])])


def derive(t: RecordTable, isolated_e2e: Mapping[str, float] | None) -> Derived:
    v, p = t.values, t.present
    arr, ft, fin_s = v["arrival_s"], v["first_token_s"], v["finish_s"]
    names = t.names["status"]
    status = t.codes["status"]
    finished = _is(status, names, "finished")
    has_ttft = p["first_token_s"].copy()
    ttft = ft - arr
    e2e = fin_s - arr
    out = v["output_tokens"]
    has_tpot = finished & (out > 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (fin_s - ft) / np.where(has_tpot, out - 1, 1).astype(np.float64)
    has_wait, wait = _waits(t)
    overdue = _overdue(t, has_wait, wait)
    has_deadline = p["deadline_s"]
    late = fin_s > v["deadline_s"]
    miss = has_deadline & (_is(status, names, "expired") | (finished & late))
    ttft0 = np.where(has_ttft, ttft, 0.0)       # meets_slo's d.get("ttft", 0)
    tpot0 = np.where(has_tpot, tpot, 0.0)
    met = (finished & ~(p["ttft_slo_s"] & (ttft0 > v["ttft_slo_s"]))
           & ~(p["tpot_slo_s"] & (tpot0 > v["tpot_slo_s"])) & ~(has_deadline & late))
    in_time = finished & (~p["max_wait_s"] | (ttft <= v["max_wait_s"]))
    tokens = v["prompt_tokens"] + v["output_tokens"]
    has_slow = np.zeros(t.n, dtype=bool)
    slow = np.zeros(t.n)
    if isolated_e2e:
        iso = np.array([isolated_e2e.get(rid, np.nan) for rid in t.strings["request_id"]], dtype=np.float64)
        known = np.fromiter((rid in isolated_e2e for rid in t.strings["request_id"]), bool, t.n)
        has_slow = finished & known
        with np.errstate(invalid="ignore"):
            slow = e2e / np.where(iso > MIN_ISOLATED_E2E_S, iso, MIN_ISOLATED_E2E_S)
    return Derived(np.arange(t.n), status, finished, has_ttft, ttft, e2e, has_tpot, tpot, has_wait, wait,
                   overdue, miss, v["preemptions"], met, in_time, tokens, has_slow, slow)


def _waits(t: RecordTable) -> tuple[np.ndarray, np.ndarray]:
    """(has a wait, the wait): until admission, or until its end when never admitted."""
    v, p = t.values, t.present
    return p["scheduled_s"] | p["finish_s"], np.where(p["scheduled_s"], v["scheduled_s"], v["finish_s"]) - v["arrival_s"]


def overdue_mask(t: RecordTable) -> np.ndarray:
    """The requests that waited longer than their class's max wait."""
    return _overdue(t, *_waits(t))


def _overdue(t: RecordTable, has_wait: np.ndarray, wait: np.ndarray) -> np.ndarray:
    return has_wait & t.present["max_wait_s"] & (wait > t.values["max_wait_s"])


def _is(codes: np.ndarray, names: list[str], name: str) -> np.ndarray:
    return codes == names.index(name) if name in names else np.zeros(len(codes), dtype=bool)


def pct(a: np.ndarray) -> dict:
    if not len(a):
        return {"p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(a.max())}


def group_metrics_of(t: RecordTable, d: Derived) -> dict[str, Any]:
    """``metrics.group_metrics`` of the rows in ``d`` (in record order)."""
    codes, first = np.unique(d.status, return_index=True)
    counts = np.bincount(d.status, minlength=len(t.names["status"]))
    status = {t.names["status"][c]: int(counts[c]) for c in codes[np.argsort(first)].tolist()}
    slow = d.slow[d.has_slow]
    waits = d.wait[d.has_wait]
    fin = d.finished
    rows_out = d.row[~fin].tolist()
    names, reasons, scodes = t.names["status"], t.strings["reason"], t.codes["status"]
    return {
        "requests": len(d.row), "status": status, "ttft_s": pct(d.ttft[d.has_ttft]),
        "tpot_s": pct(d.tpot[d.has_tpot]), "e2e_s": pct(d.e2e[fin]),
        "max_wait_s": float(waits.max()) if len(waits) else None,
        "slowdown": pct(slow) | ({"mean": float(np.mean(slow))} if len(slow) else {}),
        "overdue_requests": int(d.overdue.sum()), "deadline_misses": int(d.miss.sum()),
        "preemptions": int(d.preemptions.sum()), "slo_met": int(d.met.sum()),
        "goodput": {"finished_tokens": int(d.tokens[fin].sum()), "in_time_tokens": int(d.tokens[d.in_time].sum()),
                    "in_time_requests": int(d.in_time.sum()), "slo_tokens": int(d.tokens[d.met].sum())},
        "outcomes": outcomes({"status": names[scodes[i]], "reason": reasons[i]} for i in rows_out),
    }
