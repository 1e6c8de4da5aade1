"""The columnar records and the metrics over them give what the per-record dicts give.

References here are the per-record definitions (a loop over dicts): ``request_record`` and
``json.dumps`` for the records, ``servicegaps.starvation`` for service gaps, and small
loops for the group metrics, the backlog and the fleet's timeline sums.
"""

from __future__ import annotations

import io
import json
import math
from collections import defaultdict

import numpy as np
from hypothesis import given, settings, strategies as st

from tokenfair.core.costmodel import load_profile
from tokenfair.evaluation.metrics import backlog_intervals, group_metrics, request_record, summarize
from tokenfair.evaluation.record_table import JSONL_CHUNK, RecordTable
from tokenfair.evaluation.servicegaps import starvation
from tokenfair.evaluation.table_gaps import starvation_of
from tokenfair.runtime.output import write_run
from tokenfair.sim.fleet import FleetConfig, simulate_fleet_once
from tokenfair.sim.fleet_metrics import fleet_records, fleet_timeline
from tokenfair.sim.simulate import simulate, simulate_once
from tokenfair.workloads.scenarios import build_scenario

STATUSES = ("finished", "rejected", "expired", "failed")


def _jsonl(recs) -> str:
    return "".join(json.dumps(r) + "\n" for r in recs)


def _table_jsonl(t: RecordTable) -> str:
    fh = io.StringIO()
    t.write_jsonl(fh)
    return fh.getvalue()


def test_a_runs_table_holds_its_request_records_and_writes_them_as_json_dumps():
    wl, contract = build_scenario("many-light", 0)          # preemptions and recomputation (KV-bound)
    res = simulate_once(wl, "fair", contract, load_profile("llama2-7b-a100"))
    recs = [request_record(r) for r in res.requests]
    t = RecordTable.from_requests(res.requests)
    assert len(t) == len(recs) and t.rows() == recs and list(t) == recs
    assert [type(v) for v in t.rows()[0].values()] == [type(v) for v in recs[0].values()]
    assert any(r["preemptions"] for r in recs)
    assert _table_jsonl(t) == _jsonl(recs)


def test_a_fleets_table_has_the_replica_column_none_for_requests_ended_at_the_gateway(tmp_path):
    wl, contract = build_scenario("flood", 0)
    run = simulate_fleet_once(wl, "fair", contract, load_profile(None),
                              FleetConfig(num_replicas=3, fleet_policy="fair"))
    t = fleet_records(run)
    want = [dict(request_record(r), replica=k) for r, k in zip(run.requests, run.replica_of)]
    assert t.rows() == want and t.keys[-1] == "replica"
    write_run(tmp_path, t, {}, {})
    assert (tmp_path / "requests.jsonl").read_text() == _jsonl(want)


def _record(i: int, tenant: str, status: str, arrival: float, wait: float | None, run: float | None,
            max_wait: float | None, slo: float | None, deadline: float | None, out: int) -> dict:
    sched = None if wait is None else arrival + wait
    finish = None if run is None else (sched if sched is not None else arrival) + run
    if status == "finished" and (sched is None or finish is None):
        status = "rejected"
    first = sched + run / 2 if status == "finished" else None
    return {"request_id": f"r{i}-\u00e9", "tenant": tenant, "class": "interactive" if i % 3 else "batch",
            "arrival_s": arrival, "scheduled_s": sched, "first_token_s": first, "finish_s": finish,
            "prompt_tokens": 100 * (i % 97), "output_tokens": out if status == "finished" else 0,
            "status": status, "reason": "" if status == "finished" else f"{status}: reason {i % 2}",
            "preemptions": i % 2, "deadline_s": deadline, "recomputed_tokens": i % 5,
            "swapped_bytes": 0, "predicted_output_tokens": 256, "max_wait_s": max_wait,
            "ttft_slo_s": slo, "tpot_slo_s": None if slo is None else slo / 10}


_times = st.floats(0.0, 50.0, allow_nan=False).map(lambda x: round(x, 1))   # ties happen
_row = st.tuples(st.sampled_from(["a", "b", "c", "\u00fc"]), st.sampled_from(STATUSES), _times,
                 st.none() | _times, st.none() | _times, st.none() | st.sampled_from([5.0, 30.0]),
                 st.none() | st.sampled_from([2.0, math.inf]), st.none() | _times, st.integers(0, 40))
_records = st.lists(_row, min_size=0, max_size=60).map(lambda rows: [_record(i, *r) for i, r in enumerate(rows)])


@settings(max_examples=150, deadline=None)
@given(_records)
def test_the_columnar_service_gaps_are_the_per_record_sweeps(recs):
    assert starvation_of(RecordTable.from_dicts(recs)) == starvation(recs)


@settings(max_examples=150, deadline=None)
@given(_records, st.booleans())
def test_the_columnar_group_metrics_are_the_per_record_definitions(recs, with_isolated):
    iso = {r["request_id"]: 0.5 + (i % 4) for i, r in enumerate(recs) if i % 3} if with_isolated else None
    assert group_metrics(recs, iso) == _reference_group_metrics(recs, iso)


@settings(max_examples=100, deadline=None)
@given(_records)
def test_the_columnar_backlog_is_the_per_record_one(recs):
    got = {k: np.isin(np.arange(80), iv.positions()) for k, iv in backlog_intervals(recs, "tenant", 80, 1.0).items()}
    want = _reference_backlog(recs, 80, 1.0)
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, -0.0, 1.5, 2.0, math.nan, math.inf, -math.inf, 1e-310]),
                          st.sampled_from([None, 3, -7]), st.text(max_size=4)), max_size=40))
