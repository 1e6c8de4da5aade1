"""Readers for the public traces, the ServeGen generator, transforms and bad rows."""

from __future__ import annotations

import inspect
import json
import os
import re
import statistics
from collections import Counter
from pathlib import Path

import pytest

from tokenfair.workloads import servegen, traces
from tokenfair.workloads.servegen import generate_servegen
from tokenfair.workloads.servegen_files import parse_pmf
from tokenfair.workloads.traces import (
    SkippedRow, TraceWorkload, find_traces_dir, limit, load_workload, parse_timestamp_ns, read_azure,
    read_mooncake, read_vtc, remap_tenants, scale_rate, slice_time, spread_tenants, tile,
)
from tokenfair.workloads.transforms import MAX_SPREAD_TENANTS
from tokenfair.workloads.workload import MAX_ARRIVAL_S, TraceRow, Workload, WorkloadError


@pytest.fixture(scope="module")
def root(public_traces) -> Path:
    return public_traces


def check_invariants(wl: Workload) -> None:
    arr = [r.arrival_s for r in wl.rows]
    assert arr and arr[0] == 0.0
    assert all(a <= b for a, b in zip(arr, arr[1:]))
    assert len({r.request_id for r in wl.rows}) == len(wl.rows)
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in wl.rows)


def mean(xs) -> float:
    return statistics.fmean(xs)


# --- public traces ---------------------------------------------------------------------------

def test_azure_code_and_conv_as_two_tenants(root):
    wl = load_workload("azure", traces_dir=root)
    check_invariants(wl)
    assert isinstance(wl, TraceWorkload) and wl.skipped == ()
    counts = Counter(r.tenant for r in wl.rows)
    assert counts == {"code": 8819, "conv": 19366}
    # conv starts 18:15:46.6805900, code 18:17:03.9799600: exact to 100 ns
    first_code = next(r for r in wl.rows if r.tenant == "code")
    assert first_code.arrival_s == pytest.approx(77.29937, abs=1e-9)
    code = wl.only_tenant("code")
    assert mean(r.prompt_tokens for r in code.rows) == pytest.approx(2048, rel=0.01)
    assert mean(r.output_tokens for r in code.rows) == pytest.approx(28, rel=0.03)


def test_azure_conv_full_file_matches_readme(root):
    wl = load_workload("azure:conv", traces_dir=root)
    check_invariants(wl)
    assert len(wl) == 19366 and wl.tenants == ["conv"]
    assert mean(r.prompt_tokens for r in wl.rows) == pytest.approx(1155, rel=0.01)
    assert mean(r.output_tokens for r in wl.rows) == pytest.approx(211, rel=0.01)
    assert len(wl) / wl.rows[-1].arrival_s == pytest.approx(5.53, rel=0.02)
    # sub-second timestamps are kept: many distinct fractional parts
    assert len({round(r.arrival_s % 1, 4) for r in wl.rows[:500]}) > 400


def test_azure_conv_over_20_tenants_is_skewed_and_seeded(root):
    wl = load_workload("azure:conv", traces_dir=root, num_tenants=20, seed=3)
    check_invariants(wl)
    counts = Counter(r.tenant for r in wl.rows)
    assert sorted(counts) == [f"t{i:02d}" for i in range(20)]
    assert counts["t00"] > 5 * counts["t19"]
    again = load_workload("azure:conv", traces_dir=root, num_tenants=20, seed=3)
    other = load_workload("azure:conv", traces_dir=root, num_tenants=20, seed=4)
    assert again.rows == wl.rows
    assert [r.tenant for r in other.rows] != [r.tenant for r in wl.rows]
    # only the tenant changes
    assert [r.request_id for r in other.rows] == [r.request_id for r in wl.rows]


def test_mooncake_keeps_prefix_hashes(root):
    wl = load_workload("mooncake", traces_dir=root)
    check_invariants(wl)
    assert len(wl) == 12031 and wl.tenants == ["default"]
    assert wl.rows[-1].arrival_s == pytest.approx(3536.999)
    assert all(r.prefix_hashes for r in wl.rows[:100])
    assert wl.rows[0].prefix_hashes[:3] == (0, 1, 2)
    # equal ids = shared prefix: block 0 is shared by many requests
    assert sum(1 for r in wl.rows if r.prefix_hashes[:1] == (0,)) > 100
    assert mean(r.prompt_tokens for r in wl.rows) == pytest.approx(12035, rel=0.01)
    syn = load_workload("mooncake:synthetic", traces_dir=root, num_tenants=4)
    check_invariants(syn)
    assert len(syn) == 3993 and len(syn.tenants) == 4
    assert all(r.prefix_hashes for r in syn.rows)


