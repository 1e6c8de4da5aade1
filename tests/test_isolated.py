"""The isolated baselines in bulk equal one request at a time, bit for bit."""

from __future__ import annotations

import dataclasses
import random

import pytest

from tokenfair.contracts.contract import Contract
from tokenfair.core.costmodel import BUILTIN_PROFILES, load_profile
from tokenfair.runtime.intake import DEFAULT_MAX_TOKENS
from tokenfair.sim import isolated
from tokenfair.sim.isolated import isolated_e2e, isolated_latency
from tokenfair.workloads.workload import TraceRow, moved, with_tenant


def random_rows(seed: int, n: int) -> list[TraceRow]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = rng.choice([1, 2, 511, 512, 513, 2048, 4097]) if i % 5 == 0 else rng.randrange(1, 9000)
        output = rng.choice([1, 2, 3, 8, 9, 129, 8193, 9000]) if i % 7 == 0 else rng.randrange(1, 1500)
        rows.append(TraceRow(f"r{i}", 0.0, "t", prompt, output))
    return rows


@pytest.mark.parametrize("name", sorted(BUILTIN_PROFILES))
def test_bulk_equals_one_at_a_time(name, monkeypatch):
    profile = load_profile(name)
    rows = random_rows(sum(map(ord, name)), 200)
    monkeypatch.setattr(isolated, "MAX_BLOCK_ROWS", 3)     # blocks split within a length too
    for chunk in (61, 512, 2048):
        bulk = isolated_e2e(rows, Contract(), profile, chunk)
        assert list(bulk) == [r.request_id for r in rows]
        for r in rows:
            assert bulk[r.request_id] == isolated_latency(r, Contract(), profile, chunk)[1], (name, chunk, r)


def test_each_distinct_length_pair_is_computed_once(monkeypatch):
    """A tiled trace repeats its (prompt, output) pairs: each is computed once and every
    copy gets the value one request at a time gives."""
    profile = load_profile(None)
    base = random_rows(7, 60)
    rows = base + [moved(r, 1.0, f"{r.request_id}#1") for r in base]
    computed = []
    real = isolated._decode_step_times

    def counting(prof, ctx):
        computed.append(ctx.shape[0] if ctx.ndim == 2 else 1)
        return real(prof, ctx)
    monkeypatch.setattr(isolated, "_decode_step_times", counting)
    bulk = isolated_e2e(rows, Contract(), profile, 512)
    pairs = {(r.prompt_tokens, r.output_tokens) for r in base if r.output_tokens > 1}
    assert sum(computed) == len(pairs) < len(rows)
    monkeypatch.setattr(isolated, "_decode_step_times", real)
    for r in rows:
        assert bulk[r.request_id] == isolated_latency(r, Contract(), profile, 512)[1]


def test_the_baseline_is_of_what_the_run_can_do():
    """A request is measured alone as the engine runs it: its output stopped at max_tokens
    (the default when it names none), and a prompt the KV pool can never hold (rejected in
    the run) has no baseline -- neither is computed token by token."""
    profile = load_profile(None)
    capped = TraceRow("capped", 0.0, "t", 100, DEFAULT_MAX_TOKENS)
    rows = [TraceRow("huge-output", 0.0, "t", 100, 10 ** 12), capped,
            TraceRow("huge-prompt", 0.0, "t", 10 ** 12, 10), TraceRow("fits", 0.0, "t", 999, 10)]
    bulk = isolated_e2e(rows, Contract(), profile, 512, capacity_tokens=1000)
    assert set(bulk) == {"huge-output", "capped", "fits"}
    assert bulk["huge-output"] == bulk["capped"] == isolated_latency(capped, Contract(), profile, 512)[1]
    assert isolated_latency(rows[0], Contract(), profile, 512) == isolated_latency(capped, Contract(), profile, 512)
    limited = dataclasses.replace(rows[0], max_tokens=50)
    assert isolated_e2e([limited], Contract(), profile, 512)["huge-output"] == \
        isolated_latency(TraceRow("x", 0.0, "t", 100, 50), Contract(), profile, 512)[1]