def test_odd_values_are_written_as_json_writes_them(values):
    recs = []
    for i, (x, k, text) in enumerate(values):
        r = _record(i, text, "finished", 1.0, 1.0, 2.0, x, None, None, 3)
        r["deadline_s"] = x if k is None else None
        r["swapped_bytes"] = 0 if k is None else k
        recs.append(r)
    t = RecordTable.from_dicts(recs)
    assert _table_jsonl(t) == _jsonl(recs)
    assert json.dumps(t.rows()) == json.dumps(recs)


def test_the_jsonl_is_written_a_chunk_at_a_time_and_repeated_floats_are_formatted_once():
    recs = [_record(i, "t", "finished", i * 0.25, 0.5, 1.0 / (i + 1), 30.0, 2.0, None, 5)
            for i in range(2 * JSONL_CHUNK + 3)]
    assert _table_jsonl(RecordTable.from_dicts(recs)) == _jsonl(recs)


def test_summary_of_a_table_is_the_summary_of_its_dicts():
    wl, contract = build_scenario("burst", 0)
    out = simulate(wl, "vtc", contract, load_profile(None), isolated=False)
    assert summarize(out.records, out.timeline, contract) == summarize(out.table, out.timeline, contract)


def test_the_fleet_timeline_sums_the_replicas_in_order():
    wl, contract = build_scenario("whale", 0)
    run = simulate_fleet_once(wl, "vtc", contract, load_profile(None), FleetConfig(num_replicas=3))
    parts = [r.recorder.to_json() for r in run.replicas]
    merged = fleet_timeline(run)
    assert json.dumps(merged) == json.dumps(_reference_fleet_timeline(parts, merged["swap_s"]))


# -- references: the per-record definitions ---------------------------------------------------

def _pct(values):
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(np.asarray(values, dtype=float), [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(max(values))}


def _reference_group_metrics(recs, iso):
    from tokenfair.evaluation.goodput import goodput, outcomes
    ttft, tpot, e2e, wait, slow, met = [], [], [], [], [], []
    status: dict[str, int] = defaultdict(int)
    overdue = misses = preempt = 0
    for r in recs:
        a = r["arrival_s"]
        status[r["status"]] += 1
        d = {}
        if r["first_token_s"] is not None:
            d["ttft"] = r["first_token_s"] - a
            ttft.append(d["ttft"])
        if r["status"] == "finished":
            e2e.append(r["finish_s"] - a)
            if r["output_tokens"] > 1:
                d["tpot"] = (r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
                tpot.append(d["tpot"])
            if iso and r["request_id"] in iso:
                slow.append(e2e[-1] / max(1e-9, iso[r["request_id"]]))
        end = r["scheduled_s"] if r["scheduled_s"] is not None else r["finish_s"]
        if end is not None:
            wait.append(end - a)
            overdue += r["max_wait_s"] is not None and wait[-1] > r["max_wait_s"]
        late = r["deadline_s"] is not None and r["status"] == "finished" and r["finish_s"] > r["deadline_s"]
        misses += r["deadline_s"] is not None and (r["status"] == "expired" or late)
        preempt += r["preemptions"]
        met.append(r["status"] == "finished" and not late
                   and not (r["ttft_slo_s"] is not None and d.get("ttft", 0) > r["ttft_slo_s"])
                   and not (r["tpot_slo_s"] is not None and d.get("tpot", 0) > r["tpot_slo_s"]))
    return {"requests": len(recs), "status": dict(status), "ttft_s": _pct(ttft), "tpot_s": _pct(tpot),
            "e2e_s": _pct(e2e), "max_wait_s": max(wait) if wait else None,
            "slowdown": _pct(slow) | ({"mean": float(np.mean(slow))} if slow else {}),
            "overdue_requests": overdue, "deadline_misses": misses, "preemptions": preempt,
            "slo_met": sum(met), "goodput": goodput(recs, met), "outcomes": outcomes(recs)}


def _reference_backlog(recs, n_buckets, bucket_s):
    diffs: dict[str, np.ndarray] = {}
    for r in recs:
        start = r["arrival_s"] + 1.0
        end = r["scheduled_s"] if r["scheduled_s"] is not None else r["finish_s"]
        if end is None or end <= start:
            continue
        arr = diffs.setdefault(r["tenant"], np.zeros(n_buckets + 1, dtype=np.int64))
        arr[min(n_buckets, int(start // bucket_s))] += 1
        arr[min(n_buckets, int(-(-end // bucket_s)))] -= 1
    return {k: np.cumsum(v)[:n_buckets] > 0 for k, v in diffs.items()}


def _reference_fleet_timeline(parts, swap_s):
    merged = {"bucket_s": parts[0]["bucket_s"]}
    for key in ("tenant_service", "class_service"):
        acc: dict = defaultdict(lambda: defaultdict(float))
        for p in parts:
            for name, series in p[key].items():
                for b, v in series.items():
                    acc[name][b] += v
        merged[key] = {name: dict(sorted(s.items())) for name, s in acc.items()}
    for key in ("tokens", "queue_len", "running"):
        tot: dict = defaultdict(int)
        for p in parts:
            for b, v in p[key].items():
                tot[b] += v
        merged[key] = dict(sorted(tot.items()))
    kv: dict = defaultdict(list)
    for p in parts:
        for b, v in p["kv_usage"].items():
            kv[b].append(v)
    merged["kv_usage"] = {b: sum(v) / len(v) for b, v in sorted(kv.items())}
    merged["preemptions"] = sorted(x for p in parts for x in p["preemptions"])
    merged["num_steps"] = sum(p["num_steps"] for p in parts)
    merged["busy_s"] = sum(p["busy_s"] for p in parts)
    merged["swap_s"] = swap_s
    return merged