def test_vtc_real_trace(root):
    wl = load_workload("vtc", traces_dir=root)
    check_invariants(wl)
    assert len(wl) == 1500 and len(wl.tenants) == 27
    assert mean(r.prompt_tokens for r in wl.rows) == pytest.approx(136, rel=0.02)
    assert mean(r.output_tokens for r in wl.rows) == pytest.approx(256, rel=0.02)
    assert all(r.prompt_tokens < 1024 and r.output_tokens < 1024 for r in wl.rows)
    assert wl.rows[0].request_id == "0" and wl.rows[0].tenant == "dummy-lora-7b-rank-8-13"


def test_servegen_several_tenants_reproducible(root):
    kw = dict(duration_s=120, max_clients=6, rate_scale=0.05)
    wl = load_workload("servegen", traces_dir=root, seed=1, **kw)
    check_invariants(wl)
    counts = Counter(r.tenant for r in wl.rows)
    assert len(counts) >= 4
    assert max(counts.values()) > 3 * min(counts.values())  # tenants differ in rate
    assert wl.rows[-1].arrival_s < 120
    assert load_workload("servegen", traces_dir=root, seed=1, **kw).rows == wl.rows
    other = load_workload("servegen", traces_dir=root, seed=2, **kw)
    assert other.rows != wl.rows and set(r.tenant for r in other.rows) == set(counts)
    # a client with a dataset gets its own lengths; client 5 has none -> pooled PMF
    assert len({r.prompt_tokens for r in wl.rows}) > 20


def test_servegen_start_window_and_explicit_clients(root):
    folder = root / "servegen" / "language-m-small"
    # client 1 becomes active at 74400 s, has no dataset file (pooled PMF of the others)
    wl = generate_servegen(folder, duration_s=600, seed=0, clients=[1], rate_scale=0.2)
    check_invariants(wl)
    assert wl.tenants == ["c01"]
    # its first window has rate 23.56 req/s -> about 2800 requests in 600 s at 0.2
    assert 1000 < len(wl) < 6000
    wl2 = generate_servegen(folder, duration_s=600, seed=0, clients=[1, 2], start_window_s=74400, rate_scale=0.2)
    # a client's arrivals ignore the other clients (its lengths come from the pooled PMF
    # of the selected clients with data, here client 2, so they may differ)
    c01 = [r.arrival_s for r in wl2.only_tenant("c01").rows]
    assert [t - c01[0] for t in c01] == pytest.approx([r.arrival_s for r in wl.rows], abs=1e-6)


def test_servegen_rate_matches_window(tmp_path):
    for dist, p1 in (("Gamma", 0.25), ("Weibull", 0.5), ("Exponential", 0)):
        d = tmp_path / dist
        d.mkdir()
        (d / "chunk-0-trace.csv").write_text(f"0,0,0,,0,0\n600,50,2,{dist},{p1},0.1\n1200,0,0,,0,0\n")
        wl = generate_servegen(d, duration_s=600, seed=5)
        assert wl.tenants == ["c00"]
        assert len(wl) == pytest.approx(30000, rel=0.15), dist
        # no dataset anywhere -> documented default PMF
        assert {r.prompt_tokens for r in wl.rows} <= set(servegen.DEFAULT_INPUT_PMF)


# --- transforms --------------------------------------------------------------------------------

def _toy() -> TraceWorkload:
    rows = tuple(TraceRow(f"r{i}", float(i), "ab"[i % 2], 10 + i, 5) for i in range(10))
    return TraceWorkload("toy", rows, (SkippedRow("f", 3, "bad"),))


def test_transforms():
    wl = _toy()
    s = slice_time(wl, 2.5, 6.0)
    assert [r.request_id for r in s.rows] == ["r3", "r4", "r5"] and s.rows[0].arrival_s == 0.0
    assert isinstance(s, TraceWorkload) and s.skipped == wl.skipped
    assert scale_rate(wl, 2.0).rows[-1].arrival_s == 4.5
    with pytest.raises(WorkloadError):
        scale_rate(wl, 0)
    assert remap_tenants(wl, {"a": "x"}).tenants == ["b", "x"]
    assert remap_tenants(wl, str.upper).tenants == ["A", "B"]
    with pytest.raises(WorkloadError):
        remap_tenants(wl, lambda t: "")
    assert len(limit(wl, 3)) == 3 and limit(wl, 3).rows == wl.rows[:3]
    sp = spread_tenants(wl, 3, seed=0)
    assert set(sp.tenants) <= {"t00", "t01", "t02"}