def test_with_tenant_is_replace():
    row = TraceRow("a", 1.5, "t", 10, 20, klass="k", deadline_s=3.0, priority=2.0, max_tokens=30,
                   prefix_hashes=(1, 2))
    assert all(getattr(row, f.name) != f.default for f in dataclasses.fields(TraceRow))   # every field set
    assert with_tenant(row, "u") == dataclasses.replace(row, tenant="u")
    assert moved(row, 7.25) == dataclasses.replace(row, arrival_s=7.25)
    assert moved(row, 7.25, "a#3") == dataclasses.replace(row, arrival_s=7.25, request_id="a#3")


@pytest.mark.parametrize("policy", ["fifo", "vtc", "fair"])
def test_a_run_without_timeline_ends_the_same(policy):
    from tokenfair.evaluation.metrics import request_record
    from tokenfair.runtime.step_counter import StepCounter
    from tokenfair.sim.simulate import simulate_once
    from tokenfair.workloads.scenarios import build_scenario
    wl, contract = build_scenario("whale", 0)
    profile = load_profile(None)
    full = simulate_once(wl, policy, contract, profile)
    bare = simulate_once(wl, policy, contract, profile, timeline=False)
    assert isinstance(bare.recorder, StepCounter) and not isinstance(full.recorder, StepCounter)
    assert [request_record(r) for r in bare.requests] == [request_record(r) for r in full.requests]
    assert bare.end_s == full.end_s and bare.recorder.num_steps == full.recorder.num_steps > 0
    assert not bare.recorder.tenant_service and not bare.recorder.kv_usage   # nothing recorded
    assert full.recorder.tenant_service


def test_every_policy_is_measured_against_the_reference_schedulers_runs():
    """The isolated baselines run on ``REFERENCE_POLICY`` whatever the run's policy: fifo's,
    vtc's and fair's summaries carry the same tenant-alone figures and the same per-request
    baseline; on hol the chat tenant alone under fair would have had another P99 TTFT, and a
    request's closed form is prefilled in the reference scheduler's chunks, not fair's."""
    from tokenfair.evaluation.metrics import group_metrics
    from tokenfair.evaluation.record_table import RecordTable
    from tokenfair.sim.simulate import (REFERENCE_POLICY, isolated_baselines, reference_chunk, simulate,
                                        simulate_once)
    from tokenfair.workloads.scenarios import build_scenario
    wl, contract = build_scenario("hol", 0)
    profile = load_profile(None)
    runs = {p: simulate(wl, p, contract, profile) for p in ("fifo", "vtc", "fair")}
    isolated_of = {p: {t: m["isolated"] for t, m in out.summary["tenants"].items()} for p, out in runs.items()}
    assert set(isolated_of["fair"]) == {"chat", "docs"}
    assert isolated_of["fair"] == isolated_of["vtc"] == isolated_of["fifo"]
    fair_alone = simulate_once(wl.only_tenant("chat"), "fair", contract, profile, timeline=False)
    own = group_metrics(RecordTable.from_requests(fair_alone.requests), None)
    assert own["ttft_s"]["p99"] != isolated_of["fair"]["chat"]["ttft_s"]["p99"]
    assert runs["fifo"].run.scheduler.policy.max_chunk() == reference_chunk(contract) \
        != runs["fair"].run.scheduler.policy.max_chunk()
    iso_req, _ = isolated_baselines(wl, contract, profile)
    long_prompt = max(wl.rows, key=lambda r: r.prompt_tokens)
    assert iso_req[long_prompt.request_id] == isolated_latency(long_prompt, contract, profile,
                                                               reference_chunk(contract))[1]
    assert iso_req[long_prompt.request_id] != isolated_latency(long_prompt, contract, profile, 512)[1]
    assert REFERENCE_POLICY == "fifo"