def test_tile_repeats_the_trace_back_to_back():
    wl = _toy()
    assert tile(wl, 10) is wl
    t = tile(wl, 25)                          # 3 copies, the period is the span plus one mean gap
    assert len(t) == 30 and t.name == "toyx3"
    check_invariants(t)
    assert [r.arrival_s for r in t.rows[10:12]] == [9.9, 10.9]
    assert t.rows[10].request_id == "r0#1" and t.rows[29].request_id == "r9#2"
    assert [(r.tenant, r.prompt_tokens) for r in t.rows[20:]] == [(r.tenant, r.prompt_tokens) for r in wl.rows]


def test_transforms_refuse_what_memory_or_the_timeline_cannot_hold():
    wl = _toy()                               # arrivals 0..9 s
    with pytest.raises(WorkloadError, match=r"scale_rate by 1e-07: the last arrival would be at 9e\+07 s"):
        scale_rate(wl, 1e-7)
    assert scale_rate(wl, 1e-6).rows[-1].arrival_s == pytest.approx(9e6)     # within MAX_ARRIVAL_S
    with pytest.raises(WorkloadError, match=r"tile to 20000000 requests \(2000000 copies\)"):
        tile(wl, 20_000_000)
    with pytest.raises(WorkloadError, match="spread over at most 1000000"):
        spread_tenants(wl, MAX_SPREAD_TENANTS + 1)
    assert len(spread_tenants(wl, MAX_SPREAD_TENANTS, seed=0)) == len(wl)


# --- bad rows ------------------------------------------------------------------------------------

def test_azure_bad_row_names_file_line_field(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_code.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:17:03.9799600,4808,10\n"
                 "2023-11-16 18:17:04.0319600,x,8\n"
                 "2023-11-16 18:17:04.5,110,0\n"
                 "not a time,110,27\n"
                 "2023-11-16 18:17:05.0781490,110,27\n")
    with pytest.raises(WorkloadError, match=re.escape(f"{p}:3: field 'ContextTokens': expected an integer, got 'x'")):
        read_azure(p)
    wl = read_azure(p, skip_bad_rows=True)
    assert len(wl) == 2 and wl.tenants == ["code"]
    assert [(s.line, s.file) for s in wl.skipped] == [(3, str(p)), (4, str(p)), (5, str(p))]
    assert "field 'GeneratedTokens'" in wl.skipped[1].message
    assert "field 'TIMESTAMP'" in wl.skipped[2].message
    assert wl.rows[1].arrival_s == pytest.approx(1.098189, abs=1e-9)
    # the same file found by sniffing, through the one entry point
    assert load_workload(str(p), skip_bad_rows=True).rows == wl.rows


def test_mooncake_and_vtc_bad_rows(tmp_path):
    m = tmp_path / "m.jsonl"
    m.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [0]}\n'
                 '{"timestamp": 10, "input_length": 5\n'
                 '{"timestamp": 20, "input_length": 5, "output_length": 2, "hash_ids": ["a"]}\n'
                 '{"timestamp": 1500, "input_length": 7, "output_length": 3, "hash_ids": [0, 1]}\n')
    with pytest.raises(WorkloadError, match=re.escape(f"{m}:2: not valid JSON")):
        read_mooncake(m)
    wl = load_workload(str(m), skip_bad_rows=True)
    assert len(wl) == 2 and [s.line for s in wl.skipped] == [2, 3]
    assert "field 'hash_ids'" in wl.skipped[1].message
    assert wl.rows[1].arrival_s == 1.5 and wl.rows[1].prefix_hashes == (0, 1)

    v = tmp_path / "v.csv"
    v.write_text("req_id,client,arrival_s,prompt_len,output_len\n0,a,0.5,3,4\n1,b,soon,3,4\n2,b,1.5,3,4\n")
    with pytest.raises(WorkloadError, match=re.escape(f"{v}:3: field 'arrival_s': expected a number, got 'soon'")):
        read_vtc(v)
    wl = load_workload(str(v), skip_bad_rows=True)
    assert wl.tenants == ["a", "b"] and wl.rows[-1].arrival_s == 1.0 and len(wl.skipped) == 1


def test_an_arrival_past_the_span_limit_names_the_line(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("request_id,arrival_s,tenant,prompt_tokens,output_tokens\na,0,t,10,10\nb,1e300,t,10,10\n")
    with pytest.raises(WorkloadError, match=re.escape("t.csv:3: field 'arrival_s': must be <= 1e+07, got '1e300'")):
        load_workload(str(p))
    p.write_text(f"request_id,arrival_s,tenant,prompt_tokens,output_tokens\na,{MAX_ARRIVAL_S},t,10,10\n")
    assert load_workload(str(p)).rows[0].arrival_s == MAX_ARRIVAL_S


def test_tokenfair_format_and_servegen_bad_rows(tmp_path):
    t = tmp_path / "own.csv"
    t.write_text("request_id,arrival_s,tenant,prompt_tokens,output_tokens\nr1,1.0,a,5,5\nr2,2.0,a,zero,5\n")
    with pytest.raises(WorkloadError, match=re.escape(f"{t}:3: field 'prompt_tokens'")):
        load_workload(str(t))
    wl = load_workload(str(t), skip_bad_rows=True)
    assert len(wl) == 1 and wl.rows[0].arrival_s == 1.0 and wl.skipped[0].line == 3

    d = tmp_path / "sg"
    d.mkdir()
    (d / "chunk-3-trace.csv").write_text("0,5,1,Gamma,1,0.2\n600,5,1,Poisson,1,1\n1200,5,1,,0,0\n")
    with pytest.raises(WorkloadError, match=re.escape("chunk-3-trace.csv:2: field 'distribution'")):
        generate_servegen(d, duration_s=60, seed=0)
    wl = load_workload(str(d), duration_s=60, skip_bad_rows=True)
    assert wl.tenants == ["c03"] and len(wl.skipped) == 1 and wl.skipped[0].line == 2


def test_empty_and_missing():
    with pytest.raises(WorkloadError, match="not a trace name"):
        load_workload("no/such/file.csv")
    with pytest.raises(WorkloadError, match="azure:conv"):
        load_workload("azure:chat", traces_dir="/nonexistent")


# --- PMFs: ast.literal_eval only ----------------------------------------------------------------

def test_pmf_parsing_is_literal_only(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd) or 0)
    with pytest.raises(WorkloadError, match="not a plain Python dict literal"):
        parse_pmf("__import__('os').system('x')", "chunk-1-dataset.json: window '0'")
    with pytest.raises(WorkloadError, match="not a plain Python dict literal"):
        parse_pmf("{1: __import__('os').system('x')}", "w")
    assert calls == []
    src = inspect.getsource(servegen)
    assert "ast.literal_eval" in src
    assert not re.search(r"(?<![\w.])eval\(", src.replace("literal_eval(", ""))
    assert parse_pmf("{}", "w") is None
    assert parse_pmf("{0: 0.5, 1: 0.25, 4: 0.2500001}", "w") == pytest.approx({1: 0.75, 4: 0.25}, rel=1e-5)
    for bad, why in (("[1, 2]", "dict"), ("{1: -0.5, 2: 1.5}", ">= 0"), ("{1: 0.5}", "sum"),
                     ("{'a': 1.0}", "non-negative integer"), ("{1.5: 1.0}", "non-negative integer")):
        with pytest.raises(WorkloadError, match=why):
            parse_pmf(bad, "w")


def test_servegen_dataset_pmfs_are_used(tmp_path):
    d = tmp_path / "sg"
    d.mkdir()
    (d / "chunk-0-trace.csv").write_text("0,20,1,Exponential,0,0\n600,20,1,Exponential,0,0\n")
    (d / "chunk-1-trace.csv").write_text("0,20,1,Exponential,0,0\n600,20,1,Exponential,0,0\n")
    (d / "chunk-0-dataset.json").write_text(json.dumps({
        "0": {"input_tokens": "{}", "output_tokens": "{}"},
        "600": {"input_tokens": "{7: 1.0}", "output_tokens": "{0: 0.5, 3: 0.5}"}}))
    wl = generate_servegen(d, duration_s=1200, seed=0)
    c0, c1 = wl.only_tenant("c00"), wl.only_tenant("c01")
    assert {r.prompt_tokens for r in c0.rows} == {7} and {r.output_tokens for r in c0.rows} == {1, 3}
    assert {r.prompt_tokens for r in c1.rows} == {7}  # no dataset -> pooled from client 0
    (d / "chunk-0-dataset.json").write_text(json.dumps({"0": {"input_tokens": "eval('1')", "output_tokens": "{}"}}))
    with pytest.raises(WorkloadError, match=r"chunk-0-dataset.json: window '0': field 'input_tokens'"):
        generate_servegen(d, duration_s=60, seed=0)


def test_timestamps_and_traces_dir(tmp_path, monkeypatch):
    a = parse_timestamp_ns("2023-11-16 18:17:03.9799600")
    b = parse_timestamp_ns("2023-11-16T18:17:04.0319600")
    assert b - a == 52_000_000
    assert parse_timestamp_ns("2023-11-16 18:17:04") - a == 20_040_000
    with pytest.raises(WorkloadError, match="TIMESTAMP"):
        parse_timestamp_ns("2023-13-16 18:17:04")
    monkeypatch.setenv("TOKENFAIR_TRACES", str(tmp_path))
    assert find_traces_dir() == tmp_path
    monkeypatch.setenv("TOKENFAIR_TRACES", str(tmp_path / "nope"))
    with pytest.raises(WorkloadError, match="TOKENFAIR_TRACES"):
        find_traces_dir()
    assert traces.generate_servegen is generate_servegen
